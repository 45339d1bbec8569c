"""What each track optimises and reports unless the sweep says otherwise (objectives, the matched-utility bar, the
report's axes), and a sweep's `bar` and `report` settings read against those defaults."""
from __future__ import annotations

from dataclasses import dataclass

from obliviate.errors import ConfigError
from obliviate.eval.score import Bar, Expr, parse_expr


@dataclass(frozen=True)
class Defaults:
    """What a track optimises and reports unless the sweep says otherwise."""

    objectives: tuple[tuple[str, str], ...]  # (direction, expression)
    forget: str
    utility: str
    fluency: str
    keep: dict[str, float]
    at_most: dict[str, float]


KNOWLEDGE_DEFAULTS = Defaults((("minimize", "forget_score"), ("maximize", "min(neighbours_accuracy, retain_accuracy)")),
                              "forget_score", "min(neighbours_accuracy, retain_accuracy)", "forget_degenerate_share",
                              {"neighbours_accuracy": 0.9, "retain_accuracy": 0.9}, {"forget_degenerate_share": 0.1})


DEMO_DEFAULTS = Defaults((("minimize", "forget_fact_recall"), ("maximize", "model_utility")), "forget_fact_recall",
                         "model_utility", "forget_degenerate_share", {"model_utility": 0.9},
                         {"forget_degenerate_share": 0.1})


UNLEARN_DEFAULTS = Defaults((("minimize", "forget_rougeL_recall"), ("maximize", "model_utility")),
                            "forget_rougeL_recall", "model_utility", "forget_degenerate_share", {"model_utility": 0.9},
                            {"forget_degenerate_share": 0.1})


def parse_bar(raw: dict, d: Defaults, valid: set[str]) -> Bar:
    """The report's matched-utility bar from the sweep's `bar` section over the track's defaults `d`."""
    unknown = sorted(set(raw) - {"forget", "keep", "at_most"})
    if unknown:
        raise ConfigError(f"bar: unknown key(s) {unknown}; valid: forget, keep, at_most")
    keep, at_most = raw.get("keep", d.keep), raw.get("at_most", d.at_most)
    for key, table in (("keep", keep), ("at_most", at_most)):
        if not isinstance(table, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in table.values()):
            raise ConfigError(f"bar.{key}: expected a mapping metric -> number, got {table!r}")
        for name in table:
            parse_expr(str(name), valid, f"bar.{key}")
            if not str(name).isidentifier():
                raise ConfigError(f"bar.{key}: {name!r} must be one metric name, not an expression")
    return Bar(parse_expr(raw.get("forget", d.forget), valid, "bar.forget"),
               {str(k): float(v) for k, v in keep.items()}, {str(k): float(v) for k, v in at_most.items()})


def parse_axes(raw: dict, d: Defaults, valid: set[str]) -> dict[str, Expr]:
    """The frontier plot's forget, utility and fluency expressions (the sweep's `report` over the defaults)."""
    unknown = sorted(set(raw) - {"forget", "utility", "fluency"})
    if unknown:
        raise ConfigError(f"report: unknown key(s) {unknown}; valid: forget, utility, fluency")
    return {k: parse_expr(raw.get(k, getattr(d, k)), valid, f"report.{k}") for k in ("forget", "utility", "fluency")}

