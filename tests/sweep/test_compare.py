"""`obliviate compare`: the front and the best-at-matched-utility table on a small table worked out by hand."""
from __future__ import annotations

import json

import pytest

from obliviate.errors import ObliviateError
from obliviate.sweep.compare import Collection, Point, best_per_method, build_report, fronts, write_compare
from obliviate.sweep.tracks import KNOWLEDGE_DEFAULTS, parse_axes, parse_bar


def _p(method, n, forget, neigh, retain, degenerate, state="complete", repeat_of=None, mcq=0.25):
    return Point("src", method, f"{method} #{n}", state, {"train.lr": 1e-4 * (n + 1)},
                 {"forget_accuracy": forget, "forget_mcq_accuracy": mcq, "forget_score": forget,
                  "neighbours_accuracy": neigh, "retain_accuracy": retain, "forget_degenerate_share": degenerate},
                 repeat_of=repeat_of)


ORIGINAL = {"forget_score": 1.0, "neighbours_accuracy": 1.0, "retain_accuracy": 1.0, "forget_degenerate_share": 0.0}
POINTS = [
    _p("ASU", 0, 0.6, 1.0, 1.0, 0.0),    # front (best utility)
    _p("ASU", 1, 0.3, 0.95, 0.9, 0.05),  # front; passes the bar (0.95 >= 0.9, 0.9 >= 0.9, 0.05 <= 0.1): ASU's best
    _p("ASU", 2, 0.4, 0.9, 0.9, 0.0),    # dominated by #1 (more forget, utility min 0.9 = #1's 0.9)
    _p("ASU", 3, 0.0, 0.5, 0.9, 0.3),    # front (lowest forget); fails the bar
    _p("ASU", 4, 0.0, 0.2, 0.2, 0.0, state="pruned"),  # pruned: never on a front
    _p("ASU", 5, 0.5, 1.0, 1.0, 0.0, repeat_of="ASU #1"),  # a repeat of #1 with another seed
    _p("NPO", 0, 0.1, 0.6, 0.8, 0.0),    # front; fails the bar
    _p("NPO", 1, 0.2, 0.6, 0.7, 0.0),    # dominated by #0 (more forget, the same utility min 0.6)
]


def _coll():
    return Collection(list(POINTS), dict(ORIGINAL), "knowledge")


def test_fronts_equal_the_pareto_front_worked_out_by_hand():
    axes = parse_axes({}, KNOWLEDGE_DEFAULTS, None)
    f = fronts(_coll(), axes)
    assert [p.name for p in f["ASU"]] == ["ASU #3", "ASU #1", "ASU #0"]  # sorted by forget score
    assert [p.name for p in f["NPO"]] == ["NPO #0"]


def test_best_at_matched_utility_with_its_seed_spread_or_none_found():
    bar = parse_bar({}, KNOWLEDGE_DEFAULTS, None)
    best = {b.method: b for b in best_per_method(_coll(), bar)}
    assert best["ASU"].point.name == "ASU #1" and [p.name for p in best["ASU"].seeds] == ["ASU #1", "ASU #5"]
    assert best["NPO"].point is None
    text, summary, figs = build_report(_coll())
    assert ("| ASU | ASU #1 | 0.300 | 0.900 | 0.050 | 0.400 ± 0.141 (n=2) | 0.950 ± 0.071 (n=2) | 2 of 2 | "
            "lr=0.0002 |") in text
    assert ("| NPO | none found | | | | | | | nearest: NPO #0, 0.100 / 0.600, breaks neighbours_accuracy 0.6 < 0.9x 1; "
            "retain_accuracy 0.8 < 0.9x 1 |") in text
    assert "Verdict: ASU 0.300 (lowest forget score at matched utility first); none found for NPO." in text
    nothing = [_p("RMU", 0, 1.0, 1.0, 1.0, 0.0)]
    assert "RMU 1.000 (forgets nothing: θ0's score)" in build_report(Collection(nothing, dict(ORIGINAL), "knowledge"))[0]
    assert summary["verdict"] == ["ASU"]
    assert summary["methods"]["ASU"]["seeds"] == [0.3, 0.5] and summary["methods"]["ASU"]["seeds_passing"] == 2
    assert [x["trial"] for x in summary["methods"]["ASU"]["front"]] == ["ASU #3", "ASU #1", "ASU #0"]
    assert "| ASU | 5 | 1 | 0 |" in text  # complete (repeat included), pruned, failed
    assert "ASU #4 (pruned)" in text and [name for name, _ in figs] == ["frontier.png"]


def test_a_stricter_bar_changes_the_winner():
    bar = parse_bar({"keep": {"neighbours_accuracy": 0.99}}, KNOWLEDGE_DEFAULTS, None)
    best = {b.method: b.point for b in best_per_method(_coll(), bar)}
    assert best["ASU"].name == "ASU #0"  # the only trial keeping 99% of the neighbours


def test_compare_reads_demo_results_and_refuses_a_directory_without_runs(tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    runs = {"target": {"metrics": {"forget_fact_recall": 0.9, "model_utility": 0.8, "forget_degenerate_share": 0.0}},
            "ASU_KL": {"metrics": {"forget_fact_recall": 0.3, "model_utility": 0.79, "forget_degenerate_share": 0.0}},
            "GradDiff": {"metrics": {"forget_fact_recall": 0.0, "model_utility": 0.5, "forget_degenerate_share": 1.0}}}
    (demo / "results.json").write_text(json.dumps({"runs": runs}))
    report = write_compare([str(demo)], tmp_path / "cmp", log=lambda s: None)
    text = report.read_text()
    assert "| ASU_KL | ASU_KL (demo) | 0.300 | 0.790 | 0.000 |" in text  # 0.79 >= 0.9 x 0.8
    assert "| GradDiff | none found |" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ObliviateError, match=r"compare: .*empty holds no runs \(no sweep.yaml, results.json or "
                                             r"metrics.json\)"):
        write_compare([str(empty)], tmp_path / "cmp2", log=lambda s: None)
    assert not (tmp_path / "cmp2").exists()
    with pytest.raises(ObliviateError, match="compare: .*nowhere is not a directory"):
        write_compare([str(tmp_path / "nowhere")], tmp_path / "cmp3", log=lambda s: None)
