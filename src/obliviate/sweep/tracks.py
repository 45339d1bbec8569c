"""What a sweep's trials run on: a base config turned into a prepared model and data, and one trial = one method
unlearned from θ0 with one training section, then evaluated.

Three tracks, by the base config:
  knowledge  a knowledge demo config (`kind: knowledge`, e.g. configs/demo_real.yaml): the pretrained model is
             probed once, its known facts grouped once; trials report forget / neighbour / retain / held-out
             accuracy, the MCQ probe, fluency and `forget_score` (the stronger of generation and MCQ).
  demo       a synthetic demo config (e.g. configs/demo.yaml): the world, the retain model and the target are
             built once (and kept in the sweep's directory for resumed and other local workers); trials report
             every TOFU metric against that retain model.
  unlearn    an `obliviate unlearn` config: its θ0, forget / retain rows and evaluation; trials report its
             TOFU metrics (forget quality when eval.retain_model is set).
Every worker prepares its track once and runs its trials in-process on copies of θ0; the θ0 caches
(teacher and reference statistics) are kept across trials that share them.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from obliviate.config import (
    LoraSettings,
    MethodConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    build,
    read_yaml,
    to_dict,
)
from obliviate.errors import ConfigError
from obliviate.eval.metrics import metric_infos
from obliviate.eval.score import forget_score
from obliviate.preflight import preflight_unlearn
from obliviate.setups.world import DemoConfig, eval_config, preflight_demo, world_models
from obliviate.sweep.defaults import DEMO_DEFAULTS, KNOWLEDGE_DEFAULTS, UNLEARN_DEFAULTS, Defaults
from obliviate.sweep.retained import absent, stand_in
from obliviate.sweep.storage import ORIGINAL_ROWS, RETAIN_ROWS
from obliviate.train.student import load_model, student_copy

Log = Callable[[str], None]


@dataclass
class TrialResult:
    """One trial's final metrics (numbers only), its evaluation-during-training curve and timings."""

    metrics: dict[str, float | None]
    curve: list[dict[str, Any]] = field(default_factory=list)
    train_seconds: float = 0.0
    seconds: float = 0.0
    best_step: int | None = None
    steps: int = 0
    rows: dict[str, list[float]] = field(default_factory=dict)  # metric -> per-row values (intervals over rows)
    report: dict[str, Any] | None = None  # {metrics, rows} on the held-out rows selection never reads


