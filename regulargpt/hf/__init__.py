"""The Hugging Face format: an exported run loads with ``transformers`` (``AutoModelForCausalLM`` /
``AutoTokenizer``), generates through our cached decoders, and evaluates in tools built on them (docs/EXPORT.md).

* :mod:`configuration`: :class:`~regulargpt.hf.configuration.RegularGPTConfig`, the ``config.json`` of an export:
  the run's ``model`` section, verbatim, plus the depth policy as a field of its own;
* :mod:`cache`: :class:`~regulargpt.hf.cache.DecoderCache`, one of our cached decoders behind ``transformers``'
  ``Cache`` interface, which ``generate`` passes from step to step;
* :mod:`modeling`: :class:`~regulargpt.hf.modeling.RegularGPTForCausalLM`, a thin ``PreTrainedModel`` around the
  model :func:`regulargpt.model.build_model` builds (no second copy of the network);
* :mod:`tokenizer`: the run's sentencepiece model as a ``tokenizers`` BPE (``tokenizer.json``) that encodes and
  decodes exactly like it;
* :mod:`model_card`: the ``README.md`` of an export, from the run directory;
* :mod:`export`: the folder itself (``python launch/export.py RUN --format hf --out DIR``).

Every module here imports ``transformers`` (the ``dev`` extra); nothing outside this package does, so the rest of
``regulargpt`` runs without it. This ``__init__`` imports none of them.
"""
