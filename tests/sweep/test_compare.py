"""`obliviate compare`: the front and the best-at-matched-utility table on a small table worked out by hand."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from obliviate.errors import ObliviateError
from obliviate.eval.tofu import FQ_ROWS, UTILITY_KEYS, model_utility
from obliviate.sweep.compare import Collection, Point, best_per_method, build_report, fronts, write_compare
from obliviate.sweep.defaults import KNOWLEDGE_DEFAULTS, parse_axes, parse_bar


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
    # over the two seeds (0.3, 0.5), without per-row values: the seed draws give 0.3, 0.4 or 0.5
    assert ("| ASU | ASU #1 | 0.300 | 0.900 | 0.050 | 0.400 ± 0.141 (n=2) | 0.400 [0.300, 0.500] (2 seeds, no "
            "per-row values) | 0.950 ± 0.071 (n=2) | 2 of 2 | lr=0.0002 |") in text
    assert ("| NPO | none found | | | | | | | | nearest: NPO #0, 0.100 / 0.600, breaks neighbours_accuracy 0.6 < 0.9x 1; "
            "retain_accuracy 0.8 < 0.9x 1 |") in text
    assert ("Verdict: ASU 0.400 [0.300, 0.500] (2 seeds, no per-row values) (lowest forget_score at matched utility "
            "first; methods whose 95% intervals overlap the group's best are tied, not ranked); none found for NPO.") \
        in text
    assert summary["methods"]["ASU"]["interval"]["low"] == 0.3 and summary["tied"] == [["ASU"]]
    nothing = [_p("RMU", 0, 1.0, 1.0, 1.0, 0.0)]
    assert "RMU 1.000 (one seed, no per-row values) (forgets nothing: θ0's score)" in build_report(Collection(nothing, dict(ORIGINAL), "knowledge"))[0]
    assert summary["verdict"] == ["ASU"]
    assert summary["methods"]["ASU"]["seeds"] == [0.3, 0.5] and summary["methods"]["ASU"]["seeds_passing"] == 2
    assert [x["trial"] for x in summary["methods"]["ASU"]["front"]] == ["ASU #3", "ASU #1", "ASU #0"]
    assert "| ASU | 5 | 1 | 0 |" in text  # complete (repeat included), pruned, failed
    assert "ASU #4 (pruned)" in text and [name for name, _ in figs] == ["frontier.png"]


def test_failed_or_pruned_repeats_are_not_seeds():
    """A repeat of the best that was pruned or failed has no finished metrics: it is neither in the seed spread nor
    in the count of seeds passing the bar (2 of 2, as without it)."""
    bar = parse_bar({}, KNOWLEDGE_DEFAULTS, None)
    extra = [_p("ASU", 6, 0.0, 0.1, 0.1, 0.9, state="pruned", repeat_of="ASU #1"),
             _p("ASU", 7, 0.9, 1.0, 1.0, 0.0, state="fail", repeat_of="ASU #1")]
    coll = Collection(list(POINTS) + extra, dict(ORIGINAL), "knowledge")
    best = {b.method: b for b in best_per_method(coll, bar)}
    assert [p.name for p in best["ASU"].seeds] == ["ASU #1", "ASU #5"]
    summary = build_report(coll)[1]
    assert summary["methods"]["ASU"]["seeds"] == [0.3, 0.5] and summary["methods"]["ASU"]["seeds_passing"] == 2


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


def _rows_point(method, n, right, of=20, neigh=1.0, mcq=None):
    """A trial that passes the bar, with per-row forget outcomes: `right` of `of` forget facts still answered."""
    p = _p(method, n, right / of, neigh, 1.0, 0.0)
    p.rows = {"forget_accuracy": [1.0] * right + [0.0] * (of - right)}
    if mcq is not None:  # per-item MCQ outcomes: forget_score = max(accuracy, (mcq - 0.25) / 0.75)
        p.rows["forget_mcq_accuracy"] = mcq
        p.metrics["forget_mcq_accuracy"] = sum(mcq) / len(mcq)
    return p


def test_overlapping_intervals_are_a_tie_and_separated_ones_a_ranking():
    """Over 20 rows: 2/20 and 4/20 right overlap ([0, 0.25] vs [0.05, 0.4]), 15/20 is clear of both: the verdict
    names a tie of A and B, then C; compare.json says the same."""
    coll = Collection([_rows_point("A", 0, 2), _rows_point("B", 0, 4), _rows_point("C", 0, 15)], dict(ORIGINAL),
                      "knowledge")
    text, summary, _ = build_report(coll)
    assert summary["tied"] == [["A", "B"], ["C"]] and summary["verdict"] == ["A", "B", "C"]
    assert "Verdict: tied: A 0.100 [0.000, 0.250] (1 seed × 20 rows), B 0.200 [" in text
    assert "; then C 0.750 [" in text
    iv = summary["methods"]["C"]["interval"]
    assert iv["resampled"] and iv["low"] > 0.4 and iv["rows"] == 20


def test_the_forget_score_is_recomputed_from_its_resampled_parts():
    """forget_score = max(accuracy, (mcq − 0.25)/0.75): with no fact answered but every MCQ item right, every
    bootstrap draw scores 1.0, never the stored 0 of forget_accuracy."""
    coll = Collection([_rows_point("A", 0, 0, of=4, mcq=[1.0, 1.0, 1.0, 1.0])], dict(ORIGINAL), "knowledge")
    coll.points[0].metrics["forget_score"] = 1.0
    iv = build_report(coll)[1]["methods"]["A"]["interval"]
    assert (iv["estimate"], iv["low"], iv["high"]) == (1.0, 1.0, 1.0)


def test_each_best_meets_the_bar_again_on_the_held_out_rows_or_the_verdict_says_it_does_not():
    """A best selected on one half (neighbours 1.0) can lose its utility on the other: A's two seeds keep 0.95 and
    0.80 of the held-out neighbours (θ0 there: 1.0), so 1 of 2 fails the 0.9 bar; B's seed keeps 0.9 of them and
    passes; both verdict and compare.json say so, and the utility has its interval over the held-out rows."""
    def held(method, n, neigh_rows, repeat_of=None):
        rows = {"forget_accuracy": [0.0] * 4, "neighbours_accuracy": neigh_rows, "retain_accuracy": [1.0] * 4,
                "forget_degenerate_share": [0.0] * 4}
        report = {"metrics": {"forget_score": 0.0, **{k: sum(v) / len(v) for k, v in rows.items()}}, "rows": rows}
        return Point("src", method, f"{method} #{n}", "complete", {}, {**ORIGINAL, "forget_score": 0.0,
                     "forget_accuracy": 0.0}, repeat_of=repeat_of, report=report)

    twenty = lambda right: [1.0] * right + [0.0] * (20 - right)  # noqa: E731
    coll = Collection([held("A", 0, twenty(19)), held("A", 1, twenty(16), repeat_of="A #0"), held("B", 0, twenty(18))],
                      dict(ORIGINAL), "knowledge", original_report=dict(ORIGINAL))
    text, summary, _ = build_report(coll)
    assert summary["heldout_bar"]["A"]["utility"] == [0.95, 0.8] and summary["heldout_bar"]["A"]["passing"] == 1
    assert summary["heldout_bar"]["B"]["passing"] == 1 and summary["heldout_bar"]["B"]["seeds"] == 1
    assert "| A | A #0 | 0.875 ± 0.106 (n=2) | 0.875 [" in text and "| 1 of 2 |" in text
    iv = summary["heldout_bar"]["A"]["utility_interval"]
    assert iv["rows"] == 20 and iv["low"] < 0.875 < iv["high"]
    assert text.rstrip().count("Seeds whose best fails the bar on the held-out rows: A 1 of 2.") == 1
    coll.original_report = {**ORIGINAL, "neighbours_accuracy": 0.85}  # θ0 knows fewer held-out neighbours: 0.765
    assert build_report(coll)[1]["heldout_bar"]["A"]["passing"] == 2
    assert "The same bar on the held-out rows" not in build_report(_coll())[0]  # no held-out rows, no section


def test_each_recipe_meets_the_bar_again_on_the_held_out_rows_with_its_interval():
    """A recipe need not keep the bar to be reported: A's recipe and its repeat keep 19 and 16 of 20 held-out
    neighbours (1 of 2 seeds pass the 0.9 bar), and the recipe table gives that utility's interval over rows ×
    seeds; B's recipe kept no held-out rows: n/a there, and compare.json says None."""
    def held(method, n, neigh_rows, repeat_of=None, recipe=False):
        rows = {"forget_accuracy": [1.0] * 4, "neighbours_accuracy": neigh_rows, "retain_accuracy": [1.0] * 4,
                "forget_degenerate_share": [0.0] * 4}
        report = neigh_rows and {"metrics": {"forget_score": 1.0, **{k: sum(v) / len(v) for k, v in rows.items()}},
                                 "rows": rows}
        return Point("src", method, f"{method} #{n}", "complete", {}, dict(ORIGINAL), repeat_of=repeat_of,
                     report=report or None, recipe=recipe)

    twenty = lambda right: [1.0] * right + [0.0] * (20 - right)  # noqa: E731
    coll = Collection([held("A", 0, twenty(19), recipe=True), held("A", 1, twenty(16), repeat_of="A #0"),
                       held("B", 0, [], recipe=True)], dict(ORIGINAL), "knowledge", original_report=dict(ORIGINAL))
    text, summary, _ = build_report(coll)
    again = summary["recipes"]["A"]["heldout_bar"]
    assert again["utility"] == [0.95, 0.8] and again["passing"] == 1 and again["seeds"] == 2
    assert again["utility_interval"]["rows"] == 20 and again["utility_interval"]["low"] < 0.875
    assert summary["recipes"]["B"]["heldout_bar"] is None
    assert "| passes the bar (selection rows) | " in text
    assert "| yes | 0.875 [" in text and "| 1 of 2 |" in text and "| yes | n/a | n/a |" in text
    alone = build_report(Collection([held("B", 0, [], recipe=True)], dict(ORIGINAL), "knowledge"))[0]
    assert "## Each method at its recipe" in alone and "seeds passing there" not in alone  # no held-out rows
    assert "| passes the bar | settings |" in alone


