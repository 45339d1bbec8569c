"""`obliviate prepare rwku`: SAGO's RWKU batch (setup_data.py:91-179) from a local copy of the hub's configs, and the
RWKU presets training on it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from obliviate.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _subjects(path: Path, key: str = "subject") -> list[str]:
    return [rec[key] for rec in json.loads(path.read_text(encoding="utf-8"))]


def test_the_batch_holds_the_first_n_targets_and_the_last_n_as_retain(rwku_source: Path, tmp_path: Path,
                                                                       capsys) -> None:
    out = tmp_path / "Batch" / "1-3"
    assert main(["prepare", "rwku", "--targets", "3", "--source", str(rwku_source), "--out", str(out)]) == 0
    first, last = ["Person 0", "Person 1", "Person 2"], ["Person 97", "Person 98", "Person 99"]
    assert _subjects(out / "passage.json") == [n for n in first for _ in range(2)]  # both passages, source order
    assert _subjects(out / "retain_passage.json") == [n for n in last for _ in range(2)]
    assert _subjects(out / "intro.json", "target") == first
    for level in ("forget_level1", "forget_level2", "forget_level3", "neighbor_level1", "neighbor_level2"):
        assert _subjects(out / f"{level}.json") == first
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["passage.json", "retain_passage.json", "intro.json", "forget_level1.json", "forget_level2.json",
         "forget_level3.json", "neighbor_level1.json", "neighbor_level2.json"])  # no staging folder left
    assert f"{out / 'passage.json'}: 6 records" in capsys.readouterr().out
    from obliviate.eval.rwku import load_rwku

    assert {lv: len(p) for lv, p in load_rwku(out).items()} == {lv: 3 for lv in load_rwku(out)}


@pytest.mark.parametrize("targets", ["0", "51"])
def test_a_batch_that_would_overlap_its_retain_set_is_refused(targets: str, rwku_source: Path, tmp_path: Path,
                                                              capsys) -> None:
    out = tmp_path / "b"
    assert main(["prepare", "rwku", "--targets", targets, "--source", str(rwku_source), "--out", str(out)]) == 2
    assert "choose 1 <= N <= 50" in capsys.readouterr().err and not out.exists()
    assert list(tmp_path.iterdir()) == []  # no staging folder either


def test_an_existing_batch_is_kept_unless_overwrite(rwku_source: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "mine.txt").write_text("keep me", encoding="utf-8")
    args = ["prepare", "rwku", "--targets", "2", "--source", str(rwku_source), "--out", str(out)]
    assert main(args) == 2
    assert "already exists" in capsys.readouterr().err and (out / "mine.txt").read_text() == "keep me"
    assert main(args + ["--overwrite"]) == 0
    assert not (out / "mine.txt").exists() and len(_subjects(out / "passage.json")) == 4


def test_a_source_without_subjects_names_the_record(tmp_path: Path, rwku_source: Path, capsys) -> None:
    bad = tmp_path / "src"
    bad.mkdir()
    for f in rwku_source.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "train_original_passage.json").write_text(json.dumps([{"text": "no subject"}]), encoding="utf-8")
    assert main(["prepare", "rwku", "--targets", "2", "--source", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert "train_original_passage.json" in capsys.readouterr().err and not (tmp_path / "b").exists()


@pytest.mark.parametrize("name", ["npo_sago", "simnpo_pcgrad", "graddiff_pcgrad_global", "ga"])
def test_the_rwku_presets_train_on_a_prepared_batch(name: str, rwku_source: Path, model_dir: Path,
                                                    tmp_path: Path) -> None:
    """Each preset's recipe (objective, retain term, rule, stream windows, warm-up) on the tiny model: the GPU-only
    switches (FSDP over 4 processes, bf16) off, windows of 16 tokens to suit the made-up passages."""
    batch = tmp_path / "batch"
    assert main(["prepare", "rwku", "--targets", "4", "--source", str(rwku_source), "--out", str(batch)]) == 0
    out = tmp_path / "run"
    rc = main(["unlearn", "--config", str(ROOT / "configs" / "rwku" / f"{name}.yaml"), f"model.path={model_dir}",
               f"data.source={batch}", "data.max_length=16", "train.fsdp=false", "train.precision=fp32",
               "train.gradient_checkpointing=false", "train.batch_size=2", "train.grad_accum=1", "train.epochs=1",
               "train.progress=false", f"output_dir={out}"])
    assert rc == 0
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert history and all(h["loss"] == h["loss"] for h in history)  # finite, not NaN


# ----------------------------------------------------------------------------- TOFU on its last N authors

def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_tofu_on_its_last_20_authors_keeps_tofus_protocol(tmp_path: Path, tofu_dir: Path, capsys) -> None:
    out = tmp_path / "tofu-20"
    assert main(["prepare", "tofu", "--authors", "20", "--out", str(out)]) == 0
    full, tofu_full = _rows(out / "full.jsonl"), _rows(tofu_dir / "full.jsonl")
    assert full == tofu_full[-400:]  # TOFU's authors 181-200, records unchanged, in TOFU's order
    f10, f05 = _rows(out / "forget10.jsonl"), _rows(out / "forget05.jsonl")
    assert f10 == full[-40:] and f10 == _rows(tofu_dir / "forget01.jsonl")  # 10% of 20 authors = TOFU's last 2
    assert f05 == full[-20:]  # 5% = the last author
    assert _rows(out / "retain90.jsonl") == full[:-40] and _rows(out / "retain95.jsonl") == full[:-20]
    assert _rows(out / "forget10_perturbed.jsonl") == _rows(tofu_dir / "forget01_perturbed.jsonl")
    perturbed = _rows(out / "forget05_perturbed.jsonl")
    assert [r["question"] for r in perturbed] == [r["question"] for r in f05]
    assert all(len(r["perturbed_answer"]) == 5 for r in perturbed)
    retain_p = _rows(out / "retain_perturbed.jsonl")  # utility's retain rows: the 18 authors no forget split holds
    assert [r["question"] for r in retain_p] == [r["question"] for r in full[:-40]]
    assert all(r["perturbed_answer"] and r["paraphrased_answer"] for r in retain_p)
    holdout = _rows(tofu_dir / "holdout01.jsonl")
    assert _rows(out / "holdout10.jsonl") == holdout and _rows(out / "holdout05.jsonl") == holdout[:20]
    assert not {r["question"] for r in holdout} & {r["question"] for r in tofu_full}  # never trained
    for name in ("real_authors", "world_facts_perturbed"):
        assert (out / f"{name}.jsonl").read_bytes() == (tofu_dir / f"{name}.jsonl").read_bytes()
    assert (out / "LICENSE").read_text() == (tofu_dir / "LICENSE").read_text()
    assert "authors 181-200" in (out / "README.md").read_text()
    assert not (out / "forget01.jsonl").exists()  # 1% of 20 authors is no whole author
    assert f"{out / 'retain90'}.jsonl: 360 rows" in capsys.readouterr().out
    from obliviate.data.rows import load_split

    assert len(load_split(out, "forget10_perturbed")) == 40  # every command reads it as TOFU


def test_tofu_on_10_authors_has_a_single_forget_split(tmp_path: Path) -> None:
    out = tmp_path / "t"
    assert main(["prepare", "tofu", "--authors", "10", "--out", str(out)]) == 0
    assert sorted(p.stem for p in out.glob("forget*")) == ["forget10", "forget10_perturbed"]  # 5%: half an author
    assert len(_rows(out / "forget10.jsonl")) == 20 and len(_rows(out / "retain_perturbed.jsonl")) == 180


@pytest.mark.parametrize("authors, message", [("1", "from 2 to 20"), ("21", "from 2 to 20"),
                                              ("15", "no forget share")])
def test_tofu_author_counts_that_do_not_fit_are_refused(authors: str, message: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "t"
    assert main(["prepare", "tofu", "--authors", authors, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_tofu_from_a_folder_that_is_not_tofu_writes_nothing(tmp_path: Path, tofu_dir: Path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "full.jsonl").write_text((tofu_dir / "full.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["prepare", "tofu", "--source", str(src), "--out", str(tmp_path / "t")]) == 2
    assert "no forget10_perturbed.jsonl" in capsys.readouterr().err and not (tmp_path / "t").exists()
