"""Gradient rules: combine the forget gradient g_f and the retain gradient g_r into one update.

SAGO and its baselines (Xiao et al., ACL 2026, arXiv 2604.14808; docs/METHODS.md §2). γ weighs the
forget task, α the retain task. Every rule takes two equal-length lists of per-parameter tensors
(None = no gradient for that parameter) and returns new tensors; inputs are never modified.
Elementwise arithmetic runs in the gradient's precision (half types upcast to float32) and results
are cast back to the gradient's dtype; inner products use BLAS per tensor and are summed across
tensors in float64 (gru's projection is computed entirely in float64, as docs/METHODS.md §2.2 asks). This
keeps a step's synthesis a small fraction of a backward pass (benchmarks/sago_overhead.py).

Sharding (FSDP/ZeRO): `sum`, `sago` and `sago_retain` are elementwise, so they are exact on a
shard of the gradients. `pcgrad` needs a dot product over each whole parameter tensor, and `pcgrad_global`,
`blur`, `gru` and `gru_ema` need global dot products and norms. On shards, pass `reduce`: a function
taking a CPU float64 vector of this rank's partial sums and returning their sums over all shards
(train/fsdp.py all-reduces it); each rule calls it once per step, the statistics once more. Without
it (None) the lists are taken to be whole tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
from torch import Tensor

from obliviate.registry import Registry

EPS = 1e-10  # added to squared norms in every projection (docs/METHODS.md §2.2), except gru's (its authors add none)
GRU_MOMENTUM = 0.8  # gru_ema: ema <- 0.8·ema + 0.2·g_r
GRU_GAMMA = 0.8  # gru's default gru_gamma (authors' gamma_gru): ema <- 0.8·g_r + 0.2·ema, from ema = 0

Grads = list[Optional[Tensor]]
Pair = Optional[tuple[Tensor, Tensor]]  # (g_f, g_r), or None when both are absent
Reducer = Callable[[Tensor], Tensor]  # partial sums [K] float64 (CPU) of this shard -> sums over all shards


@dataclass
class RuleState:
    """Per-run state of the stateful rules (the gru / gru_ema EMA of g_r); part of the checkpoint."""

    ema: Optional[list[Optional[Tensor]]] = None  # one entry per parameter, None until first seen
    step: int = 0  # number of gru updates applied

    def state_dict(self) -> dict[str, Any]:
        """Tensors, ints and None only, so `torch.load(weights_only=True)` reads it back."""
        ema = None if self.ema is None else [None if t is None else t.detach().clone() for t in self.ema]
        return {"step": int(self.step), "ema": ema}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore from `state_dict()` output; unknown or missing keys are errors."""
        if set(sd) != {"step", "ema"}:
            raise ValueError(f"RuleState state_dict needs keys ['ema', 'step'], got {sorted(sd)}")
        ema = sd["ema"]
        self.ema = None if ema is None else [None if t is None else t.detach().clone() for t in ema]
        self.step = int(sd["step"])


RuleFn = Callable[..., Grads]


@dataclass(frozen=True)
class RuleSpec:
    """A registered gradient rule and its traits: the one place that decides what a rule needs.

    elementwise: output coordinate j depends on coordinate j of g_f and g_r only (exact on any shard; receives the
    conflict masks); per_tensor: output i depends on input tensor i only (streamed one tensor at a time);
    reduces: sums dot products or norms over shards through `reduce`; separate: combines separately computed forget
    and retain gradients (False only for `sum`, which a fused backward computes exactly); coefficients: the
    whole-tensor scalars a per-tensor rule needs before streaming (pcgrad), summed over shards in one call;
    conflict_masks: takes the conflict masks c = (g_f ⊙ g_r < 0), computed once per step for it and the stats;
    params: names of the rule's own settings (keyword arguments with defaults, e.g. gru's gru_gamma), which
    `combine` takes from its `params` mapping."""

    name: str
    fn: RuleFn
    elementwise: bool = False
    per_tensor: bool = False
    reduces: bool = False
    separate: bool = True
    coefficients: Optional[Callable[..., list[float]]] = None
    conflict_masks: bool = False
    params: tuple[str, ...] = ()

    def __call__(self, *args: Any, **kw: Any) -> Grads:
        return self.fn(*args, **kw)


RULES: Registry[RuleSpec] = Registry("gradient rule")


def rule(name: str, **traits: Any) -> Callable[[RuleFn], RuleFn]:
    """Decorator: register `fn` as gradient rule `name` with its traits (see RuleSpec)."""
    def deco(fn: RuleFn) -> RuleFn:
        RULES.add(name, RuleSpec(name, fn, **traits))
        return fn
    return deco
