"""`obliviate compare DIR --best-configs OUT`: each method's best trial as a config that runs alone, and reproduces it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from obliviate.config import RunConfig, build, load_config
from obliviate.errors import ObliviateError
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.export import slug, write_best_configs, write_transfer_config
from obliviate.sweep.run import run_sweep

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_best_trial_of_an_unlearn_sweep_runs_alone_and_gives_the_trials_numbers(unlearn_base, tmp_path,
                                                                                     monkeypatch):
    """The exported config trains what the trial trained: `obliviate unlearn` on it reproduces the trial's metrics."""
    from obliviate.cli.unlearn import run_unlearn

    base = unlearn_base(max_examples=4)
    out = tmp_path / "sw"
    methods = {"NPO": {"forget": "npo", "forget_args": {"beta": 0.1}, "retain": "nll", "train": {"seed": 3}},
               "GradDiff": {"forget": "ga", "retain": "nll"}}
    cfg = build(SweepConfig, {"base": str(base), "methods": methods, "trials": 2, "sampler": "random",
                              "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True},
                                        "method.forget_args.beta": {"float": [0.05, 0.5], "methods": ["NPO"]}},
                              "bar": {"keep": {"model_utility": 0.0}}, "output_dir": str(out)})
    run_sweep(cfg, log=lambda s: None)
    summary = json.loads((out / "compare.json").read_text())
    lines = []
    written = write_best_configs(out, tmp_path / "best", log=lines.append)
    assert sorted(p.name for p in written) == ["GradDiff.yaml", "NPO.yaml"]
    best = summary["methods"]["NPO"]["best"]
    run_cfg = load_config(RunConfig, str(tmp_path / "best" / "NPO.yaml"))
    assert run_cfg.method.forget == "npo" and run_cfg.method.forget_args["beta"] == best["params"]["method.forget_args.beta"]
    assert run_cfg.train.lr == best["params"]["train.lr"] and run_cfg.train.seed == 3  # the method's own seed
    assert run_cfg.train.max_steps == 2 and run_cfg.output_dir == "runs/sw-NPO"
    text = (tmp_path / "best" / "NPO.yaml").read_text()
    assert text.startswith(f"# {best['trial']} of the sweep in {out}") and "obliviate unlearn --config" in text
    assert any(line.startswith(f"NPO: {best['trial']} -> ") for line in lines)
    monkeypatch.chdir(tmp_path)
    metrics = run_unlearn(run_cfg)["eval"]
    for name in ("forget_rougeL_recall", "forget_truth_ratio", "model_utility", "forget_quality"):
        assert metrics[name] == pytest.approx(best["metrics"][name], abs=1e-6), name


def test_a_method_without_a_best_gets_no_file_and_the_cli_writes_the_others(unlearn_base, tmp_path):
    base = unlearn_base(max_examples=4)
    out = tmp_path / "sw"
    methods = {"GA": {"forget": "ga", "retain": None}, "NPO": {"forget": "npo", "retain": "nll"}}
    cfg = build(SweepConfig, {"base": str(base), "methods": methods, "trials": 1, "sampler": "random",
                              "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
                              "bar": {"keep": {"model_utility": 0.0}, "at_most": {"forget_rougeL_recall": -1.0}},
                              "output_dir": str(out)})
    run_sweep(cfg, log=lambda s: None)  # no trial has a recall below -1: no method has a best
    lines = []
    assert write_best_configs(out, tmp_path / "best", log=lines.append) == []
    assert sorted(line.split(":")[0] for line in lines) == ["GA", "NPO"] and "no trial passes the bar" in lines[0]
    res = subprocess.run([sys.executable, "-m", "obliviate.cli", "compare", str(tmp_path / "world"), "--best-configs",
                          str(tmp_path / "b2")], capture_output=True, text=True)
    assert res.returncode == 2 and "--best-configs" in res.stderr and "is not a sweep directory" in res.stderr
    assert not (tmp_path / "b2").exists()
    with pytest.raises(ObliviateError, match="is not a sweep directory"):
        write_best_configs(tmp_path / "world", tmp_path / "b3")