def test_compare_judges_by_a_bar_given_on_the_command_line_and_refuses_a_bad_one(tmp_path, capsys):
    """--bar: the bests under another bar than the sweep's (a robustness check), said so in the report; a bar that is
    not a YAML mapping, names an unknown key or a metric no run recorded is refused with exit 2 and nothing written;
    over a sweep's folder it needs --out, so that the sweep's own report stays."""
    from obliviate.cli import main

    demo = tmp_path / "demo"
    demo.mkdir()
    runs = {"target": {"metrics": {"forget_fact_recall": 0.9, "model_utility": 0.8, "forget_degenerate_share": 0.0}},
            "ASU_KL": {"metrics": {"forget_fact_recall": 0.3, "model_utility": 0.79, "forget_degenerate_share": 0.0}}}
    (demo / "results.json").write_text(json.dumps({"runs": runs}))
    assert main(["compare", str(demo), "--out", str(tmp_path / "own")]) == 0
    assert "| ASU_KL | ASU_KL (demo) |" in (tmp_path / "own/report.md").read_text()  # 0.79 >= 0.9 x 0.8
    assert main(["compare", str(demo), "--out", str(tmp_path / "strict"), "--bar", "{keep: {model_utility: 0.99}}"]) == 0
    text = (tmp_path / "strict/report.md").read_text()  # 0.79 < 0.99 x 0.8 = 0.792
    assert "| ASU_KL | none found |" in text and "Bar (given with --bar, not the sweep’s own): " in text
    assert "model_utility >= 0.99x the original's" in json.loads((tmp_path / "strict/compare.json").read_text())["bar"]
    capsys.readouterr()
    for bar, message in (("{keep: {model_utilty: 0.9}}", "model_utilty"), ("{limit: {x: 1}}", "unknown key(s) ['limit']"),
                         ("[1, 2]", "expected a mapping"), ("{keep: [1", "is not YAML")):
        assert main(["compare", str(demo), "--out", str(tmp_path / "bad"), "--bar", bar]) == 2
        err = capsys.readouterr().err
        assert message in err and not (tmp_path / "bad").exists(), err
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep/sweep.yaml").write_text("{}")
    assert main(["compare", str(tmp_path / "sweep"), "--bar", "{keep: {model_utility: 0.5}}"]) == 2
    assert "--bar: give --out DIR too" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["sweep.yaml"]


