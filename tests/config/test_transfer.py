"""The languages transfer study (configs/sweep/smollm2_languages_transfer.yaml) runs each best of the held-out
capitals study at exactly the point that study selected: its methods must equal the capitals report's bests (and
NPO's nearest miss), key by key, so that neither file can drift from the other unnoticed."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TRANSFER = ROOT / "configs" / "sweep" / "smollm2_languages_transfer.yaml"
CAPITALS = ROOT / "docs" / "sweeps" / "smollm2_capitals_heldout"


def _point(section: dict[str, Any], key: str) -> Any:
    """A sweep parameter (`train.lr`, `method.alpha`, `method.forget_args.beta`) read from a method's section."""
    head, *rest = key.split(".")
    node: Any = section.get("train", {}) if head == "train" else section
    for part in rest:
        node = node[part]
    return node


def _selected(report: dict[str, Any], method: str) -> dict[str, Any]:
    """The capitals study's best of a method, or its nearest miss (the front's point of highest utility)."""
    entry = report["methods"][method]
    if entry["best"] is not None:
        return entry["best"]["params"]
    return max(entry["front"], key=lambda p: p["utility"])["params"]


def test_each_method_sits_at_the_capitals_study_selection():
    transfer = yaml.safe_load(TRANSFER.read_text())
    report = json.loads((CAPITALS / "compare.json").read_text())
    capitals = yaml.safe_load((CAPITALS / "sweep.yaml").read_text())
    assert set(transfer["methods"]) == set(capitals["methods"]) - {"GradDiff"}  # GradDiff: nothing near the bar
    for method, section in transfer["methods"].items():
        params = _selected(report, method)
        assert params, method
        for key, value in params.items():
            assert _point(section, key) == value, (method, key)
        for key in ("forget", "retain", "combine"):  # the preset itself is the capitals study's
            if key in capitals["methods"][method] and key not in params and f"method.{key}" not in params:
                assert section.get(key) == capitals["methods"][method][key], (method, key)
        if "method.forget_args" not in params:  # the preset's fixed arguments (RMU's layer) are the capitals' too
            for key, value in capitals["methods"][method].get("forget_args", {}).items():
                assert section["forget_args"][key] == value, (method, key)
        assert section.get("retain_args") == capitals["methods"][method].get("retain_args"), method
    assert transfer["space"] == {} and transfer["trials"] == 1 and transfer["start_at_recipe"] and transfer["repeats"] == capitals["repeats"]
    assert transfer["bar"] == capitals["bar"] and transfer["heldout_share"] == capitals["heldout_share"]
    assert transfer["set"]["knowledge.forget_families"] == ["languages"]
    assert {k: v for k, v in transfer["set"].items() if k != "knowledge.forget_families"} == capitals["set"]