def test_the_best_of_a_knowledge_sweep_is_a_demo_config_with_that_method_alone(model_dir, facts_file, tmp_path):
    from obliviate.setups.knowledge import KnowledgeDemoConfig

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "kind": "knowledge", "model": {"path": str(model_dir)},
        "knowledge": {"facts": str(facts_file), "forget_families": ["fam_a"], "max_new_tokens": 8, "batch_size": 8,
                      "max_eval": 4},
        "max_length": 64, "unlearn": {"max_steps": 2, "batch_size": 2, "lr": 1e-3, "progress": False},
        "methods": {"GradDiff": {"forget": "ga", "retain": "nll"}, "NPO": {"forget": "npo", "retain": "nll"}}}))
    out = tmp_path / "sw"
    cfg = build(SweepConfig, {"base": str(base), "trials": 1, "sampler": "random", "output_dir": str(out),
                              "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
                              "bar": {"keep": {"retain_accuracy": 0.0}, "at_most": {"forget_degenerate_share": 1.0}}})
    run_sweep(cfg, log=lambda s: None)
    summary = json.loads((out / "compare.json").read_text())
    written = write_best_configs(out, tmp_path / "best", log=lambda s: None)
    assert sorted(p.name for p in written) == ["GradDiff.yaml", "NPO.yaml"]
    demo = load_config(KnowledgeDemoConfig, str(tmp_path / "best" / "NPO.yaml"))
    assert list(demo.methods) == ["NPO"] and demo.methods["NPO"]["forget"] == "npo"
    assert demo.unlearn.lr == summary["methods"]["NPO"]["best"]["params"]["train.lr"] and demo.unlearn.max_steps == 2
    assert "obliviate demo --config" in (tmp_path / "best" / "NPO.yaml").read_text()


