"""`obliviate compare`'s "ASU across its teacher map": each (τ, layers) point the trials tried, the teacher's numbers
from the map beside the students' counts, best under the bar and lowest forget score (worked out by hand)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from obliviate.sweep.compare import build_report, scales
from obliviate.sweep.points import Collection, Point
from obliviate.sweep.teachermap import cell_rows, map_path, teacher_map_section

ORIGINAL = {"forget_rougeL_recall": 1.0, "model_utility": 0.5, "forget_degenerate_share": 0.0}
SPACE = {"space": {"train.lr": {"float": [1e-5, 1e-4]},
                   "method.forget_args": [{"choices": [{"tau": 2.0, "layers": None}], "methods": ["X"]},
                                          {"teacher_map": "MAP", "methods": ["ASU_KL"]}]},
         "bar": {"keep": {"model_utility": 0.9}, "at_most": {"forget_degenerate_share": 0.1}}}


def _point(n: int, tau: float, layers, forget: float, utility: float, degenerate: float = 0.0, method: str = "ASU_KL",
           **kw) -> Point:
    metrics = {"forget_rougeL_recall": forget, "model_utility": utility, "forget_degenerate_share": degenerate}
    return Point("s", method, f"{method} #{n}",
                 params={"train.lr": 1e-4, "method.forget_args": {"tau": tau, "layers": layers}}, metrics=metrics, **kw)


def _coll(tmp_path: Path) -> Collection:
    grid = [{"tau": 4.0, "layers": [7, 8, 9], "fluent_forgetting": True,
             "forget": {"recall": 0.25, "degenerate": 0.15}, "retain": {"recall": 0.33, "degenerate": 0.0}},
            {"tau": 2.0, "layers": None, "fluent_forgetting": False,
             "forget": {"recall": 0.01, "degenerate": 1.0}, "retain": {"recall": 0.0, "degenerate": 1.0}}]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"base": {"forget": {"recall": 0.98}}, "grid": grid}), encoding="utf-8")
    points = [
        _point(0, 2.0, None, 0.01, 0.10, 0.95),  # forgets, but breaks: fails both conditions
        _point(1, 4.0, [7, 8, 9], 0.40, 0.46, report={"metrics": {"forget_rougeL_recall": 0.44}}),  # passes
        _point(2, 4.0, [7, 8, 9], 0.30, 0.46, 0.2),  # lower, but 20% degenerate: fails the ceiling
        _point(3, 4.0, [7, 8, 9], 0.35, 0.44),  # utility 0.44 < 0.9 x 0.5: fails
        _point(4, 4.0, [7, 8, 9], 0.38, 0.45, report={"metrics": {"forget_rougeL_recall": 0.41}}),  # passes, best
        _point(5, 4.0, [7, 8, 9], 0.10, 0.50, repeat_of="ASU_KL #4"),  # a repeat: not a trial of its own here
        _point(6, 4.0, [7, 8, 9], 0.05, 0.50, state="pruned"),  # not finished
        _point(0, 8.0, [18, 19, 20], 0.6, 0.5, method="ASU_GD"),  # not on the map
        Point("s", "NPO", "NPO #0", params={"train.lr": 1e-4}, metrics=dict(ORIGINAL)),  # no τ: not in the section
    ]
    sweep = json.loads(json.dumps(SPACE).replace("MAP", str(path)))
    return Collection(points, dict(ORIGINAL), "unlearn", sweep)


def test_map_path_is_the_teacher_map_dimension_of_the_sweeps_space():
    assert map_path(SPACE) == "MAP"
    assert map_path({"space": {"method.forget_args": {"teacher_map": "a.json"}}}) == "a.json"
    assert map_path({"space": {"train.lr": {"float": [1, 2]}}}) is None and map_path(None) is None


def test_each_point_tried_gets_its_counts_best_under_the_bar_and_lowest_forget(tmp_path):
    coll = _coll(tmp_path)
    bar, axes = scales(coll)
    rows = {(r["method"], r["tau"]): r for r in cell_rows(coll, bar, axes)}
    assert list(rows) == [("ASU_KL", 2.0), ("ASU_KL", 4.0), ("ASU_GD", 8.0)]  # by τ; NPO has no τ
    mid = rows[("ASU_KL", 4.0)]
    assert (mid["trials"], mid["passing"]) == (4, 2)  # #1-#4; the repeat #5 and the pruned #6 left out
    assert (mid["best"], mid["best_forget"], mid["best_heldout"]) == ("ASU_KL #4", 0.38, 0.41)
    assert (mid["lowest"], mid["lowest_forget"], mid["lowest_fluency"]) == ("ASU_KL #2", 0.30, 0.2)
    low = rows[("ASU_KL", 2.0)]
    assert (low["trials"], low["passing"], low["best"], low["layers"]) == (1, 0, None, None)


def test_the_section_sets_the_teachers_numbers_beside_the_students(tmp_path):
    coll = _coll(tmp_path)
    lines, summary = teacher_map_section(coll, *scales(coll))
    text = "\n".join(lines)
    assert "θ0's forget recall 0.980" in text
    assert "| 4 | 7-9 | 0.250 | 0.330 | 0.150 | yes | ASU_KL | 4 | 2 | ASU_KL #4: 0.380 [0.410] | ASU_KL #2, 0.300, " \
           "0.460, 0.200 |" in text
    assert "| 2 | all | 0.010 | 0.000 | 1.000 | no | ASU_KL | 1 | 0 | none |" in text
    assert "| 8 | 18-20 | not on the map | | | | ASU_GD | 1 | 1 |" in text
    assert [c["tau"] for c in summary["cells"]] == [2.0, 4.0, 8.0]
    report, data, _ = build_report(coll)
    assert "## ASU across its teacher map" in report and data["teacher_map"] == summary


def test_a_sweep_without_a_map_or_an_unreadable_map(tmp_path):
    coll = _coll(tmp_path)
    bar, axes = scales(coll)
    plain = Collection(coll.points, coll.original, "unlearn", {"bar": SPACE["bar"]})
    assert teacher_map_section(plain, bar, axes) == ([], {})
    (tmp_path / "calibration.json").unlink()
    lines, summary = teacher_map_section(coll, bar, axes)
    assert "cannot be read from here" in "\n".join(lines) and len(summary["cells"]) == 3


def test_the_maps_floor_is_the_teacher_that_forgets_most_within_each_fluency_ceiling(tmp_path):
    coll = _coll(tmp_path)
    path = tmp_path / "calibration.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["grid"].append({"tau": 6.0, "layers": [1, 2], "fluent_forgetting": True,  # untried, within 0.1
                         "forget": {"recall": 0.30, "degenerate": 0.05}, "retain": {"recall": 0.4, "degenerate": 0.0}})
    data["config"] = {"degenerate_max": 0.15}  # τ 4 sits exactly on it
    path.write_text(json.dumps(data), encoding="utf-8")
    lines, summary = teacher_map_section(coll, *scales(coll))
    text = "\n".join(lines)
    # the bar's ceiling 0.1: τ 4 (0.15) and τ 2 (1.0) are above it, τ 6 (0.30) is the floor; the map's 0.15 admits τ 4
    assert ("of its 3 points, the teacher that forgets most within the bar's forget_degenerate_share ceiling (at most "
            "0.1 of its replies degenerate) recalls 0.300 (τ 6, layers 1-2; no trial tried it); within the map's own "
            "fluency rule (at most 0.15 of its replies degenerate) recalls 0.250 (τ 4, layers 7-9; 4 trials tried it).") \
        in text
    # lowest students: τ 2 all 0.01 vs teacher 0.01 (+0.000), τ 4 0.30 vs 0.25 (+0.050); τ 8 is not on the map
    assert "from +0.000 to +0.050; at none of the 2 points did a student forget more than its teacher." in text
    assert "a student distilled from a teacher over a ceiling can still answer fluently" in text
    assert [(f["ceiling"], f["tau"], f["recall"]) for f in summary["floors"]] == [(0.1, 6.0, 0.30), (0.15, 4.0, 0.25)]


def test_a_student_below_its_teacher_is_counted_and_no_fluent_point_is_said_so(tmp_path):
    coll = _coll(tmp_path)
    coll.points[0] = _point(0, 2.0, None, 0.004, 0.10, 0.95)  # below its teacher's 0.01
    lines, summary = teacher_map_section(coll, *scales(coll))
    text = "\n".join(lines)  # no config: only the bar's 0.1, which no point of this map stays under
    assert "(at most 0.1 of its replies degenerate): none, no point stays under it." in text
    assert "from -0.006 to +0.050; at 1 of 2 points a student forgot more than its teacher." in text
    assert summary["floors"] == [{"ceiling": 0.1, "source": "the bar's forget_degenerate_share ceiling", "tau": None,
                                  "layers": None, "recall": None}]
    bar, axes = scales(coll)
    rule = teacher_map_section(coll, replace(bar, at_most={}), axes)[1]
    assert rule["floors"] == []  # a bar without a fluency ceiling and a map without a rule: no floor
