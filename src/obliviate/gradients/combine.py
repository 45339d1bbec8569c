"""Combining: `combine` / `combine_into` apply a rule (streamed into .grad for per-tensor rules) and measure the
geometry of g_f, g_r and the result (cosines, conflict share), over shards with one `reduce` call."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

import torch
from torch import Tensor

from obliviate.gradients.rules import RULES, RuleSpec, RuleState, spec_of
from obliviate.gradients.tensors import Grads, Reducer, align_pairs, conflict_masks_of, list_dot, side_of


def _cos(dot: float, sq_a: float, sq_b: float) -> float:
    """Cosine from float64 scalars; 0.0 when either norm is zero (no direction to compare)."""
    return 0.0 if sq_a <= 0.0 or sq_b <= 0.0 else dot / math.sqrt(sq_a * sq_b)


SUMS = ("ff", "rr", "gg", "fr", "gf", "gr", "n_conflict", "n_total")


def stat_sums(forget_grads: Grads, retain_grads: Grads, combined: Grads,
              masks: Optional[list[Optional[Tensor]]] = None) -> dict[str, float]:
    """The additive pieces of `stats` (inner products, conflict and coordinate counts), float64, of these
    tensors (of this shard: sum the dicts over shards with `reduce_sums`)."""
    if len(combined) != len(forget_grads):
        raise ValueError(f"combined has {len(combined)} gradients, inputs have {len(forget_grads)}")
    pairs = align_pairs(forget_grads, retain_grads)
    masks = masks if masks is not None else conflict_masks_of(pairs)
    fs, rs, gs = side_of(pairs, 0), side_of(pairs, 1), combined
    return {"ff": list_dot(fs, fs), "rr": list_dot(rs, rs), "gg": list_dot(gs, gs), "fr": list_dot(fs, rs), "gf": list_dot(gs, fs),
            "gr": list_dot(gs, rs), "n_conflict": float(sum(int(torch.count_nonzero(m)) for m in masks if m is not None)),
            "n_total": float(sum(p[0].numel() for p in pairs if p is not None))}


def reduce_sums(parts: list[dict[str, float]], reduce: Optional[Reducer]) -> list[dict[str, float]]:
    """`stat_sums` dicts summed over shards, all in ONE call of `reduce` (identity when None)."""
    if reduce is None or not parts:
        return parts
    flat = reduce(torch.tensor([[p[k] for k in SUMS] for p in parts], dtype=torch.float64).reshape(-1))
    rows = flat.reshape(len(parts), len(SUMS)).tolist()
    return [dict(zip(SUMS, row)) for row in rows]


def stats_from_sums(s: dict[str, float]) -> dict[str, float]:
    """cos_f_r, cos_g_f, cos_g_r (0.0 if a norm is 0) and conflict_share from `stat_sums` totals."""
    return {"cos_f_r": _cos(s["fr"], s["ff"], s["rr"]), "cos_g_f": _cos(s["gf"], s["gg"], s["ff"]),
            "cos_g_r": _cos(s["gr"], s["gg"], s["rr"]),
            "conflict_share": s["n_conflict"] / s["n_total"] if s["n_total"] else 0.0}


def stats(forget_grads: Grads, retain_grads: Grads, combined: Grads,
          masks: Optional[list[Optional[Tensor]]] = None) -> dict[str, float]:
    """Global cos_f_r, cos_g_f, cos_g_r (float64; 0.0 if a norm is 0) and conflict_share of coordinates."""
    return stats_from_sums(stat_sums(forget_grads, retain_grads, combined, masks))


def _check_names(names: list[str], *lists: Grads) -> None:
    """Raise ValueError unless `names` and every gradient list have the same length."""
    if any(len(x) != len(names) for x in lists):
        raise ValueError(f"per-module names ({len(names)}) and gradient lists "
                         f"({', '.join(str(len(x)) for x in lists)}) must have the same length")


def per_module_stats(names: list[str], forget_grads: Grads, retain_grads: Grads,
                     combined: Grads) -> dict[str, dict[str, float]]:
    """`stats` per parameter tensor, keyed by name; tensors with neither gradient are left out."""
    _check_names(names, forget_grads, retain_grads, combined)
    return {n: stats([f], [r], [g]) for n, f, r, g in zip(names, forget_grads, retain_grads, combined)
            if f is not None or r is not None}


def _rule_kw(spec: RuleSpec, reduce: Optional[Reducer]) -> dict[str, Any]:
    """`reduce=` for a rule that sums scalars over shards; an error for a rule that cannot on shards."""
    if reduce is None or spec.elementwise:
        return {}
    if spec.reduces:
        return {"reduce": reduce}
    able = [n for n in RULES.names() if RULES.get(n).elementwise or RULES.get(n).reduces]
    raise ValueError(f"gradient rule '{spec.name}' does not say how to sum its scalars over gradient shards; "
                     f"sharded training supports {', '.join(able)}")


def combine(rule: str | RuleSpec, forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
            state: Optional[RuleState] = None, per_module_names: Optional[list[str]] = None,
            reduce: Optional[Reducer] = None,
            params: Optional[Mapping[str, Any]] = None) -> tuple[Grads, dict[str, Any]]:
    """Apply the rule (its spec or registered name); return (combined grads, stats dict with "modules" when names
    are given).

    `reduce`: the lists are this rank's shards; dot products, norms and stats are summed over shards.
    `params`: the rule's own settings (`RuleSpec.resolve`: defaults filled, unknown keys a ValueError)."""
    spec = spec_of(rule)
    rule_kw = _rule_kw(spec, reduce) | spec.resolve(params)
    if per_module_names is not None:  # check before a stateful rule touches its state
        _check_names(per_module_names, forget_grads, retain_grads)
    masks = conflict_masks_of(align_pairs(forget_grads, retain_grads))  # computed once: SAGO's mask is stats' conflict count
    kw = {"masks": masks} if spec.conflict_masks else {}
    grads = spec.fn(forget_grads, retain_grads, alpha=alpha, gamma=gamma, state=state, **kw, **rule_kw)
    if reduce is None:
        out: dict[str, Any] = dict(stats(forget_grads, retain_grads, grads, masks))
        if per_module_names is not None:
            out["modules"] = per_module_stats(per_module_names, forget_grads, retain_grads, grads)
        return grads, out
    parts = [stat_sums(forget_grads, retain_grads, grads, masks)]
    present = []
    if per_module_names is not None:
        present = [i for i, (f, r) in enumerate(zip(forget_grads, retain_grads)) if f is not None or r is not None]
        parts += [stat_sums([forget_grads[i]], [retain_grads[i]], [grads[i]], [masks[i]]) for i in present]
    parts = reduce_sums(parts, reduce)
    out = dict(stats_from_sums(parts[0]))
    if per_module_names is not None:
        out["modules"] = {per_module_names[i]: stats_from_sums(p) for i, p in zip(present, parts[1:])}
    return grads, out


