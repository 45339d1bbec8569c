"""Gradient rules: combine the forget gradient g_f and the retain gradient g_r into one update (SAGO and its
baselines; docs/METHODS.md §2). The package face only: `rules.py` (RuleSpec, the registry RULES, each rule and its
traits, RuleState), `combine.py` (combine, combine_into and the gradient-geometry statistics), `tensors.py` (the
list arithmetic they share)."""
from __future__ import annotations

from obliviate.gradients.combine import (
    SUMS,
    combine,
    combine_into,
    per_module_stats,
    reduce_sums,
    stat_sums,
    stats,
    stats_from_sums,
)
from obliviate.gradients.rules import (
    EPS,
    GRU_GAMMA,
    GRU_MOMENTUM,
    LOOP_ARGS,
    RULES,
    RuleSpec,
    RuleState,
    pcgrad_coefs,
    rule,
    spec_of,
)
from obliviate.gradients.tensors import Grads, Pair, Reducer

__all__ = ["EPS", "GRU_GAMMA", "GRU_MOMENTUM", "Grads", "LOOP_ARGS", "Pair", "RULES", "Reducer", "RuleSpec", "RuleState",
           "SUMS", "combine", "combine_into", "pcgrad_coefs", "per_module_stats", "reduce_sums", "rule", "spec_of",
           "stat_sums", "stats", "stats_from_sums"]
