"""`obliviate ls`: the forget objectives, retain terms, gradient rules and preset recipes, one line each; and
every objective's own keys for `--help-config`."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from obliviate.catalogue import builtin
from obliviate.eval.benchmarks import BENCHMARKS
from obliviate.registry import PLUGIN_GROUP

HELP = "list forget objectives, retain terms, gradient rules and presets"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`ls` takes no arguments."""


def run(args: argparse.Namespace) -> int:
    print(list_components())
    return 0


def first_sentence(text: str) -> str:
    """The first sentence of a YAML file's header comment (its leading `#` lines joined), whole."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    words = " ".join(lines).split()
    for i, word in enumerate(words):
        if word.endswith((".", ".)", "?", "!")) and not word.endswith(("e.g.", "i.e.", "vs.", "etc.")):
            return " ".join(words[: i + 1])
    return " ".join(words)


def _preset_line(path: Path, configs: Path) -> str:
    """A preset's path under configs/ and the first sentence of its header comment."""
    return f"  {path.relative_to(configs)!s:<44} {first_sentence(path.read_text(encoding='utf-8'))}"


def plugin_lines(builtins: dict[str, set[str]]) -> list[str]:
    """What installed plugins add (entry-point group obliviate.plugins), one line each; nothing without plugins
    (then no torch is imported)."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=PLUGIN_GROUP))
    if not found:
        return []
    from obliviate.gradients import RULES
    from obliviate.objectives import FORGET, RETAIN

    lines = [f"plugins ({', '.join(f'{ep.name} = {ep.value}' for ep in found)}):"]
    for kind, reg in (("forget", FORGET), ("retain", RETAIN), ("rule", RULES)):
        for name in reg.names():
            if name not in builtins[kind]:
                fn = getattr(reg.get(name), "fn", None)
                doc = ((getattr(fn, "__doc__", None) or "").strip().splitlines() or [""])[0]
                lines.append(f"  {kind:<7} {name:<12} {doc}")
    return lines


def list_components() -> str:
    """One line per forget objective, retain term, gradient rule and preset recipe (no torch import)."""

    lines = []
    for kind, title in (("forget", "forget objectives (method.forget):"), ("retain", "retain terms (method.retain):"),
                        ("rule", "gradient rules (method.combine.rule):")):
        lines += [title] + [f"  {n:<12} {summary}" for n, summary in builtin(kind).items()]
    lines += plugin_lines({kind: set(builtin(kind)) for kind in ("forget", "retain", "rule")})

    lines += ["benchmarks (obliviate eval --benchmark):"] + [f"  {n:<12} {BENCHMARKS.get(n).help}" for n in BENCHMARKS.names()]
    configs = Path(__file__).resolve().parents[3] / "configs"
    presets = sorted(configs.rglob("*.yaml"), key=lambda p: (len(p.relative_to(configs).parts), p))
    if presets:  # every folder: the CPU presets, then configs/gpu/ and configs/twins/ (recipes for a GPU, their twins)
        lines += [f"presets ({configs}):"] + [_preset_line(p, configs) for p in presets]
    return "\n".join(lines)


KEY_HELP = {
    "tau": "attention temperature of the teacher (> 1 smooths; <= 1 needs method.allow_unusual_tau=true)",
    "layers": "layers whose attention is smoothed (null: all; negative indices count from the last layer)",
    "reduction": "token: mean over all tokens of the batch | example: mean per example, then over examples",
    "beta": "inverse temperature of the loss",
    "delta": "reward margin",
    "layer": "decoder layer whose output is steered (0-based)",
    "steering_coef": "norm c of the steering vector c·u",
    "seed": "seed of the random steering direction",
    "trainable_params": "wmdp (mlp.down_proj of the trainable layers) | layers | list of parameter-name regexes",
    "trainable_layers": "layers trained (null: layer-2..layer)",
    "gru_gamma": "weight of the current retain gradient in the EMA, m <- gru_gamma·g_r + (1 - gru_gamma)·m "
                 "(the authors: 0.8, 0.9, 0.95)",
}


def objective_keys() -> list[tuple[str, Any, str]]:
    """(key, default, help) of every registered forget objective's, retain term's and gradient rule's own settings."""
    from obliviate.gradients import RULES
    from obliviate.objectives import FORGET, RETAIN

    rows = []
    for section, reg, what in (("method.forget_args", FORGET, "method.forget"), ("method.retain_args", RETAIN,
                                                                                 "method.retain")):
        for name in reg.names():
            spec = reg.get(name)
            for key, default in spec.defaults().items():
                allowed = spec.allowed().get(key)
                text = KEY_HELP.get(key, "hyper-parameter of the loss") + (f" ({' | '.join(map(str, allowed))})"
                                                                           if allowed else "")
                rows.append((f"{section}.{key}", default, f"[{what}={name}] {text}"))
    for name in RULES.names():
        for key, default in RULES.get(name).defaults().items():
            rows.append((f"method.combine.args.{key}", default,
                         f"[method.combine.rule={name}] {KEY_HELP.get(key, 'setting of the gradient rule')}"))
    return rows