def test_a_transfer_sweep_runs_each_selected_point_again_and_reproduces_its_numbers(unlearn_base, tmp_path):
    """`--transfer`: NPO's best (it passes the bar) and GA's nearest miss (no GA trial can pass: the fewest broken
    conditions, then the lowest forget recall) become each method's only trial of a new sweep, with their values
    written into the method sections (lr into `train`, β into `forget_args` beside the kept δ); on the same rows
    that sweep trains what the selected trials trained and gives their numbers."""
    from obliviate.sweep.points import collect

    base = unlearn_base(max_examples=4)
    out = tmp_path / "sw"
    methods = {"NPO": {"forget": "simnpo", "forget_args": {"beta": 2.5, "delta": 0.5}, "retain": "nll"},
               "GA": {"forget": "ga", "retain": "nll", "train": {"max_steps": 1}}}
    bar = {"forget": "forget_rougeL_recall", "keep": {"model_utility": 0.0}}
    cfg = build(SweepConfig, {"base": str(base), "methods": methods, "trials": 3, "sampler": "random", "repeats": 1,
                              "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True},
                                        "method.forget_args.beta": {"float": [1.0, 4.0], "methods": ["NPO"]},
                                        "method.alpha": {"float": [0.5, 2.0], "methods": ["GA"]}},
                              "bar": bar, "output_dir": str(out), "queue": {"NPO": [{"train.lr": 1e-3}]}})
    run_sweep(cfg, log=lambda s: None)
    summary = json.loads((out / "compare.json").read_text())["methods"]
    best, ga_best = summary["NPO"]["best"], summary["GA"]["best"]
    lines: list[str] = []
    path = write_transfer_config(out, tmp_path / "t.yaml", lines.append)
    raw = yaml.safe_load(path.read_text())
    assert lines == [f"NPO: {best['trial']} (its best)", f"GA: {ga_best['trial']} (its best)"]
    recorded = (out / "sweep.yaml").read_text()
    (out / "sweep.yaml").write_text(recorded.replace(  # now no trial can pass: each method's nearest miss
        "model_utility: 0.0", "model_utility: 0.0\n    forget_rougeL_recall: 2.0"))
    first = [p for p in collect([str(out)]).points if p.repeat_of is None]
    ga = [p for p in first if p.method == "GA"]
    miss = min(ga, key=lambda p: (p.metrics["forget_rougeL_recall"], ga.index(p)))
    assert miss is not ga[0]  # so that "the first trial" would not pass for the rule
    missed: list[str] = []
    write_transfer_config(out, tmp_path / "m.yaml", missed.append)
    assert missed[1] == f"GA: {miss.name} (its nearest miss)" and missed[0].endswith("(its nearest miss)")
    miss_section = yaml.safe_load((tmp_path / "m.yaml").read_text())["methods"]["GA"]
    assert miss_section["train"] == {"max_steps": 1, "lr": miss.params["train.lr"]}
    assert miss_section["alpha"] == miss.params["method.alpha"]
    (out / "sweep.yaml").write_text(recorded)
    # the same bar given to compare (--bar) instead of written into the sweep: the same choice, and the transfer
    # sweep carries that bar; the best configs follow it too (no best, no config)
    strict = {**bar, "keep": {"model_utility": 0.0, "forget_rougeL_recall": 2.0}}
    given: list[str] = []
    write_transfer_config(out, tmp_path / "g.yaml", given.append, bar=strict)
    assert given == missed and yaml.safe_load((tmp_path / "g.yaml").read_text())["bar"] == strict
    assert (out / "sweep.yaml").read_text() == recorded
    assert write_best_configs(out, tmp_path / "none", lambda s: None, bar=strict) == []
    npo, ga_section = raw["methods"]["NPO"], raw["methods"]["GA"]
    assert npo["forget_args"] == {"beta": best["params"]["method.forget_args.beta"], "delta": 0.5}
    assert npo["train"] == {"lr": best["params"]["train.lr"]}
    assert ga_section["train"] == {"max_steps": 1, "lr": ga_best["params"]["train.lr"]}
    assert raw["space"] == {} and raw["trials"] == 1 and raw["start_at_recipe"] and raw["repeats"] == 1
    assert "queue" not in raw  # its points are in the space the transfer sweep has not
    assert raw["output_dir"] == f"{out}-transfer" and path.read_text().startswith("# Each method of the sweep in ")
    raw["output_dir"] = str(tmp_path / "again")
    run_sweep(build(SweepConfig, raw), log=lambda s: None)
    again = {p.method: p for p in collect([str(tmp_path / "again")]).points if p.repeat_of is None}
    assert again["NPO"].recipe and again["GA"].recipe
    for name in ("forget_rougeL_recall", "model_utility", "forget_quality"):
        assert again["NPO"].metrics[name] == pytest.approx(best["metrics"][name], abs=1e-6), name
        assert again["GA"].metrics[name] == pytest.approx(ga_best["metrics"][name], abs=1e-6), name
    assert sum(p.repeat_of is not None for p in collect([str(tmp_path / "again")]).points) == 2  # 1 repeat each


def test_a_transfer_file_is_refused_before_anything_is_written(tmp_path):
    res = subprocess.run([sys.executable, "-m", "obliviate.cli", "compare", str(tmp_path), "--transfer",
                          str(tmp_path / "t.txt"), "--out", str(tmp_path / "rep")], capture_output=True, text=True)
    assert res.returncode == 2 and "--transfer" in res.stderr and "is not a sweep directory" in res.stderr
    (tmp_path / "sweep.yaml").write_text("base: nowhere.yaml\n")
    res = subprocess.run([sys.executable, "-m", "obliviate.cli", "compare", str(tmp_path), "--transfer",
                          str(tmp_path / "t.txt"), "--out", str(tmp_path / "rep")], capture_output=True, text=True)
    assert res.returncode == 2 and "t.txt should be a .yaml file" in res.stderr
    assert not (tmp_path / "rep").exists() and not (tmp_path / "t.txt").exists()
    with pytest.raises(ObliviateError, match="is not a sweep directory"):
        write_transfer_config(tmp_path / "nowhere", tmp_path / "t.yaml")


def test_recovery_cells_show_each_attacks_share_with_its_interval():
    from obliviate.sweep.papers import recovery_cells

    audit = {"shares": {"relearn": 0.62, "quantize": -0.1, "mia": 0.9},
             "intervals": {"relearn": [0.4, 0.81], "quantize": None, "mia": None}}
    assert recovery_cells(audit) == ["62% [40%, 81%]", "0%*"]  # relearning, then quantisation; mia not shown
    assert recovery_cells({"shares": {"relearn": None}}) == ["n/a", "n/a"]  # undefined, or the attack did not run
    assert recovery_cells(None) == ["–", "–"]  # no audit of this row