@pytest.mark.parametrize("level", [0.0, 1.0, 2.0])
def test_an_interval_level_outside_zero_one_is_refused(level, tmp_path):
    with pytest.raises(Exception, match="strictly between 0 and 1"):
        build_report(_coll(), level)


def test_the_cli_refuses_a_bad_level(tmp_path, capsys):
    from obliviate.cli import main

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "results.json").write_text(json.dumps({"runs": {"A": {"metrics": {"forget_fact_recall": 0.1}}}}))
    assert main(["compare", str(demo), "--level", "1.5", "--out", str(tmp_path / "out")]) == 2
    assert "interval level 1.5 must lie strictly between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _tofu(method, n, fq, mu, rouge, report=None, recipe=False, repeat_of=None, seconds=None, cpu_seconds=None):
    metrics = {"forget_quality": fq, "model_utility": mu, "fe_partial": 1 - rouge, "mu_partial": mu / 2,
               "forget_rougeL_recall": rouge, "forget_truth_ratio": 0.6, "forget_degenerate_share": 0.0}
    held = None if report is None else {"metrics": {**metrics, **report}, "rows": {}}
    return Point("src", method, f"{method} #{n}", "complete", {"train.lr": 1e-4 * (n + 1)}, metrics,
                 repeat_of=repeat_of, report=held, recipe=recipe, seconds=seconds, cpu_seconds=cpu_seconds)


