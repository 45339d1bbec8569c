"""`obliviate sweep` on a tiny model's knowledge track: budgets, resumption, two workers, pruning, failures, bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from obliviate.config import build, to_dict
from obliviate.errors import ConfigError, ObliviateError
from obliviate.eval.tofu import FQ_ROWS, forget_quality
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.run import plan_sweep, run_sweep
from obliviate.sweep.storage import ORIGINAL_ROWS, RETAIN_ROWS

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _cfg(base_file, out, **over):
    raw = {"base": str(base_file), "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
           "trials": 2, "sampler": "random", "output_dir": str(out)}
    raw.update(over)
    return build(SweepConfig, raw)


def _trials(out, method, study="sweep"):
    s = optuna.load_study(study_name=f"{study}/{method}", storage=f"sqlite:///{Path(out).resolve() / 'sweep.db'}")
    return s, s.get_trials(deepcopy=False)


def test_a_sweep_runs_each_methods_budget_records_everything_and_writes_the_comparison(base_file, tmp_path):
    out = tmp_path / "sw"
    lines = []
    res = run_sweep(_cfg(base_file, out, eval_every_steps=2, eval_rows=2, repeats=1, keep_best=True), log=lines.append)
    assert res["outcomes"] == {"complete": 6}  # 2 trials + 1 repeat per method
    for method in ("GradDiff", "NPO"):
        study, trials = _trials(out, method)
        assert [t.state.name for t in trials] == ["COMPLETE"] * 3
        main, rep = trials[:2], trials[2]
        for t in main:
            m = t.user_attrs["metrics"]
            assert 1e-4 <= t.params["train.lr"] <= 1e-2 and t.user_attrs["params"] == {"train.lr": t.params["train.lr"]}
            assert t.values[0] == pytest.approx(m["forget_score"])  # objective 1: the track's default
            assert t.values[1] == pytest.approx(min(m["neighbours_accuracy"], m["retain_accuracy"]))
            assert [c["step"] for c in t.user_attrs["curve"]] == [2, 4] and t.user_attrs["steps"] == 4
            assert t.user_attrs["best_step"] in (2, 4)
            rows = t.user_attrs["rows"]  # per-row outcomes, whose means are the metrics (compare's intervals)
            for name in ("forget_accuracy", "neighbours_accuracy", "retain_accuracy", "forget_mcq_accuracy"):
                if m.get(name) is not None:
                    assert sum(rows[name]) / len(rows[name]) == pytest.approx(m[name]), name
        assert rep.user_attrs["repeat_of"] in (0, 1) and rep.user_attrs["seed"] == 1  # base seed 0 + 1
        assert rep.params == trials[rep.user_attrs["repeat_of"]].params
        assert study.user_attrs["original"]["forget_accuracy"] == 1.0  # θ0 knows its forget facts by construction
    for f in ("report.md", "report.html", "frontier.png", "compare.json", "sweep.yaml"):
        assert (out / f).is_file(), f
    summary = json.loads((out / "compare.json").read_text())
    assert set(summary["methods"]) == {"GradDiff", "NPO"}
    for m in summary["methods"].values():  # a best over 2 seeds and its rows: an interval, resampled
        assert m["interval"] is None or (m["interval"]["seeds"] == 2 and m["interval"]["rows"] > 0)
    assert any("[NPO #" in line for line in lines)
    # the same command again: the budget is met, nothing runs, nothing is lost
    again = run_sweep(_cfg(base_file, out, eval_every_steps=2, eval_rows=2, repeats=1, keep_best=True),
                      log=lambda s: None)
    assert again["ran"] == 0 and len(_trials(out, "NPO")[1]) == 3


def test_a_broken_prune_rule_stops_the_trial_at_its_first_evaluation(base_file, tmp_path):
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, trials=1, eval_every_steps=1, eval_rows=2,
               prune=[{"metric": "retain_accuracy", "below": 2.0}], methods={"GA": {"forget": "ga", "retain": None}})
    res = run_sweep(cfg, log=lambda s: None)
    assert res["outcomes"] == {"pruned": 1}
    t = _trials(out, "GA")[1][0]
    assert t.state.name == "PRUNED" and [c["step"] for c in t.user_attrs["curve"]] == [1]
    assert t.user_attrs["pruned"].startswith("pruned at step 1: retain_accuracy = ")
    # relative to θ0: 0.0 x θ0's accuracy is never broken, the trial completes all 4 steps
    out2 = tmp_path / "sw2"
    cfg2 = _cfg(base_file, out2, trials=1, eval_every_steps=1, eval_rows=2, methods={"GA": {"forget": "ga", "retain": None}},
                prune=[{"metric": "retain_accuracy", "below": 0.0, "relative": True}])
    assert run_sweep(cfg2, log=lambda s: None)["outcomes"] == {"complete": 1}
    assert len(_trials(out2, "GA")[1][0].user_attrs["curve"]) == 4


def test_a_failed_trial_is_recorded_with_its_error_and_the_sweep_goes_on(base_file, tmp_path, monkeypatch):
    from obliviate.sweep import tracks

    real = tracks.Track.run

    def flaky(self, method, train, monitor=None):
        if train.lr > 1e-3:
            raise RuntimeError("loss is nan")
        return real(self, method, train, monitor)

    monkeypatch.setattr(tracks.Track, "run", flaky)
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, trials=3, methods={"GA": {"forget": "ga", "retain": "nll"}},
               space={"train.lr": {"choices": [1e-4, 1e-2, 2e-4]}}, sampler="grid")
    res = run_sweep(cfg, log=lambda s: None)
    assert res["outcomes"] == {"complete": 2, "failed": 1}
    trials = _trials(out, "GA")[1]
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert len(trials) == 3 and len(failed) == 1 and failed[0].params["train.lr"] == 1e-2
    assert failed[0].user_attrs["error"] == "RuntimeError: loss is nan"
    assert "GA #" in (out / "report.md").read_text() and "loss is nan" in (out / "report.md").read_text()


@pytest.mark.parametrize("over, match", [
    ({"space": {"train.learnrate": {"float": [1e-4, 1e-3]}}}, r"unknown key 'train.learnrate'; valid keys: \['seed', "),
    ({"space": {"train.lr": {"float": [1e-3, 1e-4]}}}, r"range \[0.001, 0.0001\] is inverted"),
    ({"space": {"train.lr": {"float": [1e-3, 1e-3]}}}, "is empty"),
    ({"objectives": [{"minimize": "forget_acc"}]}, r"objectives\[0\].minimize: 'forget_acc' names no metric "
                                                    r"\['forget_acc'\]; valid metrics: \["),
    ({"objectives": [{"lower": "forget_accuracy"}]}, "expected {minimize: METRIC}"),
    ({"prune": [{"metric": "nope", "below": 1}], "eval_every_steps": 1}, r"prune\[0\].metric: 'nope' names no metric"),
    ({"prune": [{"metric": "retain_accuracy", "below": 1}]}, "eval_every_steps=None is impossible"),
    ({"storage": "sqlite:////no/such/dir/s.db"}, "storage sqlite:////no/such/dir/s.db cannot be opened"),
    ({"storage": "postgresql://nobody@127.0.0.1:1/db"}, "cannot be opened"),
    ({"storage": "not a url"}, "neither a database URL"),
    ({"storage": "journal:/no/such/dir/s.journal"}, "does not exist"),
    ({"methods": {"X": {"forget": "nope"}}}, "unknown forget objective 'nope'"),
    ({"bar": {"keep": {"min(a, b)": 0.9}}}, "bar.keep"),
    ({"base": "no/such/base.yaml"}, r"base: no/such/base.yaml is not found from .*run it from there, or give base as "
                                    "an absolute path"),
    ({"base": "/no/such/base.yaml"}, "config file not found: /no/such/base.yaml"),
])
def test_bad_input_is_one_clear_error_with_nothing_written(base_file, tmp_path, over, match):
    out = tmp_path / "sw"
    with pytest.raises(ObliviateError, match=match):
        run_sweep(_cfg(base_file, out, **over), log=lambda s: None)
    assert not out.exists()


def test_a_set_key_given_twice_has_one_spelling_and_the_later_value(base_file, tmp_path, capsys):
    """`set.knowledge.forget_families=[...]` on the command line over a file's flat `knowledge.forget_families`:
    one key remains (the recorded sweep shows it once) with the command line's value, and the track forgets it."""
    from obliviate.cli import main
    from obliviate.sweep.config import flat_keys

    assert flat_keys({"a.b": 1, "c": 2, "a": {"b": 3, "d": {"e": 4}}}) == {"c": 2, "a.b": 3, "a.d.e": 4}
    assert flat_keys({"a": {"b": 3}, "a.b": 1}) == {"a.b": 1}
    cfg = build(SweepConfig, {"set": {"knowledge.forget_families": ["capitals"],
                                      "knowledge": {"forget_families": ["languages"]}}})
    assert cfg.set == {"knowledge.forget_families": ["languages"]}
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(base_file), "set": {"knowledge.forget_families": ["fam_a"]},
                                     "methods": {"NPO": {"forget": "npo", "retain": "nll"}}}))
    assert main(["validate", "--offline", "--config", str(sweep), "set.knowledge.forget_families=[fam_b]"]) == 0
    assert "forget fam_b" in capsys.readouterr().out
    with pytest.raises(ObliviateError, match="set: expected dict, got list"):
        build(SweepConfig, {"set": ["audit=false"]})


