"""`obliviate sweep`: Optuna studies over a base run config, one per method, shared by any number of workers.

A worker checks the whole sweep before anything is written (base config, methods, space, objectives, pruning
rules, storage), then prepares its track once (sweep/tracks.py) and runs trials until every method has
`trials` finished ones: each trial is asked from the method's study, run in this process on a copy of θ0,
and told back as complete (its objective values), pruned (an evaluation during training broke a `prune`
rule) or failed (it diverged or raised: the error is kept, the sweep goes on). The method whose study has
the fewest trials goes next, so several workers share the budget evenly. Interrupted trials (Ctrl-C, a
killed worker) are failed and done again: finished trials are never lost or repeated, so the same command
resumes an interrupted sweep. Optuna's storage is the only shared state: SQLite in the output directory
by default, any database URL or a journal file for workers on several machines.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from obliviate.config import MethodConfig, TrainConfig, build, to_dict
from obliviate.errors import ConfigError, ObliviateError
from obliviate.eval.score import Bar, Expr, parse_expr
from obliviate.files import check_output_dir, remove_path
from obliviate.modeling.sources import check_layer_indices
from obliviate.progress import on_terminal
from obliviate.sweep import retained
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.defaults import parse_axes, parse_bar
from obliviate.sweep.search import (
    constrain,
    enqueue_repeats,
    is_warm,
    make_sampler,
    open_study,
    queue_first,
    queue_next,
    source_storage,
    warm_study,
)
from obliviate.sweep.space import Dim, grid_size, grid_space, parse_space, queued_point, recipe_point, trial_settings
from obliviate.sweep.storage import STORAGE_FILE, open_storage, references_done
from obliviate.sweep.tracks import Track, load_base, make_track
from obliviate.sweep.workers import (
    MAX_CLASHES,
    WORKER,
    Heartbeat,
    check_models,
    clash,
    counts,
    fail_stale,
    is_repeat,
    model_digests,
    repeat_waiting,
    requeue_recipe,
    surplus,
)

Log = Callable[[str], None]
CONFIG_FILE = "sweep.yaml"
# what a study's recorded config must agree on across workers and runs: not where each worker writes, nor its
# timing, nor the budget (raising `trials` extends a finished sweep, and a new best gets its own repeats), nor where
# the sweep its first trials were copied from lay (warm_start: each study records what it copied), nor the points
# queued (each study records those it queued)
_PER_WORKER = ("storage", "output_dir", "overwrite", "stale_after_s", "trials", "repeats", "warm_start", "queue")


@dataclass(frozen=True)
class PruneRule:
    """Stop a trial when `metric` falls below (or rises above) `threshold` (× θ0's value when relative)."""

    metric: Expr
    below: bool
    threshold: float
    relative: bool

    def limit(self, original: dict[str, Any]) -> float:
        return self.threshold * self.metric(original) if self.relative else self.threshold

    def broken(self, value: float, original: dict[str, Any]) -> bool:
        limit = self.limit(original)
        if math.isnan(value) or math.isnan(limit):
            return False  # a missing value never prunes: it is reported, not guessed
        return value < limit if self.below else value > limit


@dataclass
class SweepPlan:
    """A checked sweep: everything a worker needs before it loads a model."""

    cfg: SweepConfig
    track: Track
    methods: dict[str, dict[str, Any]]
    dims: list[Dim]
    objectives: list[tuple[bool, Expr]]  # (maximize, expression)
    prune: list[PruneRule]
    bar: Bar
    axes: dict[str, Expr]
    lines: list[str] = field(default_factory=list)
    recipes: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> its recipe's params (start_at_recipe)
    queued: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # method -> its queue's params (`queue`)
    trains: dict[str, Any] = field(default_factory=dict)  # method -> its TrainConfig: the base's with its own `train`

    def budget(self, method: str) -> int:
        if self.cfg.sampler == "grid":
            return min(self.cfg.trials, grid_size(self.dims, method))
        return self.cfg.trials

    def study_name(self, method: str) -> str:
        return f"{self.cfg.study}/{method}"


def _objectives(raw: list, defaults: Sequence[tuple[str, str]], valid: set[str]) -> list[tuple[bool, Expr]]:
    items = raw or [{d: e} for d, e in defaults]
    out = []
    for i, item in enumerate(items):
        if not (isinstance(item, dict) and len(item) == 1 and next(iter(item)) in ("minimize", "maximize")):
            raise ConfigError(f"objectives[{i}]: expected {{minimize: METRIC}} or {{maximize: METRIC}}, got {item!r}")
        direction, text = next(iter(item.items()))
        out.append((direction == "maximize", parse_expr(text, valid, f"objectives[{i}].{direction}")))
    return out


def _prune_rules(raw: list, valid: set[str]) -> list[PruneRule]:
    out = []
    for i, item in enumerate(raw):
        where = f"prune[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected {{metric: EXPR, below: x}} or {{metric: EXPR, above: x}}, got {item!r}")
        unknown = sorted(set(item) - {"metric", "below", "above", "relative"})
        sides = [k for k in ("below", "above") if k in item]
        if unknown or len(sides) != 1 or "metric" not in item:
            raise ConfigError(f"{where}: give metric and exactly one of below / above (optional relative: true); got "
                              f"keys {sorted(item)}")
        x = item[sides[0]]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ConfigError(f"{where}.{sides[0]}: expected a number, got {x!r}")
        rel = item.get("relative", False)
        if not isinstance(rel, bool):
            raise ConfigError(f"{where}.relative: expected true or false, got {rel!r}")
        out.append(PruneRule(parse_expr(item["metric"], valid, f"{where}.metric"), sides[0] == "below", float(x), rel))
    return out