PairFn = Callable[[int, Tensor, Tensor], Tensor]  # (index, g_f, g_r) in float64 -> g in float64


def _align(forget_grads: Grads, retain_grads: Grads) -> list[Pair]:
    """Validate the lists and pair them; a missing side becomes zeros of the other's shape."""
    if len(forget_grads) != len(retain_grads):
        raise ValueError(
            f"forget and retain gradient lists differ in length: {len(forget_grads)} vs {len(retain_grads)}"
        )
    pairs: list[Pair] = []
    for i, (f, r) in enumerate(zip(forget_grads, retain_grads)):
        if f is not None and r is not None and f.shape != r.shape:
            raise ValueError(
                f"gradient {i}: forget shape {tuple(f.shape)} != retain shape {tuple(r.shape)}"
            )
        if f is None and r is None:
            pairs.append(None)
        else:
            pairs.append((f if f is not None else torch.zeros_like(r),
                          r if r is not None else torch.zeros_like(f)))
    return pairs


def _work(t: Tensor) -> Tensor:
    """The tensor in a working precision: float32/float64 as they are, half types upcast to float32."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _map(pairs: list[Pair], fn: PairFn) -> Grads:
    """Apply fn per tensor in working precision (one tensor at a time); cast to g_f's dtype."""
    return [None if p is None else fn(i, _work(p[0]), _work(p[1])).to(p[0].dtype)
            for i, p in enumerate(pairs)]


def _tdot(x: Tensor, y: Tensor) -> Tensor:
    """⟨x, y⟩ of two same-shape tensors as a float64 scalar (BLAS dot in working precision)."""
    x, y = _work(x).reshape(-1), _work(y).reshape(-1)
    if x.dtype != y.dtype:
        x, y = x.double(), y.double()
    return torch.dot(x, y).double()


def _total(values: list[Tensor]) -> float:
    """Sum float64 scalars living on any devices with one host sync per device."""
    per_device: dict[torch.device, Tensor] = {}
    for v in values:
        per_device[v.device] = per_device.get(v.device, 0) + v
    return float(sum(float(v) for v in per_device.values()))


def _dot(xs: list[Optional[Tensor]], ys: list[Optional[Tensor]]) -> float:
    """Σ_i ⟨x_i, y_i⟩ over entries present in both lists, accumulated in float64."""
    return _total([_tdot(x, y) for x, y in zip(xs, ys) if x is not None and y is not None])


def _dots(products: list[tuple[list[Optional[Tensor]], list[Optional[Tensor]]]],
          reduce: Optional[Reducer] = None) -> list[float]:
    """Several `_dot`s, completed over shards with ONE call of `reduce` (when given)."""
    vals = [_dot(xs, ys) for xs, ys in products]
    if reduce is None:
        return vals
    return reduce(torch.tensor(vals, dtype=torch.float64)).tolist()


def _side(pairs: list[Pair], i: int) -> list[Optional[Tensor]]:
    return [None if p is None else p[i] for p in pairs]


def _conflict(f: Tensor, r: Tensor) -> Tensor:
    """Elementwise conflict mask c = (g_f ⊙ g_r < 0); [*shape] bool; zeros never conflict.

    Signs, not the product: a product of two tiny gradients would underflow to 0 and hide a conflict.
    """
    return ((f > 0) & (r < 0)) | ((f < 0) & (r > 0))


def _masks(pairs: list[Pair]) -> list[Optional[Tensor]]:
    """Conflict masks of every pair (None where both gradients are absent)."""
    return [None if p is None else _conflict(*p) for p in pairs]


@rule("sum", elementwise=True, per_tensor=True, separate=False)
def rule_sum(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
             state: Optional[RuleState] = None) -> Grads:
    """g = γ·g_f + α·g_r; lists of [*shape_i] tensors."""
    return _map(_align(forget_grads, retain_grads), lambda _, f, r: gamma * f + alpha * r)


def _select(mask: Tensor, r: Tensor, f: Tensor, alpha: float, gamma: float) -> Tensor:
    """where(mask, α·r, γ·f) with as few full-size temporaries as the weights allow."""
    if alpha == gamma:
        out = torch.where(mask, r, f)
        return out if alpha == 1.0 else out.mul_(alpha)
    if gamma != 0.0 and 1e-6 <= abs(alpha / gamma) <= 1e6:  # rescaling is exact enough in this range
        return torch.where(mask, r * (alpha / gamma), f).mul_(gamma)
    return torch.where(mask, r * alpha, f * gamma)


