"""The documents of a prepared split as text, for lm-evaluation-harness's ``regulargpt_test`` task
(``eval/lm_eval_tasks/regulargpt_test/``): no download, the data folder is the dataset.

A split is one token stream: every document's ids followed by the eos id (``data_prep/prepare.py``). Cut after each
eos and decoded, the pieces are the documents' texts again (the tokenizer round-trips exactly:
:mod:`regulargpt.data.tokenizer`); empty pieces are dropped. Example: ids ``[5, 6, eos, 7, eos]`` → two documents,
``decode([5, 6])`` and ``decode([7])``.

lm-eval scores each document with ``loglikelihood_rolling``: the sum of log p(token | the tokens before it), its
first token read after one prefix token (our export's tokenizer has no bos, so that is eos: what the training
stream holds before every document). :func:`process_results` turns that sum into the task's metrics, as
lm-eval's wikitext task does: word perplexity exp(−Σ ll / Σ words), words = ``len(re.split(r"\\s+", text))``;
byte perplexity exp(−Σ ll / Σ UTF-8 bytes); bits per byte −Σ ll / (Σ bytes · ln 2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from regulargpt.data import DataError, Tokenizer, open_split
from regulargpt.data.verify import DEFAULT_LEVEL
from regulargpt.errors import UserError

__all__ = ["LmEvalTaskError", "load_split", "process_results", "split_documents"]


class LmEvalTaskError(UserError, ValueError):
    """The task was asked for a data folder or split that cannot be read; the message says which and why."""


def split_documents(data_dir: str | Path, split: str = "test", verify: str = DEFAULT_LEVEL) -> list[str]:
    """The texts of the documents of `split` in the prepared folder `data_dir` (see the module docstring)."""
    try:
        tokens = open_split(data_dir, split, verify=verify)
        tok = Tokenizer.load(tokens.tokenizer_path)
    except DataError as err:
        raise LmEvalTaskError(str(err)) from None
    ids = np.asarray(tokens.tokens, dtype=np.int64)
    ends = np.flatnonzero(ids == tok.eos_id)  # each document's eos
    starts = np.concatenate([[0], ends + 1])
    stops = np.concatenate([ends, [len(ids)]])  # a last piece without eos is kept as it is
    return [tok.decode(ids[a:b]) for a, b in zip(starts, stops) if b > a]


def load_split(data: str | None = None, split: str = "test", **_: Any) -> Any:
    """lm-eval's ``custom_dataset``: ``--metadata '{"data": "DIR"}'`` (and optionally ``"split"``) → a
    ``datasets.DatasetDict`` whose ``test`` (the task's split, whichever split of DIR it holds) has one row ``{"text": …}`` per document of DIR's `split`. lm-eval passes
    every metadata key (its own ``version`` too): the others are ignored."""
    import datasets

    if not data:
        raise LmEvalTaskError("the regulargpt_test task needs the data folder: pass "
                              "--metadata '{\"data\": \"data/stdlib-2k\"}' (a folder made by data_prep/prepare.py)")
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": split_documents(data, split)})})


def process_results(doc: dict[str, str], results: list[float]) -> dict[str, tuple[float, int]]:
    """One document's loglikelihood → (ll, words) and (ll, bytes) for the word/byte perplexity and bits per byte
    aggregations (lm-eval's weighted perplexities)."""
    (loglikelihood,) = results
    text = doc["text"]
    words, size = len(re.split(r"\s+", text)), len(text.encode("utf-8"))
    return {"word_perplexity": (loglikelihood, words), "byte_perplexity": (loglikelihood, size),
            "bits_per_byte": (loglikelihood, size)}