def method_train(base: Any, own: Any, name: str) -> Any:
    """A method's training settings: the base config's, with the method's own `train` mapping (e.g. its authors'
    epochs) set over them; a trial's values are set over these."""
    if own is None:
        return base
    if not isinstance(own, dict):
        raise ConfigError(f"methods.{name}.train: expected a mapping of training settings (e.g. {{epochs: 5}}), got "
                          f"{own!r}")
    return build(TrainConfig, {**to_dict(base), **own}, f"methods.{name}.train.")


def plan_sweep(cfg: SweepConfig) -> SweepPlan:
    """Check the whole sweep without loading a model (also what `obliviate validate` would reject)."""
    from obliviate.train.unlearn import resolve_method

    kind, base = load_base(cfg.base, cfg.set)
    track = make_track(kind, base, Path(cfg.output_dir))
    lines = [f"base: {cfg.base} ({kind} track)"] + track.check()
    methods = {str(k): v for k, v in cfg.methods.items()} if cfg.methods else track.methods()
    trains = {}
    for name, raw in methods.items():
        if not isinstance(raw, dict):
            raise ConfigError(f"methods.{name}: expected a method section (forget, retain, ...), got {raw!r}")
        if "/" in name:
            raise ConfigError(f"methods.{name}: a method name cannot contain '/'")
        methods[name] = raw = dict(raw)
        trains[name] = method_train(track.train, raw.pop("train", None), name)
        resolve_method(build(MethodConfig, raw, f"methods.{name}."))
    dims = parse_space(cfg.space, methods, track.train)
    if cfg.sampler == "grid":
        for name in methods:
            grid_space(dims, name)  # a float range without a step is an error here
    valid = track.metric_names()
    bar = parse_bar(cfg.bar, track.defaults, valid)
    objectives = [(False, bar.forget)] if cfg.search == "bar" else \
        _objectives(cfg.objectives, track.defaults.objectives, valid)
    plan = SweepPlan(cfg, track, methods, dims, objectives, _prune_rules(cfg.prune, valid), bar,
                     parse_axes(cfg.report, track.defaults, valid), lines, trains=trains)
    if cfg.start_at_recipe:
        plan.recipes = {m: recipe_point(dims, methods[m], trains[m], m) for m in methods}
        plan.lines += [f"first trial of {m}: its recipe, {_describe(p)}" for m, p in plan.recipes.items()]
    plan.lines += [f"methods: {', '.join(methods)}; {', '.join(str(plan.budget(m)) for m in methods)} trials each "
                   f"({cfg.sampler})",
                   "space: " + ("; ".join(f"{d.key} ({d.kind}{' for ' + ','.join(d.methods) if d.methods else ''})"
                                          for d in dims) or "none (each method's base settings)"),
                   "objectives: " + ", ".join(f"{'maximize' if up else 'minimize'} {e.text}" for up, e in objectives)
                   + (f" (search: bar; constraints: {bar.describe()})" if cfg.search == "bar" else "")]
    for m, points in ((str(k), v) for k, v in cfg.queue.items()):
        if m not in methods:
            raise ConfigError(f"queue.{m}: no such method in this sweep; its methods: {', '.join(methods)}")
        plan.queued[m] = [queued_point(dims, p, m, i) for i, p in enumerate(points)]
        plan.lines += [f"queued for {m}: {_describe(p)}" for p in plan.queued[m]]
    if cfg.warm_start:
        plan.lines.append(f"warm start: the finished trials of the sweep in {cfg.warm_start}")
    return plan