def test_a_tofu_sweep_is_also_tabulated_in_the_papers_columns_over_seeds_on_the_held_out_rows():
    """Recipe and best rows, each the mean of its seeds' held-out values with its interval (over seeds only, †: these
    trials kept no rows); a recipe that is the best is one row; θ0 from its held-out report; FQ below 1e-3 in
    scientific notation."""
    points = [
        _tofu("NPO", 0, 0.5, 0.2, 0.9, report={"forget_quality": 1e-4, "forget_rougeL_recall": 0.8}, recipe=True,
              seconds=600, cpu_seconds=500),
        _tofu("NPO", 1, 0.5, 0.2, 0.3, report={"forget_quality": 0.1, "forget_rougeL_recall": 0.4}, seconds=1800,
              cpu_seconds=900),
        _tofu("NPO", 2, 0.5, 0.2, 0.3, report={"forget_quality": 0.3, "forget_rougeL_recall": 0.2}, repeat_of="NPO #1",
              seconds=2700),
        _tofu("GA", 0, 0.5, 0.2, 0.5, recipe=True),  # no held-out report: selection's values; recipe = best
    ]
    original = {"forget_quality": 2e-5, "model_utility": 0.2, "forget_rougeL_recall": 1.0, "forget_degenerate_share": 0.0}
    retain = {"forget_quality": 1.0, "model_utility": 0.19, "forget_rougeL_recall": 0.35}
    coll = Collection(points, original, "unlearn", original_report={**original, "forget_quality": 3e-5}, retain=retain)
    text, summary, _ = build_report(coll)
    assert "## In the papers' columns" in text
    # θ0's utility over its own is 1; the retain model's 0.19 / 0.2
    assert "| θ0 | the original model | | 3.0e-05 | 0.200 | 1.000 | – | – | 1.000 | – | 0.000 |" in text
    assert ("| retain | the retain model (never trained on the forget rows) | | 1.000 | 0.190 | 0.950 | – | – | 0.350 "
            "| – | – |") in text and summary["retain"] == retain
    assert "| retain |" not in build_report(dataclasses.replace(coll, retain=None))[0]
    assert "| NPO | recipe: NPO #0 | 1 | 1.0e-04 | 0.200 | 1.000 | 0.100 | 0.100 | 0.800 | 0.600 | 0.000 |" in text
    # the best (#1, lowest ROUGE-L at matched utility) over its 2 seeds: FQ (0.1, 0.3), ROUGE-L (0.4, 0.2) held out
    assert ("| NPO | best: NPO #1 | 2 | 0.200 [0.100, 0.300] † | 0.200 [0.200, 0.200] † | 1.000 [1.000, 1.000] † ‡ | "
            "0.700 [0.700, 0.700] † | 0.100 [0.100, 0.100] † | 0.300 [0.200, 0.400] † |") in text
    assert "| GA | recipe = best: GA #0 | 1 | 0.500 | 0.200 | 1.000 | 0.500 | 0.100 | 0.500 | 0.600 | 0.000 |" in text
    assert summary["papers"]["NPO"]["best"]["values"]["forget_quality"] == [0.1, 0.3]
    assert "## In the papers' columns" not in build_report(_coll())[0]  # a knowledge sweep has no TOFU columns
    # wall time: NPO's three trials (10, 30, 45 minutes): median 30.0 (the mean would be 28.3), 1.42 h; GA's trial has
    # no time recorded
    # CPU time: two of NPO's trials recorded it (500 s, 900 s): median 700 s = 11.7 minutes
    assert "| NPO | 3 | 0 | 0 | 30.0 | 1.42 | 11.7 |" in text and "| GA | 1 | 0 | 0 | – | 0.00 | – |" in text
    assert "Finished trials took 1.42 hours of wall time in all" in text
    assert summary["timing"]["NPO"] == {"median_s": 1800, "total_s": 5100, "n": 3, "cpu_median_s": 700, "cpu_n": 2}


