"""How a sweep searches: each method's Optuna study and sampler, the matched-utility bar as the search's own
objective and constraints (`search: bar`), and studies started from another sweep's finished trials (`warm_start`).

With `search: bar` the sampler minimises what the verdict minimises (the bar's forget expression) and treats the
bar's conditions as constraints (Optuna's TPE ranks a trial breaking one below every trial keeping them all), so
the search looks where the verdict looks, not along a two-objective front whose best points on utility are
untouched models.
"""
from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

from obliviate.errors import ObliviateError
from obliviate.eval.score import Bar, nearest_to_bar
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.space import grid_space
from obliviate.sweep.storage import STORAGE_FILE, open_storage, recorded_url
from obliviate.sweep.workers import counts, is_repeat, repeats_of

SweepPlan = Any  # sweep.run's SweepPlan (run imports this module)

# what a warm-started sweep may change from the sweep it starts from: how it searches and judges, not what a trial is
SEARCH_ONLY = ("objectives", "search", "sampler", "seed", "warm_start", "bar", "report", "study")
MISSING = 1.0  # how far a condition whose metric is missing counts as broken (θ0's units: a whole θ0 value)
WARM_DONE = "warm_start"  # study attribute set once a study's copied trials are all in


def bar_constraints(bar: Bar, metrics: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, float]:
    """The bar's conditions as named constraint values, <= 0 when kept (Optuna's convention): keep {m: s} gives
    `keep.m` = (s·θ0[m] − m) / |θ0[m]| (a shortfall in shares of θ0's value; absolute when θ0[m] is 0), at_most
    {m: c} gives `at_most.m` = m − c; a missing or NaN value (or θ0's) gives MISSING."""
    out = {}
    for name, share in bar.keep.items():
        value, ref = _number(metrics.get(name)), _number(original.get(name))
        out[f"keep.{name}"] = MISSING if math.isnan(value) or math.isnan(ref) else \
            (share * ref - value) / (abs(ref) or 1.0)
    for name, ceiling in bar.at_most.items():
        value = _number(metrics.get(name))
        out[f"at_most.{name}"] = MISSING if math.isnan(value) else value - ceiling
    return out


def constrain(plan: SweepPlan, study: Any, trial: Any, metrics: Mapping[str, Any]) -> None:
    """With `search: bar`, record the bar's constraint values on a trial about to be told complete (Optuna's TPE
    ranks a trial breaking one below every trial keeping them all)."""
    if plan.cfg.search == "bar":
        for key, value in bar_constraints(plan.bar, metrics, study.user_attrs.get("original") or {}).items():
            trial.set_constraint(key, value)