# --- storage ------------------------------------------------------------------------------------------------

def storage_url(cfg: SweepConfig) -> str:
    return cfg.storage or f"sqlite:///{Path(cfg.output_dir).resolve() / STORAGE_FILE}"


def _saved_config(cfg: SweepConfig) -> dict[str, Any]:
    return {k: v for k, v in to_dict(cfg).items() if k not in _PER_WORKER}


def as_recorded(previous: dict[str, Any]) -> dict[str, Any]:
    """A sweep config recorded earlier (sweep.yaml, a study's attribute), per-worker keys left out and keys added
    to SweepConfig since filled with their defaults: a sweep started before a new key existed is still the same."""
    mine = {k: v for k, v in previous.items() if k not in _PER_WORKER}
    return {**json.loads(json.dumps(_saved_config(SweepConfig()))), **mine}


def _resumable(cfg: SweepConfig) -> bool:
    """True when the output directory holds this very sweep: its sweep.yaml records this config."""
    saved = Path(cfg.output_dir) / CONFIG_FILE
    if not saved.is_file():
        return False
    previous = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    return as_recorded(previous) == json.loads(json.dumps(_saved_config(cfg)))


def prepare_output(cfg: SweepConfig) -> bool:
    """Create (or reuse, when it holds this very sweep) the output directory; True when resuming."""
    out = Path(cfg.output_dir)
    saved = out / CONFIG_FILE
    same = _resumable(cfg)
    if saved.is_file() and not same and not cfg.overwrite:
        raise ObliviateError(f"{out} holds another sweep (its {CONFIG_FILE} differs from this config); choose "
                             "another output_dir, or pass overwrite=true to start again")
    resumed = saved.is_file() and same  # the same sweep is always resumed, never wiped (other workers may use it)
    if not resumed:
        check_output_dir(out, cfg.overwrite)
        if out.exists():
            remove_path(out)
        out.mkdir(parents=True)
    tmp = out / f".{CONFIG_FILE}.tmp"  # rewritten on resume too: this worker's storage is what the report reads
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
    tmp.replace(saved)
    return resumed


# --- the worker ----------------------------------------------------------------------------------------------

def _warm_source(cfg: SweepConfig) -> tuple[Any, str]:
    """The storage and study prefix of the sweep `warm_start` names, checked before anything is written."""
    saved = Path(cfg.warm_start or "") / CONFIG_FILE
    if not saved.is_file():
        raise ObliviateError(f"warm_start: {cfg.warm_start} is not a sweep's folder (no {CONFIG_FILE}); name the "
                             "output_dir of the sweep whose trials start this one")
    recorded = as_recorded(yaml.safe_load(saved.read_text(encoding="utf-8")) or {})
    return source_storage(cfg, recorded, json.loads(json.dumps(_saved_config(cfg))))


