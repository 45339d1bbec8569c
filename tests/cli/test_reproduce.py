"""`obliviate reproduce`: a published table's rows run as their presets (here the CPU twins, cut to a step), the
table written beside the published numbers, a second call resumes instead of running again, bad input refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from obliviate.cli import main
from obliviate.published import OPEN_UNLEARNING_TOFU_1B, TABLES

ROOT = Path(__file__).resolve().parents[2]
TINY = ["train.max_steps=1", "train.batch_size=2", "train.grad_accum=1", "train.progress=false",
        "eval.max_examples=2", "eval.max_new_tokens=4", "eval.holdout_split=null"]


@pytest.fixture
def repo(tmp_path, model_dir, monkeypatch) -> Path:
    """A checkout's layout: configs/ and the tiny TOFU target and retain model in runs/."""
    import shutil

    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for name in ("runs/tofu-target-tiny", "runs/tofu-retain99-tiny"):
        shutil.copytree(model_dir, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_table_row_has_its_presets_and_the_published_numbers_are_open_unlearnings() -> None:
    for table in TABLES.values():
        for row in table.rows:
            for twins in (False, True):
                if not twins or table.twins is not None:
                    assert (ROOT / table.folder(twins) / f"{row}.yaml").is_file(), (table.name, row, twins)
    pub = TABLES["tofu-llama32-1b"].published
    # by hand from open-unlearning docs/results.md: NPO on forget01, GradDiff on forget10
    assert pub["npo_forget01"] == {"forget_quality": 0.92, "model_utility": 0.56, "forget_truth_ratio": 0.66}
    assert pub["graddiff_forget10"]["forget_quality"] == 1.06e-239 and len(pub) == 6 * 3
    assert "finetuned" not in "".join(pub) and OPEN_UNLEARNING_TOFU_1B["retain"]["01"][0] == "1.0"
    assert TABLES["asu-tofu-llama2-7b"].published == {}  # not transcribed: the table says so
    sago = TABLES["sago-wmdp-bio"]  # by hand from the SAGO paper's summary: SimNPO+GD, MMLU 26.7 -> 56.4 -> 57.4
    assert sago.published["simnpo_sago_bio"] == {"lm_eval_wmdp_bio_accuracy": 0.282, "lm_eval_mmlu_accuracy": 0.574}
    assert sago.published["simnpo_pcgrad_bio"]["lm_eval_mmlu_accuracy"] == 0.564 and len(sago.published) == 3
    assert sago.published["simnpo_sum_bio"]["lm_eval_wmdp_bio_accuracy"] == 0.261
    assert sago.evals[1][1:] == ("mcq.lm_eval_tasks=[mmlu]", "mcq.lm_eval_num_fewshot=5")  # SAGO's README: 5-shot


def test_a_table_runs_its_twins_writes_the_comparison_and_resumes(repo: Path, capsys) -> None:
    out = repo / "runs" / "rep"
    args = ["reproduce", "tofu-llama32-1b", *TINY, "--twins", "--rows", "npo_forget01,graddiff_forget01", "--out",
            str(out)]  # overrides right after the table, as the usage line shows
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "npo_forget01: configs/twins/tofu_llama32_1b/npo_forget01.yaml; 1 optimizer steps, 0 of them" in printed
    assert "MB + activations (estimate)" in printed and "[2/2] npo_forget01: ran" in printed
    data = json.loads((out / "reproduce.json").read_text())
    assert list(data["rows"]) == ["graddiff_forget01", "npo_forget01"]  # the table's order
    npo = data["rows"]["npo_forget01"]
    assert npo["status"] == "ran" and set(npo["metrics"]) == {"forget_quality", "model_utility", "forget_truth_ratio"}
    assert npo["metrics"]["forget_truth_ratio"] is not None
    assert data["published"]["npo_forget01"]["model_utility"] == 0.56
    md = (out / "reproduce.md").read_text()
    ours = npo["metrics"]["model_utility"]
    assert "| npo_forget01 | ran | 0.92 \\| " in md and "| forget_quality: published \\| ours \\| Δ |" in md
    lines = md.splitlines()
    header, rule = lines[lines.index(next(ln for ln in lines if ln.startswith("| row |"))):][:2]  # cells agree
    assert header.replace("\\|", "").count("|") == rule.count("|") == 6
    assert not list((out / "npo_forget01").glob("*.safetensors")) and (out / "npo_forget01" / "metrics.json").is_file()
    assert main(args) == 0  # resumes: both rows are read, none runs again
    again = capsys.readouterr().out
    assert "[1/2] graddiff_forget01: done earlier" in again and "[2/2] npo_forget01: done earlier" in again
    assert ": ran" not in again and json.loads((out / "reproduce.json").read_text())["rows"][
        "npo_forget01"]["metrics"]["model_utility"] == ours


def test_the_plan_prints_steps_and_memory_and_trains_nothing(repo: Path, capsys) -> None:
    out = repo / "runs" / "plan"
    assert main(["reproduce", "asu-tofu-llama2-7b", "--twins", "--plan", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "asu_gd_forget05: configs/twins/asu_tofu_llama2_7b/asu_gd_forget05.yaml; 31 optimizer steps, 6 of them " \
           "warming up" in printed
    assert printed.count("(estimate)") == 9 and not out.exists()


@pytest.mark.parametrize("args, message", [
    (["reproduce", "tofu"], "unknown table 'tofu'; valid: tofu-llama32-1b, asu-tofu-llama2-7b, sago-wmdp-bio"),
    (["reproduce", "sago-wmdp-bio", "--twins"], "sago-wmdp-bio has no CPU twins: WMDP's bio forget corpus is gated"),
    (["reproduce", "tofu-llama32-1b", "--rows", "npo_forget02"], "npo_forget02 not in tofu-llama32-1b; valid:"),
    (["reproduce", "tofu-llama32-1b", "train.nope=1", "--twins"], "train.nope"),
])
def test_bad_input_is_refused_before_anything_runs(repo: Path, capsys, args, message) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (repo / "runs" / "reproduce-tofu-llama32-1b-twins").exists()


def test_outside_a_checkout_it_says_where_to_run(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "tofu-llama32-1b", "--twins", "--plan"]) == 2
    assert "run obliviate reproduce from the repository root" in capsys.readouterr().err


def test_parameter_counts_by_hand() -> None:
    """Llama-2-7B: 32 x (2·4096² + 2·4096² + 3·4096·11008 + 2·4096) + 4096 + 2·32000·4096 = 6,738,415,616;
    Llama-3.2-1B (8 KV heads of 64, tied head): 16 x 60,821,504 + 2048 + 128256·2048 = 1,235,814,400."""
    from obliviate.cli.reproduce import memory_estimate, parameter_count

    llama2 = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000,
              "num_attention_heads": 32, "num_key_value_heads": 32}
    llama32 = {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192, "vocab_size": 128256,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True}
    assert parameter_count(llama2) == 6_738_415_616 and parameter_count(llama32) == 1_235_814_400
    assert parameter_count({"hidden_size": 8}) is None
    from obliviate.config import RunConfig, load_config

    cfg = load_config(RunConfig, ROOT / "configs" / "gpu" / "asu_tofu_llama2_7b" / "asu_gd_forget01.yaml")
    import obliviate.cli.reproduce as rep

    original = rep.model_json
    rep.model_json = lambda path: llama2
    try:  # fp32 weights 4 + gradients 4 + paged 32-bit AdamW 8 + the teacher's fp32 copy 4 = 20 bytes a parameter
        assert memory_estimate(cfg, frozen_copy=True) == "6.74B parameters: ~134.8 GB + activations (estimate)"
        assert memory_estimate(cfg, frozen_copy=False) == "6.74B parameters: ~107.8 GB + activations (estimate)"
    finally:
        rep.model_json = original


def test_a_tables_evaluations_run_after_each_row_and_resume_on_their_own(repo: Path, tmp_path: Path, monkeypatch,
                                                                         capsys) -> None:
    """A table whose rows evaluate on a multiple-choice file after training: the accuracy lands in the table; a row
    whose evaluation is missing re-runs only the evaluation."""
    import dataclasses


    items = [{"question": f"Which town is number {i}?", "choices": [f"town {i}", "a", "b", "c"], "answer": 0}
             for i in range(4)]
    mcq = tmp_path / "toy.jsonl"
    mcq.write_text("".join(json.dumps(it) + "\n" for it in items), encoding="utf-8")
    base = TABLES["tofu-llama32-1b"]
    table = dataclasses.replace(base, name="toy", rows=("npo_forget01",), metrics=("forget_quality", "toy_accuracy"),
                                published={}, evals=(("benchmark=mcq", f"mcq.source={mcq}", "mcq.name=toy"),))
    monkeypatch.setitem(TABLES, "toy", table)
    out = repo / "runs" / "toy"
    args = ["reproduce", "toy", *TINY, "--twins", "--out", str(out), "--keep-models"]
    assert main(args) == 0
    assert "then 1 evaluations (native)" in capsys.readouterr().out
    evaluated = json.loads((out / "npo_forget01" / "eval-0" / "metrics.json").read_text())["eval"]["toy_accuracy"]
    row = json.loads((out / "reproduce.json").read_text())["rows"]["npo_forget01"]
    assert row["metrics"]["toy_accuracy"] == evaluated and 0 <= evaluated <= 1
    assert row["metrics"]["forget_quality"] is not None  # the run's own metric, beside the evaluation's
    assert "| npo_forget01 | ran |" in (out / "reproduce.md").read_text()
    import shutil

    shutil.rmtree(out / "npo_forget01" / "eval-0")  # as if stopped between training and evaluating
    trained = (out / "npo_forget01" / "metrics.json").stat().st_mtime_ns
    assert main(args[:-1]) == 0
    assert (out / "npo_forget01" / "metrics.json").stat().st_mtime_ns == trained  # not trained again
    again = json.loads((out / "reproduce.json").read_text())["rows"]["npo_forget01"]["metrics"]
    assert again == row["metrics"] and not list((out / "npo_forget01").glob("*.safetensors"))  # weights gone now
    assert main(args[:-1]) == 0 and "done earlier" in capsys.readouterr().out


def test_a_table_scored_by_lm_eval_is_refused_before_training_when_it_is_missing(repo: Path, model_dir: Path,
                                                                                 monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    corpora = repo / "data" / "wmdp" / "wmdp-corpora"
    corpora.mkdir(parents=True)
    for side in ("forget", "retain"):
        (corpora / f"bio-{side}-corpus.jsonl").write_text(json.dumps({"text": f"{side} text"}) + "\n", encoding="utf-8")
    args = ["reproduce", "sago-wmdp-bio", f"model.path={model_dir}", "--rows", "simnpo_sago_bio"]
    assert main(args) == 2
    assert "sago-wmdp-bio scores its rows with lm-evaluation-harness (wmdp_bio, mmlu)" in capsys.readouterr().err
    assert not (repo / "runs").exists() or not any((repo / "runs").glob("reproduce-sago*"))
    assert main(args + ["--plan"]) == 0  # a plan for another machine only says so
    assert "then 2 evaluations (wmdp_bio, mmlu; lm-eval is not installed here)" in capsys.readouterr().out
