"""How a sweep searches: the bar as objective and constraints (`search: bar`), and warm starts from another sweep."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import optuna
import pytest

from obliviate.config import build
from obliviate.errors import ConfigError, ObliviateError
from obliviate.eval.score import Bar, parse_expr
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.points import collect
from obliviate.sweep.run import plan_sweep, run_sweep
from obliviate.sweep.search import MISSING, bar_constraints

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _bar() -> Bar:
    return Bar(parse_expr("f"), {"u": 0.9, "v": 0.5}, {"d": 0.1})


def test_the_bars_conditions_become_constraint_values_worked_by_hand():
    original = {"u": 0.5, "v": 0.0}
    keys = ["keep.u", "keep.v", "at_most.d"]
    # u: (0.9·0.5 − 0.4) / 0.5 = 0.1 short; v: θ0 is 0, so absolute: 0.5·0 − 0.2 = −0.2; d: 0.3 − 0.1 = 0.2 over
    got = bar_constraints(_bar(), {"u": 0.4, "v": 0.2, "d": 0.3}, original)
    assert list(got) == keys and list(got.values()) == pytest.approx([0.1, -0.2, 0.2])
    # kept: u (0.45 − 0.5) / 0.5 = −0.1, d 0.05 − 0.1 = −0.05
    got = bar_constraints(_bar(), {"u": 0.5, "v": 0.0, "d": 0.05}, original)
    assert list(got.values()) == pytest.approx([-0.1, 0.0, -0.05])
    # a missing or NaN value (or θ0's) breaks its condition by MISSING; booleans are not numbers
    assert bar_constraints(_bar(), {"v": math.nan, "d": True}, {"v": 1.0}) == dict.fromkeys(keys, MISSING)


def test_tpe_proposes_from_the_best_trials_that_keep_the_bar_not_the_best_that_break_it():
    """Trials whose lowest forget values break the bar's keep condition (x < 0.5): TPE's good side is the feasible
    ones when the trials carry bar_constraints, the lowest values when they carry none."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    bar, dist = Bar(parse_expr("f"), {"u": 0.5}, {}), {"x": FloatDistribution(0.0, 1.0)}
    chosen = {}
    for constrained in (True, False):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2))
        for i in range(20):
            x = i / 20
            study.add_trial(create_trial(value=x, params={"x": x}, distributions=dist, constraints=bar_constraints(
                bar, {"u": x}, {"u": 1.0}) if constrained else None))
        chosen[constrained] = []
        for _ in range(10):
            trial = study.ask({"x": dist["x"]})
            chosen[constrained].append(trial.params["x"])
            study.tell(trial, state=TrialState.FAIL)
    assert sum(x >= 0.5 for x in chosen[True]) >= 8 and sum(x >= 0.5 for x in chosen[False]) <= 2


def _cfg(base_file, out, **over):
    raw = {"base": str(base_file), "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
           "trials": 2, "sampler": "random", "output_dir": str(out)}
    raw.update(over)
    return build(SweepConfig, raw)


def test_search_bar_makes_the_bars_forget_the_one_objective(base_file, tmp_path):
    plan = plan_sweep(_cfg(base_file, tmp_path / "o", search="bar", bar={"forget": "forget_accuracy"}))
    assert [(up, e.text) for up, e in plan.objectives] == [(False, "forget_accuracy")]
    assert any("search: bar" in line and "neighbours_accuracy >= 0.9x" in line for line in plan.lines)
    with pytest.raises(ConfigError, match="objectives.*empty with search: bar"):
        _cfg(base_file, tmp_path / "o", search="bar", objectives=[{"minimize": "forget_score"}])
    with pytest.raises(ConfigError, match="search='best'.*objectives or bar"):
        _cfg(base_file, tmp_path / "o", search="best")


def _study(out: Path, method: str) -> optuna.Study:
    return optuna.load_study(study_name=f"sweep/{method}", storage=f"sqlite:///{out.resolve() / 'sweep.db'}")


