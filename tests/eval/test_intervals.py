"""Bootstrap intervals over rows and seeds, and the tie rule: hand-worked tables."""
from __future__ import annotations

import math

import numpy as np
import pytest

from obliviate.errors import ConfigError
from obliviate.eval.intervals import Interval, bootstrap, check_level, paired, ratio_to_reference, tied_groups
from obliviate.eval.score import parse_expr

ACC = parse_expr("forget_accuracy")


def test_a_constant_table_has_a_point_interval_and_one_seed_without_rows_has_none():
    iv = bootstrap(ACC, [({}, {"forget_accuracy": [1, 1, 1, 1]})])
    assert (iv.estimate, iv.low, iv.high, iv.resampled, iv.rows) == (1.0, 1.0, 1.0, True, 4)
    bare = bootstrap(ACC, [({"forget_accuracy": 0.3}, {})])
    assert (bare.estimate, bare.low, bare.high, bare.resampled) == (0.3, 0.3, 0.3, False)
    assert "no interval" in bare.text()


def test_two_rows_zero_and_one_span_the_whole_range():
    """Resampling [0, 1] gives means 0, 0.5, 1 with chances 1/4, 1/2, 1/4: the 95% interval is [0, 1]."""
    iv = bootstrap(ACC, [({}, {"forget_accuracy": [0, 1]})], draws=4000)
    assert (iv.estimate, iv.low, iv.high) == (0.5, 0.0, 1.0)


def test_twenty_rows_half_right_match_the_normal_approximation():
    """p = 0.5 over 20 rows: 0.5 ± 1.96·sqrt(0.25/20) = [0.281, 0.719] (the bootstrap's steps are 0.05)."""
    iv = bootstrap(ACC, [({}, {"forget_accuracy": [1] * 10 + [0] * 10})], draws=4000)
    assert iv.estimate == 0.5 and abs(iv.low - 0.281) <= 0.07 and abs(iv.high - 0.719) <= 0.07
    assert iv.low in {0.25, 0.3} and iv.high in {0.7, 0.75}


def test_seeds_are_resampled_too_and_rows_stay_paired_within_a_group():
    """Two seeds of constant rows, 0 and 1: only the seed draw varies, so the interval is [0, 1] and the estimate
    their mean; a score of two metrics over the same rows (a − b with a = b row by row) is exactly 0 in every draw."""
    iv = bootstrap(ACC, [({}, {"forget_accuracy": [0, 0, 0]}), ({}, {"forget_accuracy": [1, 1, 1]})], draws=2000)
    assert (iv.estimate, iv.low, iv.high, iv.seeds) == (0.5, 0.0, 1.0, 2)
    diff = parse_expr("a - b")
    rows = {"a": [0, 1, 0, 1, 1], "b": [0, 1, 0, 1, 1]}
    paired = bootstrap(diff, [({}, rows)])
    assert (paired.low, paired.high) == (0.0, 0.0)


def test_metrics_without_rows_enter_as_they_are():
    score = parse_expr("forget_accuracy + bonus")
    iv = bootstrap(score, [({"bonus": 1.0}, {"forget_accuracy": [0, 0]})])
    assert (iv.estimate, iv.low, iv.high) == (1.0, 1.0, 1.0)


def test_the_row_count_is_that_of_the_metrics_the_score_rests_on():
    """A forget score over 3 forget rows beside 175 retain rows rests on 3 rows, not 175; forget_score rests on its
    two accuracies (the knowledge track recomputes it from them)."""
    rows = {"forget_accuracy": [1, 0, 1], "forget_mcq_accuracy": [1, 1, 0, 0], "retain_accuracy": [1] * 175}
    assert bootstrap(ACC, [({}, rows)], reads=ACC.rests_on).rows == 3
    assert bootstrap(ACC, [({}, rows)]).rows == 175  # without `reads`: every metric's rows
    score = parse_expr("forget_score")
    assert score.rests_on == ("forget_score", "forget_accuracy", "forget_mcq_accuracy")
    assert parse_expr("min(a, forget_accuracy)").rests_on == ("a", "forget_accuracy")
    assert bootstrap(score, [({"forget_score": 0.5}, rows)], reads=score.rests_on).rows == 4


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, True, "0.9"])
def test_a_level_outside_zero_one_is_refused(level):
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        check_level(level)


