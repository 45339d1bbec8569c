"""`obliviate sweep` configuration: a base run config, the methods, a search space, objectives and a budget."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obliviate.config.fields import require, setting


@dataclass(frozen=True)
class SweepConfig:
    base: str = setting("", "the run config trials start from: an unlearn config, a synthetic demo config (configs/demo.yaml) "
                       "or a knowledge demo config (kind: knowledge, configs/demo_real.yaml)")
    set: dict = setting({}, "overrides of the base config, key.sub: value (e.g. {knowledge.max_per_family: 5, audit: false})")
    methods: dict = setting({}, "name -> method section (forget, forget_args, retain, ...; and `train`: that method's "
                                "own training settings over the base's, e.g. its authors' epochs); empty: the base's "
                                "methods (an unlearn config: its one method)")
    space: dict = setting({}, "search space: key -> {float: [low, high], log: true} | {int: [low, high]} | {choices: [...]}, "
                         "each optionally limited to some methods (methods: [names]); keys: seed, train.*, method.*, "
                         "method.forget_args.*, method.retain_args.* (the error for an unknown key lists them)")
    objectives: list = setting([], "[{minimize: EXPR} | {maximize: EXPR}], EXPR a metric or an expression such as "
                              "min(neighbours_accuracy, retain_accuracy); empty: the track's forget and utility scores")
    search: str = setting("objectives", "objectives (the sampler follows `objectives`) | bar (it minimises the bar's "
                          "forget expression with the bar's conditions as constraints: the search looks where the "
                          "verdict looks; `objectives` must then be empty)")
    warm_start: str | None = setting(None, "the output_dir of a sweep whose finished trials start this one's studies "
                                           "(copied, counted in the budget; only search, objectives, sampler, seed, "
                                           "bar, report and study may differ): search another way without running "
                                           "them again")
    trials: int = setting(8, "finished trials per method: every method gets the same number of trials and steps budget")
    sampler: str = setting("tpe", "tpe (Optuna's TPE; multi-objective with several objectives) | random | grid (every "
                             "combination of choices and stepped ranges; trials then at most the grid's size)")
    start_at_recipe: bool = setting(False, "each method's first trial is its recipe: the base config with the method's "
                                           "own section (the authors' recipe when the presets are theirs), so the "
                                           "report shows that point and the search starts from it; every recipe "
                                           "value must lie inside the space (tpe or random sampler)")
    queue: dict = setting({}, "method -> [points tried before the sampler's, after the recipe]: each point a mapping "
                              "of space keys to values inside the space (keys left out are sampled); each counts in "
                              "the budget, is queued once per study (adding points later queues only the new ones), "
                              "and the report marks it 'queued'; a running sweep may be given more")
    seed: int = setting(0, "the sampler's seed (a trial's own seed is train.seed, or the `seed` dimension)")
    eval_every_steps: int | None = setting(None, "evaluate during each trial every N optimizer steps (and at its last step) "
                                            "on eval_rows rows per group: the curve is kept, `prune` reads it")
    eval_rows: int = setting(8, "rows per group in the evaluation during training")
    keep_best: bool = setting(False, "end each trial on its best evaluation during training (by the first objective) "
                                "instead of its last step")
    prune: list = setting([], "stop a trial when an evaluation during training breaks a rule: [{metric: EXPR, below: x} | "
                         "{metric: EXPR, above: x}], `relative: true` makes x a share of θ0's value")
    repeats: int = setting(0, "after the trials, run each method's best trial again with this many other seeds "
                         "(train.seed + 1, + 2, ...): its spread in the report")
    bar: dict = setting({}, "the report's matched-utility bar: {forget: EXPR, keep: {metric: share of θ0's value}, "
                       "at_most: {metric: ceiling}}; empty: the track's (knowledge: neighbour and retain accuracy >= "
                       "0.9x θ0's, <= 10% degenerate)")
    report: dict = setting({}, "axes of the report's frontier plot: {forget: EXPR, utility: EXPR, fluency: METRIC}; "
                          "empty: the track's")
    heldout_share: float | None = setting(None, "the share of each group's evaluation rows held out for the verdict; "
                                                "trials are selected (objectives, pruning, the best at matched utility) on "
                                                "the other rows only (eval/heldout.py). null: 0.5 on the knowledge track, "
                                                "no held-out rows on the TOFU tracks (demo, unlearn)")
    study: str = setting("sweep", "study name in the storage (one study per method: <study>/<method>)")
    storage: str | None = setting(None, "Optuna storage shared by the workers: a database URL (sqlite:///file.db, "
                                   "postgresql://user@host/db, mysql://...) or a journal file (journal:PATH or a path "
                                   "ending in .journal); null: sqlite in output_dir")
    stale_after_s: int = setting(300, "a running trial whose worker has not reported for this long is failed and redone "
                                 "(a worker on this machine whose process is gone: at once)")
    output_dir: str = setting("obliviate-sweep", "the sweep's directory: sweep.yaml, the default storage, the report")
    overwrite: bool = setting(False, "replace an output_dir holding another sweep or other files (the default storage in "
                                "it is deleted; a shared storage is never touched); the same sweep is always resumed")

    def __post_init__(self) -> None:
        if isinstance(self.set, Mapping):  # (the loader refuses anything else with its own error)
            object.__setattr__(self, "set", flat_keys(self.set))  # one spelling per key: a later `set.a.b=` wins
        require(self.trials >= 1, "trials", self.trials, ">= 1")
        require(self.heldout_share is None or not isinstance(self.heldout_share, bool)
                and isinstance(self.heldout_share, (int, float)) and 0 < self.heldout_share < 1,
                "heldout_share", self.heldout_share,
                "strictly between 0 and 1 (e.g. 0.5: half of each group's rows select, the other half judge)")
        require(self.sampler in ("tpe", "random", "grid"), "sampler", self.sampler, "tpe, random or grid")
        require(self.search in ("objectives", "bar"), "search", self.search, "objectives or bar")
        require(not (self.search == "bar" and self.objectives), "objectives", self.objectives,
                "empty with search: bar (the bar's forget expression is then the one objective)")
        require(not (self.warm_start and self.sampler == "grid"), "warm_start", self.warm_start,
                "null with sampler grid (a grid visits its own points)")
        require(self.eval_every_steps is None or self.eval_every_steps >= 1, "eval_every_steps",
                 self.eval_every_steps, ">= 1 or null")
        require(self.eval_rows >= 1, "eval_rows", self.eval_rows, ">= 1")
        require(self.repeats >= 0, "repeats", self.repeats, ">= 0")
        require(not (self.start_at_recipe and self.sampler == "grid"), "start_at_recipe", self.start_at_recipe,
                "false with sampler grid (a grid visits its own points; use tpe or random)")
        require(isinstance(self.queue, Mapping) and all(isinstance(v, list) for v in self.queue.values()),
                "queue", self.queue, "a mapping of method names to lists of points ({NPO: [{train.lr: 1.0e-4}]})")
        require(not (self.queue and self.sampler == "grid"), "queue", self.queue,
                "empty with sampler grid (a grid visits its own points; use tpe or random)")
        require(self.stale_after_s >= 1, "stale_after_s", self.stale_after_s, ">= 1")
        require(bool(self.study) and "/" not in self.study, "study", self.study, "a non-empty name without '/'")
        require(not ((self.keep_best or self.prune) and self.eval_every_steps is None), "eval_every_steps",
                 self.eval_every_steps, "set (>= 1) when keep_best or prune is used: both read the evaluations "
                                        "during training")


def flat_keys(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{a: {b: 1}, c.d: 2} -> {a.b: 1, c.d: 2}: `set` edits leaves, so a section keeps its other keys; where two
    spellings name one key (`a.b: 1` in the file, `set.a.b=2` on the command line), the later one wins."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            for key, value in flat_keys(v, f"{prefix}{k}.").items():
                out.pop(key, None)
                out[key] = value
        else:
            out.pop(f"{prefix}{k}", None)
            out[f"{prefix}{k}"] = v
    return out


def locate(path: str, anchor: Path) -> str:
    """A relative path a sweep file names (its base, a teacher map): as given when it exists from the current
    folder, else the first match in the sweep file's folder or one of its parents (a path written from the
    repository root works from anywhere), else as given (the error that follows names it)."""
    if not path or Path(path).is_absolute() or Path(path).exists():
        return path
    for folder in [anchor, *anchor.parents]:
        if (folder / path).exists():
            return str(folder / path)
    return path


def anchored(cfg: SweepConfig, sweep_file: str | Path) -> SweepConfig:
    """`cfg` with its base and teacher-map paths located from `sweep_file` (locate)."""
    anchor = Path(sweep_file).resolve().parent
    space = {key: ([_anchor_dim(d, anchor) for d in spec] if isinstance(spec, list) else _anchor_dim(spec, anchor))
             for key, spec in cfg.space.items()}
    return dataclasses.replace(cfg, base=locate(cfg.base, anchor), space=space)


def _anchor_dim(spec: Any, anchor: Path) -> Any:
    if isinstance(spec, dict) and isinstance(spec.get("teacher_map"), str):
        return {**spec, "teacher_map": locate(spec["teacher_map"], anchor)}
    return spec

