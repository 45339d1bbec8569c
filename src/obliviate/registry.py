"""Name -> object registries whose unknown-name errors list every valid name."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from obliviate.errors import ObliviateError

T = TypeVar("T")


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
        key = str(name).lower()
        if key not in self._items:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            )
        return self._items[key]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