def test_a_warm_start_copies_finished_trials_rescored_for_the_bar_and_runs_only_the_rest(base_file, tmp_path):
    first = tmp_path / "first"
    run_sweep(_cfg(base_file, first, repeats=1), log=lambda s: None)  # 2 trials + 1 repeat per method
    lines: list[str] = []
    second = tmp_path / "second"
    res = run_sweep(_cfg(base_file, second, repeats=1, trials=3, sampler="tpe", search="bar",
                         warm_start=str(first)), log=lines.append)
    assert any("recorded in the storage by an earlier worker, not repeated" in s for s in lines)  # θ0 copied too
    plan = plan_sweep(_cfg(base_file, second, search="bar"))
    for method in ("GradDiff", "NPO"):
        old, new = _study(first, method), _study(second, method)
        before, after = old.get_trials(), new.get_trials()
        assert len(after) >= 4 and after[3].user_attrs.get("copied_from") is None  # 3 copied, then its own
        original = old.user_attrs["original"]
        assert new.user_attrs["original"] == original and new.user_attrs["warm_start"]["trials"] == 3
        for a, b in zip(before, after[:3]):
            assert b.user_attrs["copied_from"] == f"sweep/{method} #{a.number}" and b.params == a.params
            assert b.user_attrs["metrics"] == a.user_attrs["metrics"]
            assert b.values == pytest.approx([a.user_attrs["metrics"]["forget_score"]])  # rescored: one objective
            assert b.constraints == pytest.approx(bar_constraints(plan.bar, a.user_attrs["metrics"], original))
        rep = before[2]  # the repeat points at its best by number, in the new study too
        assert after[2].user_attrs["repeat_of"] == rep.user_attrs["repeat_of"]
        own = after[3]  # run by the constrained TPE: Optuna recorded its constraints from the bar
        assert own.state.name == "COMPLETE" and own.values == pytest.approx([own.user_attrs["metrics"]["forget_score"]])
        assert own.constraints == pytest.approx(bar_constraints(plan.bar, own.user_attrs["metrics"], original))
    assert res["ran"] >= 2  # one new trial per method (and the repeats a new best needs), not the copied ones again


def test_a_warm_start_skips_trials_that_never_used_the_budget_renumbers_repeats_and_travels_without_its_source(base_file, tmp_path):
    from optuna.trial import TrialState, create_trial

    first = tmp_path / "first"
    run_sweep(_cfg(base_file, first, trials=1), log=lambda s: None)
    study = _study(first, "GradDiff")
    done = study.get_trials()[0]

    def like(**kw):
        return create_trial(params=done.params, distributions=done.distributions, **kw)

    # #1 a worker stopped mid-trial (failed as stale, done again as #2), #3 a repeat of #2 with another seed
    study.add_trial(like(state=TrialState.FAIL, user_attrs={"stale": True}))
    study.add_trial(like(values=[0.5, 0.25], user_attrs={"metrics": {"forget_score": 0.5}}))
    study.add_trial(like(values=[0.4, 0.25], user_attrs={"metrics": {"forget_score": 0.4}, "repeat_of": 2, "seed": 1}))
    second = tmp_path / "second"
    res = run_sweep(_cfg(base_file, second, trials=2, warm_start=str(first), search="bar"), log=lambda s: None)
    assert res["ran"] == 1  # copied trials use the budget: GradDiff's 2 are in, NPO runs its second
    after = _study(second, "GradDiff").get_trials()
    assert [t.user_attrs["copied_from"] for t in after] == ["sweep/GradDiff #0", "sweep/GradDiff #2",
                                                            "sweep/GradDiff #3"]
    assert after[2].user_attrs["repeat_of"] == 1 and after[2].values == [0.4]  # #2 is #1 here
    assert after[1].constraints == dict.fromkeys(["keep.neighbours_accuracy", "keep.retain_accuracy",
                                                  "at_most.forget_degenerate_share"], MISSING)  # no such metrics
    # carried elsewhere without the sweep it started from (a fresh machine): it goes on from its own storage,
    # while a sweep that has yet to copy its warm start still needs that sweep
    moved, half = tmp_path / "moved", tmp_path / "half"
    shutil.copytree(second, moved)
    shutil.copytree(second, half)
    optuna.delete_study(study_name="sweep/NPO", storage=f"sqlite:///{half.resolve() / 'sweep.db'}")
    shutil.rmtree(first)
    lines: list[str] = []
    res = run_sweep(_cfg(base_file, moved, trials=3, warm_start=str(tmp_path / "gone"), search="bar"),
                    log=lines.append)  # where its source was is this machine's business, as output_dir is
    assert any("warm start: already in this storage" in s and "gone not read" in s for s in lines)
    assert res["ran"] == 2 and len(_study(moved, "GradDiff").get_trials()) == 4
    for out in (tmp_path / "new", half):  # NPO's study is not in half: its warm start is yet to be copied
        with pytest.raises(ObliviateError, match="not a sweep's folder"):
            run_sweep(_cfg(base_file, out, trials=3, warm_start=str(first), search="bar"), log=lambda s: None)