@rule("sago", elementwise=True, per_tensor=True, conflict_masks=True)
def rule_sago(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
              state: Optional[RuleState] = None, masks: Optional[list[Optional[Tensor]]] = None) -> Grads:
    """SAGO: g = α·g_r ⊙ c + γ·g_f ⊙ (1−c), c = (g_f ⊙ g_r < 0); elementwise, shard-local."""
    pairs = _align(forget_grads, retain_grads)
    masks = masks if masks is not None else _masks(pairs)
    return _map(pairs, lambda i, f, r: _select(masks[i], r, f, alpha, gamma))


@rule("sago_retain", elementwise=True, per_tensor=True, conflict_masks=True)
def rule_sago_retain(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
                     state: Optional[RuleState] = None, masks: Optional[list[Optional[Tensor]]] = None) -> Grads:
    """SAGO "prefer retain": g = α·g_r + γ·g_f ⊙ (1−c); elementwise, shard-local."""
    pairs = _align(forget_grads, retain_grads)
    masks = masks if masks is not None else _masks(pairs)
    return _map(pairs, lambda i, f, r: alpha * r + gamma * f.masked_fill(masks[i], 0.0))


def pcgrad_coefs(pairs: list[Pair], reduce: Optional[Reducer] = None) -> list[float]:
    """Per tensor: ⟨g_f,g_r⟩/(‖g_r‖²+ε) when ⟨g_f,g_r⟩ < 0, else 0 (sums over shards with ONE `reduce` call)."""
    part = torch.zeros(2 * len(pairs), dtype=torch.float64)
    for i, p in enumerate(pairs):
        if p is not None:
            f, r = _work(p[0]), _work(p[1])
            part[2 * i], part[2 * i + 1] = float(torch.sum(f * r)), float(torch.sum(r * r))
    sums = (reduce(part) if reduce is not None else part).tolist()
    return [d / (rr + EPS) if d < 0 else 0.0 for d, rr in zip(sums[0::2], sums[1::2])]


def _pcgrad_tensor(f: Tensor, r: Tensor, coef: float, alpha: float, gamma: float) -> Tensor:
    """One tensor: g_f ← g_f − coef·g_r (coef from `pcgrad_coefs`, 0 without conflict); g = γ·g_f + α·g_r."""
    if coef != 0.0:
        f = f - coef * r
    return gamma * f + alpha * r


@rule("pcgrad", per_tensor=True, reduces=True, coefficients=pcgrad_coefs)
def rule_pcgrad(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
                state: Optional[RuleState] = None, reduce: Optional[Reducer] = None,
                coefs: Optional[list[float]] = None) -> Grads:
    """PCGrad per parameter tensor (module-wise): if ⟨g_f,g_r⟩ < 0 over the WHOLE tensor,
    g_f ← g_f − ⟨g_f,g_r⟩/(‖g_r‖²+ε)·g_r; g = γ·g_f + α·g_r. `coefs`: precomputed `pcgrad_coefs`."""
    pairs = _align(forget_grads, retain_grads)
    coefs = coefs if coefs is not None else pcgrad_coefs(pairs, reduce)
    return _map(pairs, lambda i, f, r: _pcgrad_tensor(f, r, coefs[i], alpha, gamma))


@rule("pcgrad_global", reduces=True)
def rule_pcgrad_global(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
                       state: Optional[RuleState] = None, reduce: Optional[Reducer] = None) -> Grads:
    """PCGrad with one dot product and norm over all parameters (over all shards with `reduce`)."""
    pairs = _align(forget_grads, retain_grads)
    fs, rs = _side(pairs, 0), _side(pairs, 1)
    dot, rr = _dots([(fs, rs), (rs, rs)], reduce)
    coef = dot / (rr + EPS) if dot < 0 else 0.0
    return _map(pairs, lambda _, f, r: gamma * (f - coef * r) + alpha * r)


@rule("blur", reduces=True)
def rule_blur(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
              state: Optional[RuleState] = None, reduce: Optional[Reducer] = None) -> Grads:
    """BLUR (global): g_r ← g_r − ⟨g_r,g_f⟩/(‖g_f‖²+ε)·g_f ALWAYS, then g = γ·g_f + α·g_r.

    Read from docs/METHODS.md §2.2 (no conflict test in its table row) and BLUR's published code: the
    projection is unconditional, so unlike the other rules blur does NOT reduce to `sum` on aligned
    gradients; it does when ⟨g_r, g_f⟩ = 0. Its two scalars are summed over shards with `reduce`.
    """
    pairs = _align(forget_grads, retain_grads)
    fs, rs = _side(pairs, 0), _side(pairs, 1)
    rf, ff = _dots([(rs, fs), (fs, fs)], reduce)
    coef = rf / (ff + EPS)
    return _map(pairs, lambda _, f, r: gamma * f + alpha * (r - coef * f))