def test_validate_describes_a_sweep_without_loading_a_model(base_file, tmp_path):
    lines = plan_sweep(_cfg(base_file, tmp_path / "sw")).lines
    assert lines[0].endswith("(knowledge track)") and "methods: GradDiff, NPO; 2, 2 trials each (random)" in lines
    assert not (tmp_path / "sw").exists()


def test_another_sweep_in_the_same_directory_is_refused_and_a_larger_budget_extends_it(base_file, tmp_path):
    out = tmp_path / "sw"
    run_sweep(_cfg(base_file, out, trials=1, methods={"GA": {"forget": "ga", "retain": "nll"}}), log=lambda s: None)
    with pytest.raises(ObliviateError, match="holds another sweep"):
        run_sweep(_cfg(base_file, out, trials=1, methods={"GA": {"forget": "ga", "retain": "kl"}}), log=lambda s: None)
    assert len(_trials(out, "GA")[1]) == 1  # nothing already saved is lost
    res = run_sweep(_cfg(base_file, out, trials=2, methods={"GA": {"forget": "ga", "retain": "nll"}}),
                    log=lambda s: None)
    assert res["ran"] == 1 and len(_trials(out, "GA")[1]) == 2  # the same sweep, one trial more


def _cli_sweep(cfg_file, *args, env=None):
    return subprocess.Popen([sys.executable, "-m", "obliviate.cli", "sweep", "--config", str(cfg_file), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _write_cfg(path, base_file, out, **over):
    raw = {"base": str(base_file), "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
           "methods": {"GA": {"forget": "ga", "retain": "nll"}}, "trials": 6, "sampler": "random",
           "output_dir": str(out), "stale_after_s": 600}
    raw.update(over)
    path.write_text(yaml.safe_dump(raw))
    return path


def test_two_workers_share_one_study_each_trial_once_and_both_contribute(base_file, tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    procs = [_cli_sweep(_write_cfg(tmp_path / f"w{i}.yaml", base_file, tmp_path / f"out{i}"), "--storage", storage,
                        "--max-trials", "3") for i in range(2)]  # 3 each: the 6 need both, however slow one starts
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    trials = optuna.load_study(study_name="sweep/GA", storage=storage).get_trials()
    ran = [t for t in trials if "surplus" not in t.user_attrs]
    assert len(ran) == 6 and all(t.state.name == "COMPLETE" for t in ran)
    assert len({t.number for t in trials}) == len(trials)
    assert len({t.params["train.lr"] for t in ran}) == 6  # two workers that ask at once draw different points
    by_worker = Counter(t.user_attrs["worker"] for t in ran)
    assert sorted(by_worker.values()) == [3, 3], by_worker  # both workers ran trials, neither past its cap
    for i in range(2):  # each worker's own directory holds the report of the shared study
        assert (tmp_path / f"out{i}" / "report.md").is_file()


def _states(db: Path) -> list[str]:
    """The trials' states read straight from the SQLite file, read-only (opening an Optuna storage here could race
    the worker that is creating its tables), a running trial only once its worker has named itself in it (it does
    so right after asking for it); [] while the file or its tables do not exist yet."""
    import sqlite3

    if not db.is_file():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            named = {r[0] for r in con.execute("SELECT trial_id FROM trial_user_attributes WHERE key = 'params'")}
            rows = con.execute("SELECT trial_id, state FROM trials ORDER BY number").fetchall()
    except sqlite3.OperationalError:
        return []
    return [state for tid, state in rows if state != "RUNNING" or tid in named]


def test_a_sweep_killed_mid_trial_resumes_with_its_finished_trials_intact(base_file, tmp_path):
    out = tmp_path / "sw"
    cfg_file = _write_cfg(tmp_path / "s.yaml", base_file, out, trials=3, set={"unlearn.max_steps": 300})
    proc = _cli_sweep(cfg_file)
    deadline = time.time() + 300
    while time.time() < deadline:  # wait for one finished trial and the next one running
        states = _states(out / "sweep.db")
        if states.count("COMPLETE") >= 1 and "RUNNING" in states:
            break
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before it could be killed mid-trial (states {states}):\n"
                        f"{proc.communicate()[0][-3000:]}")
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"the sweep never had a finished and a running trial:\n{proc.communicate()[0][-3000:]}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {t.number: (t.params, t.values) for t in _trials(out, "GA")[1] if t.state.name == "COMPLETE"}
    again = _cli_sweep(cfg_file)
    log = again.communicate(timeout=600)[0]
    assert again.returncode == 0, log
    trials = _trials(out, "GA")[1]
    after = {t.number: (t.params, t.values) for t in trials if t.state.name == "COMPLETE"}
    assert len(after) == 3 and all(after[n] == v for n, v in before.items())  # finished trials intact
    killed = [t for t in trials if t.state.name == "FAIL"]
    assert len(killed) == 1 and killed[0].user_attrs.get("stale") is True  # the dead worker's trial, done again


def test_a_prune_rule_by_hand():
    from obliviate.eval.score import parse_expr
    from obliviate.sweep.run import PruneRule

    rel = PruneRule(parse_expr("a"), below=True, threshold=0.5, relative=True)
    assert rel.limit({"a": 0.8}) == pytest.approx(0.4)  # half of θ0's value
    assert rel.broken(0.3, {"a": 0.8}) and not rel.broken(0.45, {"a": 0.8}) and not rel.broken(0.4, {"a": 0.8})
    absolute = PruneRule(parse_expr("a"), below=True, threshold=0.5, relative=False)
    assert absolute.limit({"a": 0.8}) == 0.5 and absolute.broken(0.45, {"a": 0.8})
    above = PruneRule(parse_expr("d"), below=False, threshold=0.5, relative=False)
    assert above.broken(0.6, {}) and not above.broken(0.5, {})
    assert not rel.broken(float("nan"), {"a": 0.8}) and not rel.broken(0.1, {})  # a missing value never prunes


def test_a_sweep_over_an_unlearn_config_reports_tofu_metrics(unlearn_base, tmp_path):
    base = unlearn_base(max_steps=8, max_examples=2, max_new_tokens=4)
    out = tmp_path / "sw"
    res = run_sweep(_cfg(base, out, trials=1, eval_every_steps=4, eval_rows=2), log=lambda s: None)
    assert res["outcomes"] == {"complete": 1}
    study, trials = _trials(out, "npo+nll")
    m = trials[0].user_attrs["metrics"]
    assert trials[0].values == [m["forget_rougeL_recall"], m["model_utility"]]  # the unlearn track's defaults
    assert m["forget_quality"] is not None  # eval.retain_model gives forget quality, computed once per worker
    assert study.user_attrs["original"]["forget_quality"] == pytest.approx(1.0)  # θ0 against itself
    assert [c["step"] for c in trials[0].user_attrs["curve"]] == [4, 8]
    assert "forget_rougeL_recall" in trials[0].user_attrs["curve"][0]
    # how far its forget loss moved (train/guard.py loss_change): at the default lr (1e-5) 8 steps barely move NPO's
    assert 0 < m["forget_loss_change"] < 0.01
    assert not Path("ignored").exists()


def test_a_tofu_sweep_selects_on_some_rows_and_reports_on_the_others(unlearn_base, tmp_path, monkeypatch):
    """heldout_share on an unlearn (TOFU) base: every split is cut once by row; selection (objectives, the quick
    evaluation) reads one part, the trial's report the other, each with TOFU's own aggregates on its rows only
    (forget quality: the KS test on that part's forget rows against the retain model's truth ratios of the same rows)."""
    from obliviate.eval import runner
    from obliviate.eval.heldout import tofu_cut

    base = unlearn_base(max_steps=1, max_examples=6, max_new_tokens=2)
    seen, real = [], runner.evaluate_model

    def spy(model, tok, splits, cfg, retain_tr=None, *a, **kw):
        seen.append(({k: [r.question for r in v] for k, v in splits.items()}, retain_tr))
        return real(model, tok, splits, cfg, retain_tr, *a, **kw)

    monkeypatch.setattr(runner, "evaluate_model", spy)
    import obliviate.sweep.run as run_module

    ticks = iter(range(100, 10_000, 21))  # the worker's CPU clock: 21 s a reading
    out = tmp_path / "sw"
    with pytest.MonkeyPatch.context() as clock:
        clock.setattr(run_module.time, "process_time", lambda: float(next(ticks)))
        assert run_sweep(_cfg(base, out, trials=1, heldout_share=0.5), log=lambda s: None)["outcomes"] == \
            {"complete": 1}
    study, trials = _trials(out, "npo+nll")
    report = trials[0].user_attrs["report"]["metrics"]
    assert report["forget_quality"] is not None and study.user_attrs["original_report"]["forget_quality"] == 1.0
    # the trial's CPU time: the clock's reading after the trial less the one before (one tick), not its wall time
    assert trials[0].user_attrs["cpu_seconds"] == 21.0 and trials[0].user_attrs["seconds"] != 21.0
    # each part keeps its own per-row values (compare's intervals over rows): their means are that part's metrics
    for metrics, rows in ((trials[0].user_attrs["metrics"], trials[0].user_attrs["rows"]),
                          (report, trials[0].user_attrs["report"]["rows"])):
        assert {"forget_rougeL_recall", "forget_prob", "forget_degenerate_share", "retain_truth_ratio"} <= set(rows)
        for key, values in rows.items():
            if key not in FQ_ROWS:
                assert metrics[key] == pytest.approx(float(np.mean(values)), abs=1e-9), key
        # forget quality's parts, paired by row: the KS test of the two is the part's forget quality
        assert forget_quality(np.array(rows[FQ_ROWS[0]]), np.array(rows[FQ_ROWS[1]])) == metrics["forget_quality"]
    assert len(trials[0].user_attrs["report"]["rows"]["forget_rougeL_recall"]) == len(seen[1][0]["forget"])
    parts = [q for q, _ in seen]
    assert len(parts) == 6  # θ0, the retain model and the trial, each on the selection part then the report part
    for select, held in (parts[0:2], parts[2:4], parts[4:6]):
        for split in select:
            assert select[split] and held[split] and not set(select[split]) & set(held[split]), split
    assert len(seen[0][1]) == len(parts[0]["forget"]) and len(seen[1][1]) == len(parts[1]["forget"])  # its own rows'
    assert study.user_attrs["original"]["forget_quality"] == 1.0  # θ0 against itself, on the selection part too
    # the retain model (here θ0's own weights) is recorded once, on the verdict's rows: θ0's held-out report exactly
    assert study.user_attrs["retain_report"] == study.user_attrs["original_report"]
    assert study.user_attrs["retain_report"] != study.user_attrs["original"]
    # θ0's and the retain model's per-row values on the verdict's rows, whose means are their reports (compare's
    # intervals of θ0 and of each method's utility over θ0's on the same rows)
    rows0 = study.user_attrs[ORIGINAL_ROWS]
    assert set(rows0) == set(trials[0].user_attrs["report"]["rows"]) and study.user_attrs[RETAIN_ROWS] == rows0
    for key, values in rows0.items():
        if key not in FQ_ROWS:
            assert study.user_attrs["original_report"][key] == pytest.approx(float(np.mean(values)), abs=1e-9), key
    # a study made before those rows were kept evaluates θ0 once more when resumed, and records them
    import sqlite3

    with sqlite3.connect(out / "sweep.db") as db:
        db.execute("DELETE FROM study_user_attributes WHERE key IN (?, ?)", (ORIGINAL_ROWS, RETAIN_ROWS))
    lines: list[str] = []
    assert run_sweep(_cfg(base, out, trials=1, heldout_share=0.5), log=lines.append)["ran"] == 0
    assert not any("not repeated" in line for line in lines)
    assert _trials(out, "npo+nll")[0].user_attrs[ORIGINAL_ROWS] == rows0
    lines.clear()
    run_sweep(_cfg(base, out, trials=1, heldout_share=0.5), log=lines.append)
    assert "θ0's evaluation: recorded in the storage by an earlier worker, not repeated" in lines
    cut = tofu_cut({"a": list(range(6)), "b": list(range(3))}, 0.5, 0)
    assert [sorted(cut[0][k].tolist() + cut[1][k].tolist()) for k in "ab"] == [list(range(6)), list(range(3))]
    assert len(cut[1]["a"]) == 3 and len(cut[1]["b"]) in (1, 2)
    assert tofu_cut({"a": list(range(6))}, 0.5, 0)[1]["a"].tolist() == cut[1]["a"].tolist()  # the same cut again


def test_stale_trials_a_dead_worker_a_silent_one_and_one_that_never_named_its_worker(tmp_path):
    from obliviate.sweep.workers import ORPHAN_S, WORKER, fail_stale

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = WORKER.rpartition(":")[0]
    trials = [study.ask() for _ in range(5)]
    now = time.time()
    trials[0].set_user_attr("worker", f"{host}:{dead.pid}")            # this machine, process gone: stale at once
    trials[0].set_user_attr("heartbeat", now)
    trials[1].set_user_attr("worker", WORKER)                          # alive and beating: kept
    trials[1].set_user_attr("heartbeat", now)
    trials[2].set_user_attr("worker", "elsewhere:1")                   # another machine, silent for 100 s: stale
    trials[2].set_user_attr("heartbeat", now - 100)
    trials[3].set_user_attr("heartbeat", now - ORPHAN_S - 1)           # never named its worker: an orphan
    trials[4].set_user_attr("worker", "elsewhere:2")                   # another machine, beating: kept
    trials[4].set_user_attr("heartbeat", now - 10)
    assert fail_stale(study, stale_after_s=60, now=now) == 3
    got = study.get_trials()
    assert [t.state.name for t in got] == ["FAIL", "RUNNING", "FAIL", "FAIL", "RUNNING"]
    assert all(got[i].user_attrs.get("stale") for i in (0, 2, 3))


def test_selection_never_reads_the_held_out_rows(base_file, tmp_path, monkeypatch):
    """The same sweep twice, the second with every held-out row's outcome flipped after evaluation: each trial's
    selection metrics and objective values are unchanged, its held-out report is not, and so is the best."""
    from obliviate.eval import heldout, knowledge

    held: set[str] = set()
    real_cut, real_eval = heldout.report_ids, knowledge.evaluate_knowledge

    def cut(*args, **kwargs):
        held.update(real_cut(*args, **kwargs))
        return set(held)

    monkeypatch.setattr(heldout, "report_ids", cut)
    space = {"train.lr": {"choices": [1e-3, 3e-3]}}
    methods = {"GA": {"forget": "ga", "retain": "nll"}}
    runs = {}
    for name, poison in (("clean", False), ("poisoned", True)):
        def evaluate(*args, **kwargs):
            out = real_eval(*args, **kwargs)
            if poison:
                out["rows"] = {k: [1 - v if i in held else v for v, i in zip(vals, out["row_ids"][k])]
                               for k, vals in out["rows"].items()}
            return out

        monkeypatch.setattr(knowledge, "evaluate_knowledge", evaluate)
        out = tmp_path / name
        run_sweep(_cfg(base_file, out, trials=2, sampler="grid", space=space, methods=methods), log=lambda s: None)
        runs[name] = (_trials(out, "GA")[1], json.loads((out / "compare.json").read_text()))
    assert held  # the knowledge track cut its rows
    (clean, c_sum), (dirty, d_sum) = runs["clean"], runs["poisoned"]
    for a, b in zip(clean, dirty):
        strip = lambda m: {k: v for k, v in m.items() if k != "train_seconds"}  # noqa: E731
        assert strip(a.user_attrs["metrics"]) == strip(b.user_attrs["metrics"]) and a.values == b.values
        assert a.user_attrs["report"]["metrics"] != b.user_attrs["report"]["metrics"]
    assert (c_sum["methods"]["GA"]["best"] or {}).get("trial") == (d_sum["methods"]["GA"]["best"] or {}).get("trial")
    assert c_sum["heldout"] is (c_sum["methods"]["GA"]["best"] is not None)
    if c_sum["methods"]["GA"]["best"] is not None:  # the verdict's estimate is the held-out report's score
        number = int(c_sum["methods"]["GA"]["best"]["trial"].split("#")[1])
        for (trials, summary) in runs.values():
            report = trials[number].user_attrs["report"]["metrics"]
            assert summary["methods"]["GA"]["interval"]["estimate"] == pytest.approx(report["forget_score"])


def test_each_method_starts_at_its_recipe_and_the_report_shows_it(base_file, tmp_path):
    """start_at_recipe: every study's first trial is the base's settings (lr 1e-3 here), marked, and the
    comparison has a row per method at its recipe with its interval over rows."""
    out = tmp_path / "sw"
    res = run_sweep(_cfg(base_file, out, start_at_recipe=True), log=lambda s: None)
    assert res["outcomes"] == {"complete": 4}
    for method in ("GradDiff", "NPO"):
        study, trials = _trials(out, method)
        assert trials[0].user_attrs["recipe"] is True and trials[0].params == {"train.lr": 1e-3}
        assert study.user_attrs["recipe"] == {"train.lr": 1e-3}
        assert "recipe" not in trials[1].user_attrs and trials[1].params["train.lr"] != 1e-3
    summary = json.loads((out / "compare.json").read_text())
    assert set(summary["recipes"]) == {"GradDiff", "NPO"}
    npo = summary["recipes"]["NPO"]
    assert npo["trial"] == "NPO #0" and npo["params"] == {"train.lr": 1e-3} and npo["interval"]["rows"] > 0
    assert npo["interval"]["seeds"] == 1
    report = (out / "report.md").read_text()
    assert report.index("## Each method at its recipe") < report.index("## Best at matched utility")
    assert "| NPO | NPO #0 |" in report
    again = run_sweep(_cfg(base_file, out, start_at_recipe=True, trials=3), log=lambda s: None)
    assert again["ran"] == 2  # one more trial each; the recipe is not enqueued a second time
    assert sum(bool(t.user_attrs.get("recipe")) for t in _trials(out, "NPO")[1]) == 1
    with pytest.raises(ObliviateError, match="start_at_recipe"):
        _cfg(base_file, out, start_at_recipe=True, sampler="grid")
    with pytest.raises(ObliviateError, match=r"space.train.lr: the recipe of GradDiff sets 0.001, outside"):
        plan_sweep(_cfg(base_file, tmp_path / "x", start_at_recipe=True,
                        space={"train.lr": {"float": [1e-5, 1e-4], "log": True}}))


def test_a_recipe_run_first_with_its_seeds_then_a_larger_budget_repeats_the_new_best(base_file, tmp_path,
                                                                                      monkeypatch):
    """trials=1 with start_at_recipe: each method's recipe is its best and gets its repeats (seeds from the method's
    own train.seed), so the recipe row has an interval over seeds; trials=2 later: the best of the two gets its
    repeats too and the recipe's stay, and θ0 is not evaluated again (the storage holds its evaluation)."""
    from obliviate.sweep import tracks
    from obliviate.sweep.search import best_trial

    methods = {"NPO": {"forget": "npo", "retain": "nll", "train": {"seed": 5}}}
    out = tmp_path / "sw"
    res = run_sweep(_cfg(base_file, out, methods=methods, start_at_recipe=True, trials=1, repeats=2),
                    log=lambda s: None)
    assert res["outcomes"] == {"complete": 3}
    trials = _trials(out, "NPO")[1]
    assert [t.user_attrs.get("repeat_of") for t in trials] == [None, 0, 0]
    assert [t.user_attrs.get("seed") for t in trials[1:]] == [6, 7]  # the method's seed 5, not the base's 0
    assert all(t.params == trials[0].params for t in trials)
    recipe = json.loads((out / "compare.json").read_text())["recipes"]["NPO"]
    assert recipe["interval"]["seeds"] == 3 and recipe["interval"]["rows"] > 0
    cfg = _cfg(base_file, out, methods=methods, start_at_recipe=True, trials=2, repeats=2)
    original = _trials(out, "NPO")[0].user_attrs["original"]
    real, calls = tracks.KnowledgeTrack._evaluate, []

    def counted(self, model, rows, replies=None):
        calls.append(model is self.model)
        return real(self, model, rows, replies)

    monkeypatch.setattr(tracks.KnowledgeTrack, "_evaluate", counted)
    lines = []
    again = run_sweep(cfg, log=lines.append)
    assert not any(calls) and len(calls) == again["ran"]  # one evaluation per trial, none of θ0
    assert "θ0's evaluation: recorded in the storage by an earlier worker, not repeated" in lines
    assert _trials(out, "NPO")[0].user_attrs["original"] == original
    study, trials = _trials(out, "NPO")
    best = best_trial(plan_sweep(cfg), study)
    mine = [t for t in trials if t.user_attrs.get("repeat_of") == best.number]
    assert sorted(t.user_attrs["seed"] for t in mine) == [6, 7] and all(t.state.name == "COMPLETE" for t in mine)
    assert again["ran"] == (1 if best.number == 0 else 3)  # the new trial, and its 2 repeats if it is the best
    assert sum(t.user_attrs.get("repeat_of") == 0 for t in trials) == 2  # the recipe's repeats stay
    assert run_sweep(cfg, log=lambda s: None)["ran"] == 0


def test_a_recipe_cut_short_with_its_worker_is_run_again_not_replaced_by_a_sampled_trial(base_file, tmp_path):
    """A worker killed during the recipe (a deadline, a lost machine): the next worker fails that trial as stale and
    runs the recipe again, so the study's first point stays the recipe; a recipe queued twice runs once."""
    methods = {"NPO": {"forget": "npo", "retain": "nll"}}
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods=methods, start_at_recipe=True, trials=1)
    assert run_sweep(cfg, log=lambda s: None, max_trials=0)["ran"] == 0  # the study and its queued recipe only
    study, _ = _trials(out, "NPO")
    cut = study.ask()  # the recipe, taken by a worker that then died
    assert cut.user_attrs["recipe"] is True
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    from obliviate.sweep.workers import WORKER

    cut.set_user_attr("worker", f"{WORKER.rpartition(':')[0]}:{dead.pid}")
    assert run_sweep(cfg, log=lambda s: None)["outcomes"] == {"complete": 1}
    trials = _trials(out, "NPO")[1]
    assert [(t.state.name, bool(t.user_attrs.get("recipe"))) for t in trials] == [("FAIL", True), ("COMPLETE", True)]
    assert trials[0].user_attrs["stale"] is True and trials[1].params == {"train.lr": 1e-3}
    assert run_sweep(cfg, log=lambda s: None)["ran"] == 0
    from obliviate.sweep.workers import surplus

    study.enqueue_trial({"train.lr": 1e-3}, user_attrs={"recipe": True})  # a second worker's copy of the recipe
    copy = study.ask()
    assert copy.user_attrs["recipe"] and surplus(study, copy, budget=2)  # within budget, still surplus


def test_a_worker_past_start_before_starts_no_trial_and_the_same_command_goes_on(base_file, tmp_path):
    """--start-before S: once S seconds have passed since the worker began, it starts no trial (the one it runs ends
    first); the same command again runs the rest."""
    methods = {"NPO": {"forget": "npo", "retain": "nll"}}
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods=methods, trials=2)
    lines: list[str] = []
    assert run_sweep(cfg, log=lines.append, start_before_s=0)["ran"] == 0
    assert "--start-before 0 s has passed: this worker starts no other trial" in lines
    assert run_sweep(cfg, log=lambda s: None, start_before_s=1e9)["outcomes"] == {"complete": 2}


