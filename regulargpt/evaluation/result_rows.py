"""Result rows of ``results.jsonl`` (:mod:`regulargpt.evaluation.length_sweep`, probe rows of
:mod:`regulargpt.evaluation.probe_sweep`): what identifies one (:func:`row_key`), the latest row per key, and the
display label of each variant. Shared by the writers (results_file) and the readers (lm_report, probe_report).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from regulargpt.config.rope_scaling import describe_rope_scaling
from regulargpt.files import read_jsonl

__all__ = ["ROW_KEY", "Row", "latest_rows", "load_rows", "row_key", "variant_id_of", "variant_labels"]

Row = dict[str, Any]
ROW_KEY = ("run", "depth_policy", "rope_scaling", "dataset", "split", "length", "protocol", "stride", "tokens",
           "probe")

# How a differing config key is written in a variant's label (keys not listed: the key without its section).
_SHORT_KEYS = {"model.depth_policy": "depth", "model.rope_scaling": "rope", "model.rel_bias_init": "r_init",
               "model.depth_scaled_init": "depth_init",
               "checkpoint_step": "step", "data.dataset": "data"}


def row_key(row: Row) -> tuple[Any, ...]:
    """What identifies a result: (run, evaluation-time depth policy, RoPE scaling, dataset, split, length, protocol,
    stride, tokens, probe). The depth policy is None for rows scored with the model's own, the scaling (its canonical
    JSON, :func:`regulargpt.config.rope_scaling.rope_scaling_key`) None for none; rows written before either existed
    too; probe is None for perplexity rows and "passkey" / "copy" for probe rows (probe_sweep)."""
    return tuple(row.get(k) for k in ROW_KEY)


def load_rows(path: str | Path) -> list[Row]:
    """The rows of a results file, read with :func:`regulargpt.files.read_jsonl` (a torn last line is dropped with a
    warning; any other bad line is an error naming file and line). FileNotFoundError if there is no file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no results file")
    return read_jsonl(path)


def latest_rows(rows: Sequence[Row]) -> list[Row]:
    """The last row per :func:`row_key`, in first-seen order, leaving out rows of replaced data: where rows of a
    (dataset, split) record the content they scored (``split_fingerprint``), only rows with the fingerprint of the
    last such row count; older ones, and rows without a fingerprint, scored a folder that has since been rebuilt."""
    current = {(row.get("dataset"), row.get("split")): row["split_fingerprint"] for row in rows
               if row.get("split_fingerprint") is not None}
    latest: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        mine = row.get("split_fingerprint")
        if mine == current.get((row.get("dataset"), row.get("split")), mine):
            latest[row_key(row)] = row
    return list(latest.values())


def variant_id_of(row: Row) -> str:
    """The row's variant id; rows written before variants existed fall back to their model name."""
    return row.get("variant") or row["model"]


def _short(key: str, value: Any) -> str:
    name = _SHORT_KEYS.get(key, key.split(".", 1)[-1])
    text = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    if key == "model.rope_scaling" and isinstance(value, dict):
        text = describe_rope_scaling(value)
    return f"{name}={text}"


def variant_labels(rows: Sequence[Row]) -> dict[str, str]:
    """variant id → display label: the model name, plus ``key=value`` for every config key whose value differs
    between the variants that share that name (in the order of the config).

    >>> rows = [{"model": "M", "variant": "a", "variant_config": {"model.pad": "learned", "train.lr": 1}},
    ...         {"model": "M", "variant": "b", "variant_config": {"model.pad": "mask", "train.lr": 1}}]
    >>> variant_labels(rows)
    {'a': 'M pad=learned', 'b': 'M pad=mask'}
    """
    by_name: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        by_name[row["model"]].setdefault(variant_id_of(row), row.get("variant_config") or {})
    labels = {}
    for name, variants in by_name.items():
        keys = list(dict.fromkeys(k for cfg in variants.values() for k in cfg))
        differing = [k for k in keys if len({json.dumps(cfg.get(k), sort_keys=True) for cfg in variants.values()}) > 1]
        for vid, cfg in variants.items():
            extra = " ".join(_short(k, cfg[k]) for k in differing if k in cfg)
            labels[vid] = f"{name} {extra}".strip()
    return labels
