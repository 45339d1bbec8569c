"""Objective specs: a registered loss function plus what it needs from the loop.

A loss takes TokenStats (obliviate.modeling.logprobs) and keyword-only hyper-parameters and
returns a scalar to MINIMISE. Its first parameter `policy` is the student on the batch; `needs`
names the extra statistics the loop passes by keyword, each a TokenStats on a [B, T] batch:
  "reference"          frozen θ0 on the same batch,
  "teacher"            frozen θ0 with smoothed attention (ASU),
  "refusal"            the student on the same questions answered with a refusal (IDK, DPO, AP),
  "refusal_reference"  frozen θ0 on that refusal batch,
  "hidden"             policy (and reference, if also needed) TokenStats carry the output of decoder
                       layer `layer` (the loss's own `layer` hyper-parameter), captured by a hook (RMU).
`loop_params` are hyper-parameters the loop consumes instead of the loss: the teacher's tau and
layers (ASU), the trainable parameters (RMU), the positions that count (`positions`, modeling.logprobs
POSITIONS: "answer" tokens by default; ME, UNDIAL and KL may count other positions, as their reference
code does; `last_position` makes "batch" count every logit of a row, the last one included). `choices` lists the allowed values of string hyper-parameters;
a token-level loss's keyword `reduction` ("token" | "example", obliviate.modeling.logprobs) is
checked without being listed.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from obliviate.errors import ConfigError
from obliviate.modeling.logprobs import REDUCTIONS
from obliviate.registry import Registry


@dataclass(frozen=True)
class ObjectiveSpec:
    """A registered forget objective or retain term."""

    name: str
    fn: Callable[..., Any]
    needs: tuple[str, ...] = ()
    loop_params: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    last_position: bool = False
    frozen_use: str = "rows"  # how the loss reads θ0's stats: "scalar" (.logp/.mask only: a cache keeps one number
    #                           per token), "kl" (rows only through a KL: a top-k cache may approximate them), "rows"

    def allowed(self) -> dict[str, tuple[Any, ...]]:
        """Hyper-parameters restricted to a set of values (reduction included when the loss has one)."""
        extra = {"reduction": REDUCTIONS} if "reduction" in self.loss_defaults() else {}
        return {**extra, **dict(self.choices)}

    def loss_defaults(self) -> dict[str, Any]:
        """Keyword-only hyper-parameters of the loss and their defaults."""
        sig = inspect.signature(self.fn)
        return {n: p.default for n, p in sig.parameters.items()
                if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}

    def defaults(self) -> dict[str, Any]:
        """Every hyper-parameter a config may set for this objective, with its default."""
        return {**self.loss_defaults(), **dict(self.loop_params)}

    def resolve(self, args: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split user args into (loss kwargs, loop kwargs), defaults filled; unknown keys are errors."""
        args = dict(args or {})
        valid = self.defaults()
        unknown = sorted(set(args) - set(valid))
        if unknown:
            raise ConfigError(f"unknown hyper-parameter(s) {unknown} for {self.name!r}; "
                              f"valid keys: {sorted(valid) or 'none'}")
        merged = {**valid, **args}
        for key, ok in self.allowed().items():
            if key in merged and merged[key] not in ok:
                raise ConfigError(f"{self.name}: {key} must be one of {list(ok)}, got {merged[key]!r}")
        loss = {k: merged[k] for k in self.loss_defaults()}
        loop = {k: merged[k] for k in self.loop_params}
        return loss, loop


NEEDS = ("reference", "teacher", "refusal", "refusal_reference", "hidden")

FORGET: Registry[ObjectiveSpec] = Registry("forget objective")
RETAIN: Registry[ObjectiveSpec] = Registry("retain term")


FROZEN_USES = ("rows", "scalar", "kl")


def _register(reg: Registry[ObjectiveSpec], name: str, needs: tuple[str, ...], loop_params: Mapping[str, Any] | None,
              choices: Mapping[str, tuple[Any, ...]] | None = None, last_position: bool = False,
              frozen_use: str = "rows"):
    unknown = sorted(set(needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"{name}: unknown needs {unknown}; valid: {NEEDS}")
    if frozen_use not in FROZEN_USES:
        raise ValueError(f"{name}: frozen_use must be one of {FROZEN_USES}, got {frozen_use!r}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        doc = (fn.__doc__ or "").strip().splitlines()
        reg.add(name, ObjectiveSpec(name, fn, needs, dict(loop_params or {}), doc[0] if doc else "", dict(choices or {}),
                                    last_position, frozen_use))
        return fn

    return deco


def forget_objective(name: str, *, needs: tuple[str, ...] = (), loop_params: Mapping[str, Any] | None = None,
                     choices: Mapping[str, tuple[Any, ...]] | None = None, frozen_use: str = "rows"):
    """Decorator registering a forget objective (a loss to minimise on the forget batch); `frozen_use`: ObjectiveSpec."""
    return _register(FORGET, name, needs, loop_params, choices, frozen_use=frozen_use)


def retain_term(name: str, *, needs: tuple[str, ...] = (), loop_params: Mapping[str, Any] | None = None,
                choices: Mapping[str, tuple[Any, ...]] | None = None, last_position: bool = False,
                frozen_use: str = "rows"):
    """Decorator registering a retain term (a loss to minimise on the retain batch); `frozen_use`: ObjectiveSpec."""
    return _register(RETAIN, name, needs, loop_params, choices, last_position, frozen_use)
