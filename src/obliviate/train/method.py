"""A method resolved against the registries: its forget objective, retain term and gradient rule looked up once,
their hyper-parameters checked and filled with defaults (errors name the valid keys), and the settings that decide the
trajectory (the run's fingerprint)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from obliviate.config import MethodConfig
from obliviate.errors import ConfigError
from obliviate.gradients import RULES, RuleSpec
from obliviate.modeling.teacher import Teacher
from obliviate.objectives import FORGET, RETAIN, ObjectiveSpec


@dataclass(frozen=True)
class ResolvedMethod:
    """A method with registry entries and validated hyper-parameters."""

    forget: ObjectiveSpec
    forget_kw: dict[str, Any]
    loop_kw: dict[str, Any]
    retain: ObjectiveSpec | None
    retain_kw: dict[str, Any]
    gamma: float
    alpha: float
    rule: RuleSpec  # the gradient rule, looked up once
    separate: bool
    module_stats: bool
    retain_loop_kw: dict[str, Any] = field(default_factory=dict)
    rule_params: dict[str, Any] = field(default_factory=dict)  # method.combine.args resolved (e.g. gru_gamma)
    teacher: Teacher | None = None  # ASU's smoothed θ0 (τ, layers), checked once; None when the objective has none

    def needs(self) -> set[str]:
        return set(self.forget.needs) | set(self.retain.needs if self.retain else ())

    @property
    def teacher_kw(self) -> dict[str, Any] | None:
        """{"tau", "layers"} of the smoothed teacher (its cache key and the layer check), when there is one."""
        return self.teacher.as_args() if self.teacher is not None else None

    def settings(self) -> dict[str, Any]:
        """The resolved hyper-parameters (defaults filled in) that decide the trajectory: the run's fingerprint."""
        return {"forget": self.forget.name, "forget_args": {**self.forget_kw, **self.loop_kw},
                "retain": self.retain.name if self.retain else None, "retain_args": {**self.retain_kw, **self.retain_loop_kw}, "gamma": self.gamma,
                "alpha": self.alpha, "combine": {"rule": self.rule.name, "separate_backward": self.separate, **self.rule_params}}

    @property
    def needs_frozen(self) -> bool:
        return bool(self.needs() & {"reference", "teacher", "refusal_reference"})

    @property
    def needs_refusals(self) -> bool:
        return bool(self.needs() & {"refusal", "refusal_reference"})


def cache_trajectory(m: MethodConfig) -> dict[str, Any]:
    """The θ0-cache settings that change the numbers (top-k's tail bucket, bf16 rounding); exact = live."""
    return {"topk": m.cache_topk if m.cache == "topk" else None, "bf16": bool(m.cache_bf16) and m.cache != "none"}


def resolve_method(m: MethodConfig) -> ResolvedMethod:
    """Look up objective and retain term by name and check their hyper-parameters (errors name valid keys)."""
    f = FORGET.get(m.forget)
    fkw, tkw = f.resolve(m.forget_args)
    r = RETAIN.get(m.retain) if m.retain else None
    rkw, rloop = r.resolve(m.retain_args) if r else ({}, {})
    c = m.combine
    spec = RULES.get(c.rule)  # unknown rule -> error listing valid rules
    try:
        rule_args = spec.resolve(c.args)
    except ValueError as exc:
        raise ConfigError(f"method.combine.args: {exc}") from None
    separate = spec.separate or bool(c.separate_backward)
    if spec.separate and c.separate_backward is False:
        raise ConfigError(f"method.combine.rule={c.rule} needs separate forget and retain backward passes; "
                          "drop method.combine.separate_backward=false")
    if separate and r is None:
        raise ConfigError(f"method.combine.rule={c.rule} combines forget and retain gradients, but method.retain "
                          "is null; set a retain term (e.g. method.retain=nll) or use rule sum")
    return ResolvedMethod(f, fkw, tkw, r, rkw, m.gamma, m.alpha,
                          spec, separate, c.module_stats, retain_loop_kw=rloop, rule_params=rule_args,
                          teacher=Teacher.from_args(tkw, m.allow_unusual_tau) if "teacher" in f.needs else None)
