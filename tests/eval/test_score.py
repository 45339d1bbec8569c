"""Metric expressions, the stronger-of forget score, the Pareto front and the matched-utility bar, by hand."""
from __future__ import annotations

import math

import pytest

from obliviate.errors import ConfigError
from obliviate.eval.score import Bar, best_under_bar, dominates, forget_score, pareto_front, parse_expr


def test_expressions_compute_what_they_say():
    m = {"a": 0.5, "b": 0.25, "c": 2}
    assert parse_expr("a")(m) == 0.5
    assert parse_expr("min(a, b)")(m) == 0.25
    assert parse_expr("max(a, b, 0.3)")(m) == 0.5
    assert parse_expr("a - b * c")(m) == 0.0
    assert parse_expr("(a + b) / c")(m) == 0.375
    assert parse_expr("-a + abs(-b)")(m) == -0.25
    assert parse_expr("min(a, b)").names == ("a", "b")


def test_a_missing_metric_makes_the_score_nan_never_zero():
    for text in ("min(a, missing)", "max(missing, a)", "a + missing", "missing"):
        assert math.isnan(parse_expr(text)({"a": 1.0, "missing": None})), text
    assert math.isnan(parse_expr("a / b")({"a": 1.0, "b": 0.0}))
    assert math.isnan(parse_expr("a")({"a": True}))  # a flag is not a metric


@pytest.mark.parametrize("text, match", [
    ("a ** 2", "not a metric expression"), ("__import__('os')", "not a metric expression"),
    ("a.b", "not a metric expression"), ("min()", "not a metric expression"), ("'x'", "not a metric expression"),
    ("a +", "syntax error"), ("", "expected a metric name"), ("0.5", "names no metric"),
])
def test_anything_but_metrics_and_arithmetic_is_refused(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_expr(text, {"a"})


def test_an_unknown_metric_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"objectives\[0\]: 'min\(retain, nope\)' names no metric \['nope'\]; valid "
                                          r"metrics: \['forget', 'retain'\]"):
        parse_expr("min(retain, nope)", {"retain", "forget"}, "objectives[0]")


@pytest.mark.parametrize("gen, mcq, expected", [
    (0.2, 0.25, 0.2),          # MCQ at chance adds nothing
    (0.0, 1.0, 1.0),           # hidden in generation, still ranked first: fully known
    (0.1, 0.625, 0.5),         # (0.625 - 0.25) / 0.75
    (0.6, 0.625, 0.6),
    (0.0, 0.1, 0.0),           # below chance clips at 0
    (None, 0.4, 0.2),
    (0.3, None, 0.3),
    (None, None, None),
])
def test_forget_score_is_the_stronger_probe_with_mcq_rescaled_above_chance(gen, mcq, expected):
    got = forget_score(gen, mcq)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_pareto_front_by_hand():
    # (forget ↓, utility ↑)
    pts = [(0.5, 0.8), (0.2, 0.7), (0.2, 0.9), (0.9, 0.95), (0.1, 0.1), (0.6, 0.8), (0.2, 0.9), (math.nan, 1.0)]
    # (0.2, 0.9) dominates (0.5, 0.8), (0.2, 0.7), (0.6, 0.8); its twin does not dominate it (equal); NaN never counts
    assert pareto_front(pts, (False, True)) == [2, 3, 4, 6]
    assert pareto_front(pts, (True, True)) == [3]  # maximising both: only the top-right point
    assert dominates((0.1, 0.9), (0.2, 0.9), (False, True)) and not dominates((0.2, 0.9), (0.2, 0.9), (False, True))


def test_the_bar_keeps_shares_of_the_original_and_ceilings_then_takes_the_lowest_forget():
    bar = Bar(parse_expr("forget"), {"retain": 0.9}, {"degenerate": 0.1})
    original = {"retain": 1.0}
    runs = [{"forget": 0.0, "retain": 0.85, "degenerate": 0.0},   # utility below 0.9x
            {"forget": 0.1, "retain": 0.90, "degenerate": 0.2},   # too degenerate
            {"forget": 0.3, "retain": 0.95, "degenerate": 0.1},   # passes (both limits inclusive)
            {"forget": 0.2, "retain": 0.92, "degenerate": 0.05},  # passes, lower forget: the best
            {"forget": None, "retain": 1.0, "degenerate": 0.0}]   # forget missing: never the best
    assert [bar.passes(r, original) for r in runs] == [False, False, True, True, False]
    assert best_under_bar(runs, bar, original) == 3
    assert best_under_bar(runs[:2], bar, original) is None
    assert not bar.passes(runs[3], {})  # without the original's value the share cannot be checked
    assert bar.describe() == "lowest forget with retain >= 0.9x the original's and degenerate <= 0.1"


def test_without_a_winner_the_nearest_miss_is_the_run_breaking_fewest_conditions():
    from obliviate.eval.score import nearest_to_bar

    bar = Bar(parse_expr("forget"), {"retain": 0.9}, {"degenerate": 0.1})
    runs = [{"forget": 0.0, "retain": 0.0, "degenerate": 1.0},   # breaks both
            {"forget": 0.4, "retain": 0.95, "degenerate": 0.5},  # breaks one
            {"forget": 0.2, "retain": 0.5, "degenerate": 0.0}]   # breaks one, lower forget: the nearest miss
    assert [bar.violations(r, {"retain": 1.0}) for r in runs] == [2, 1, 1]
    assert nearest_to_bar(runs, bar, {"retain": 1.0}) == 2
    assert nearest_to_bar(runs + [{"forget": 0.9, "retain": 1.0, "degenerate": 0.0}], bar, {"retain": 1.0}) == 3
    assert nearest_to_bar([], bar, {}) is None