def _update_ema(state: RuleState, pairs: list[Pair], current: float, first_is_g_r: bool) -> None:
    """ema ← current·g_r + (1−current)·ema per [*shape_i] entry (float64, stored ≥ float32).

    first_is_g_r: a fresh entry starts at g_r (gru_ema); else at 0, and an entry without gradient
    decays as if g_r were 0 (gru: the authors' code stores zeros for parameters without gradient).
    """
    prev = state.ema if state.ema is not None else [None] * len(pairs)
    if len(prev) != len(pairs):
        raise ValueError(f"gru state holds {len(prev)} EMA tensors but got {len(pairs)} gradients")
    new: list[Optional[Tensor]] = []
    for i, (e, p) in enumerate(zip(prev, pairs)):
        if p is None:
            new.append(e if first_is_g_r or e is None else ((1 - current) * e.double()).to(e.dtype))
            continue
        r = p[1]
        if e is not None and e.shape != r.shape:
            raise ValueError(f"gru EMA {i} has shape {tuple(e.shape)}, gradient has {tuple(r.shape)}")
        if e is None:
            avg = r.double() if first_is_g_r else current * r.double()
        else:
            avg = current * r.double() + (1 - current) * e.to(r.device, torch.float64)
        # copy on a g_r start: for float64 grads avg would alias the caller's g_r
        new.append(avg.to(torch.promote_types(r.dtype, torch.float32), copy=e is None and first_is_g_r))
    state.ema = new
    state.step += 1


def _project_off(pairs: list[Pair], ema: list[Optional[Tensor]], eps: float,
                 reduce: Optional[Reducer] = None) -> float:
    """Coefficient k of g_f ← g_f − k·ema: ⟨g_f,ema⟩/(‖ema‖²+eps) when ⟨g_f,ema⟩ < 0, else 0 (float64)."""
    dot, ee = _dots([(_side(pairs, 0), ema), (ema, ema)], reduce)
    return dot / (ee + eps) if dot < 0 else 0.0


def _need_state(rule: str, state: Optional[RuleState]) -> RuleState:
    if state is None:
        raise ValueError(f"rule '{rule}' keeps an EMA of the retain gradient: pass state=RuleState() and keep it")
    return state


@rule("gru", reduces=True, params=("gru_gamma",))
def rule_gru(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
             state: Optional[RuleState] = None, reduce: Optional[Reducer] = None,
             gru_gamma: float = GRU_GAMMA) -> Grads:
    """GRU as its authors' code (Wang et al. 2025, open-unlearning src/trainer/unlearn/gru.py): g = γ·g_f'.

    ema ← gru_gamma·g_r + (1 − gru_gamma)·ema (ema starts at 0; gru_gamma is the authors' gamma_gru, default 0.8,
    swept over 0.8 / 0.9 / 0.95 in their paper: the CURRENT retain gradient weighs gru_gamma); if
    ⟨g_f,ema⟩ < 0, g_f' = g_f − ⟨g_f,ema⟩/‖ema‖²·ema (no ε), else g_f' = g_f. Only the rectified
    forget gradient is written: g_r enters through the projection alone, so α is unused (the
    authors' trainer has no weights: γ = 1 there). Projection in float64; mutates `state`.
    """
    if not 0.0 < gru_gamma < 1.0:
        raise ValueError(f"gru_gamma must lie strictly between 0 and 1 (the authors use 0.8-0.95), got {gru_gamma}")
    state = _need_state("gru", state)
    pairs = _align(forget_grads, retain_grads)
    _update_ema(state, pairs, gru_gamma, first_is_g_r=False)
    ema = list(state.ema or [])
    pairs = [(torch.zeros_like(e), torch.zeros_like(e)) if p is None and e is not None else p
             for p, e in zip(pairs, ema)]  # the authors' zeros: a decayed EMA still projects there
    coef = _project_off(pairs, ema, 0.0, reduce)

    def fn(i: int, f: Tensor, r: Tensor) -> Tensor:
        e = ema[i]
        if coef != 0.0 and e is not None:
            f = f - coef * e.to(f.device, torch.float64)
        return gamma * f

    return _map(pairs, fn)