def _check_study(study: Any, plan: SweepPlan) -> None:
    """The study was made by this sweep (or is new: then this sweep's config is recorded in it)."""
    mine = json.loads(json.dumps(_saved_config(plan.cfg)))
    recorded = study.user_attrs.get("config")
    if recorded is None:
        study.set_user_attr("config", mine)
        study.set_user_attr("track", plan.track.kind)
        return
    recorded = as_recorded(recorded)
    if recorded != mine:
        diff = sorted(k for k in set(recorded) | set(mine) if recorded.get(k) != mine.get(k))
        raise ObliviateError(f"the storage's study {study.study_name!r} was made by another sweep config (it differs "
                             f"in {diff}); use the same config, another study name (study=...) or another storage")


def _describe(params: dict[str, Any]) -> str:
    def show(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else json.dumps(v) if not isinstance(v, str) else v

    return " ".join(f"{k.split('.')[-1]}={show(v)}" for k, v in params.items()) or "base settings"


def _monitor(plan: SweepPlan, original_quick: dict[str, Any]) -> Any:
    """The evaluation during training of one trial: curve, best weights by the first objective, pruning."""
    from obliviate.train.monitor import Monitor, StopRun

    cfg = plan.cfg
    if cfg.eval_every_steps is None:
        return None
    up, first = plan.objectives[0]

    def stop(step: int, entry: dict[str, Any], curve: list) -> None:
        for rule in plan.prune:
            value = rule.metric(entry)
            if rule.broken(value, original_quick):
                raise StopRun(f"pruned at step {step}: {rule.metric.text} = {value:.4g} "
                              f"{'<' if rule.below else '>'} {rule.limit(original_quick):.4g}", curve)

    return Monitor(cfg.eval_every_steps, lambda m: plan.track.quick(m, cfg.eval_rows), score=first, maximize=up,
                   keep_best=cfg.keep_best, stop=stop if plan.prune else None)


def run_trial(plan: SweepPlan, study: Any, trial: Any, method: str, log: Log) -> str:
    """Run one asked trial and tell the study its outcome; the outcome's name."""
    from optuna.trial import TrialState

    from obliviate.train.monitor import StopRun

    track, cfg = plan.track, plan.cfg
    params = {d.key: d.suggest(trial) for d in plan.dims if d.applies(method)}
    if "seed" in trial.user_attrs:  # a repeat of a best trial, with its own seed
        params["seed"] = trial.user_attrs["seed"]
    trial.set_user_attr("worker", WORKER)
    trial.set_user_attr("heartbeat", time.time())
    trial.set_user_attr("params", json.loads(json.dumps(params)))
    label = f"[{method} #{trial.number}{' repeat' if 'repeat_of' in trial.user_attrs else ''}] {_describe(params)}"
    t0, c0 = time.perf_counter(), time.process_time()  # wall time, and this process's CPU time (paused: not counted)
    try:
        with Heartbeat(study, trial._trial_id, min(30.0, cfg.stale_after_s / 4)):
            method_cfg, train_cfg = trial_settings(plan.methods[method], plan.trains[method], params,
                                                   f"trial of {method}")
            live = not on_terminal()  # in a log, the loop's lines show a trial is alive; on a terminal, one line
            train_cfg = dataclasses.replace(train_cfg, progress=live)
            if live:
                log(f"{label}: training")
            monitor = _monitor(plan, track.original_quick)
            res = track.run(method_cfg, train_cfg, monitor)
    except StopRun as stop:
        trial.set_user_attr("curve", stop.curve)
        trial.set_user_attr("pruned", str(stop))
        study.tell(trial, state=TrialState.PRUNED)
        log(f"{label}: {stop} ({time.perf_counter() - t0:.0f} s)")
        return "pruned"
    except KeyboardInterrupt:
        trial.set_user_attr("interrupted", True)
        study.tell(trial, state=TrialState.FAIL)
        raise
    except (ObliviateError, RuntimeError, ValueError, ArithmeticError, MemoryError) as exc:
        trial.set_user_attr("error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
        study.tell(trial, state=TrialState.FAIL)
        log(f"{label}: failed ({trial.user_attrs.get('error', exc)}); the sweep goes on")
        return "failed"
    values = [e(res.metrics) for _, e in plan.objectives]
    trial.set_user_attr("metrics", res.metrics)
    if res.rows:  # per-row values: compare's intervals resample them
        trial.set_user_attr("rows", res.rows)
    if res.report is not None:  # the held-out rows' metrics: the verdict's, never read by selection
        trial.set_user_attr("report", res.report)
    trial.set_user_attr("curve", res.curve)
    trial.set_user_attr("seconds", res.seconds)
    trial.set_user_attr("cpu_seconds", time.process_time() - c0)
    trial.set_user_attr("steps", res.steps)
    if res.best_step is not None:
        trial.set_user_attr("best_step", res.best_step)
    missing = [e.text for v, (_, e) in zip(values, plan.objectives) if math.isnan(v)]
    if missing:
        trial.set_user_attr("error", f"objective(s) {missing} could not be computed (a metric is missing)")
        study.tell(trial, state=TrialState.FAIL)
        log(f"{label}: failed ({trial.user_attrs['error']})")
        return "failed"
    constrain(plan, study, trial, res.metrics)
    study.tell(trial, values)
    shown = ", ".join(f"{e.text} {v:.3f}" for v, (_, e) in zip(values, plan.objectives))
    log(f"{label}: {shown} ({res.seconds:.0f} s)")
    return "complete"


def _next_method(plan: SweepPlan, studies: dict[str, Any]) -> tuple[str | None, bool]:
    """(the method to run a trial of next, whether any method still waits on trials running elsewhere)."""
    best, waiting = None, False
    fewest = None
    for name, study in studies.items():
        trials = [t for t in study.get_trials(deepcopy=False) if not is_repeat(t)]
        used = sum(counts(t) for t in trials)
        finished = sum(counts(t) and t.state.name != "RUNNING" for t in trials)
        if used < plan.budget(name) and (fewest is None or used < fewest):
            best, fewest = name, used
        elif finished < plan.budget(name):
            waiting = True
    return best, waiting


def run_sweep(cfg: SweepConfig, log: Log = print, storage: str | None = None,
              max_trials: int | None = None, start_before_s: float | None = None) -> dict[str, Any]:
    """Check, prepare and run this worker's share of the sweep, then write the report; a summary.

    `storage` (the --storage flag) replaces cfg.storage; `max_trials` stops this worker after that many trials, and
    `start_before_s` after the trial it runs once that many seconds have passed since it began preparing (the others,
    or a later run of the same command, do the rest)."""
    from obliviate.sweep.compare import write_compare

    if storage:
        cfg = dataclasses.replace(cfg, storage=storage)
    plan = plan_sweep(cfg)
    url = storage_url(cfg)
    shared = open_storage(url) if cfg.storage else None  # a shared storage that cannot be opened: nothing written
    resuming = shared is not None or (Path(cfg.output_dir) / STORAGE_FILE).is_file() and _resumable(cfg)
    retained.check_new(plan.track, resuming)  # a new storage cannot hold a record of an absent retain model
    warm = bool(cfg.warm_start) and resuming and is_warm(shared if shared is not None else open_storage(url), plan)
    source = _warm_source(cfg) if cfg.warm_start and not warm else None
    resumed = prepare_output(cfg)
    store = shared if shared is not None else open_storage(url)
    for line in plan.lines:
        log(f"  {line}")
    log(f"storage: {url} ({'resumed' if resumed else 'new output directory'}); worker {WORKER}")
    if cfg.warm_start and source is None:
        log(f"  warm start: already in this storage (each study records what it copied); {cfg.warm_start} not read")
    studies = {m: open_study(store, plan, m) if source is None else warm_study(store, plan, m, source,
                                                                              cfg.stale_after_s) for m in plan.methods}
    for method, study in studies.items():
        _check_study(study, plan)
        queue_first(study, plan, method)  # its recipe, then its queued points: each once (the first worker)
    track = plan.track
    t0 = time.perf_counter()
    track.heldout_share = cfg.heldout_share if cfg.heldout_share is not None else \
        (0.5 if track.kind == "knowledge" else None)
    track.heldout_seed = cfg.seed
    # exact: θ0 and rows unchanged; studies made before θ0's per-row values were kept evaluate it once more
    track.need_original = not all(references_done(s, track.heldout_share is not None) for s in studies.values())
    if not track.need_original:
        log("θ0's evaluation: recorded in the storage by an earlier worker, not repeated")
    track.recorded = retained.recorded(studies.values())  # the retain model's outputs (sweep/retained.py)
    track.prepare(log)
    check_models(studies.values(), {**model_digests(track.model, getattr(track, "retain_model", None)),
                                    "rows": track.rows_key()})

    for d in plan.dims:  # layer sets against the loaded model, before any trial; a teacher map's: made on another?
        if d.key in ("method.forget_args.layers", "method.forget_args"):
            for value in d.extremes():
                check_layer_indices(value.get("layers") if d.key == "method.forget_args" else value, track.layers(),
                                    f"space.{d.key}" + (" (teacher map)" if d.key == "method.forget_args" else ""))
    if cfg.eval_every_steps is not None:
        track.original_quick = track.quick(track.model, cfg.eval_rows)
    for study in studies.values():
        if not references_done(study, track.heldout_share is not None):
            for key, value in track.references().items():
                study.set_user_attr(key, value)
    retained.record(studies.values(), track)
    log(f"prepared the {track.kind} track in {time.perf_counter() - t0:.0f} s")
    outcomes: dict[str, int] = {}
    ran = clashes = 0
    while max_trials is None or ran < max_trials:
        if start_before_s is not None and time.perf_counter() - t0 >= start_before_s:
            log(f"--start-before {start_before_s:g} s has passed: this worker starts no other trial")
            break
        for name, s in studies.items():
            fail_stale(s, cfg.stale_after_s)
            requeue_recipe(s, plan.recipes.get(name))
        method, waiting = _next_method(plan, studies)
        if method is None:
            for name, s in studies.items():
                enqueue_repeats(plan, s, name)
            method = next((m for m, s in studies.items() if cfg.repeats and repeat_waiting(s)), None)
        if method is None:
            if waiting:  # others' running trials may still fail and need redoing: wait for them
                time.sleep(min(10.0, cfg.stale_after_s / 4))
                continue
            break
        n = len(studies[method].get_trials(deepcopy=False))
        study = open_study(store, plan, method, make_sampler(cfg, method, n))
        waited = queue_next(study, plan, method, make_sampler(cfg, method, n))
        trial = study.ask()
        clashed = clashes < MAX_CLASHES and clash(study, trial, waited)  # drawn again at the next count
        if surplus(study, trial, plan.budget(method)) or clashed:
            from optuna.trial import TrialState

            trial.set_user_attr("surplus", True)  # never run: another worker took the last trial or point first
            study.tell(trial, state=TrialState.FAIL)
            clashes += clashed
            if clashed:
                log(f"[{method} #{trial.number}] another worker drew the same point at the same moment: drawing again")
            continue
        clashes = 0
        outcome = run_trial(plan, study, trial, method, log)
        retained.record(studies.values(), track)  # the retain model's scores the trial made, for the others
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        ran += 1
    try:
        report: Path | str = write_compare([cfg.output_dir], Path(cfg.output_dir), log=lambda s: None, storage=store)
    except ObliviateError as exc:  # e.g. every trial still running elsewhere: the report comes with a later run
        report = f"none yet ({exc})"
    log(f"this worker ran {ran} trial(s) {outcomes}; report: {report}")
    return {"ran": ran, "outcomes": outcomes, "report": str(report)}