def test_overlapping_methods_are_tied_and_the_rest_ranked():
    def iv(e, lo, hi):
        return Interval(e, lo, hi, 0.95, 3, 20, True)

    ivs = {"A": iv(0.10, 0.05, 0.20), "B": iv(0.15, 0.12, 0.30), "C": iv(0.40, 0.25, 0.50), "D": iv(0.60, 0.55, 0.7),
           "E": iv(math.nan, math.nan, math.nan)}
    # A leads; B overlaps A, C does not (0.25 > 0.20); then C leads, D does not overlap it (0.55 > 0.50)
    assert tied_groups(ivs) == [["A", "B"], ["C"], ["D"], ["E"]]
    assert tied_groups(ivs, lower_is_better=False) == [["D"], ["C", "B"], ["A"], ["E"]]  # B overlaps C (0.25 <= 0.30)


def test_the_interval_is_the_two_sided_quantiles_of_the_draws():
    """40 rows, half right: a draw's mean is Binomial(40, 1/2)/40. P(X ≤ 25) = 0.960 and P(X ≤ 26) = 0.981, so the
    97.5% quantile is 26/40 = 0.65 (a one-sided 95% bound would be 25/40); by symmetry the 2.5% one is 14/40."""
    iv = bootstrap(ACC, [({}, {"forget_accuracy": [1] * 20 + [0] * 20})], draws=4000)
    assert (iv.low, iv.high) == (0.35, 0.65)


def test_a_draw_group_pairs_rows_and_separate_groups_are_drawn_apart():
    """a - b with a = b row by row: one draw for both (the default, equal lengths) keeps it 0; a group each draws
    them independently, so the difference spreads to both sides; `whole` hands the score the resampled rows."""
    diff = parse_expr("a - b")
    rows = {"a": [0, 1, 0, 1, 1], "b": [0, 1, 0, 1, 1]}
    apart = bootstrap(diff, [({}, rows)], group=lambda key, n: key)
    assert apart.estimate == 0.0 and apart.low < -0.2 and apart.high > 0.2
    # max of resampled [0, 1]: 0 when both draws pick row 0 (chance 1/4), else 1; the rows as they are: 1
    seen = []
    top = bootstrap(lambda m: seen.append(type(m["x"])) or float(max(m["x"])), [({}, {"x": [0, 1]})],
                    whole=("x",), draws=4000)
    assert (top.estimate, top.low, top.high) == (1.0, 0.0, 1.0) and set(seen) == {np.ndarray}
    with pytest.raises(ValueError, match="draw group .g. holds metrics of 2 and of 5 rows"):
        bootstrap(diff, [({}, {"a": [0] * 5, "b": [0, 1]})], group=lambda key, n: "g")


def test_the_default_draws_are_those_of_before_groups_existed():
    """The default group (by length) consumes the generator as it always did: the interval of a fixed table is
    the one computed before `group` was added (0.6, 0.8525 at 20 draws, seed 0)."""
    rows = {"forget_accuracy": [1, 0, 1, 1, 0, 1, 1, 1, 0, 1], "retain_accuracy": [1, 0] * 7}
    iv = bootstrap(ACC, [({}, rows), ({}, {k: v[::-1] for k, v in rows.items()})], draws=20)
    assert (iv.low, iv.high) == pytest.approx((0.6, 0.8525))


def test_a_ratio_to_a_reference_on_the_same_rows_is_paired():
    """The same rows for both sides: a/a is 1 in every draw; against a reference that is 1 on every row the ratio
    is the model's own mean ([0, 1] → 0.5 with the draws' 0, 0.5, 1); a zero reference gives NaN."""
    own = ({}, {"acc": [0, 1, 0, 1]})
    same = bootstrap(ratio_to_reference("acc"), [paired(own, ({}, {"acc": [0, 1, 0, 1]}))])
    assert (same.estimate, same.low, same.high) == (1.0, 1.0, 1.0)
    one = bootstrap(ratio_to_reference("acc"), [paired(({}, {"acc": [0, 1]}), ({}, {"acc": [1, 1]}))], draws=4000)
    assert (one.estimate, one.low, one.high) == (0.5, 0.0, 1.0)
    assert paired(({"x": 1}, {}), ({"x": 2}, {}))[0] == {"x": 1, "θ0:x": 2}
    assert math.isnan(ratio_to_reference("acc")({"acc": 0.5, "θ0:acc": 0.0}))
    doubled = ratio_to_reference("acc", derive=lambda m: {**m, "acc": 2 * m["acc"]} if "acc" in m else m)
    assert doubled({"acc": 0.5, "θ0:acc": 0.25}) == 2.0  # both sides derived: (2·0.5) / (2·0.25)
