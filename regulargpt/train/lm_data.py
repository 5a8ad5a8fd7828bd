"""The language-model trainer's data: the train and val splits of a prepared token folder, checked against the
model before anything is built, and the fingerprint a checkpoint keeps of them.

    train_split, val_split, manifest = open_data(cfg)      # TrainError naming the folder and the fix otherwise
    data_fingerprint(manifest)  # {"tokenizer_sha256", "vocab_size", "train_tokens", "val_tokens"}: a resume
                                # with other data is refused (regulargpt.train.lm_checkpoint)
"""

from __future__ import annotations

import os
import sys
from typing import Any

from regulargpt.config import Config
from regulargpt.errors import TrainError

__all__ = ["data_fingerprint", "open_data"]


def data_fingerprint(manifest: dict[str, Any]) -> dict[str, Any]:
    return {"tokenizer_sha256": manifest["tokenizer"]["sha256"], "vocab_size": manifest["vocab_size"],
            "train_tokens": manifest["splits"]["train"]["tokens"], "val_tokens": manifest["splits"]["val"]["tokens"]}


def open_data(cfg: Config) -> tuple[Any, Any, dict[str, Any]]:
    """Train and val splits, checked against the manifest at level ``data.verify`` (regulargpt.data.verify); clear
    errors for a missing folder, a vocabulary or tokenizer mismatch, a damaged or truncated token file or a
    too-short split. A manifest without block checksums is noted once (by rank 0)."""
    from regulargpt.data import DataError, check_tokenizer, load_manifest, open_split

    if not cfg.data.path:
        raise TrainError("data.path is empty; prepare a folder with `python data_prep/prepare.py --source "
                         "python-stdlib --out data/stdlib` and pass --set data.path=data/stdlib")
    try:
        manifest = load_manifest(cfg.data.path, vocab_size=cfg.model.vocab_size)
    except DataError as err:
        raise TrainError(f"data.path={cfg.data.path!r}: {err}") from None
    if manifest["vocab_size"] != cfg.model.vocab_size:
        raise TrainError(f"model.vocab_size={cfg.model.vocab_size} does not match the data: "
                         f"{cfg.data.path}/manifest.json has vocab_size={manifest['vocab_size']}. "
                         f"Set --set model.vocab_size={manifest['vocab_size']} "
                         f"or prepare the data with --vocab-size {cfg.model.vocab_size}")
    check_tokenizer(cfg.data.path)
    splits = []
    for name in ("train", "val"):
        # the manifest's vocab_size was compared with the model's above
        split = open_split(cfg.data.path, name, verify=cfg.data.verify)
        if len(split) < cfg.data.seq_len + 1:
            raise TrainError(f"{cfg.data.path}: the {name} split has {len(split)} tokens, fewer than "
                             f"data.seq_len + 1 = {cfg.data.seq_len + 1}; prepare more data (--max-bytes) or lower "
                             f"data.seq_len")
        splits.append(split)
    if os.environ.get("RANK", "0") == "0":  # the launcher's rank (set for every launcher before this is called)
        for note in dict.fromkeys(split.note for split in splits if split.note):
            print(f"note: {note}", file=sys.stderr, flush=True)
    return splits[0], splits[1], manifest
