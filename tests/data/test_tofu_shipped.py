"""The TOFU copy shipped in the package: intact, consistent, licensed, and reachable as data.source=tofu."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import tomllib

from obliviate.data.rows import builtin_dir, load_split, resolve_source
from obliviate.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_file_matches_its_recorded_sha256(tofu_dir):
    sums = dict(reversed(line.split()) for line in (tofu_dir / "SHA256SUMS").read_text().splitlines())
    files = sorted(p.name for p in tofu_dir.glob("*.jsonl"))
    assert files == sorted(sums) and len(files) == 18
    for name in files:
        assert hashlib.sha256((tofu_dir / name).read_bytes()).hexdigest() == sums[name], name


def test_the_licence_and_the_provenance_note_travel_with_the_files(tofu_dir):
    assert (tofu_dir / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) 2024 CMU Locus Lab")
    note = (tofu_dir / "PROVENANCE.md").read_text()
    assert "locuslab/TOFU" in note and "2401.06121" in note and "LICENSE" in note


def test_the_wheel_carries_the_shipped_data():
    """pyproject's package-data globs match every file under resources/ (else an installed wheel lacks them)."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["obliviate"]
    res = ROOT / "src" / "obliviate"
    for path in (res / "resources").rglob("*"):
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts:
            rel = path.relative_to(res)
            assert any(rel.match(g) for g in globs), f"{rel} is not in package-data {globs}"


def test_the_splits_are_consistent_as_tofu_defines_them(tofu_dir):
    q = {s: [r.question for r in load_split("tofu", s)] for s in
         ("full", "retain90", "retain95", "retain99", "forget01", "forget05", "forget10", "retain_perturbed",
          "holdout10", "forget10_perturbed")}
    assert len(q["full"]) == 4000
    for retain, forget in (("retain90", "forget10"), ("retain95", "forget05"), ("retain99", "forget01")):
        assert q[retain] + q[forget] == q["full"], (retain, forget)
    assert set(q["retain_perturbed"]) <= set(q["retain90"]) and len(q["retain_perturbed"]) == 400
    assert not set(q["holdout10"]) & set(q["full"])
    assert q["forget10_perturbed"] == q["forget10"]
    assert all(len(r.perturbed_answer) == 5 and r.paraphrased_answer for r in load_split("tofu", "forget01_perturbed"))


def test_the_short_name_means_the_shipped_copy_wherever_it_is_run(tmp_path, monkeypatch):
    (tmp_path / "tofu").mkdir()  # a local folder of the same name does not shadow the shipped data
    monkeypatch.chdir(tmp_path)
    assert resolve_source("tofu") == builtin_dir("tofu")
    assert len(load_split("tofu", "forget01")) == 40
    assert resolve_source("./tofu") == "./tofu" and resolve_source("locuslab/TOFU") == "locuslab/TOFU"
    with pytest.raises(DataError, match=r"no split 'forget01' in \./tofu|no split 'forget01' in tofu"):
        load_split("./tofu", "forget01")


def test_an_unknown_split_of_the_shipped_data_names_the_splits_shipped():
    with pytest.raises(DataError) as err:
        load_split("tofu", "forget02")
    msg = str(err.value)
    assert msg.startswith("no split 'forget02' in the shipped tofu data; the splits shipped are: ")
    assert re.search(r"forget01, forget01_perturbed, .*world_facts_perturbed$", msg)