def numbers(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """The scalar metrics of an evaluation (lists, texts and nested tables left out; NaN as None)."""
    out: dict[str, float | None] = {}
    for k, v in metrics.items():
        if v is None:
            out[k] = None
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = None if math.isnan(float(v)) else float(v)
    return out


def knowledge_metric_names() -> set[str]:
    from obliviate.eval.knowledge import KNOWLEDGE_COLUMNS

    return set(metric_infos("knowledge")) | {k for k, _ in KNOWLEDGE_COLUMNS} | {
        "forget_score", "forget_mcq_n", "other_mcq_n", "forget_distinct_ratio", "train_seconds"}


def detect_kind(raw: Mapping[str, Any]) -> str:
    """knowledge (kind: knowledge), demo (a synthetic world's keys) or unlearn."""
    if raw.get("kind") == "knowledge":
        return "knowledge"
    if raw.get("kind") is not None:
        raise ConfigError(f"base config: unknown kind {raw.get('kind')!r}; valid: knowledge (or no kind)")
    return "demo" if {"world", "tiny", "retain_train", "target_train"} & set(raw) else "unlearn"


def load_base(path: str, overrides: Mapping[str, Any]) -> tuple[str, Any]:
    """(track kind, the validated base config) of a sweep's `base` file plus its `set` overrides (SweepConfig.set:
    flat key.sub -> value, one spelling per key)."""
    from obliviate.setups.knowledge import KnowledgeDemoConfig

    if not path:
        raise ConfigError("base is empty: set base to the run config the trials start from (an unlearn config, "
                          "configs/demo.yaml or configs/demo_real.yaml)")
    if not Path(path).is_file() and not Path(path).is_absolute():  # a sweep's recorded base: relative to where it ran
        raise ConfigError(f"base: {path} is not found from {Path.cwd()}; a sweep's base is read relative to the "
                          "folder the command runs in (the one the sweep ran in, for a recorded sweep.yaml): run it "
                          "from there, or give base as an absolute path")
    raw = read_yaml(path)
    kind = detect_kind(raw)
    cls = {"knowledge": KnowledgeDemoConfig, "demo": DemoConfig, "unlearn": RunConfig}[kind]
    cfg = build(cls, raw)
    sets = [f"{k}={_yaml(v)}" for k, v in overrides.items()]
    try:
        cfg = build(cls, apply_overrides(to_dict(cfg), sets)) if sets else cfg
    except ConfigError as exc:
        raise ConfigError(f"set: {exc}") from None
    return kind, dataclasses.replace(cfg, output_dir="")  # trials write nothing there: the sweep has its own directory


def _yaml(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON is YAML: `set` values keep their type through the override parser


class Track:
    """Base of the three tracks (module docstring)."""

    kind = ""
    defaults: Defaults

    def __init__(self, cfg: Any, workdir: Path) -> None:
        self.cfg, self.workdir = cfg, workdir
        self.model: Any = None
        self.tok: Any = None
        self.original: dict[str, float | None] = {}
        self.original_quick: dict[str, float | None] = {}
        self.original_report: dict[str, Any] | None = None
        self.retain_report: dict[str, Any] | None = None  # the retain model's metrics on the verdict's rows (TOFU)
        self.retain_rows: dict[str, list] | None = None  # and its per-row values there
        self.pool: Any = None
        self.heldout_share: float | None = None  # the sweep's heldout_share (knowledge track), set before prepare
        self.heldout_seed = 0
        self.held_out: set[str] | None = None
        self.need_original = True  # False: every study already holds θ0's evaluation (a resumed sweep), skip it

    # the base's methods and training section ------------------------------------------------------------
    def methods(self) -> dict[str, dict[str, Any]]:
        return {str(k): dict(v) for k, v in self.cfg.methods.items()}

    @property
    def train(self) -> TrainConfig:
        return self.cfg.unlearn

    @property
    def max_length(self) -> int:
        return int(self.cfg.max_length)

    def metric_names(self) -> set[str]:
        raise NotImplementedError

    def check(self) -> list[str]:
        """Checks that need no weights (the command's own pre-flight); lines describing the track."""
        raise NotImplementedError

    def prepare(self, log: Log) -> None:
        """Load or build θ0 and the data once per worker, evaluate θ0 (self.original, self.original_report) unless
        `need_original` is False."""
        raise NotImplementedError

    def layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def references(self) -> dict[str, Any]:
        """What every study records once (after prepare, when `need_original`): θ0's evaluation, its quick evaluation,
        θ0 on the held-out rows, and the retain model on the verdict's rows, those the track has."""
        import json

        out = {"original": self.original, "original_quick": json.loads(json.dumps(self.original_quick, default=str))}
        if self.original_report is not None:
            out["original_report"] = self.original_report["metrics"]
            out[ORIGINAL_ROWS] = self.original_report.get("rows") or {}
        if self.retain_report is not None:
            out |= {"retain_report": self.retain_report, RETAIN_ROWS: self.retain_rows or {}}
        return out

    def quick(self, model: Any, rows: int) -> dict[str, Any]:
        """The cheap evaluation during training (a declared subset of the metrics on `rows` rows per group)."""
        raise NotImplementedError

    def evaluate(self, model: Any) -> dict[str, Any]:
        raise NotImplementedError

    def forget_retain(self) -> tuple[list, list]:
        raise NotImplementedError

    def student(self) -> Any:
        """A trainable copy of θ0."""
        from obliviate.modeling.frozen import frozen_copy

        student = frozen_copy(self.model)
        for p in student.parameters():
            p.requires_grad_(True)
        return student

    def run(self, method: MethodConfig, train: TrainConfig, monitor: Any = None) -> TrialResult:
        """Unlearn a copy of θ0 with `method` and `train`, evaluate it (on the best evaluation's weights when the
        monitor keeps the best)."""
        import torch

        from obliviate.modeling.cache import CachePool
        from obliviate.train.guard import loss_change
        from obliviate.train.unlearn import unlearn

        t0 = time.perf_counter()
        if self.pool is None:
            self.pool = CachePool()
        torch.manual_seed(train.seed)
        student = self.student()
        forget, retain = self.forget_retain()
        res = unlearn(student, self.tok, forget, retain, method, train, max_length=self.max_length, monitor=monitor,
                      cache_pool=self.pool)
        best = monitor.restore_best(student) if monitor is not None else None
        student.eval()
        metrics, rows, report = self.parts(self.evaluate(student))
        metrics["train_seconds"], metrics["forget_loss_change"] = res.seconds, loss_change(res.history)
        return TrialResult(metrics, list(monitor.curve) if monitor is not None else [], res.seconds,
                           time.perf_counter() - t0, best, len(res.history), rows, report)

    def parts(self, evaluation: Mapping[str, Any]) -> tuple[dict[str, float | None], dict[str, list], dict | None]:
        """(the metrics selection reads, their per-row values, the held-out report {metrics, rows} or None): here
        every row is read by both; the knowledge track cuts its rows in two (eval/heldout.py)."""
        return numbers(evaluation), dict(evaluation.get("rows") or {}), None

    def rows_record(self) -> Any:
        """What a trial trains on and is measured on, as plain data (after prepare): the training rows here."""
        return [[repr(r) for r in side] for side in self.forget_retain()]

    def rows_key(self) -> str:
        """SHA-256 of rows_record(): a study goes on only on the same rows (sweep/workers.check_models), since a
        probe or a split made on another machine may keep other facts."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.rows_record(), sort_keys=True, default=str).encode()).hexdigest()


class KnowledgeTrack(Track):
    kind = "knowledge"
    defaults = KNOWLEDGE_DEFAULTS

    def metric_names(self) -> set[str]:
        return knowledge_metric_names()

    def methods(self) -> dict[str, dict[str, Any]]:
        out = super().methods()
        for name, m in out.items():
            if (m.get("forget_args") or {}).get("tau") == "auto":
                raise ConfigError(f"methods.{name}.forget_args.tau: auto (the calibration's choice) is not swept; "
                                  "give a number, or sweep method.forget_args.tau and layers instead")
        return out

    def check(self) -> list[str]:
        from obliviate.setups.knowledge import preflight_knowledge

        self._facts, lines = preflight_knowledge(self.cfg, need_output=False)
        return [line for line in lines if not line.startswith("methods:")]  # the sweep names its own methods

    def prepare(self, log: Log) -> None:
        from obliviate.modeling.load import to_eval_device
        from obliviate.setups.knowledge import probe_and_split

        cfg = self.cfg
        if not hasattr(self, "_facts"):
            self.check()
        facts = self._facts
        self.model, self.tok = load_model(dataclasses.replace(cfg.model, lora=LoraSettings()))
        to_eval_device(self.model).eval()  # students are copies of it: they start where it is
        replies, self.split = probe_and_split(self.model, self.tok, facts, cfg)
        s = self.split
        log(f"probed {len(facts)} facts: forget {len(s.forget)}, neighbours {len(s.neighbours)}, retain {len(s.retain)}, "
            f"held out {len(s.heldout)}")
        probe = {f.id: r for f, r in zip(facts, replies)}
        if self.heldout_share is not None:
            from obliviate.eval.heldout import report_ids

            cap = s.max_eval_groups(cfg.knowledge.max_eval)
            self.held_out = report_ids({g: [f.id for f in fs] for g, fs in cap.items()}, self.heldout_share,
                                       self.heldout_seed)
            log(f"held out for the verdict: {len(self.held_out)} of {sum(map(len, cap.values()))} evaluation rows "
                f"(heldout_share {self.heldout_share:g}); selection reads the others")
        if self.need_original:
            self.original, _, self.original_report = self.parts(self._evaluate(self.model, None, probe))

    def parts(self, evaluation: Mapping[str, Any]) -> tuple[dict[str, float | None], dict[str, list], dict | None]:
        if self.held_out is None:
            return super().parts(evaluation)
        from obliviate.eval.heldout import part

        select, select_rows = part(evaluation, self.held_out, report=False)
        report, report_rows = part(evaluation, self.held_out, report=True)
        return numbers(select), select_rows, {"metrics": numbers(report), "rows": report_rows}

    def _evaluate(self, model: Any, rows: int | None, replies: dict | None = None) -> dict[str, Any]:
        from obliviate.eval.knowledge import KnowledgeSplit, evaluate_knowledge

        kc, s = self.cfg.knowledge, self.split
        if rows is not None:  # every group capped, the forget group too (a cheap look during training) ...
            if self.held_out is not None:  # ... at the rows selection may read
                s = s.without(self.held_out)
            s = KnowledgeSplit(s.forget[:rows], s.neighbours[:rows], s.retain[:rows], s.heldout[:rows], s.rows, s.pool)
        out = evaluate_knowledge(model, self.tok, s, max_new_tokens=kc.max_new_tokens, batch_size=kc.batch_size,
                                 max_eval=kc.max_eval if rows is None else None, seed=self.cfg.seed, replies=replies,
                                 other_mcq=kc.other_mcq)
        out["forget_score"] = forget_score(out.get("forget_accuracy"), out.get("forget_mcq_accuracy"))
        return out

    def evaluate(self, model: Any) -> dict[str, Any]:
        return self._evaluate(model, None)

    def quick(self, model: Any, rows: int) -> dict[str, Any]:
        return self._evaluate(model, rows)

    def forget_retain(self) -> tuple[list, list]:
        return self.split.train_rows("forget"), self.split.train_rows("retain")

    def rows_record(self) -> Any:
        """The probe's groups (fact ids) and the facts held out for the verdict."""
        return {"groups": {g: [f.id for f in fs] for g, fs in self.split.groups().items()},
                "held_out": sorted(self.held_out or ())}

    def student(self) -> Any:
        return student_copy(self.model, self.cfg.model)


class TofuTrack(Track):
    """The demo and unlearn tracks: TOFU metrics against a retain model's truth ratios when there is one."""

    recorded: dict[str, Any] | None = None  # the storage's record of the retain model's outputs (sweep/retained.py)
    retain_missing: str | None = None  # eval.retain_model, when not on this machine (the record stands in)

    def metric_names(self) -> set[str]:
        from obliviate.eval.runner import tofu_metric_names

        return tofu_metric_names()

    def _ready(self, splits: dict, ev: Any, retain_model: Any, source: str, log: Log = print) -> None:
        from obliviate.eval.heldout import tofu_cut
        from obliviate.eval.runner import forget_truth_ratios

        self.splits, self.ev, self.retain_model, self.source = splits, ev, retain_model, source
        self.retain_tr = (forget_truth_ratios(retain_model, self.tok, splits["forget"], ev, self.max_length)
                          if retain_model is not None and "forget" in splits else None)
        self.retain_scores = dict((self.recorded or {}).get("scores") or {}) if retain_model is not None or \
            self.retain_missing else None  # filled by the trials' evaluations; None: no retain model at all
        if self.retain_missing:
            stand_in(self, self.retain_missing, log)
        if getattr(ev, "retain_reference", None):  # a retain model's evaluation log (eval/retain_reference.py)
            from obliviate.eval.retain_reference import retain_reference_truth_ratios

            self.retain_tr = retain_reference_truth_ratios(ev, splits)
        self.cut = None
        if self.heldout_share is not None:
            self.cut = tofu_cut(splits, self.heldout_share, self.heldout_seed)
            held = sum(len(ix) for ix in self.cut[1].values())
            log(f"held out for the verdict: {held} of {sum(map(len, splits.values()))} evaluation rows "
                f"(heldout_share {self.heldout_share:g}); selection reads the others")
        if self.need_original:
            self.original, _, self.original_report = self.parts(self.evaluate(self.model))
            if retain_model is not None:  # the papers' reference row: the model that never saw the forget rows
                metrics, rows, report = self.parts(self.evaluate(retain_model))
                self.retain_report = report["metrics"] if report is not None else metrics
                self.retain_rows = report["rows"] if report is not None else rows

    def rows_record(self) -> Any:
        """The training rows, every evaluation split's questions and answers, and the selection / held-out cut."""
        cut = None if self.cut is None else [{k: v.tolist() for k, v in part.items()} for part in self.cut]
        return {"train": super().rows_record(), "cut": cut,
                "splits": {k: [[r.question, r.answer] for r in rows] for k, rows in self.splits.items()}}

    def _on(self, model: Any, which: int) -> dict[str, Any]:
        """TOFU's metrics on one part of the rows (0: selection, 1: the held-out report), forget quality against the
        retain model's truth ratios of the same forget rows."""
        from obliviate.eval.runner import evaluate_model

        index = self.cut[which]  # type: ignore[index]
        splits = {k: [rows[i] for i in index[k]] for k, rows in self.splits.items() if len(index[k])}
        retain_tr = None if self.retain_tr is None else self.retain_tr[index["forget"]]
        return evaluate_model(model, self.tok, splits, self.ev, retain_tr, self.max_length, source=self.source,
                              retain_model=self.retain_model, retain_scores=self.retain_scores)

    def evaluate(self, model: Any) -> dict[str, Any]:
        from obliviate.eval.runner import evaluate_model

        if self.cut is not None:
            return {**self._on(model, 0), REPORT_KEY: self._on(model, 1)}
        return evaluate_model(model, self.tok, self.splits, self.ev, self.retain_tr, self.max_length, source=self.source,
                              retain_model=self.retain_model, retain_scores=self.retain_scores)

    def parts(self, evaluation: Mapping[str, Any]) -> tuple[dict[str, float | None], dict[str, list], dict | None]:
        """With held-out rows: the selection part's metrics and rows, and the report part's, each computed on its own
        rows only (forget quality's KS test included)."""
        if REPORT_KEY not in evaluation:
            return super().parts(evaluation)
        report = evaluation[REPORT_KEY]
        return numbers(evaluation), dict(evaluation.get("rows") or {}), \
            {"metrics": numbers(report), "rows": dict(report.get("rows") or {})}

    def quick(self, model: Any, rows: int) -> dict[str, Any]:
        from obliviate.eval.runner import quick_tofu

        splits = self.splits if self.cut is None else \
            {k: [r[i] for i in self.cut[0][k]] for k, r in self.splits.items()}  # selection's rows only
        return quick_tofu(model, self.tok, splits, rows, self.ev, self.max_length)


REPORT_KEY = "_report"  # an evaluation's held-out part, beside the selection part's metrics


class DemoTrack(TofuTrack):
    kind = "demo"
    defaults = DEMO_DEFAULTS

    def check(self) -> list[str]:
        return [line for line in preflight_demo(self.cfg, need_output=False) if not line.startswith("method ")]

    def prepare(self, log: Log) -> None:
        from obliviate.eval.runner import load_eval_splits

        world, world_dir, self.tok, self.model, retain_model = world_models(self.cfg, self.workdir / "base", log)
        p = self.cfg.world.forget_percent
        self._rows = world.splits[f"forget{p:02d}"], world.splits[f"retain{100 - p:02d}"]
        ev = eval_config(self.cfg)
        self._ready(load_eval_splits(str(world_dir), ev), ev, retain_model, str(world_dir), log)

    def forget_retain(self) -> tuple[list, list]:
        return self._rows


class UnlearnTrack(TofuTrack):
    kind = "unlearn"
    defaults = UNLEARN_DEFAULTS

    def methods(self) -> dict[str, dict[str, Any]]:
        return {self.cfg.method.label: to_dict(self.cfg.method)}

    @property
    def train(self) -> TrainConfig:
        return self.cfg.train

    @property
    def max_length(self) -> int:
        return int(self.cfg.data.max_length)

    def check(self) -> list[str]:
        if self.cfg.data.format != "qa":
            raise ConfigError("a sweep over an unlearn config needs data.format=qa (TOFU-style evaluation); MUSE-style "
                              "text corpora are not swept yet")
        if not self.cfg.eval.enabled:
            raise ConfigError("a sweep evaluates every trial: set eval.enabled=true in the base config")
        if self.cfg.continual.enabled:
            raise ConfigError("a sweep runs one unlearning request per trial: set continual.enabled=false")
        cfg, path = dataclasses.replace(self.cfg, output_dir=""), self.cfg.eval.retain_model
        if absent(path):  # checked without it; prepare needs the storage's record of its outputs instead
            cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, retain_model=None))
        self._plan = preflight_unlearn(cfg, need_output=False)
        return self._plan.lines + ([f"eval retain model: {path} is not here: the storage's record of its outputs "
                                    "must stand in for it"] if absent(path) else [])

    def prepare(self, log: Log) -> None:
        from obliviate.eval.runner import load_eval_splits
        from obliviate.modeling.load import load_pretrained, to_eval_device

        if not hasattr(self, "_plan"):
            self.check()
        plan = self._plan
        self._rows = plan.forget, plan.retain
        self.model, self.tok = load_model(dataclasses.replace(self.cfg.model, lora=dataclasses.replace(
            self.cfg.model.lora, enabled=False)))
        to_eval_device(self.model).eval()  # students are copies of it: they start where it is
        ev = self.cfg.eval
        source = ev.source or self.cfg.data.source
        self.retain_missing = ev.retain_model if absent(ev.retain_model) else None
        retain_model = to_eval_device(load_pretrained(ev.retain_model)[0]) if ev.retain_model and \
            not self.retain_missing else None
        self._ready(load_eval_splits(source, ev), ev, retain_model, source, log)

    def forget_retain(self) -> tuple[list, list]:
        return self._rows

    def student(self) -> Any:
        mc = self.cfg.model
        if not mc.lora.enabled:
            return super().student()

        return student_copy(self.model, mc)


TRACKS: dict[str, type[Track]] = {"knowledge": KnowledgeTrack, "demo": DemoTrack, "unlearn": UnlearnTrack}


def make_track(kind: str, cfg: Any, workdir: Path) -> Track:
    return TRACKS[kind](cfg, workdir)


