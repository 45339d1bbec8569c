"""Name -> object registries whose unknown-name errors list every valid name, and the plugins that add to them.

Plugins: an installed package that names a module under the entry-point group `obliviate.plugins` (in its
pyproject: `[project.entry-points."obliviate.plugins"] mine = "my_package.unlearning"`) has that module imported the
first time any registry is read; the module's `@forget_objective`, `@retain_term`, `@rule` and metric registrations
then stand beside the built-in ones everywhere (the CLI, `validate`, `ls`, sweeps). This is the convention pytest
and lm-evaluation-harness use for their plugins.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from obliviate.errors import ObliviateError

T = TypeVar("T")
PLUGIN_GROUP = "obliviate.plugins"
_plugins: list[str] | None = None  # the entry points loaded, once


def load_plugins() -> list[str]:
    """Import every module named under the entry-point group obliviate.plugins (once per process); the names of
    the entry points loaded. A plugin that fails to import is an ObliviateError naming it and its package."""
    global _plugins
    if _plugins is not None:
        return _plugins
    _plugins = []
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except Exception as exc:  # the plugin's own error, whatever it is, named with the plugin
            raise ObliviateError(f"obliviate plugin {ep.name!r} ({ep.value}, from package "
                                 f"{getattr(ep.dist, 'name', '?')}) failed to load: {type(exc).__name__}: {exc}; "
                                 "fix or uninstall that package") from None
        _plugins.append(ep.name)
    return _plugins


class UnknownNameError(ObliviateError, KeyError):
    """Raised for a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Registry(Generic[T]):
    """A named collection (objectives, retain terms, rules, benchmarks). Names are lowercase."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the object under `name` (lowercase, unique)."""
        if name != name.lower():
            raise ValueError(f"{self.kind} names are lowercase, got {name!r}")

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> T:
        """Register `obj` under `name` without a decorator."""
        return self.register(name)(obj)

    def get(self, name: str) -> T:
        """The object registered as `name`; an UnknownNameError listing valid names otherwise."""
        load_plugins()
        key = str(name).lower()
        if key not in self._items:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            )
        return self._items[key]

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        load_plugins()
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
