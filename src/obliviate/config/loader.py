"""YAML and `a.b=v` overrides -> a config dataclass: types checked against the annotations, unknown keys and
wrong types ConfigErrors naming the key; the reverse (to_dict) and the key listing (describe)."""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from obliviate.errors import ConfigError
from obliviate.strict_yaml import safe_load


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _check_type(value: Any, tp: Any, key: str) -> Any:
    """Coerce/validate one scalar value against a simple annotation; raise ConfigError otherwise."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} is not a valid {tp}")
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool, dict, list) and isinstance(value, tp):
        return value
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"{key}: expected {name}, got {type(value).__name__} {value!r}")


def _nested_default(f: dataclasses.Field, tp: type) -> Any:
    """The default instance of a nested config section (its factory's, else the class defaults)."""
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default if isinstance(f.default, tp) else tp()


def build(cls: type, raw: Mapping[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a nested mapping; unknown keys are errors listing the valid ones."""
    raw = dict(raw or {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"unknown key(s) {[prefix + k for k in unknown]}; valid keys under "
                          f"{prefix.rstrip('.') or 'the top level'}: {names}")
    kwargs = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in names:
        key, tp = prefix + name, hints[name]
        if _is_dataclass_type(tp):
            sub = raw.get(name) or {}
            if not isinstance(sub, dict):
                raise ConfigError(f"{key}: expected a mapping of keys, got {type(sub).__name__} {sub!r}")
            base = _nested_default(fields[name], tp)
            kwargs[name] = build(tp, {**dataclasses.asdict(base), **sub}, key + ".")
        elif name in raw:
            kwargs[name] = _check_type(raw[name], tp, key)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=v' -> (['a', 'b'], v) with v parsed as YAML (so 3 is int, [0] a list, null None)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value (e.g. train.lr=1e-5)")
    key, val = text.split("=", 1)
    try:
        parsed = safe_load(val, f"override {text!r}") if val.strip() else ""
    except yaml.YAMLError:
        parsed = val
    return key.strip().split("."), parsed


def apply_overrides(raw: dict, overrides: Sequence[str]) -> dict:
    """Apply `a.b=v` overrides to a nested dict (copy), creating sub-mappings as needed."""
    out = copy.deepcopy(raw) if raw else {}  # (a YAML round trip would sort mapping keys, e.g. the methods)
    for text in overrides:
        path, val = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
        node[path[-1]] = val
    return out


def read_yaml(path: str | Path) -> dict:
    """A YAML mapping from a file, with clear errors for a missing file or bad syntax."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}" + (" (it is a directory)" if p.is_dir() else ""))
    try:
        data = safe_load(p.read_text(encoding="utf-8"), str(p))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {' '.join(str(exc).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections (model, data, method, ...)")
    return data


def load_config(cls: type, path: str | Path | None, overrides: Sequence[str] = ()) -> Any:
    """Config of type `cls` from a YAML file (optional) plus `a.b=v` overrides.

    The YAML is resolved against the defaults first, and overrides edit that complete config, so
    `methods.ASU_KL.forget_args={tau: 8}` changes one entry of a mapping and keeps the rest.
    """
    cfg = build(cls, read_yaml(path) if path else {})
    return build(cls, apply_overrides(to_dict(cfg), overrides)) if overrides else cfg


def to_dict(cfg: Any) -> dict:
    """A plain nested dict of a config (for the resolved config written beside a run)."""
    return dataclasses.asdict(cfg)


def describe(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(key, default, help) for every leaf field of a config class, for `--help-config`."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if _is_dataclass_type(hints[f.name]):
            rows += describe(hints[f.name], prefix + f.name + ".")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            rows.append((prefix + f.name, default, f.metadata.get("help", "")))
    return rows