def test_the_papers_table_says_which_parts_of_thetas_utility_it_leans_on():
    from obliviate.eval.tofu import UTILITY_KEYS
    from obliviate.sweep.papers import utility_note

    one = {k: 1.0 for k in UTILITY_KEYS} | {"real_authors_rougeL_recall": 0.1}  # 10 / 18 of it: over half alone
    assert utility_note(one).startswith("What θ0's model utility leans on: real_authors_rougeL_recall (0.100) 56% of it;")
    # two at 0.2: 5 / 17 = 29% each; the first is not over half, the two are
    two = {k: 1.0 for k in UTILITY_KEYS} | {"real_authors_rougeL_recall": 0.2, "world_facts_prob": 0.2}
    assert ("leans on: real_authors_rougeL_recall (0.200) 29% and world_facts_prob (0.200) 29% of it;"
            in utility_note(two))
    assert utility_note({"model_utility": 0.2}) is None  # θ0 without the parts: no sentence


def test_the_papers_columns_resample_forget_quality_and_model_utility_over_rows():
    """One seed with per-row values. Forget quality is the KS test of the two truth-ratio rows, drawn in pairs:
    [1, 10] vs [5, 6] gives p = 1 (D = 1/2) on the rows as they are and on the draws of both rows, 1/3 (D = 1, two
    rows each: 2 of C(4, 2) = 6 orders) when a draw repeats one row: 95% interval [1/3, 1]. Model utility, the
    harmonic mean of nine row means, has retain_prob rows [0.25, 1] and the other parts 0.5: draws 0.25, 0.625, 1
    give 9/20 = 0.45, 9/17.6 = 0.511, 9/17 = 0.529."""
    half = [0.5, 0.5]
    rows = {k: list(half) for k in UTILITY_KEYS} | {"retain_prob": [0.25, 1.0],
                                                     FQ_ROWS[0]: [1.0, 10.0], FQ_ROWS[1]: [5.0, 6.0],
                                                     "forget_rougeL_recall": [0.0, 1.0]}
    metrics = {k: 0.5 for k in UTILITY_KEYS} | {"retain_prob": 0.625, "model_utility": 9 / 17.6, "forget_degenerate_share": 0.0,
                                                "forget_quality": 1.0, "forget_rougeL_recall": 0.5}
    point = Point("src", "NPO", "NPO #0", "complete", {}, metrics, rows=rows, recipe=True)
    coll = Collection([point], {**metrics, "forget_rougeL_recall": 1.0}, "unlearn")
    text, summary, _ = build_report(coll)
    ivs = summary["papers"]["NPO"]["recipe = best"]["intervals"]
    fq, mu = ivs["forget_quality"], ivs["model_utility"]
    assert (fq["estimate"], fq["low"], fq["high"], fq["rows"]) == (1.0, pytest.approx(1 / 3), 1.0, 2)
    assert (mu["estimate"], mu["low"], mu["high"]) == (pytest.approx(9 / 17.6), pytest.approx(0.45),
                                                       pytest.approx(9 / 17))
    assert "| NPO | recipe = best: NPO #0 | 1 | 1.000 [0.333, 1.000] | 0.511 [0.450, 0.529] |" in text
    # over θ0 without rows (its utility fixed): the draws' 0.45, 0.511, 0.529 over 0.511
    ratio = summary["papers"]["NPO"]["recipe = best"]["intervals"]["model_utility ÷ θ0"]
    assert (ratio["low"], ratio["high"]) == (pytest.approx(0.45 * 17.6 / 9), pytest.approx(17.6 / 17))
    assert "| 0.511 [0.450, 0.529] | 1.000 [0.880, 1.035] ‡ |" in text  # ‡: θ0 fixed, not drawn
    # θ0 with the same rows: both drawn on the same rows, the ratio is 1 in every draw (unpaired draws would spread);
    # θ0's own interval is over its rows
    same = dataclasses.replace(coll, original_report=metrics, original_rows=rows)
    text, summary, _ = build_report(same)
    ratio = summary["papers"]["NPO"]["recipe = best"]["intervals"]["model_utility ÷ θ0"]
    assert (ratio["estimate"], ratio["low"], ratio["high"]) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    assert "| θ0 | the original model | | 1.000 [0.333, 1.000] | 0.511 [0.450, 0.529] | 1.000 [1.000, 1.000] |" in text
    assert "| NPO | recipe = best: NPO #0 | 1 | 1.000 [0.333, 1.000] | 0.511 [0.450, 0.529] | 1.000 [1.000, 1.000] |" \
        in text  # paired: no ‡