def test_a_method_name_becomes_a_file_name():
    assert slug("NPO+SAGO") == "NPO+SAGO" and slug("my method/2") == "my_method_2"


def test_compare_adds_each_best_audit_as_the_audit_wrote_it(unlearn_base, tmp_path, monkeypatch, capsys):
    from obliviate.audit.verdict import share_with_interval

    """--audits DIR: the best trained again alone with its audit (scripts/audit_bests.sh: `obliviate compare
    --best-configs`, then `obliviate unlearn --config DIR/best/NPO.yaml audit.enabled=true output_dir=DIR/NPO`, then
    `obliviate compare --audits DIR`) becomes a row of the report: each attack's headline share as audit.json holds
    it; a folder without any best's audit is an error naming the files it expected, and nothing is written."""
    from obliviate.cli import main

    base = unlearn_base(max_examples=4)
    out = tmp_path / "sw"
    cfg = build(SweepConfig, {"base": str(base), "methods": {"NPO": {"forget": "npo", "retain": "nll"}}, "trials": 1,
                              "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
                              "bar": {"keep": {"model_utility": 0.0}}, "output_dir": str(out)})
    run_sweep(cfg, log=lambda s: None)
    monkeypatch.chdir(tmp_path)
    script = Path(__file__).resolve().parents[2] / "scripts" / "audit_bests.sh"
    done = subprocess.run(["bash", str(script), str(out), "audits", "2", "audit.max_new_tokens=4", "eval.enabled=false",
                           "audit.relearn_steps=1", "audit.max_examples=4"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr + (tmp_path / "audits/logs/NPO.log").read_text()
    assert sorted(p.name for p in (tmp_path / "audits/best").iterdir()) == ["NPO.yaml"]
    audit = json.loads((tmp_path / "audits/NPO/audit/audit.json").read_text())
    (tmp_path / "cmp").mkdir()
    for name in ("compare.json", "report.md"):
        (tmp_path / "cmp" / name).write_text((tmp_path / "audits/report" / name).read_text())
    summary = json.loads((tmp_path / "cmp/compare.json").read_text())["audits"]["NPO"]
    assert summary["shares"] == {k: (audit["verdict"].get(k) or {}).get("share")
                                 for k in ("relearn", "quantize", "paraphrase", "mia")}
    assert summary["trial"] == "NPO #0" and summary["ref0"] == audit["ref0"]
    row = next(line for line in (tmp_path / "cmp/report.md").read_text().splitlines() if line.startswith("| NPO | NPO #0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    order = ("relearn", "quantize", "paraphrase", "mia")  # the report's column order
    assert summary["intervals"] == {k: (audit["verdict"].get(k) or {}).get("interval") for k in order}
    # (this tiny target knows none of the facts, so its shares are undefined, n/a: tests/test_audit.py has the numbers)
    shown = [share_with_interval(summary["shares"][k], summary["intervals"][k]) for k in order]
    assert cells[2:6] == shown and cells[6] == audit["ref0"]
    # the papers' table gains the two recovery columns, filled on the best's row only
    table = [line for line in (tmp_path / "cmp/report.md").read_text().split("## In the papers' columns")[1]
             .splitlines() if line.startswith("|")]
    assert table[0].endswith("| relearning brings back ↓ | quantisation brings back ↓ |")
    best = next(line for line in table if line.startswith("| NPO |") and "best: NPO #0" in line)
    assert [c.strip() for c in best.strip("|").split("|")][-2:] == shown[:2]
    assert next(line for line in table if line.startswith("| θ0 |")).endswith("| – | – |")
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert main(["compare", str(out), "--audits", "empty", "--out", "cmp2"]) == 2
    err = capsys.readouterr().err
    assert "no audit of a best under empty" in err and "empty/NPO/audit/audit.json" in err and not (tmp_path / "cmp2").exists()
    assert main(["compare", str(out), "--audits", "nowhere", "--out", "cmp3"]) == 2 and not (tmp_path / "cmp3").exists()
    # resumable: the config it trained is kept beside the audit, and a best audited already is not trained again
    assert (tmp_path / "audits/NPO/best.yaml").read_text() == (tmp_path / "audits/best/NPO.yaml").read_text()
    made = (tmp_path / "audits/NPO/audit/audit.json").stat().st_mtime_ns
    again = subprocess.run(["bash", str(script), str(out), "audits", "2"], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0 and "NPO: its best is audited already (audits/NPO)" in again.stdout, again.stderr
    assert (tmp_path / "audits/NPO/audit/audit.json").stat().st_mtime_ns == made
    # an audit of an earlier best (its best.yaml names another trial) is not shown as the current best's
    kept = tmp_path / "audits/NPO/best.yaml"
    kept.write_text(kept.read_text().replace("# NPO #0 of the sweep", "# NPO #7 of the sweep", 1))
    assert main(["compare", str(out), "--audits", "audits", "--out", "cmp4"]) == 2 and not (tmp_path / "cmp4").exists()
    assert "audits of an earlier best, not shown: NPO (audited NPO #7, best now NPO #0)" in capsys.readouterr().err
    # and one whose best changed is trained again, unless UNTIL has passed: then it says what it left
    late = subprocess.run(["bash", str(script), str(out), "audits", "2"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "UNTIL": "1"})
    assert late.returncode == 2 and "1 audits not started (UNTIL has passed)" in late.stderr
    assert (tmp_path / "audits/NPO/audit/audit.json").stat().st_mtime_ns == made


def test_an_audits_trial_is_read_from_the_config_it_trained(tmp_path):
    from obliviate.sweep.audits import audited_trial, best_header

    (tmp_path / "NPO+SAGO").mkdir()
    assert audited_trial(tmp_path, "NPO+SAGO") is None  # no best.yaml: an audit run by hand
    (tmp_path / "NPO+SAGO/best.yaml").write_text(best_header("NPO+SAGO #12", Path("sw"), "bar") + "method: {}\n")
    assert audited_trial(tmp_path, "NPO+SAGO") == "NPO+SAGO #12"
    (tmp_path / "NPO+SAGO/best.yaml").write_text("method: {}\n")
    assert audited_trial(tmp_path, "NPO+SAGO") is None


@pytest.mark.parametrize("script, args, message", [
    ("audit_bests.sh", [], "usage: bash scripts/audit_bests.sh SWEEP_DIR OUTPUT_DIR JOBS"),
    ("audit_bests.sh", ["{tmp}", "out", "two"], "JOBS must be a whole number of at least 1, not 'two'"),
    ("audit_bests.sh", ["{tmp}", "out", "0"], "JOBS must be a whole number of at least 1, not '0'"),
    ("audit_bests.sh", ["{tmp}", "out", "2"], "no sweep in {tmp} (no sweep.yaml): run obliviate sweep first"),
    ("audit_bests.sh", ["{tmp}", "out", "2", "UNTIL=9pm"], "UNTIL must be a time in seconds since the epoch, not '9pm'"),
    ("sweep_workers.sh", ["a.yaml", "out", "2"], "usage: bash scripts/sweep_workers.sh CONFIG OUTPUT_DIR WORKERS"),
    ("sweep_workers.sh", ["a.yaml", "out", "2", "1h"], "WORKERS and SECONDS must be whole numbers"),
    ("sweep_workers.sh", ["{tmp}/a.yaml", "out", "2", "60"], "no such sweep config: {tmp}/a.yaml"),
    ("tofu20_audits.sh", [], "usage: bash scripts/tofu20_audits.sh SECONDS [OUTPUT_DIR]"),
    ("tofu20_audits.sh", ["60", "JOBS=two"], "SECONDS, JOBS and DRAIN must be whole numbers"),
    ("tofu20_audits.sh", ["60"], "no docs/sweeps/smollm2_tofu20_cpu/sweep.yaml: run this from the repository root"),
    ("tofu20_audits.sh", ["60", "SWEEP=all"], "SWEEP must be main, forget05, forget05_asu or forget05_search, not 'all'"),
    ("tofu20_audits.sh", ["60", "REF0=both"], "REF0 must be unlearned or retain, not 'both'"),
    ("tofu20_audits.sh", ["60", "SWEEP=forget05"],
     "no docs/sweeps/smollm2_tofu20_forget05_cpu/sweep.yaml: run this from the repository root"),
    ("tofu20_study.sh", [], "usage: bash scripts/tofu20_study.sh SECONDS [STUDY_DIR]"),
    ("tofu20_study.sh", ["1h"], "SECONDS and WORKERS must be whole numbers"),
    ("tofu20_study.sh", ["60"], "no configs/sweep/smollm2_tofu20.yaml: run this from the repository root"),
    ("tofu20_study.sh", ["60", "SWEEP=rmu"], "no configs/sweep/smollm2_tofu20_rmu.yaml: run this from the repository root"),
    ("tofu20_study.sh", ["60", "SWEEP=all"], "SWEEP must be main, rmu, forget05, forget05_asu or forget05_search, not 'all'"),
    ("tofu20_study.sh", ["60", "SWEEP=forget05"],
     "no configs/sweep/smollm2_tofu20_forget05.yaml: run this from the repository root"),
    ("tofu20_study.sh", ["60", "SWEEP=forget05_asu"],
     "no configs/sweep/smollm2_tofu20_forget05_asu_floor.yaml: run this from the repository root"),
    ("tofu20_audits.sh", ["60", "SWEEP=forget05_asu"],
     "no docs/sweeps/smollm2_tofu20_forget05_asu_cpu/sweep.yaml: run this from the repository root"),
    ("tofu20_study.sh", ["60", "SWEEP=forget05_search"],
     "no configs/sweep/smollm2_tofu20_forget05_search.yaml: run this from the repository root"),
    ("tofu20_audits.sh", ["60", "SWEEP=forget05_search"],
     "no docs/sweeps/smollm2_tofu20_forget05_search_cpu/sweep.yaml: run this from the repository root"),
])
def test_the_study_scripts_refuse_bad_arguments_with_exit_2_and_write_nothing(script, args, message, tmp_path):
    path = Path(__file__).resolve().parents[2] / "scripts" / script
    env = dict(a.split("=", 1) for a in args if a.split("=")[0].isupper())  # SWEEP=rmu: an environment variable
    args = [a.format(tmp=tmp_path) for a in args if a.split("=")[0] not in env]
    done = subprocess.run(["bash", str(path), *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, **env})
    assert done.returncode == 2 and message.format(tmp=tmp_path) in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_audit_section_names_each_best_it_has_no_audit_of(tmp_path):
    """A best without an audit.json under the folder gets no row, and the note under the table names it with its
    trial (a partly audited study says which bests it lacks); the audited best's row holds its shares by hand."""
    from types import SimpleNamespace

    from obliviate.sweep.audits import audit_section

    (tmp_path / "NPO/audit").mkdir(parents=True)
    verdict = {"relearn": {"share": 0.25, "interval": [0.1, 0.4]}, "quantize": {"share": 0.0, "interval": [0.0, 0.05]}}
    (tmp_path / "NPO/audit/audit.json").write_text(json.dumps({"verdict": verdict, "ref0": "the unlearned model"}))
    bests = [SimpleNamespace(method=m, point=SimpleNamespace(name=f"{m} #{i}")) for i, m in enumerate(("NPO", "RMU",
                                                                                                         "GradDiff"))]
    lines, summary = audit_section(bests, tmp_path)
    assert list(summary) == ["NPO"] and summary["NPO"]["shares"]["relearn"] == 0.25
    assert "| NPO | NPO #0 | 25% [10%, 40%] | 0% [0%, 5%] | n/a | n/a | the unlearned model |" in lines
    assert f"Bests with no audit under {tmp_path}: RMU (RMU #1), GradDiff (GradDiff #2)." in lines
    (tmp_path / "RMU/audit").mkdir(parents=True)
    (tmp_path / "RMU/audit/audit.json").write_text(json.dumps({"verdict": {}, "ref0": "x"}))
    (tmp_path / "GradDiff/audit").mkdir(parents=True)
    (tmp_path / "GradDiff/audit/audit.json").write_text(json.dumps({"verdict": {}, "ref0": "x"}))
    assert not any(line.startswith("Bests with no audit") for line in audit_section(bests, tmp_path)[0])