def test_sweep_workers_with_drain_start_no_trial_in_the_drained_seconds(base_file, tmp_path):
    """scripts/sweep_workers.sh with DRAIN=D gives each worker --start-before: the seconds from its start to D before
    the deadline, 0 when the deadline is no further than D, so that no trial starts; a DRAIN that is not a whole
    number is refused before anything starts."""
    methods = {"NPO": {"forget": "npo", "retain": "nll"}}
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({**to_dict(_cfg(base_file, tmp_path / "unused", methods=methods, trials=1)),
                                      "output_dir": "unused"}))
    script = Path(__file__).resolve().parents[2] / "scripts" / "sweep_workers.sh"
    done = subprocess.run(["bash", str(script), str(config), str(tmp_path / "sw2"), "1", "300"], capture_output=True,
                          text=True, env={**os.environ, "DRAIN": "300"})
    log = (tmp_path / "sw2-logs" / "w1.log").read_text()
    assert done.returncode == 0, done.stderr + log
    assert "--start-before 0 s has passed" in log and "this worker ran 0 trial(s)" in log
    bad = subprocess.run(["bash", str(script), str(config), str(tmp_path / "sw3"), "1", "60"], capture_output=True,
                         text=True, env={**os.environ, "DRAIN": "soon"})
    assert bad.returncode == 2 and "DRAIN must be a whole number of seconds, not 'soon'" in bad.stderr
    assert not (tmp_path / "sw3-logs").exists()
    from obliviate.cli import main

    assert main(["sweep", "--config", str(config), "--start-before", "-5", f"output_dir={tmp_path / 'sw4'}"]) == 2
    assert not (tmp_path / "sw4").exists()  # refused before anything is written


