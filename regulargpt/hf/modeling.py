"""``AutoModelForCausalLM`` for every regulargpt language model: a thin ``PreTrainedModel`` around our own model.

:class:`RegularGPTForCausalLM` holds the network :func:`regulargpt.model.build_model` builds from the config's
``regulargpt`` section (``self.model``: a :class:`~regulargpt.model.RegularGPT` or
:class:`~regulargpt.model.TransformerLM`, its weights ``model.<our state-dict name>`` in ``model.safetensors``). It
adds the ``transformers`` calling convention and nothing to the network:

* ``forward(input_ids, labels=None)`` → ``CausalLMOutputWithPast`` with fp32 logits (B, T, V) equal to
  ``self.model(input_ids)``, and the shifted next-token loss when `labels` are given (-100 = ignored);
* ``use_cache`` (the config's default: on) outside autograd: the logits come from one of our cached decoders
  (:mod:`regulargpt.generation`) and ``outputs.cache`` (``outputs.past_key_values`` in transformers 5.17: whichever
  field ``CausalLMOutputWithPast`` has, :func:`cache_field`) is a :class:`~regulargpt.hf.cache.DecoderCache`, which
  ``generate`` hands back with the next token only: under ``depth_policy="train"`` a RegularGPT decodes in constant
  time and memory per token. ``past_key_values`` is accepted as the older name of ``cache``;
* ``attention_mask`` with padding on the right (a batch of unequal lengths; padded positions get meaningless logits)
  is scored without a cache. Left padding is refused: every sequence starts at position 0. A RegularGPT under
  ``depth_policy="adaptive"`` takes its depth from the length, so each row of a padded batch is run at its own length.

Choose RegularGPT's depth policy at load time (same weights)::

    model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, depth_policy="train")
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from regulargpt.generation import make_decoder
from regulargpt.hf.cache import DecoderCache


def cache_field(output_class: type = CausalLMOutputWithPast) -> str:
    """The field of `output_class` that carries the cache, read off its dataclass fields (not the version string):
    "cache" in transformers 5.25, "past_key_values" in 5.17 (and in an output class with neither, "cache")."""
    names = {field.name for field in dataclasses.fields(output_class)}
    return "past_key_values" if "past_key_values" in names and "cache" not in names else "cache"
from regulargpt.hf.configuration import RegularGPTConfig
from regulargpt.model import build_model

__all__ = ["RegularGPTForCausalLM", "right_padded_lengths"]


def right_padded_lengths(attention_mask: Tensor | None, length: int) -> list[int] | None:
    """Each row's number of real tokens when some rows are padded on the right; None when no position is padded.

    Example: [[1, 1, 1], [1, 1, 0]] → [3, 2]; [[0, 1, 1]] (left padding) → ValueError."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    real = attention_mask.bool()
    lengths = real.sum(dim=1)  # (B,)
    if not torch.equal(real, torch.arange(length, device=real.device)[None, :] < lengths[:, None]):
        raise ValueError("attention_mask: only padding on the right is supported (every sequence starts at "
                         "position 0 of our position signals and caches); pad on the right, or pass one sequence "
                         "at a time")
    return lengths.tolist()


class RegularGPTForCausalLM(PreTrainedModel, GenerationMixin):
    """A regulargpt language model (RegularGPT or a dense baseline) as a ``transformers`` causal LM."""

    config_class = RegularGPTConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _tied_weights_keys = {"model.head.proj.weight": "model.embed.table.weight"}  # only when tie_word_embeddings

    def __init__(self, config: RegularGPTConfig) -> None:
        super().__init__(config)
        self.model = build_model(config.model_config)  # initialises its own weights (regulargpt.model.layers)
        self._fresh_buffers: dict[str, Tensor] | None = None
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate must not make a DynamicCache: the first forward makes our DecoderCache

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed.table

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.head.proj

    def _init_weights(self, module: nn.Module) -> None:
        """Called by ``transformers`` for every module whose tensors did not come from ``model.safetensors``.

        The weights file holds every parameter and persistent buffer, so after ``from_pretrained`` these are the
        modules with non-persistent buffers (ALiBi slopes, RoPE frequencies: functions of the config, left empty by
        loading); they get the values a freshly built model has. Parameters are never touched: ``build_model``
        initialised them, or the weights file filled them."""
        own = [name for name, _ in module.named_buffers(recurse=False) if name in module._non_persistent_buffers_set]
        if not own:
            return
        if self._fresh_buffers is None:
            with torch.device("cpu"):
                fresh = build_model(self.config.model_config)
            self._fresh_buffers = {name: buffer for name, buffer in fresh.named_buffers()}
        prefix = next(name for name, m in self.model.named_modules() if m is module)
        with torch.no_grad():
            for name in own:
                buffer = getattr(module, name)
                buffer.copy_(self._fresh_buffers[f"{prefix}.{name}" if prefix else name].to(buffer.device))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, cache: DecoderCache | None = None,
                use_cache: bool | None = None, labels: Tensor | None = None, logits_to_keep: int = 0,
                inputs_embeds: Tensor | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast | tuple[Tensor, ...]:
        """input_ids (B, T) → logits (B, T, V) (the last `logits_to_keep` positions when > 0), the loss of `labels`
        (B, T), and the cache to continue from (see the module docstring)."""
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds: regulargpt models read token ids only; pass input_ids")
        cache = kwargs.pop("past_key_values", None) if cache is None else cache
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is not None:  # the mask covers the cached positions too (generate passes it so)
            if attention_mask is not None and not bool(attention_mask.all()):
                raise ValueError("attention_mask: a padded batch cannot continue from a cache; generate one prompt "
                                 "at a time, or prompts of equal length")
            logits = cache.extend(input_ids)
        else:
            lengths = right_padded_lengths(attention_mask, input_ids.shape[1])
            if use_cache and lengths is None and not torch.is_grad_enabled():
                cache = DecoderCache(make_decoder(self.model))
                logits = cache.prefill(input_ids, last_only=logits_to_keep == 1)
            else:
                logits = self._padded_logits(input_ids, lengths)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        out = CausalLMOutputWithPast(loss=loss, logits=logits.float(), **{cache_field(): cache})
        use_dict = self.config.return_dict if return_dict is None else return_dict
        return out if use_dict else out.to_tuple()

    def _padded_logits(self, input_ids: Tensor, lengths: list[int] | None) -> Tensor:
        """The model's forward over the whole batch; rows run alone at their own lengths when the model's depth
        depends on the length (RegularGPT, depth_policy adaptive) and the batch is padded."""
        cfg = self.model.config
        if lengths is None or not (cfg.architecture == "regular_gpt" and cfg.depth_policy == "adaptive"):
            return self.model(input_ids)
        logits = self.model(input_ids[:1, :1]).new_zeros(*input_ids.shape, cfg.vocab_size)  # (B, T, V)
        for row, n in enumerate(lengths):
            logits[row, :n] = self.model(input_ids[row:row + 1, :n])[0]
        return logits
