"""Loading a config: JSON files with ``extends`` chains, ``--set section.key=value`` overrides converted to the
field's type, strict type checks with did-you-mean hints, and the resolved config written back as JSON::

    load_config("configs/tiny/regular_gpt.json", ["model.chunk_size=4"])   # -> Config
    load_config("configs/formal/parity_check.json", kind=FormalConfig)      # -> FormalConfig
    load_config_dict(config_to_dict(cfg)) == cfg                            # a resolved config round-trips
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from regulargpt.config.run_configs import Config, FormalConfig
from regulargpt.config.sections import ConfigError
from regulargpt.files import atomic_write_text, read_json_object
from regulargpt.strict_json import DuplicateKeyError, loads_strict


# ----------------------------------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if typing.get_origin(tp) is dict:
        return "a JSON object"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Type-check one JSON value against a field type; returns the value converted (int -> float for float fields)."""
    origin = typing.get_origin(tp)
    ok: bool
    if origin is Literal:
        ok = value in typing.get_args(tp) and type(value) is type(typing.get_args(tp)[0])
    elif origin is list:
        if isinstance(value, list):
            return [_check_value(v, typing.get_args(tp)[0], f"{where}[{i}]") for i, v in enumerate(value)]
        ok = False
    elif origin is dict:
        ok = isinstance(value, dict)
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise ConfigError(f"{where}: {value!r} is not allowed; expected a finite number")
        if ok:
            return float(value)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"unsupported config field type {tp}")
    if not ok:
        raise ConfigError(f"{where}: {value!r} has the wrong type; expected {_type_name(tp)}")
    return value


def _did_you_mean(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else "allowed keys: " + ", ".join(sorted(allowed))


def build_section(cls: type, raw: Any, where: str) -> Any:
    """Dataclass `cls` from a JSON object, strictly: unknown keys (with a did-you-mean hint) and wrong types are
    ConfigErrors naming ``where.key``. Used for config sections and other JSON files (sweep profiles)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(f"{where}.{key}: unknown key; {_did_you_mean(key, names)}")
        kwargs[key] = _check_value(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


AnyConfig = TypeVar("AnyConfig", Config, FormalConfig)


def _sections(kind: type) -> dict[str, Any]:
    """Top-level key -> its type: a section dataclass, or ``dict[str, Any]`` for a pass-through object."""
    return typing.get_type_hints(kind)


def load_config_dict(raw: dict[str, Any], source: str = "<dict>", kind: type[AnyConfig] = Config) -> AnyConfig:
    """Build a validated `kind` (:class:`Config` or :class:`FormalConfig`) from an already-merged dict (no
    ``extends``); ConfigError naming `source` and the key for an unknown key, a wrong type or an impossible value."""
    try:
        if not isinstance(raw, dict):
            raise ConfigError(f"top level: expected a JSON object, got {type(raw).__name__}")
        types = _sections(kind)
        for key in raw:
            if key not in types:
                raise ConfigError(f"{key}: unknown section; {_did_you_mean(key, list(types))}")
        values: dict[str, Any] = {}
        for name, tp in types.items():
            if dataclasses.is_dataclass(tp):
                values[name] = build_section(tp, raw.get(name, {}), name)
            elif isinstance(raw.get(name, {}), dict):
                values[name] = dict(raw.get(name, {}))
            else:
                raise ConfigError(f"{name}: expected a JSON object, got {raw[name]!r}")
        return kind(**values)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON config object from `path` (:func:`regulargpt.files.read_json_object`); ConfigError naming the file
    (and line and column when it is malformed)."""
    return read_json_object(path, ConfigError, kind="config file")


def merge_dicts(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `over` wins. Lists and scalars are replaced, objects merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge_dicts(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _load_raw(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"{path}: 'extends' cycle: " + " -> ".join(str(p) for p in chain + (path,)))
    raw = read_json(path)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: {parent!r} has the wrong type; expected a relative path string")
    return merge_dicts(_load_raw(path.parent / parent, chain + (path,)), raw)


def _parse_override_value(text: str, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    try:
        if origin is list:  # 64,128 or JSON's [64, 128]
            inner = typing.get_args(tp)[0]
            if text.strip().startswith("["):
                items = json.loads(text)
                if not isinstance(items, list):
                    raise ValueError
                return [_parse_override_value(str(t) if not isinstance(t, str) else t, inner, where) for t in items]
            return [_parse_override_value(t.strip(), inner, where) for t in text.split(",") if t.strip()]
        if origin is dict:
            return loads_strict(text)
        if tp is bool or (origin is Literal and isinstance(typing.get_args(tp)[0], bool)):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if tp is int or (origin is Literal and isinstance(typing.get_args(tp)[0], int)):
            return int(text)
        if tp is float:
            return float(text)
    except DuplicateKeyError as err:
        raise ConfigError(f"--set {where}={text}: {err}") from None
    except (ValueError, json.JSONDecodeError):
        raise ConfigError(f"--set {where}={text}: cannot convert {text!r} to {_type_name(tp)}") from None
    return text


def apply_overrides(raw: dict[str, Any], overrides: list[str], kind: type = Config) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw `kind` config dict, converting each value to its field's type.

    ``deepspeed.*`` keys take JSON values (``--set deepspeed.zero_optimization={"stage":2}``) or plain strings.
    """
    out = json.loads(json.dumps(raw))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. model.chunk_size=4")
        path, text = item.split("=", 1)
        parts = path.strip().split(".")
        sections = {name: tp for name, tp in _sections(kind).items() if dataclasses.is_dataclass(tp)}
        if parts[0] in _sections(kind) and parts[0] not in sections and len(parts) >= 2:  # a pass-through object
            try:
                value: Any = loads_strict(text)
            except DuplicateKeyError as err:
                raise ConfigError(f"--set {item}: {err}") from None
            except json.JSONDecodeError:
                value = text
            node = out.setdefault(parts[0], {})
            for p in parts[1:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
            continue
        if len(parts) != 2 or parts[0] not in sections:
            hint = _did_you_mean(parts[0], list(sections)) if parts[0] not in sections else "use SECTION.KEY"
            raise ConfigError(f"--set {item}: {path!r} is not a SECTION.KEY path; {hint}")
        section, key = parts
        cls = sections[section]
        names = [f.name for f in dataclasses.fields(cls)]
        if key not in names:
            raise ConfigError(f"--set {item}: {section}.{key}: unknown key; {_did_you_mean(key, names)}")
        out.setdefault(section, {})[key] = _parse_override_value(text, typing.get_type_hints(cls)[key], path)
    return out


def load_config(path: str | Path, overrides: list[str] | None = None, kind: type[AnyConfig] = Config) -> AnyConfig:
    """Load a JSON config (following ``extends``), apply ``--set`` overrides, and validate it as `kind`.

    >>> cfg = load_config("configs/tiny/regular_gpt.json", ["model.chunk_size=4"])  # doctest: +SKIP
    >>> cfg = load_config("configs/formal/parity_check.json", kind=FormalConfig)  # doctest: +SKIP
    """
    path = Path(path)
    raw = _load_raw(path)
    try:
        raw = apply_overrides(raw, overrides or [], kind)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return load_config_dict(raw, str(path), kind)


def config_to_dict(cfg: Config | FormalConfig) -> dict[str, Any]:
    """The resolved config as plain JSON-able data (no ``extends``)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config | FormalConfig, path: str | Path) -> None:
    """Write the resolved config atomically (temporary file + rename)."""
    atomic_write_text(Path(path), json.dumps(config_to_dict(cfg), indent=2, sort_keys=True) + "\n")