def test_layer_sets_in_the_space_are_checked_against_the_model_before_any_trial(base_file, tmp_path):
    """A space's layer sets, its own or a teacher map's points (a map made on another model), must name layers the
    model has: the first worker is refused before any trial, with the dimension named."""
    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.0, "layers": [0]}, "retain": "kl"}}
    spaces = {"method.forget_args.layers": ({"choices": [[0], [9]]}, r"space\.method\.forget_args\.layers=\[9\]"),
              "method.forget_args": ({"teacher_map": str(tmp_path / "map.json"), "include": [{"tau": 2.0, "layers": [9]}]},
                                     r"space\.method\.forget_args \(teacher map\)=\[9\]")}
    (tmp_path / "map.json").write_text(json.dumps({"grid": [{"tau": 4.0, "layers": [1], "fluent_forgetting": True}],
                                                   "base": {"forget": {"recall": 1.0}}}))
    for key, (dim, message) in spaces.items():
        cfg = _cfg(base_file, tmp_path / key, methods=methods, trials=1, space={key: dim})
        with pytest.raises(ConfigError, match=message + ": layer index 9 is out of range"):
            run_sweep(cfg, log=lambda s: None)
        assert _trials(tmp_path / key, "ASU")[1] == []


def test_a_worker_with_other_weights_for_theta0_or_other_rows_is_refused(base_file, tmp_path):
    """The first worker records the digests of θ0's weights and of the rows (the probe's groups, the held-out cut)
    in every study; a later worker with other weights (a target fine-tuned again elsewhere) or other rows (a probe
    that kept other facts on another CPU) is refused before any trial, naming what differs and both digests. A study
    recorded before a digest existed is given it, not refused."""
    from obliviate.receipt.digests import model_hashes, weights_digest
    from obliviate.train.student import load_model

    methods = {"NPO": {"forget": "npo", "retain": "nll"}}
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods=methods, trials=1)
    assert run_sweep(cfg, log=lambda s: None, max_trials=0)["ran"] == 0
    study, _ = _trials(out, "NPO")
    theta0 = load_model(plan_sweep(cfg).track.cfg.model)[0]
    recorded = study.user_attrs["models"]
    assert recorded["original"] == weights_digest(model_hashes(theta0)) and set(recorded) == {"original", "rows"}
    study.set_user_attr("models", {"original": recorded["original"]})  # made before the rows had a digest
    assert run_sweep(cfg, log=lambda s: None, max_trials=0)["ran"] == 0
    assert _trials(out, "NPO")[0].user_attrs["models"] == recorded
    study.set_user_attr("models", {**recorded, "rows": "1" * 64})
    with pytest.raises(ObliviateError, match=r"made with other rows \(training, evaluation, cut\) \(rows 111111111111 "
                                             r"there, "):
        run_sweep(cfg, log=lambda s: None)
    study.set_user_attr("models", {**recorded, "original": "0" * 64})
    with pytest.raises(ObliviateError, match=r"made with other θ0's weights \(original 000000000000 there, "):
        run_sweep(cfg, log=lambda s: None)
    assert _trials(out, "NPO")[1] == []  # no trial ran


