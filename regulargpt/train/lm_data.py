"""The language-model trainer's data: the train and val splits of a prepared token folder (``data.path``) or of each
folder of a mixture (``data.paths``), checked against the model before anything is built, the samplers that read
them, and the fingerprint a checkpoint keeps of them.

    train_split, val_split, manifest = open_data(cfg)      # one folder; TrainError naming the folder and the fix
    corpora = open_corpora(cfg)                            # [Corpus] for data.path or data.paths, each checked so
    sampler = train_sampler(corpora, cfg, rank, world)     # WindowSampler (one folder) or MixtureSampler
    data_fingerprint(corpora)   # one folder: {"tokenizer_sha256", "vocab_size", "train_tokens", "val_tokens"};
                                # a mixture adds per corpus its weight and split fingerprints: a resume with other
                                # data is refused (check_same_data, regulargpt.train.lm_checkpoint)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regulargpt.config import Config
from regulargpt.data import TokenSplit, WindowSampler
from regulargpt.data.mixture import MixtureSampler, normalise_weights
from regulargpt.errors import TrainError

__all__ = ["Corpus", "check_same_data", "data_fingerprint", "mixture_record", "open_corpora", "open_data",
           "train_sampler", "val_samplers"]


@dataclass(frozen=True)
class Corpus:
    """One training folder: its path, name (the folder's name: metrics and evaluation rows use it), normalised
    mixture weight (1.0 for a single folder), splits and manifest."""

    path: str
    weight: float
    train: TokenSplit
    val: TokenSplit
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return Path(self.path).name


def _open_folder(path: str, cfg: Config) -> tuple[TokenSplit, TokenSplit, dict[str, Any]]:
    """One folder's train and val splits, checked at level ``data.verify``; TrainError or DataError naming it."""
    from regulargpt.data import DataError, check_tokenizer, load_manifest, open_split

    key = "data.path" if cfg.data.path else "data.paths"
    try:
        manifest = load_manifest(path, vocab_size=cfg.model.vocab_size)
    except DataError as err:
        raise TrainError(f"{key}={path!r}: {err}") from None
    if manifest["vocab_size"] != cfg.model.vocab_size:
        raise TrainError(f"model.vocab_size={cfg.model.vocab_size} does not match the data: "
                         f"{path}/manifest.json has vocab_size={manifest['vocab_size']}. "
                         f"Set --set model.vocab_size={manifest['vocab_size']} "
                         f"or prepare the data with --vocab-size {cfg.model.vocab_size}")
    check_tokenizer(path)
    splits = []
    for name in ("train", "val"):
        # the manifest's vocab_size was compared with the model's above
        split = open_split(path, name, verify=cfg.data.verify)
        if len(split) < cfg.data.seq_len + 1:
            raise TrainError(f"{path}: the {name} split has {len(split)} tokens, fewer than "
                             f"data.seq_len + 1 = {cfg.data.seq_len + 1}; prepare more data (--max-bytes) or lower "
                             f"data.seq_len")
        splits.append(split)
    return splits[0], splits[1], manifest


def _note(splits: list[TokenSplit]) -> None:
    """Print each distinct note of `splits` (a manifest without block checksums) once, on rank 0."""
    if os.environ.get("RANK", "0") == "0":  # the launcher's rank (set for every launcher before this is called)
        for note in dict.fromkeys(split.note for split in splits if split.note):
            print(f"note: {note}", file=sys.stderr, flush=True)


def open_data(cfg: Config) -> tuple[Any, Any, dict[str, Any]]:
    """Train and val splits of ``data.path``, checked against the manifest at level ``data.verify``
    (regulargpt.data.verify); clear errors for a missing folder, a vocabulary or tokenizer mismatch, a damaged or
    truncated token file or a too-short split. A manifest without block checksums is noted once (by rank 0)."""
    if not cfg.data.path:
        raise TrainError("data.path is empty; prepare a folder with `python data_prep/prepare.py --source "
                         "python-stdlib --out data/stdlib` and pass --set data.path=data/stdlib (or a mixture: "
                         "--set data.paths=A,B, docs/MIXTURES.md)")
    train, val, manifest = _open_folder(cfg.data.path, cfg)
    _note([train, val])
    return train, val, manifest


def open_corpora(cfg: Config) -> list[Corpus]:
    """Every training folder (``data.path``, or each of ``data.paths``) opened and checked as :func:`open_data`
    checks one; a mixture's folders must share the tokenizer (sha256) and vocabulary, and its weights are
    normalised (:func:`regulargpt.data.mixture.normalise_weights`: by train tokens when ``data.weights`` is [])."""
    if not cfg.data.paths:
        train, val, manifest = open_data(cfg)
        return [Corpus(cfg.data.path, 1.0, train, val, manifest)]
    opened = [(path, *_open_folder(path, cfg)) for path in cfg.data.paths]
    first, _, _, reference = opened[0]
    for path, _, _, manifest in opened[1:]:
        for what, get in (("tokenizer sha256", lambda m: m["tokenizer"]["sha256"]),
                          ("vocab_size", lambda m: m["vocab_size"])):
            if get(manifest) != get(reference):
                raise TrainError(f"data.paths: {path} has {what} {str(get(manifest))[:12]} but {first} has "
                                 f"{str(get(reference))[:12]}; a mixture's folders share one tokenizer: prepare "
                                 f"{path} with `python data_prep/prepare.py --tokenizer "
                                 f"{Path(first) / reference['tokenizer']['file']} …`")
    weights = normalise_weights(cfg.data.weights, [len(train) for _, train, _, _ in opened])
    _note([split for _, train, val, _ in opened for split in (train, val)])
    return [Corpus(path, w, train, val, manifest) for (path, train, val, manifest), w in zip(opened, weights)]


def train_sampler(corpora: list[Corpus], cfg: Config, rank: int, world: int) -> WindowSampler | MixtureSampler:
    """The training batches: one folder's :class:`WindowSampler` (the windows every single-folder run has drawn),
    or a :class:`MixtureSampler` over the corpora's train splits with their weights."""
    t = cfg.train
    if len(corpora) == 1:
        return WindowSampler(corpora[0].train, cfg.data.seq_len, t.batch_size, t.seed, rank, world,
                             vocab_size=cfg.model.vocab_size)
    return MixtureSampler([c.train for c in corpora], [c.weight for c in corpora], cfg.data.seq_len, t.batch_size,
                          t.seed, rank, world, vocab_size=cfg.model.vocab_size)


def val_samplers(corpora: list[Corpus], cfg: Config, rank: int, world: int) -> list[WindowSampler]:
    """One validation sampler per corpus, over its val split with the run's seed (fixed windows every time)."""
    t = cfg.train
    return [WindowSampler(c.val, cfg.data.seq_len, t.batch_size, t.seed, rank, world, vocab_size=cfg.model.vocab_size)
            for c in corpora]


def data_fingerprint(corpora: list[Corpus]) -> dict[str, Any]:
    """What a checkpoint keeps of its data, compared on resume (paths are not: folders may move). One folder:
    {"tokenizer_sha256", "vocab_size", "train_tokens", "val_tokens"}; a mixture adds "corpora": per corpus its
    weight and the train and val split fingerprints (the manifest's sha256 and token count)."""
    m = corpora[0].manifest
    out: dict[str, Any] = {"tokenizer_sha256": m["tokenizer"]["sha256"], "vocab_size": m["vocab_size"],
                           "train_tokens": sum(c.manifest["splits"]["train"]["tokens"] for c in corpora),
                           "val_tokens": sum(c.manifest["splits"]["val"]["tokens"] for c in corpora)}
    if len(corpora) > 1:
        out["corpora"] = [{"weight": c.weight, "train": c.train.fingerprint, "val": c.val.fingerprint}
                          for c in corpora]
    return out


def mixture_record(corpora: list[Corpus]) -> list[dict[str, Any]]:
    """The mixture as the run folder records it (``mixture.json``): per corpus its name, path, weight, train
    tokens, tokenizer sha256 and split fingerprints."""
    return [{"name": c.name, "path": c.path, "weight": c.weight, "train_tokens": len(c.train),
             "tokenizer_sha256": c.manifest["tokenizer"]["sha256"], "train": c.train.fingerprint,
             "val": c.val.fingerprint} for c in corpora]


def check_same_data(run_dir: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """TrainError naming what differs unless a checkpoint's :func:`data_fingerprint` equals this run's, e.g.
    ``corpora[1].weight: checkpoint 0.25, now 0.5``."""
    if saved == now:
        return
    before, after = _flatten(saved), _flatten(now)
    diffs = "; ".join(f"{k}: checkpoint {_short(before.get(k))}, now {_short(after.get(k))}"
                      for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k))
    raise TrainError(f"{run_dir}: the data differs from the checkpoint's ({diffs}); resume with the same data "
                     f"folders{' and weights' if 'corpora' in saved or 'corpora' in now else ''}")


def _short(value: Any) -> str:
    """A value in a message: a sha256 by its first 12 hex digits ("297b4762b323…"), anything else by repr."""
    return f"{value[:12]}…" if isinstance(value, str) and len(value) == 64 else repr(value)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"corpora": [{"weight": 0.5}]} → {"corpora[0].weight": 0.5}."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items()
                for k, v in _flatten(item, f"{prefix}.{key}" if prefix else str(key)).items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flatten(item, f"{prefix}[{i}]").items()}
    return {prefix: value}
