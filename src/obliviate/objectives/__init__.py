"""Forget objectives and retain terms, registered by name (import this package to fill the registries)."""
from obliviate.objectives import forget, retain  # noqa: F401  (registration side effects)
from obliviate.objectives.base import FORGET, RETAIN, ObjectiveSpec, forget_objective, retain_term

__all__ = ["FORGET", "RETAIN", "ObjectiveSpec", "forget_objective", "retain_term"]