def test_a_repeat_queued_twice_runs_once(base_file, tmp_path):
    """Two workers that both find the best short of a repeat both queue it: the later copy is failed as surplus,
    never run."""
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods={"NPO": {"forget": "npo", "retain": "nll"}}, trials=1, repeats=1)
    assert run_sweep(cfg, log=lambda s: None)["outcomes"] == {"complete": 2}
    study, trials = _trials(out, "NPO")
    study.enqueue_trial(trials[1].params, user_attrs={"repeat_of": 0, "seed": trials[1].user_attrs["seed"]})
    assert run_sweep(cfg, log=lambda s: None)["ran"] == 0
    copy = _trials(out, "NPO")[1][-1]
    assert copy.state.name == "FAIL" and copy.user_attrs["surplus"] is True


def test_a_method_may_bring_its_own_training_settings(base_file, tmp_path):
    """methods.<name>.train: that method's training settings over the base's (its authors' epochs or steps); its
    trials and its recipe use them, the other methods keep the base's."""
    methods = {"GradDiff": {"forget": "ga", "retain": "nll", "train": {"max_steps": 2, "lr": 5e-3}},
               "NPO": {"forget": "npo", "retain": "nll"}}
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods=methods, start_at_recipe=True, trials=1)
    plan = plan_sweep(cfg)
    assert (plan.trains["GradDiff"].max_steps, plan.trains["GradDiff"].lr) == (2, 5e-3)
    assert (plan.trains["NPO"].max_steps, plan.trains["NPO"].lr) == (4, 1e-3)
    assert plan.recipes == {"GradDiff": {"train.lr": 5e-3}, "NPO": {"train.lr": 1e-3}}
    run_sweep(cfg, log=lambda s: None)
    assert [t.user_attrs["steps"] for t in _trials(out, "GradDiff")[1]] == [2]
    assert [t.user_attrs["steps"] for t in _trials(out, "NPO")[1]] == [4]
    with pytest.raises(ObliviateError, match=r"methods.NPO.train: expected a mapping"):
        plan_sweep(_cfg(base_file, tmp_path / "x", methods={"NPO": {"forget": "npo", "train": 3}}))
    with pytest.raises(ObliviateError, match=r"methods.NPO.train.epoch"):
        plan_sweep(_cfg(base_file, tmp_path / "x", methods={"NPO": {"forget": "npo", "train": {"epoch": 3}}}))