@rule("gru_ema", reduces=True)
def rule_gru_ema(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
                 state: Optional[RuleState] = None, reduce: Optional[Reducer] = None) -> Grads:
    """obliviate's earlier GRU reading: ema ← 0.8·ema + 0.2·g_r; project g_f off ema; g = γ·g_f' + α·g_r.

    Differs from `gru` (the authors' code) in three ways: the EMA keeps 0.8 of the PAST average and
    starts at the first g_r (no zero start), the projection adds ε to ‖ema‖², and α·g_r is added to
    the update. The EMA takes this step's g_r BEFORE the conflict test (a fresh state acts like
    pcgrad_global). EMA kept in at least float32; mutates `state`. Scalars summed over shards with `reduce`.
    """
    state = _need_state("gru_ema", state)
    pairs = _align(forget_grads, retain_grads)
    _update_ema(state, pairs, 1 - GRU_MOMENTUM, first_is_g_r=True)
    ema = list(state.ema or [])
    coef = _project_off(pairs, ema, EPS, reduce)

    def fn(i: int, f: Tensor, r: Tensor) -> Tensor:
        e = ema[i]
        if coef != 0.0 and e is not None:
            f = f - coef * e.to(f.device, torch.float64)
        return gamma * f + alpha * r

    return _map(pairs, fn)


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
    pairs = _align(forget_grads, retain_grads)
    masks = masks if masks is not None else _masks(pairs)
    fs, rs, gs = _side(pairs, 0), _side(pairs, 1), combined
    return {"ff": _dot(fs, fs), "rr": _dot(rs, rs), "gg": _dot(gs, gs), "fr": _dot(fs, rs), "gf": _dot(gs, fs),
            "gr": _dot(gs, rs), "n_conflict": float(sum(int(torch.count_nonzero(m)) for m in masks if m is not None)),
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


def rule_params(spec: RuleSpec, params: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The entries of `params` that rule `spec` takes (RuleSpec.params); settings of other rules are left out, so a
    caller may pass every configured one. A name no rule takes is a ValueError."""
    params = dict(params or {})
    known = {n for name in RULES.names() for n in RULES.get(name).params}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown gradient-rule setting(s) {unknown}; rules take {sorted(known) or 'none'}")
    return {k: v for k, v in params.items() if k in spec.params}


def _rule_kw(spec: RuleSpec, reduce: Optional[Reducer]) -> dict[str, Any]:
    """`reduce=` for a rule that sums scalars over shards; an error for a rule that cannot on shards."""
    if reduce is None or spec.elementwise:
        return {}
    if spec.reduces:
        return {"reduce": reduce}
    able = [n for n in RULES.names() if RULES.get(n).elementwise or RULES.get(n).reduces]
    raise ValueError(f"gradient rule '{spec.name}' does not say how to sum its scalars over gradient shards; "
                     f"sharded training supports {', '.join(able)}")


def combine(rule: str, forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
            state: Optional[RuleState] = None, per_module_names: Optional[list[str]] = None,
            reduce: Optional[Reducer] = None,
            params: Optional[Mapping[str, Any]] = None) -> tuple[Grads, dict[str, Any]]:
    """Apply RULES[rule]; return (combined grads, stats dict with "modules" when names are given).

    `reduce`: the lists are this rank's shards; dot products, norms and stats are summed over shards.
    `params`: the rules' own settings by name (e.g. {"gru_gamma": 0.9}); the rule gets those it takes."""
    spec = RULES.get(rule)
    rule_kw = _rule_kw(spec, reduce) | rule_params(spec, params)
    if per_module_names is not None:  # check before a stateful rule touches its state
        _check_names(per_module_names, forget_grads, retain_grads)
    masks = _masks(_align(forget_grads, retain_grads))  # computed once: SAGO's mask is stats' conflict count
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


def combine_into(rule: str, forget_grads: Grads, retain_grads: Grads, write: Callable[[int, Optional[Tensor]], None],
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
    spec = RULES.get(rule)
    if not spec.per_tensor:
        grads, out = combine(rule, forget_grads, retain_grads, alpha=alpha, gamma=gamma, state=state,
                             per_module_names=per_module_names, reduce=reduce, params=params)
        for i, g in enumerate(grads):
            forget_grads[i] = retain_grads[i] = None
            write(i, g)
        return out
    if per_module_names is not None:
        _check_names(per_module_names, forget_grads, retain_grads)
    pairs = _align(forget_grads, retain_grads)  # validate every pair before anything is written
    own = rule_params(spec, params)
    coefs = spec.coefficients(pairs, reduce) if spec.coefficients else None  # whole-tensor scalars, one call
    totals = dict.fromkeys(SUMS, 0.0)
    parts: dict[str, dict[str, float]] = {}
    for i in range(len(forget_grads)):
        f, r = [forget_grads[i]], [retain_grads[i]]
        if f[0] is None and r[0] is None:
            write(i, None)
            continue
        masks = _masks(_align(f, r))
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
