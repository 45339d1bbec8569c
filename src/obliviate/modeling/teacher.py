"""ASU's forget-teacher settings, in one typed place: θ0 with attention temperature τ on chosen layers.

One default (DEFAULT_TAU), one check (`check_teacher_args`, used by the config, the demos and the sweep), one
object (`Teacher`) that the frozen θ0 copy, its cache key, the calibration and the demos read. No torch here: the
config imports it. τ > 1 smooths the attention (arXiv 2603.01285 uses 2.0-2.8); τ = 1 is the model itself and
τ < 1 sharpens, both refused unless `method.allow_unusual_tau` opts in.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

from obliviate.errors import ConfigError

DEFAULT_TAU = 2.0
KEY = "method.forget_args"


def tau_problem(tau: Any) -> str | None:
    """Why `tau` cannot be a temperature at all (None when it is a finite number > 0)."""
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(tau) or tau <= 0:
        return "a finite number > 0 (ASU smooths with tau > 1; the paper uses 2.0-2.8)"
    return None


def _check_layers(value: Any, key: str) -> None:
    ok = value is None or (isinstance(value, (list, tuple)) and bool(value)
                           and all(isinstance(i, int) and not isinstance(i, bool) for i in value))
    if not ok:
        raise ConfigError(f"{key}={value!r} is impossible: it must be null (every layer) or a non-empty list of layer "
                          "indices such as [0] or [0, 1] (negative indices count from the last layer)")


def check_teacher_args(args: Mapping[str, Any], allow_unusual_tau: bool = False, key: str = KEY) -> None:
    """The teacher's settings as far as a config tells: tau a finite number > 1 (or <= 1 with the opt-in), layers
    null or a non-empty list of ints. The layer range is checked against the model before training."""
    if "tau" in args:
        tau = args["tau"]
        problem = tau_problem(tau)
        if problem:
            raise ConfigError(f"{key}.tau={tau!r} is impossible: it must be {problem}")
        if tau == 1 and not allow_unusual_tau:
            raise ConfigError(f"{key}.tau=1 makes the teacher identical to the model, so ASU would change nothing; "
                              f"use tau > 1 (e.g. {DEFAULT_TAU}), or set method.allow_unusual_tau=true to run it anyway")
        if tau < 1 and not allow_unusual_tau:
            raise ConfigError(f"{key}.tau={tau!r} < 1 sharpens the teacher's attention instead of smoothing it (ASU "
                              f"needs tau > 1, e.g. {DEFAULT_TAU}); set method.allow_unusual_tau=true to run it anyway")
    if "layers" in args:
        _check_layers(args["layers"], f"{key}.layers")


@dataclass(frozen=True)
class Teacher:
    """θ0 with attention temperature `tau` on decoder `layers` (None: every layer; negative: from the last)."""

    tau: float = DEFAULT_TAU
    layers: tuple[int, ...] | None = None

    @classmethod
    def from_args(cls, args: Mapping[str, Any] | None, allow_unusual_tau: bool = True, key: str = KEY) -> Teacher:
        """The teacher of an objective's `forget_args` (other keys ignored), checked; defaults fill what is absent."""
        args = dict(args or {})
        check_teacher_args(args, allow_unusual_tau, key)
        layers = args.get("layers")
        return cls(float(args.get("tau", DEFAULT_TAU)), None if layers is None else tuple(int(i) for i in layers))

    def as_args(self) -> dict[str, Any]:
        """{"tau": τ, "layers": [...] | None}: the form of a config's forget_args."""
        return {"tau": self.tau, "layers": None if self.layers is None else list(self.layers)}