def test_a_sweep_recorded_before_a_key_existed_is_still_the_same_sweep(base_file, tmp_path):
    """Keys added to SweepConfig later, at their defaults, do not make an older sweep directory "another sweep"."""
    from obliviate.sweep.run import prepare_output

    out = tmp_path / "sw"
    cfg = _cfg(base_file, out)
    assert prepare_output(cfg) is False
    saved = yaml.safe_load((out / "sweep.yaml").read_text())
    del saved["start_at_recipe"]
    (out / "sweep.yaml").write_text(yaml.safe_dump(saved))
    assert prepare_output(cfg) is True
    with pytest.raises(ObliviateError, match="holds another sweep"):
        prepare_output(_cfg(base_file, out, start_at_recipe=True))


def test_a_tofu_tracks_rows_key_follows_its_training_rows_splits_and_cut():
    """The rows digest a study records (with the weights' digests): another training row, another evaluation answer or
    another held-out cut is another key; the same rows again are the same key."""
    from obliviate.data.rows import QARow
    from obliviate.eval.heldout import tofu_cut
    from obliviate.sweep.tracks import UnlearnTrack

    def track(answer="Lima.", train="Tom writes.", share=0.5):
        t = object.__new__(UnlearnTrack)
        t._rows = [QARow("Where?", "Lima.")], [QARow("Who?", train)]
        t.splits = {"forget": [QARow("Where?", answer), QARow("When?", "1961.")],
                    "retain": [QARow(f"Q{i}?", f"A{i}.") for i in range(4)]}
        t.cut = tofu_cut(t.splits, share, 0) if share else None
        return t

    key = track().rows_key()
    assert track().rows_key() == key and len(key) == 64
    assert len({key, track(answer="Lima, Peru.").rows_key(), track(train="Tom paints.").rows_key(),
                track(share=None).rows_key()}) == 4


