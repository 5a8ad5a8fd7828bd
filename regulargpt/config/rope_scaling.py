"""RoPE scaling at inference (``model.rope_scaling``, ``--rope-scaling JSON``): the Hugging Face ``rope_scaling``
object, checked and normalised. The frequencies it gives are in :mod:`regulargpt.model.rotary`.

Accepted (the keys of transformers' ``rope_scaling`` for these types, plus our fixed NTK-aware type ``ntk``)::

    {"rope_type": "linear",  "factor": 4}                                          position interpolation
    {"rope_type": "ntk",     "factor": 4}                                          NTK-aware, fixed base
    {"rope_type": "dynamic", "factor": 4, "original_max_position_embeddings": 512} dynamic NTK
    {"rope_type": "yarn",    "factor": 4, "original_max_position_embeddings": 512,
     "beta_fast": 32, "beta_slow": 1, "attention_factor": null, "mscale": null, "mscale_all_dim": null,
     "truncate": true}                                                             YaRN (optional keys: HF's defaults)

``factor`` >= 1 is required; ``original_max_position_embeddings`` (the training length) is required where the type
reads it (dynamic, yarn) and accepted (recorded, unused) by linear and ntk. An empty object means no scaling.

>>> check_rope_scaling({"rope_type": "linear", "factor": 2})
{'rope_type': 'linear', 'factor': 2.0}
>>> describe_rope_scaling({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
'yarn×4 from 64'
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["ROPE_TYPES", "check_rope_scaling", "describe_rope_scaling", "rope_scaling_key"]

_YARN_OPTIONAL = {"beta_fast": float, "beta_slow": float, "attention_factor": float, "mscale": float,
                  "mscale_all_dim": float, "truncate": bool}
ROPE_TYPES: dict[str, dict[str, type]] = {  # rope_type → the keys it accepts besides rope_type and factor
    "linear": {"original_max_position_embeddings": int},  # recorded, not read
    "ntk": {"original_max_position_embeddings": int},
    "dynamic": {"original_max_position_embeddings": int},
    "yarn": {"original_max_position_embeddings": int, **_YARN_OPTIONAL},
}
_REQUIRED = {"dynamic": ("original_max_position_embeddings",), "yarn": ("original_max_position_embeddings",)}


class RopeScalingError(ValueError):
    """A bad rope_scaling object; the message names the key, the value and what is accepted."""


def check_rope_scaling(raw: Any, where: str = "rope_scaling") -> dict[str, Any]:
    """The normalised scaling (numbers as float, counts as int, None values of optional keys dropped); {} for {}.
    RopeScalingError naming `where`, the key, the value and what is accepted."""
    if not isinstance(raw, dict):
        raise RopeScalingError(f"{where}: {raw!r} is not a JSON object; expected e.g. "
                               f'{{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 512}}')
    if not raw:
        return {}
    kind = raw.get("rope_type")
    if kind not in ROPE_TYPES:
        hint = " (rope_type, not the older key 'type')" if "type" in raw and kind is None else ""
        raise RopeScalingError(f"{where}.rope_type: {kind!r} is not accepted{hint}; expected one of "
                               f"{', '.join(map(repr, ROPE_TYPES))}")
    allowed = {"rope_type": str, "factor": float, **ROPE_TYPES[kind]}
    for key in raw:
        if key not in allowed:
            raise RopeScalingError(f"{where}.{key}: not a key of rope_type {kind!r}; accepted: "
                                   f"{', '.join(sorted(allowed))}")
    for key in ("factor", *_REQUIRED.get(kind, ())):
        if raw.get(key) is None:
            raise RopeScalingError(f"{where}.{key}: missing; rope_type {kind!r} needs "
                                   f"{' and '.join(('factor', *_REQUIRED.get(kind, ())))}")
    out: dict[str, Any] = {"rope_type": kind}
    for key, tp in allowed.items():
        value = raw.get(key)
        if key == "rope_type" or value is None:
            continue
        out[key] = _typed(value, tp, f"{where}.{key}")
    if out["factor"] < 1.0:
        raise RopeScalingError(f"{where}.factor: {raw['factor']!r} is not accepted; expected a number >= 1 "
                               f"(the ratio of the new context length to the trained one)")
    if out.get("original_max_position_embeddings", 1) < 1:
        raise RopeScalingError(f"{where}.original_max_position_embeddings: {raw['original_max_position_embeddings']!r}"
                               f" is not accepted; expected the training length, an integer >= 1")
    return out


def _typed(value: Any, tp: type, where: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise RopeScalingError(f"{where}: {value!r} is not accepted; expected true or false")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RopeScalingError(f"{where}: {value!r} is not accepted; expected a finite number")
    if tp is int:
        if value != int(value):
            raise RopeScalingError(f"{where}: {value!r} is not accepted; expected an integer")
        return int(value)
    if value <= 0:
        raise RopeScalingError(f"{where}: {value!r} is not accepted; expected a number > 0")
    return float(value)


def describe_rope_scaling(scaling: dict[str, Any]) -> str:
    """A short label: ``linear×4``, ``yarn×4 from 512``, plus any optional key that is set (``beta_fast=16``)."""
    if not scaling:
        return "none"
    text = f"{scaling['rope_type']}×{scaling['factor']:g}"
    if "original_max_position_embeddings" in scaling:
        text += f" from {scaling['original_max_position_embeddings']}"
    extra = [f"{k}={scaling[k]}" for k in _YARN_OPTIONAL if k in scaling]
    return " ".join([text, *extra])


def rope_scaling_key(scaling: dict[str, Any] | None) -> str | None:
    """The scaling as it keys result rows: its canonical JSON (sorted keys, no spaces), None for no scaling."""
    return json.dumps(scaling, sort_keys=True, separators=(",", ":")) if scaling else None
