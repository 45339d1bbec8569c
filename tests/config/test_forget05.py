"""The TOFU-20 forget05 study (configs/sweep/smollm2_tofu20_forget05.yaml) runs each method of the main TOFU-20
study at exactly the point that study selected: each method's section must be the main sweep's section with the
named trial's recorded values written in (what `obliviate compare --transfer` writes), and its settings the main
sweep's with only the splits, the retain model and the output folder changed, so neither file can drift from the
other or from the committed storage unnoticed. (`--transfer` itself needs the fine-tuned target, so it is not rerun
here: tests/config/test_transfer.py runs it on a study that needs none.)"""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import yaml

from obliviate.sweep.export import _with_params

ROOT = Path(__file__).resolve().parents[2]
FORGET05 = ROOT / "configs" / "sweep" / "smollm2_tofu20_forget05.yaml"
MAIN = ROOT / "configs" / "sweep" / "smollm2_tofu20.yaml"
STORAGE = ROOT / "docs" / "sweeps" / "smollm2_tofu20_cpu" / "sweep.db"
SPLITS = {"data.forget_split": "forget05", "data.retain_split": "retain95", "eval.forget_split": "forget05_perturbed",
          "eval.holdout_split": "holdout05", "eval.retain_model": "runs/tofu20-smollm2-retain95"}


def _named_points() -> dict[str, int]:
    """The trial each method's section comes from, as the file's header names it ("ASU_KL #5, ...")."""
    text = FORGET05.read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("#   ASU_KL #"))
    return {m: int(n) for m, n in re.findall(r"([A-Za-z_+]+) #(\d+)", line)}


def _params(method: str, number: int) -> dict:
    db = sqlite3.connect(f"file:{STORAGE}?mode=ro", uri=True)
    try:
        (value,), = db.execute(
            "SELECT a.value_json FROM trial_user_attributes a JOIN trials t USING (trial_id) JOIN studies s "
            "USING (study_id) WHERE s.study_name = ? AND t.number = ? AND a.key = 'params'",
            (f"sweep/{method}", number)).fetchall()
    finally:
        db.close()
    return json.loads(value)


def test_each_method_runs_the_point_the_main_study_named() -> None:
    shipped, main = yaml.safe_load(FORGET05.read_text()), yaml.safe_load(MAIN.read_text())
    named = _named_points()
    assert set(named) == set(shipped["methods"]) == set(main["methods"])
    for method, number in named.items():
        assert shipped["methods"][method] == _with_params(main["methods"][method], _params(method, number)), method
    assert {m for m, n in named.items() if n == 0} == {"NPO", "SimNPO", "RMU"}  # the authors' recipe was their best


def test_only_the_rows_and_the_retain_model_change() -> None:
    shipped, main = yaml.safe_load(FORGET05.read_text()), yaml.safe_load(MAIN.read_text())
    assert shipped["set"] == {**main["set"], **SPLITS}
    assert shipped["space"] == {} and shipped["trials"] == 1 and shipped["start_at_recipe"] is True
    for key in ("base", "repeats", "heldout_share", "seed", "search"):
        assert shipped[key] == main[key], key
    assert shipped["output_dir"] == "obliviate-sweep-smollm2-tofu20-forget05"


def test_the_asu_floor_study_moves_only_the_teacher() -> None:
    """configs/sweep/smollm2_tofu20_forget05_asu_floor.yaml: each ASU point of the forget05 study with its teacher
    moved to tau 8 on layers 20-29 (the teacher map's floor), every other value and setting that study's."""
    floor = yaml.safe_load((FORGET05.parent / "smollm2_tofu20_forget05_asu_floor.yaml").read_text())
    shipped = yaml.safe_load(FORGET05.read_text())
    assert set(floor["methods"]) == {"ASU_KL_t8_L20-29", "ASU_GD_t8_L20-29"}
    for name, section in floor["methods"].items():
        moved = {**shipped["methods"][name.split("_t8")[0]], "forget_args": {"tau": 8.0, "layers": list(range(20, 30))}}
        assert section == moved, name
    rest = {k: v for k, v in floor.items() if k not in ("methods", "output_dir")}
    assert rest == {k: v for k, v in shipped.items() if k not in ("methods", "output_dir")}
    assert floor["output_dir"] != shipped["output_dir"]


def test_the_forget05_search_is_the_main_study_on_other_rows() -> None:
    """configs/sweep/smollm2_tofu20_forget05_search.yaml: the main study's methods, space, bar, budget and cut, with
    only the rows, the retain model and the output folder changed (so it searches forget05 as the main one forget10)."""
    search = yaml.safe_load((FORGET05.parent / "smollm2_tofu20_forget05_search.yaml").read_text())
    main = yaml.safe_load(MAIN.read_text())
    assert search["set"] == {**main["set"], **SPLITS}
    rest = {k: v for k, v in search.items() if k not in ("set", "output_dir", "queue")}
    assert rest == {k: v for k, v in main.items() if k not in ("set", "output_dir", "queue")}
    assert "queue" not in search  # the floor points ran on this target already (smollm2_tofu20_forget05_asu_floor)
    assert search["trials"] == 12 and search["start_at_recipe"] is True and search["space"]
    assert search["output_dir"] not in (main["output_dir"], yaml.safe_load(FORGET05.read_text())["output_dir"])


def test_the_main_study_queues_the_floor_points_the_forget05_split_ran() -> None:
    """configs/sweep/smollm2_tofu20.yaml queues ASU at the teacher map's floor with the same settings as the
    forget05 floor study's points (its other keys those of ASU_KL #5 and ASU_GD #7), inside the main space."""
    floor = yaml.safe_load((FORGET05.parent / "smollm2_tofu20_forget05_asu_floor.yaml").read_text())
    main = yaml.safe_load(MAIN.read_text())
    assert set(main["queue"]) == {"ASU_KL", "ASU_GD"}
    for method, points in main["queue"].items():
        ran = floor["methods"][f"{method}_t8_L20-29"]
        assert points == [{"method.forget_args": ran["forget_args"], "train.lr": ran["train"]["lr"],
                           "train.epochs": ran["train"]["epochs"], "method.alpha": ran["alpha"]}], method
        assert _with_params(main["methods"][method], _params(method, _named_points()[method]))["alpha"] == ran["alpha"]