def test_a_knowledge_tracks_rows_key_follows_the_probes_groups_and_the_held_out_facts():
    from types import SimpleNamespace

    from obliviate.eval.knowledge import KnowledgeSplit
    from obliviate.sweep.tracks import KnowledgeTrack

    def track(forget=("f1", "f2"), retain=("r1",), held=("f2",)):
        t = object.__new__(KnowledgeTrack)
        facts = {i: SimpleNamespace(id=i) for i in (*forget, *retain)}
        t.split = KnowledgeSplit([facts[i] for i in forget], [], [facts[i] for i in retain], [])
        t.held_out = set(held)
        return t

    key = track().rows_key()
    assert track().rows_key() == key
    assert len({key, track(forget=("f1", "f3")).rows_key(), track(retain=("r2",)).rows_key(),
                track(held=("f1",)).rows_key()}) == 4


def _other_worker_holds(study, cfg, method, count):
    """Another worker that read `study` when it held `count` trials: its proposal queued, asked and running."""
    from obliviate.sweep.search import enqueue_proposal, make_sampler
    from obliviate.sweep.workers import WORKER

    enqueue_proposal(study, [], plan_sweep(cfg), method, make_sampler(cfg, method, count))
    other = study.ask()
    other.set_user_attr("worker", WORKER)  # this process: alive, never stale
    other.set_user_attr("heartbeat", time.time())
    return study.get_trials(deepcopy=False)[other.number].system_attrs["fixed_params"]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_two_workers_that_read_the_study_at_once_run_its_proposal_once(base_file, tmp_path, sampler):
    """Two workers that count a study's trials at the same moment seed their samplers alike and propose one point:
    the later trial (by number) is dropped before it runs (failed, marked surplus) and its worker draws again at the
    next count, so the two run different points."""
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods={"NPO": {"forget": "npo", "retain": "nll"}}, trials=2, sampler=sampler)
    assert run_sweep(cfg, log=lambda s: None, max_trials=0)["ran"] == 0
    study, _ = _trials(out, "NPO")
    point = _other_worker_holds(study, cfg, "NPO", count=1)  # this worker will count 1 trial too
    lines: list[str] = []
    assert run_sweep(cfg, log=lines.append, max_trials=1)["outcomes"] == {"complete": 1}
    trials = _trials(out, "NPO")[1]
    assert [t.state.name for t in trials] == ["RUNNING", "FAIL", "COMPLETE"]
    assert trials[1].system_attrs["fixed_params"] == point and trials[1].user_attrs["surplus"] is True
    assert trials[2].params != point and "train.lr" in trials[2].params
    assert "[NPO #1] another worker drew the same point at the same moment: drawing again" in lines


