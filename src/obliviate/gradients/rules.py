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

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
from torch import Tensor

from obliviate.gradients.tensors import (
    Grads,
    Pair,
    Reducer,
    align_pairs,
    conflict_masks_of,
    list_dots,
    map_pairs,
    side_of,
    work_precision,
)
from obliviate.registry import Registry

EPS = 1e-10  # added to squared norms in every projection (docs/METHODS.md §2.2), except gru's (its authors add none)
GRU_MOMENTUM = 0.8  # gru_ema: ema <- 0.8·ema + 0.2·g_r
GRU_GAMMA = 0.8  # gru's default gru_gamma (authors' gamma_gru): ema <- 0.8·g_r + 0.2·ema, from ema = 0



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
    params: the rule's own settings (`method.combine.args`), read from its keyword-only parameters with a default
    other than those `combine` passes (LOOP_ARGS), e.g. gru's gru_gamma; check: raises ValueError
    for settings the rule refuses, called by `resolve` before a run starts."""

    name: str
    fn: RuleFn
    elementwise: bool = False
    per_tensor: bool = False
    reduces: bool = False
    separate: bool = True
    coefficients: Optional[Callable[..., list[float]]] = None
    conflict_masks: bool = False
    params: tuple[str, ...] = field(init=False)
    check: Optional[Callable[[Mapping[str, Any]], None]] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.defaults()))

    def __call__(self, *args: Any, **kw: Any) -> Grads:
        return self.fn(*args, **kw)

    def defaults(self) -> dict[str, Any]:
        """The rule's own settings with their defaults (its keyword-only parameters that the loop does not pass)."""
        sig = inspect.signature(self.fn)
        return {n: p.default for n, p in sig.parameters.items()
                if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and n not in LOOP_ARGS}

    def resolve(self, args: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        """`method.combine.args` checked against the rule and filled with its defaults; ValueError naming the rule,
        the key and the valid keys otherwise."""
        valid = self.defaults()
        unknown = sorted(set(args or {}) - set(valid))
        if unknown:
            raise ValueError(f"rule {self.name!r} takes no setting(s) {unknown}; valid keys of method.combine.args: "
                             f"{sorted(valid) or 'none'}")
        merged = {**valid, **dict(args or {})}
        if self.check is not None:
            self.check(merged)
        return merged


RULES: Registry[RuleSpec] = Registry("gradient rule")
LOOP_ARGS = frozenset({"alpha", "gamma", "state", "reduce", "masks", "coefs"})  # what `combine` passes, not the user


def spec_of(rule: "str | RuleSpec") -> RuleSpec:
    """A rule's spec from its spec or its registered name (unknown names: an error listing the valid ones)."""
    return rule if isinstance(rule, RuleSpec) else RULES.get(rule)


def rule(name: str, **traits: Any) -> Callable[[RuleFn], RuleFn]:
    """Decorator: register `fn` as gradient rule `name` with its traits (see RuleSpec)."""
    def deco(fn: RuleFn) -> RuleFn:
        RULES.add(name, RuleSpec(name, fn, **traits))
        return fn
    return deco
@rule("sum", elementwise=True, per_tensor=True, separate=False)
def rule_sum(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
             state: Optional[RuleState] = None) -> Grads:
    """g = γ·g_f + α·g_r; lists of [*shape_i] tensors."""
    return map_pairs(align_pairs(forget_grads, retain_grads), lambda _, f, r: gamma * f + alpha * r)


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
    pairs = align_pairs(forget_grads, retain_grads)
    masks = masks if masks is not None else conflict_masks_of(pairs)
    return map_pairs(pairs, lambda i, f, r: _select(masks[i], r, f, alpha, gamma))


@rule("sago_retain", elementwise=True, per_tensor=True, conflict_masks=True)
def rule_sago_retain(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
                     state: Optional[RuleState] = None, masks: Optional[list[Optional[Tensor]]] = None) -> Grads:
    """SAGO "prefer retain": g = α·g_r + γ·g_f ⊙ (1−c); elementwise, shard-local."""
    pairs = align_pairs(forget_grads, retain_grads)
    masks = masks if masks is not None else conflict_masks_of(pairs)
    return map_pairs(pairs, lambda i, f, r: alpha * r + gamma * f.masked_fill(masks[i], 0.0))


def pcgrad_coefs(pairs: list[Pair], reduce: Optional[Reducer] = None) -> list[float]:
    """Per tensor: ⟨g_f,g_r⟩/(‖g_r‖²+ε) when ⟨g_f,g_r⟩ < 0, else 0 (sums over shards with ONE `reduce` call)."""
    part = torch.zeros(2 * len(pairs), dtype=torch.float64)
    for i, p in enumerate(pairs):
        if p is not None:
            f, r = work_precision(p[0]), work_precision(p[1])
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
    pairs = align_pairs(forget_grads, retain_grads)
    coefs = coefs if coefs is not None else pcgrad_coefs(pairs, reduce)
    return map_pairs(pairs, lambda i, f, r: _pcgrad_tensor(f, r, coefs[i], alpha, gamma))


@rule("pcgrad_global", reduces=True)
def rule_pcgrad_global(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
                       state: Optional[RuleState] = None, reduce: Optional[Reducer] = None) -> Grads:
    """PCGrad with one dot product and norm over all parameters (over all shards with `reduce`)."""
    pairs = align_pairs(forget_grads, retain_grads)
    fs, rs = side_of(pairs, 0), side_of(pairs, 1)
    dot, rr = list_dots([(fs, rs), (rs, rs)], reduce)
    coef = dot / (rr + EPS) if dot < 0 else 0.0
    return map_pairs(pairs, lambda _, f, r: gamma * (f - coef * r) + alpha * r)


@rule("blur", reduces=True)
def rule_blur(forget_grads: Grads, retain_grads: Grads, *, alpha: float, gamma: float,
              state: Optional[RuleState] = None, reduce: Optional[Reducer] = None) -> Grads:
    """BLUR (global): g_r ← g_r − ⟨g_r,g_f⟩/(‖g_f‖²+ε)·g_f ALWAYS, then g = γ·g_f + α·g_r.

    Read from docs/METHODS.md §2.2 (no conflict test in its table row) and BLUR's published code: the
    projection is unconditional, so unlike the other rules blur does NOT reduce to `sum` on aligned
    gradients; it does when ⟨g_r, g_f⟩ = 0. Its two scalars are summed over shards with `reduce`.
    """
    pairs = align_pairs(forget_grads, retain_grads)
    fs, rs = side_of(pairs, 0), side_of(pairs, 1)
    rf, ff = list_dots([(rs, fs), (fs, fs)], reduce)
    coef = rf / (ff + EPS)
    return map_pairs(pairs, lambda _, f, r: gamma * f + alpha * (r - coef * f))


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
    dot, ee = list_dots([(side_of(pairs, 0), ema), (ema, ema)], reduce)
    return dot / (ee + eps) if dot < 0 else 0.0


def _need_state(rule: str, state: Optional[RuleState]) -> RuleState:
    if state is None:
        raise ValueError(f"rule '{rule}' keeps an EMA of the retain gradient: pass state=RuleState() and keep it")
    return state


def _check_gru(args: Mapping[str, Any]) -> None:
    gru_gamma = args["gru_gamma"]
    if isinstance(gru_gamma, bool) or not isinstance(gru_gamma, (int, float)) or not 0.0 < gru_gamma < 1.0:
        raise ValueError(f"gru_gamma must lie strictly between 0 and 1 (the authors use 0.8-0.95), got {gru_gamma!r}")


@rule("gru", reduces=True, check=_check_gru)
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
    _check_gru({"gru_gamma": gru_gamma})
    state = _need_state("gru", state)
    pairs = align_pairs(forget_grads, retain_grads)
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

    return map_pairs(pairs, fn)


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
    pairs = align_pairs(forget_grads, retain_grads)
    _update_ema(state, pairs, 1 - GRU_MOMENTUM, first_is_g_r=True)
    ema = list(state.ema or [])
    coef = _project_off(pairs, ema, EPS, reduce)

    def fn(i: int, f: Tensor, r: Tensor) -> Tensor:
        e = ema[i]
        if coef != 0.0 and e is not None:
            f = f - coef * e.to(f.device, torch.float64)
        return gamma * f + alpha * r

    return map_pairs(pairs, fn)