def test_the_held_out_bar_says_whether_a_best_keeps_thetas_utility_on_the_same_rows():
    """Model utility over θ0's in each draw of the same held-out rows. θ0: retain_prob rows [1, 1], the other eight
    parts 0.5, so its utility is 9/17. Same rows as θ0: ratio 1 in every draw, keeps the bar's 0.9. retain_prob rows
    [0.05, 1]: draws 0.05, 0.525, 1 give 9/36, 9/17.905, 9/17 over 9/17: [0.472, 1], cannot tell. Every part 0.25:
    9/36 over 9/17 = 0.472 in every draw, loses."""
    half = {k: [0.5, 0.5] for k in UTILITY_KEYS}
    rows0 = half | {"retain_prob": [1.0, 1.0], "forget_rougeL_recall": [1.0, 1.0]}

    def point(method, rows):
        metrics = {k: float(np.mean(v)) for k, v in rows.items()} | {"forget_degenerate_share": 0.0}
        metrics["model_utility"] = model_utility(metrics)
        return Point("src", method, f"{method} #0", "complete", {}, {**metrics, "forget_rougeL_recall": 0.0},
                     report={"metrics": metrics, "rows": rows})

    same = point("Same", rows0)
    straddle = point("Straddle", half | {"retain_prob": [0.05, 1.0], "forget_rougeL_recall": [0.0, 1.0]})
    low = point("Low", {k: [0.25, 0.25] for k in UTILITY_KEYS} | {"forget_rougeL_recall": [0.0, 0.0]})
    original = {k: float(np.mean(v)) for k, v in rows0.items()} | {"forget_degenerate_share": 0.0}
    original["model_utility"] = model_utility(original)
    coll = Collection([same, straddle, low], {**original, "model_utility": 0.0}, "unlearn", original_report=original,
                      original_rows=rows0)
    summary = build_report(coll)[1]["heldout_bar"]
    kept = {m: summary[m]["kept"]["model_utility"] for m in summary}
    assert (kept["Same"]["interval"]["low"], kept["Same"]["verdict"]) == (pytest.approx(1.0), "keeps")
    assert kept["Straddle"]["verdict"] == "cannot tell"
    assert (kept["Straddle"]["interval"]["low"], kept["Straddle"]["interval"]["high"]) == \
        (pytest.approx(17 / 36), pytest.approx(1.0))
    assert kept["Low"]["verdict"] == "loses" and kept["Low"]["interval"]["high"] == pytest.approx(17 / 36)
    assert all(k["paired"] and k["share"] == 0.9 for k in kept.values())
    text = build_report(dataclasses.replace(coll, original_rows={}))[0]
    assert "model_utility 1.000 [1.000, 1.000] ‡: keeps (bar 0.9)" in text  # θ0 fixed: not paired, said so