def combine_into(rule: str | RuleSpec, forget_grads: Grads, retain_grads: Grads, write: Callable[[int, Optional[Tensor]], None],
                 *, alpha: float, gamma: float, state: Optional[RuleState] = None,
                 per_module_names: Optional[list[str]] = None, reduce: Optional[Reducer] = None,
                 params: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """`combine`, streamed: output i goes to `write(i, g_i)` and inputs i are released (set to None).

    For per-tensor rules this bounds memory to the two input gradient sets plus ONE tensor (the
    loop writes g_i into .grad as it comes); global rules (pcgrad_global, blur, gru, gru_ema) need every
    output before any is written, so they hold one more full copy while combining. The lists are
    the caller's own buffers and are emptied. Returns the stats dict of `combine`. `reduce`: as `combine`
    (pcgrad then sums all its per-tensor scalars in one call before streaming). `params`: as `combine`.
    """
    spec = spec_of(rule)
    if not spec.per_tensor:
        grads, out = combine(spec, forget_grads, retain_grads, alpha=alpha, gamma=gamma, state=state,
                             per_module_names=per_module_names, reduce=reduce, params=params)
        for i, g in enumerate(grads):
            forget_grads[i] = retain_grads[i] = None
            write(i, g)
        return out
    if per_module_names is not None:
        _check_names(per_module_names, forget_grads, retain_grads)
    pairs = align_pairs(forget_grads, retain_grads)  # validate every pair before anything is written
    own = spec.resolve(params)
    coefs = spec.coefficients(pairs, reduce) if spec.coefficients else None  # whole-tensor scalars, one call
    totals = dict.fromkeys(SUMS, 0.0)
    parts: dict[str, dict[str, float]] = {}
    for i in range(len(forget_grads)):
        f, r = [forget_grads[i]], [retain_grads[i]]
        if f[0] is None and r[0] is None:
            write(i, None)
            continue
        masks = conflict_masks_of(align_pairs(f, r))
        kw: dict[str, Any] = {"masks": masks} if spec.conflict_masks else {}
        if coefs is not None:
            kw["coefs"] = [coefs[i]]
        g = spec.fn(f, r, alpha=alpha, gamma=gamma, state=state, **kw, **own)
        part = stat_sums(f, r, g, masks)
        totals = {k: totals[k] + part[k] for k in SUMS}
        if per_module_names is not None:
            parts[per_module_names[i]] = part
        forget_grads[i] = retain_grads[i] = None
        write(i, g[0])
    summed = reduce_sums([totals, *parts.values()], reduce)
    out: dict[str, Any] = dict(stats_from_sums(summed[0]))
    if per_module_names is not None:
        out["modules"] = {n: stats_from_sums(p) for n, p in zip(parts, summed[1:])}
    return out