def _number(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def make_sampler(cfg: SweepConfig, method: str, n_trials: int) -> Any:
    """The method's sampler, seeded by the sweep seed, the method and the trials so far (reproducible per study,
    and two workers asking at different points draw different values). TPE reads the trials' constraints itself."""
    import optuna

    seed = (cfg.seed * 1_000_003 + sum(map(ord, method)) * 7919 + n_trials) % 2**31
    if cfg.sampler in ("random", "grid"):  # grid: the points are enqueued (grid_point), the sampler fills nothing
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, cfg.trials // 3)))


def grid_point(plan: SweepPlan, study: Any, method: str) -> dict[str, Any] | None:
    """The first grid point (in a fixed order) that no counted trial of the study has taken, or None."""
    space = grid_space(plan.dims, method)
    keys = sorted(space)
    taken = {json.dumps([t.params.get(k) for k in keys]) for t in study.get_trials(deepcopy=False)
             if counts(t) and not is_repeat(t)}
    for combo in itertools.product(*(space[k] for k in keys)):
        if json.dumps(list(combo)) not in taken:
            return dict(zip(keys, combo))
    return None


def queue_next(study: Any, plan: SweepPlan, method: str, sampler: Any) -> bool:
    """Before a trial is asked, unless one already waits (a recipe, a repeat: it goes first): queue the grid's next
    point (sampler grid), or the point the sampler proposes from the trials without their repeats (enqueue_proposal;
    queued, so that a clash with another worker's shows before the trial runs). Whether a trial waits now."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return True
    if plan.cfg.sampler == "grid":
        point = grid_point(plan, study, method)
        if point is None:
            return False
        study.enqueue_trial(point)
    else:
        enqueue_proposal(study, trials, plan, method, sampler)
    return True


def enqueue_proposal(study: Any, trials: list, plan: SweepPlan, method: str, sampler: Any) -> None:
    """Queue the point `sampler` proposes from the study's finished `trials` with the repeats left out. A repeat runs
    a setting again with another seed; shown to TPE it would count the chosen point's neighbourhood as bad (with
    6-12 trials TPE's good side holds one or two trials, and a best with two repeats is three trials at one point),
    so the sampler sees one trial per setting, as the selection does."""
    import optuna
    from optuna.trial import TrialState

    view = optuna.create_study(directions=directions(plan), sampler=sampler)  # in memory, for this proposal only
    view.add_trials([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not is_repeat(t)])
    proposal = view.ask()
    for d in plan.dims:
        if d.applies(method):
            d.suggest(proposal)
    study.enqueue_trial(proposal.params)


def directions(plan: SweepPlan) -> list[str]:
    return ["maximize" if up else "minimize" for up, _ in plan.objectives]


def open_study(storage: Any, plan: SweepPlan, method: str, sampler: Any = None) -> Any:
    """The method's study in `storage`, created when new."""
    import optuna

    return optuna.create_study(storage=storage, study_name=plan.study_name(method), directions=directions(plan),
                               sampler=sampler, load_if_exists=True)


def source_storage(cfg: SweepConfig, recorded: Mapping[str, Any], mine: Mapping[str, Any]) -> tuple[Any, str]:
    """(storage, study prefix) of the sweep `cfg.warm_start` names, once its recorded config (`recorded`, as
    as_recorded gives it) agrees with this sweep's (`mine`) on everything but SEARCH_ONLY keys."""
    diff = sorted(k for k in set(recorded) | set(mine)
                  if k not in SEARCH_ONLY and recorded.get(k) != mine.get(k))
    if diff:
        raise ObliviateError(f"warm_start: the sweep in {cfg.warm_start} differs from this one in {diff}; a warm "
                             f"start copies trials of the same sweep searched another way (only "
                             f"{', '.join(SEARCH_ONLY)} may differ)")
    if Path(cfg.warm_start or "").resolve() == Path(cfg.output_dir).resolve():
        raise ObliviateError("warm_start: names this sweep's own output_dir; name the folder of the sweep to copy "
                             "from and a new output_dir")
    url = recorded_url(Path(cfg.warm_start or ""), recorded)
    if url is None:
        raise ObliviateError(f"warm_start: {cfg.warm_start} has no {STORAGE_FILE}: the sweep to copy from never ran")
    return open_storage(url), f"{recorded.get('study', 'sweep')}/"


def is_warm(storage: Any, plan: SweepPlan) -> bool:
    """True when every method's study in `storage` already holds its warm start (WARM_DONE): the sweep then goes
    on without the sweep it started from, e.g. from its storage carried to another machine."""
    import optuna

    attrs = {s.study_name: s.user_attrs for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    return all(WARM_DONE in attrs.get(plan.study_name(m), {}) for m in plan.methods)


def warm_study(storage: Any, plan: SweepPlan, method: str, source: tuple[Any, str], wait_s: float) -> Any:
    """The method's study; the worker that creates it first copies the source sweep's finished trials of the method
    into it (copy_trials), and the others wait (at most `wait_s`) until that is done."""
    import optuna

    try:
        study = optuna.create_study(storage=storage, study_name=plan.study_name(method), directions=directions(plan),
                                    load_if_exists=False)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=plan.study_name(method), storage=storage)
        deadline = time.monotonic() + wait_s
        while WARM_DONE not in study.user_attrs and "config" not in study.user_attrs:  # config: begun cold
            if time.monotonic() > deadline:
                raise ObliviateError(f"study {study.study_name!r}: another worker began copying the warm start's "
                                     f"trials into it {wait_s:.0f} s ago and has not finished (stopped while "
                                     "copying?); delete this sweep's output_dir (or storage) and start again")
            time.sleep(1.0)
        if WARM_DONE not in study.user_attrs:
            raise ObliviateError(f"warm_start: the storage's study {study.study_name!r} began without a warm start; "
                                 "go on with it without warm_start, or give this sweep another output_dir (storage)")
        return study
    store, prefix = source
    try:
        old = optuna.load_study(study_name=f"{prefix}{method}", storage=store)
    except KeyError:
        old = None  # a method the source never started: this study starts empty
    n = copy_trials(old, study, plan) if old is not None else 0
    study.set_user_attr(WARM_DONE, {"from": f"{prefix}{method}", "trials": n})
    return study


def copy_trials(old: Any, new: Any, plan: SweepPlan) -> int:
    """Copy `old`'s finished trials that used its budget into the empty study `new`, in order: their values
    recomputed for this sweep's objectives from their metrics (with `search: bar`, the bar's constraints too),
    repeats pointed at their best's new number, each marked `copied_from`; then `old`'s study attributes (θ0's
    evaluation, the models' digests, the recipe) but its config. The number copied."""
    from optuna.trial import TrialState, create_trial

    original = old.user_attrs.get("original") or {}
    numbers: dict[int, int] = {}
    for t in sorted(old.get_trials(deepcopy=False), key=lambda t: t.number):
        if not counts(t) or t.state == TrialState.RUNNING:
            continue
        ua = dict(t.user_attrs, copied_from=f"{old.study_name} #{t.number}")
        if "repeat_of" in ua:
            if ua["repeat_of"] not in numbers:
                continue  # the best it repeats was not copied
            ua["repeat_of"] = numbers[ua["repeat_of"]]
        state, values, constraints = t.state, None, None
        metrics = ua.get("metrics") or {}
        if state == TrialState.COMPLETE:
            values = [e(metrics) for _, e in plan.objectives]
            if any(math.isnan(v) for v in values):
                state, values = TrialState.FAIL, None
                ua["error"] = "objective(s) of this sweep could not be computed from the copied trial's metrics"
            elif plan.cfg.search == "bar":
                constraints = bar_constraints(plan.bar, metrics, original)
        new.add_trial(create_trial(state=state, values=values, params=t.params, distributions=t.distributions,
                                   user_attrs=ua, intermediate_values=t.intermediate_values, constraints=constraints))
        numbers[t.number] = len(numbers)
    for key, value in old.user_attrs.items():
        if key == "repeats_of":
            if value in numbers:
                new.set_user_attr(key, numbers[value])
        elif key not in ("config", WARM_DONE):
            new.set_user_attr(key, value)
    return len(numbers)


def queue_first(study: Any, plan: SweepPlan, method: str) -> int:
    """Queue what a method's study runs before its sampler: its recipe (start_at_recipe) when the study is new, then
    each point of its `queue` not queued before (the study records those it queued). Queued points count in the
    budget: more than its room left is an error. How many were queued."""
    from optuna.trial import TrialState

    n = 0
    if method in plan.recipes and not study.get_trials(deepcopy=False) and not study.user_attrs.get("recipe"):
        study.set_user_attr("recipe", plan.recipes[method])  # the first worker to get here enqueues it
        study.enqueue_trial(plan.recipes[method], user_attrs={"recipe": True})
        n += 1
    done = list(study.user_attrs.get("queued") or [])
    new = [p for p in plan.queued.get(method, []) if p not in done]
    if not new:
        return n
    trials = [t for t in study.get_trials(deepcopy=False) if not is_repeat(t)]
    room = plan.budget(method) - sum(counts(t) or t.state == TrialState.WAITING for t in trials)
    if len(new) > room:
        raise ObliviateError(f"queue.{method}: {len(new)} new point(s) but the study has room for {max(room, 0)} of "
                             f"its {plan.budget(method)} trials; raise trials (by {len(new) - max(room, 0)}) or "
                             "queue fewer points")
    study.set_user_attr("queued", done + new)
    for p in new:
        study.enqueue_trial(p, user_attrs={"queued": True})
    return n + len(new)


def best_trial(plan: SweepPlan, study: Any) -> Any:
    """A method's best finished trial: the bar's winner, else the one breaking the fewest of its conditions."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if not is_repeat(t)]
    i = nearest_to_bar([t.user_attrs.get("metrics", {}) for t in done], plan.bar, study.user_attrs.get("original", {}))
    return None if i is None else done[i]


def enqueue_repeats(plan: SweepPlan, study: Any, method: str) -> None:
    """Queue the repeats the method's current best trial lacks (other seeds, the same settings): a best found after
    `trials` was raised gets its own, and the repeats of an earlier best stay in the study."""
    if plan.cfg.repeats == 0:
        return
    best = best_trial(plan, study)
    if best is None:
        return
    study.set_user_attr("repeats_of", best.number)
    seed = int(best.user_attrs.get("params", {}).get("seed", plan.trains[method].seed))
    have = {t.user_attrs.get("seed") for t in repeats_of(study, best.number)}
    for k in range(1, plan.cfg.repeats + 1):
        if seed + k not in have:
            study.enqueue_trial(best.params, user_attrs={"repeat_of": best.number, "seed": seed + k})
