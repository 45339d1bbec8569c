"""The languages transfer study (configs/sweep/smollm2_languages_transfer.yaml) runs each method of the held-out
capitals study at exactly the point that study selected: it must be what `obliviate compare --transfer` writes from
docs/sweeps/smollm2_capitals_heldout, with only the family and the output folder changed, so neither file can drift
from the other unnoticed."""
from __future__ import annotations

from pathlib import Path

import yaml

from obliviate.sweep.export import write_transfer_config

ROOT = Path(__file__).resolve().parents[2]
TRANSFER = ROOT / "configs" / "sweep" / "smollm2_languages_transfer.yaml"
CAPITALS = ROOT / "docs" / "sweeps" / "smollm2_capitals_heldout"


def test_the_shipped_transfer_study_is_what_compare_writes_with_the_family_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the recorded sweep names its base from the repository root
    lines: list[str] = []
    written = yaml.safe_load(write_transfer_config(CAPITALS.relative_to(ROOT), tmp_path / "t.yaml", lines.append)
                             .read_text())
    shipped = yaml.safe_load(TRANSFER.read_text())
    assert shipped["set"] == {**written["set"], "knowledge.forget_families": ["languages"]}
    assert shipped["output_dir"] == "obliviate-sweep-smollm2-languages"
    assert {k: v for k, v in shipped.items() if k not in ("set", "output_dir")} == \
        {k: v for k, v in written.items() if k not in ("set", "output_dir")}
    assert "NPO: NPO #0 (its nearest miss)" in lines and "SimNPO: SimNPO #10 (its best)" in lines
