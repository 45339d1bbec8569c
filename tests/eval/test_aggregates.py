"""TOFU's aggregates recomputed from resampled parts: hand-worked values."""
from __future__ import annotations

import numpy as np
import pytest

from obliviate.eval.aggregates import PARTS, parts_of, row_group, with_tofu_aggregates
from obliviate.eval.intervals import bootstrap
from obliviate.eval.tofu import FQ_ROWS, UTILITY_KEYS


def test_each_split_is_its_own_draw_group():
    assert [row_group(k, 20) for k in ("forget_quality_tr", "forget_prob", "retain_truth_ratio",
                                       "real_authors_prob", "world_facts_rougeL_recall")] == \
        ["forget", "forget", "retain", "real_authors", "world_facts"]
    assert row_group("other_accuracy", 3) == "3 rows"


def test_an_aggregate_rests_on_itself_and_its_parts():
    assert parts_of(("model_utility",)) == ("model_utility", *UTILITY_KEYS)
    assert parts_of(("forget_quality", "forget_rougeL_recall")) == ("forget_quality", *FQ_ROWS, "forget_rougeL_recall")
    assert PARTS["fe_partial"] == ("forget_rougeL_recall", "forget_prob", "forget_truth_ratio",
                                   "forget_cosine_similarity", "forget_entailment_score")
    assert len(PARTS["mu"]) == 18 and "retain_token_entropy" in PARTS["mu"]


def test_model_utility_and_forget_quality_are_recomputed_from_their_parts():
    """Eight parts 0.5 and one 0.25: 9 / (8·2 + 4) = 0.45 replaces a stale 0.99; the KS test of [1, 2, 3] against
    [10, 11, 12] (D = 1, 2 of C(6, 3) = 20 orders) gives p = 0.1; without both arrays forget quality stays."""
    m = {k: 0.5 for k in UTILITY_KEYS} | {"world_facts_prob": 0.25, "model_utility": 0.99, "forget_quality": 0.5}
    out = with_tofu_aggregates({**m, FQ_ROWS[0]: np.array([1.0, 2, 3]), FQ_ROWS[1]: np.array([10.0, 11, 12])})
    assert out["model_utility"] == pytest.approx(0.45) and out["forget_quality"] == pytest.approx(0.1)
    assert with_tofu_aggregates(m)["forget_quality"] == 0.5
    assert with_tofu_aggregates(m, which=("forget_quality",))["model_utility"] == 0.99  # only what is asked
    assert with_tofu_aggregates({"model_utility": 0.3, "retain_prob": 0.5})["model_utility"] == 0.3  # parts missing


def test_closer_look_fe_and_mu_from_tofus_row_means():
    """FE over ROUGE-L 0.5, Prob 0.4 and the closer-look truth ratio 1 - 0.6 (TOFU's forget term 0.6): 1 - 1.3/3;
    the stale forget_cl_truth_ratio 0.9 is replaced; MU over four numbers of each utility split."""
    m = {"forget_rougeL_recall": 0.5, "forget_prob": 0.4, "forget_truth_ratio": 0.6, "forget_cl_truth_ratio": 0.9,
         "fe_partial": 0.0, "mu_partial": 0.0}
    for s in ("retain", "real_authors", "world_facts"):
        m |= {f"{s}_rougeL_recall": 0.5, f"{s}_prob": 0.5, f"{s}_truth_ratio": 0.25, f"{s}_cl_truth_ratio": 0.9,
              f"{s}_token_entropy": 1.0}
    out = with_tofu_aggregates(m)
    assert out["forget_cl_truth_ratio"] == pytest.approx(0.4) and out["retain_cl_truth_ratio"] == 0.25
    assert out["fe_partial"] == pytest.approx(1 - 1.3 / 3) and out["fe"] is None
    # hmean of (0.5, 0.5, 0.25, 1) x 3: 12 / (3 (2 + 2 + 4 + 1)) = 12 / 27
    assert out["mu_partial"] == pytest.approx(12 / 27) and out["mu"] is None
    assert "fe_partial" not in with_tofu_aggregates({"forget_rougeL_recall": 0.5})  # no closer look: none made


def test_a_bootstrap_of_model_utility_resamples_its_parts():
    """retain_prob rows [0.25, 1], the other parts 0.5: the draws' means 0.25, 0.625, 1 give 9/20, 9/17.6, 9/17."""
    rows = {k: [0.5, 0.5] for k in UTILITY_KEYS} | {"retain_prob": [0.25, 1.0]}
    m = {"model_utility": 9 / 17.6}
    iv = bootstrap(lambda x: x["model_utility"], [(m, rows)], derive=with_tofu_aggregates, group=row_group,
                   reads=parts_of(("model_utility",)), draws=4000)
    assert (iv.estimate, iv.low, iv.high, iv.rows) == (pytest.approx(9 / 17.6), pytest.approx(0.45),
                                                       pytest.approx(9 / 17), 2)
    fixed = bootstrap(lambda x: x["model_utility"], [(m, rows)], reads=("model_utility",))
    assert (fixed.low, fixed.high, fixed.rows) == (9 / 17.6, 9 / 17.6, 0)  # without the derive: the stored value