def test_a_warm_start_from_another_sweep_or_from_nowhere_is_refused_with_nothing_written(base_file, tmp_path):
    first = tmp_path / "first"
    run_sweep(_cfg(base_file, first), log=lambda s: None)
    out = tmp_path / "second"
    with pytest.raises(ObliviateError, match=r"differs from this one in \['set'\].*only objectives"):
        run_sweep(_cfg(base_file, out, warm_start=str(first), set={"unlearn.max_steps": 2}), log=lambda s: None)
    with pytest.raises(ObliviateError, match="not a sweep's folder"):
        run_sweep(_cfg(base_file, out, warm_start=str(tmp_path)), log=lambda s: None)
    with pytest.raises(ObliviateError, match="this sweep's own output_dir"):
        run_sweep(_cfg(base_file, first, warm_start=str(first), search="bar"), log=lambda s: None)
    twin = tmp_path / "twin"  # a sweep begun without a warm start does not take one later: its trials would mix
    shutil.copytree(first, twin)
    with pytest.raises(ObliviateError, match="'sweep/GradDiff' began without a warm start; go on with it without"):
        run_sweep(_cfg(base_file, first, warm_start=str(twin)), log=lambda s: None)
    never = tmp_path / "never"  # a sweep's folder whose storage was never made
    never.mkdir()
    (never / "sweep.yaml").write_text((first / "sweep.yaml").read_text())
    with pytest.raises(ObliviateError, match="has no sweep.db: the sweep to copy from never ran"):
        run_sweep(_cfg(base_file, out, warm_start=str(never)), log=lambda s: None)
    with pytest.raises(ObliviateError, match="no storage yet"):
        collect([str(never)])
    assert not out.exists()
    with pytest.raises(ConfigError, match="warm_start.*null with sampler grid"):
        _cfg(base_file, out, warm_start=str(first), sampler="grid")