def test_a_worker_whose_every_draw_clashes_runs_the_point_after_max_clashes(base_file, tmp_path):
    """A space of one point with another worker running it: every draw clashes, so after MAX_CLASHES (3) dropped
    draws the worker runs the point anyway instead of drawing forever."""
    out = tmp_path / "sw"
    cfg = _cfg(base_file, out, methods={"NPO": {"forget": "npo", "retain": "nll"}}, trials=2,
               space={"train.lr": {"choices": [1e-3]}})
    assert run_sweep(cfg, log=lambda s: None, max_trials=0)["ran"] == 0
    study, _ = _trials(out, "NPO")
    _other_worker_holds(study, cfg, "NPO", count=0)
    assert run_sweep(cfg, log=lambda s: None, max_trials=1)["outcomes"] == {"complete": 1}
    states = [t.state.name for t in _trials(out, "NPO")[1]]
    assert states == ["RUNNING", "FAIL", "FAIL", "FAIL", "COMPLETE"]


def test_a_clash_is_a_proposal_held_by_an_earlier_waiting_or_running_trial_or_a_point_taken_by_another():
    """clash: the later of two equal proposals while the earlier waits or runs (not once it finished: TPE may
    propose a finished point again); a trial without a point when one waited (another worker took it); never a
    recipe, a queued point, a repeat (surplus rules those) or a method without dimensions (its one point)."""
    from optuna.trial import TrialState, create_trial

    from obliviate.sweep.workers import clash

    study = optuna.create_study()
    study.enqueue_trial({"x": 1.0})
    study.tell(study.ask(), 0.0)  # #0 finished
    study.enqueue_trial({"x": 1.0})
    assert not clash(study, study.ask(), queued=True)  # #1: #0 finished
    study.enqueue_trial({"x": 1.0})
    assert clash(study, study.ask(), queued=True)  # #2: #1 runs the point
    study.enqueue_trial({"x": 2.0})
    assert not clash(study, study.ask(), queued=True)  # another point
    for attrs in ({"recipe": True}, {"queued": True}, {"repeat_of": 0, "seed": 1}):
        study.enqueue_trial({"x": 1.0}, user_attrs=attrs)
        assert not clash(study, study.ask(), queued=True), attrs
    study.enqueue_trial({"x": 3.0})  # waits (another worker queued it)
    study.add_trial(create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": {"x": 3.0}}))
    assert clash(study, study.get_trials()[-1], queued=True)
    study.enqueue_trial({})
    study.add_trial(create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": {}}))
    assert not clash(study, study.get_trials()[-1], queued=True)  # both the method's one point
    study = optuna.create_study()
    fresh = study.ask()  # nothing waits: no point until it suggests
    assert clash(study, fresh, queued=True) and not clash(study, fresh, queued=False)
