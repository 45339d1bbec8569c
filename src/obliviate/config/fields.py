"""The building blocks of every config dataclass: a field with its help text, a nested section, and the one
check that names a key, its value and the rule it breaks."""
from __future__ import annotations

from dataclasses import field
from typing import Any

from obliviate.errors import ConfigError


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    """Raise a ConfigError naming the key, its value and the rule it breaks."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is impossible: it must be {rule}")


def setting(default: Any, help: str, **kw: Any) -> Any:
    """A config field with its default (lists and dicts copied per instance) and the help text `--help-config` prints."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def section(default: Any, help: str) -> Any:
    """A nested config section whose defaults differ from its class's (e.g. a fine-tuning TrainConfig)."""
    return field(default_factory=lambda: default, metadata={"help": help})


def need(value: Any, key: str, example: str) -> Any:
    """`value`, or a ConfigError saying how to set `key` when it is empty."""
    if not value:
        raise ConfigError(f"{key} is not set; add {key}={example} (on the command line or in the YAML)")
    return value