def _lr_study(waiting: bool = False) -> tuple[optuna.Study, dict]:
    """Five settings, the best (lr 8e-3, forget 0.0) run again twice as repeats (0.05, 0.1)."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    dist = {"train.lr": FloatDistribution(1e-4, 1e-2, log=True)}
    study = optuna.create_study(direction="minimize")
    for lr, value in [(1e-4, 1.0), (2e-4, 0.9), (5e-4, 0.8), (1e-3, 0.7), (8e-3, 0.0)]:
        study.add_trial(create_trial(value=value, params={"train.lr": lr}, distributions=dist))
    for value in (0.05, 0.1):
        study.add_trial(create_trial(value=value, params={"train.lr": 8e-3}, distributions=dist,
                                     user_attrs={"repeat_of": 4}))
    if waiting:
        study.enqueue_trial({"train.lr": 3e-4})
    return study, dist


def _lr_plan():
    from types import SimpleNamespace

    from obliviate.config import TrainConfig
    from obliviate.sweep.space import parse_space

    dims = parse_space({"train.lr": {"float": [1e-4, 1e-2], "log": True}}, {"M": {}}, TrainConfig())
    return SimpleNamespace(dims=dims, objectives=[(False, None)], cfg=SimpleNamespace(sampler="tpe"))


def test_tpe_proposes_from_one_trial_per_setting_so_a_bests_repeats_do_not_push_it_away():
    """Shown the repeats, TPE's good side is the best alone and two of the three trials at lr 8e-3 sit on its bad
    side: it proposes about 2e-3 (log10 -2.7); from the trials without repeats it proposes near 8e-3 (-2.1)."""
    from obliviate.sweep.search import queue_next

    ours, plain = [], []
    for seed in range(3):
        study, dist = _lr_study()
        queue_next(study, _lr_plan(), "M", optuna.samplers.TPESampler(seed=seed, n_startup_trials=4))
        ours.append(math.log10(study.ask().suggest_float("train.lr", 1e-4, 1e-2, log=True)))
        study, _ = _lr_study()
        study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
        plain.append(math.log10(study.ask().suggest_float("train.lr", 1e-4, 1e-2, log=True)))
    assert all(abs(x - math.log10(8e-3)) < 0.2 for x in ours), ours
    assert all(abs(x - math.log10(8e-3)) > 0.3 for x in plain), plain  # what the fix is for


def test_a_waiting_trial_goes_first_and_nothing_else_is_queued():
    from optuna.trial import TrialState

    from obliviate.sweep.search import queue_next

    study, _ = _lr_study(waiting=True)
    queue_next(study, _lr_plan(), "M", optuna.samplers.TPESampler(seed=0, n_startup_trials=4))
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"train.lr": 3e-4}]


def test_queued_points_run_after_the_recipe_in_the_budget_once_each_and_the_report_marks_them(base_file, tmp_path):
    """`queue`: the recipe first, then each queued point (its other keys sampled), then the sampler, all within
    `trials`; a second run queues nothing again, a point added later is queued alone, and more points than the
    study has room for are refused before anything is queued."""
    from obliviate.sweep.compare import write_compare
    from obliviate.sweep.search import queue_first

    out = tmp_path / "q"
    space = {"train.lr": {"float": [1e-4, 1e-2], "log": True}, "train.max_steps": {"choices": [2, 4]}}
    queue = {"NPO": [{"train.lr": 3e-3}, {"train.max_steps": 2, "train.lr": 5e-4}]}
    cfg = _cfg(base_file, out, space=space, trials=4, sampler="tpe", start_at_recipe=True, queue=queue)
    plan = plan_sweep(cfg)
    assert "queued for NPO: lr=0.003" in plan.lines and "queued for NPO: max_steps=2 lr=0.0005" in plan.lines
    run_sweep(cfg, log=lambda s: None)
    trials = _study(out, "NPO").get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert trials[0].user_attrs.get("recipe") and trials[0].params == plan.recipes["NPO"]
    assert [t.user_attrs.get("queued") for t in trials] == [None, True, True, None]
    assert trials[1].params["train.lr"] == 3e-3 and trials[1].params["train.max_steps"] in (2, 4)  # sampled
    assert trials[2].params == {"train.lr": 5e-4, "train.max_steps": 2}
    assert not any(t.user_attrs.get("queued") for t in _study(out, "GradDiff").get_trials())
    assert _study(out, "NPO").user_attrs["queued"] == plan.queued["NPO"]
    settings = {p.name: p for p in collect([str(out)]).points}
    assert settings["NPO #1"].queued and not settings["NPO #0"].queued and not settings["NPO #3"].queued
    report = write_compare([str(out)], out, log=lambda s: None).read_text()
    assert "queued: lr=0.0005, max_steps=2" in report or "queued: max_steps=2, lr=0.0005" in report

    study, more = _study(out, "NPO"), {"NPO": [*queue["NPO"], {"train.lr": 1e-3}]}
    assert queue_first(study, plan, "NPO") == 0  # nothing new: the two are recorded as queued
    with pytest.raises(ObliviateError, match=r"queue.NPO: 1 new point\(s\) but the study has room for 0 of its 4 "
                                             r"trials; raise trials \(by 1\)"):
        queue_first(study, plan_sweep(_cfg(base_file, out, space=space, trials=4, sampler="tpe",
                                           start_at_recipe=True, queue=more)), "NPO")
    assert len(study.get_trials()) == 4 and len(study.user_attrs["queued"]) == 2  # nothing queued
    run_sweep(_cfg(base_file, out, space=space, trials=5, sampler="tpe", start_at_recipe=True, queue=more),
              log=lambda s: None)  # the same sweep resumed with one more point (the queue is no part of its identity)
    trials = _study(out, "NPO").get_trials()
    assert len(trials) == 5 and trials[4].user_attrs["queued"] and trials[4].params["train.lr"] == 1e-3
    assert len(_study(out, "NPO").user_attrs["queued"]) == 3


def test_a_queue_naming_no_method_of_the_sweep_or_no_list_is_refused(base_file, tmp_path):
    with pytest.raises(ConfigError, match="queue.SimNPO: no such method in this sweep; its methods: GradDiff, NPO"):
        plan_sweep(_cfg(base_file, tmp_path / "o", queue={"SimNPO": [{"train.lr": 1e-3}]}))
    with pytest.raises(ConfigError, match="queue.*a mapping of method names to lists of points"):
        _cfg(base_file, tmp_path / "o", queue={"NPO": {"train.lr": 1e-3}})
    with pytest.raises(ConfigError, match="queue.*empty with sampler grid"):
        _cfg(base_file, tmp_path / "o", queue={"NPO": [{"train.lr": 1e-3}]}, sampler="grid")
    assert not (tmp_path / "o").exists()
