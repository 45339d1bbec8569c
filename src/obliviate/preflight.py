"""Pre-flight: every check `obliviate unlearn` can make before it loads weights, shared with `obliviate validate`.

One function (`preflight_unlearn`) runs them in one order, so `validate` rejects exactly what `unlearn`
would reject before its first step, with the same message: output location, method and hyper-parameters,
data splits, every model path (config and safetensors, no weights loaded), the teacher's layers against
the model's layer count (read from config.json), RMU's forget and retain layers (one layer, as WMDP's code),
evaluation splits and models, the checkpoint directory, the trackers (train.report_to).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from obliviate import hub
from obliviate.config import CalibrateConfig, EvalRunConfig, FinetuneConfig, MethodConfig, RunConfig
from obliviate.config.fields import need
from obliviate.data.rows import check_disjoint, load_split
from obliviate.data.splits import load_attack_splits, load_data
from obliviate.errors import ConfigError
from obliviate.eval.benchmarks import BENCHMARKS, own_sections, resolve
from obliviate.eval.score import parse_expr
from obliviate.files import FINGERPRINT, check_output_dir, check_writable_location
from obliviate.modeling.sources import (
    check_layer_indices,
    check_model_source,
    check_optional_model,
    check_tokenizer_source,
    layer_count,
    model_config,
)
from obliviate.train import tracking
from obliviate.train.schedule import schedule


def input_paths(cfg: RunConfig) -> dict[str, Any]:
    """Every path an unlearning run reads, by config key (an overwritten output_dir must not contain one)."""
    return {"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer, "data.source": cfg.data.source,
            "eval.source": cfg.eval.source, "eval.retain_model": cfg.eval.retain_model,
            "eval.retain_reference": cfg.eval.retain_reference,
            "eval.embedding_model": cfg.eval.embedding_model, "eval.nli_model": cfg.eval.nli_model,
            "muse.source": cfg.muse.source, "muse.retrain_model": cfg.muse.retrain_model,
            "method.refusals": cfg.method.refusals, "train.checkpoint_dir": cfg.train.checkpoint_dir}


@dataclass
class Checked:
    """What the pre-flight found: the data, the resolved method, the model's layer count, lines for `validate`."""

    forget: list
    retain: list
    method: Any
    n_layers: int | None
    lines: list[str] = field(default_factory=list)


def _check_hidden_layer(layer: Any, n_layers: int, key: str) -> int:
    """RMU-style `layer`: the decoder layer whose output a hook reads (0-based, no negative indices)."""
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < n_layers:
        raise ConfigError(f"{key}={layer!r} must be a decoder layer index 0..{n_layers - 1} of this model "
                          f"({n_layers} layers)")
    return layer


def check_hidden_layers_agree(rm: Any) -> None:
    """A forget objective and a retain term that both read a decoder layer's output (RMU + hidden_mse) read the same
    layer: WMDP's rmu/unlearn.py hooks one module (`layer_id`) for the forget and the retain activations."""
    if rm.retain is None or "hidden" not in rm.forget.needs or "hidden" not in rm.retain.needs:
        return
    forget, retain = rm.forget_kw.get("layer"), rm.retain_kw.get("layer")
    if forget != retain:
        raise ConfigError(f"method.forget_args.layer={forget!r} and method.retain_args.layer={retain!r} differ: "
                          f"{rm.forget.name} steers one decoder layer's output on forget text while {rm.retain.name} "
                          "holds another's on retain text, but RMU (WMDP's code) reads one layer for both; set "
                          f"method.retain_args.layer={forget!r} (or method.forget_args.layer={retain!r})")


def check_method_layers(method: MethodConfig, rm: Any, n_layers: int) -> None:
    """The method's layer indices (ASU teacher layers, RMU layer and trainable layers) exist in the model."""
    if rm.teacher_kw is not None:
        check_layer_indices(rm.teacher_kw.get("layers"), n_layers, "method.forget_args.layers")
    if rm.retain is not None and "hidden" in rm.retain.needs:
        _check_hidden_layer(rm.retain_kw.get("layer"), n_layers, "method.retain_args.layer")
    if "hidden" in rm.forget.needs:
        layer = _check_hidden_layer(rm.forget_kw.get("layer"), n_layers, "method.forget_args.layer")
        chosen, params = rm.loop_kw.get("trainable_layers"), rm.loop_kw.get("trainable_params")
        if isinstance(params, str) and params not in ("wmdp", "layers"):  # train.unlearn.select_trainable's message
            raise ConfigError("trainable_params must be 'wmdp', 'layers' or a list of parameter-name regexes, "
                              f"got {params!r}")
        if isinstance(params, str):
            chosen = list(chosen) if chosen is not None else [i for i in range(layer - 2, layer + 1) if i >= 0]
            if any(not isinstance(i, int) or not 0 <= i < n_layers for i in chosen) or not chosen:
                raise ConfigError(f"trainable_layers {chosen} must be indices of the {n_layers} decoder layers "
                                  f"(0..{n_layers - 1})")


def _check_output(cfg: RunConfig) -> None:
    check_output_dir(need(cfg.output_dir, "output_dir", "runs/my-run"), cfg.overwrite, input_paths(cfg))
    ckpt = cfg.train.checkpoint_dir
    if ckpt and Path(ckpt).expanduser().resolve().is_relative_to(Path(cfg.output_dir).expanduser().resolve()):
        raise ConfigError(f"train.checkpoint_dir {ckpt} lies inside output_dir {cfg.output_dir}, which is written "
                          "(and replaced) as a whole at the end of the run; put the checkpoints elsewhere")


_DEVICE_CHECKS: ContextVar[bool] = ContextVar("obliviate_device_checks", default=True)


@contextmanager
def without_device_checks() -> Iterator[None]:
    """While active, what depends on this machine's accelerator (bitsandbytes with a CUDA GPU) is listed as skipped
    instead of checked: `validate --no-device-checks`, for a config meant for another machine."""
    token = _DEVICE_CHECKS.set(False)
    try:
        yield
    finally:
        _DEVICE_CHECKS.reset(token)


def device_checks_skipped() -> bool:
    """Whether `without_device_checks` is active (a config or plan meant for another machine)."""
    return not _DEVICE_CHECKS.get()


def _memory_switches(train: Any, model: Any) -> list[str]:
    """train.optimizer / model.load_in_4bit checked (train/switches.py; torch is imported only here)."""
    if not _DEVICE_CHECKS.get() and (train.optimizer != "adamw" or getattr(model, "load_in_4bit", False)):
        asked = f"train.optimizer={train.optimizer}" if train.optimizer != "adamw" else "model.load_in_4bit=true"
        return [f"skipped: {asked} needs bitsandbytes and a CUDA GPU, not checked on this machine "
                "(validate --no-device-checks)"]
    from obliviate.train.switches import check_memory_switches

    return check_memory_switches(train, model)


def _check_checkpoint_dir(path: str | None) -> None:
    if not path:
        return
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"train.checkpoint_dir {path} is a file, not a directory; choose another "
                          "train.checkpoint_dir")
    if not p.exists():
        check_writable_location(p, "train.checkpoint_dir")


def _check_methods_data(cfg: RunConfig, rm: Any) -> None:
    if cfg.continual.enabled and cfg.data.format == "text":
        raise ConfigError("continual unlearning is evaluated on QA rows; use data.format=qa (or a single request)")
    if rm.needs_refusals and cfg.data.format == "text":  # the loop's own message (train.unlearn._sides)
        raise ConfigError(f"{cfg.method.forget}/{cfg.method.retain} answer questions with a refusal, but the data is "
                          "raw text; use a QA split or an objective without refusals (e.g. npo, ga, rmu, asu)")
    if rm.needs_refusals:
        from obliviate.data.refusals import load_refusals

        load_refusals(cfg.method.refusals)


def unless_skipped(lines: list[str], check: Callable[[], Any], what: str = "") -> Any:
    """check(), or None with a "skipped" line in `lines` (naming `what` was being checked) when it needs the hub and
    `validate --offline` leaves it out."""
    try:
        return check()
    except hub.HubSkipped as exc:
        lines.append(f"skipped: {what + ': ' if what else ''}{exc}")
        return None


def _schedule_line(cfg: RunConfig, n_forget: int) -> list[str]:
    """QA data: the run's steps and warm-up (train/schedule.py) for the processes this launch has (WORLD_SIZE, else
    one), refused here when the warm-up outlasts the run; raw text is cut into windows only when it is tokenised."""
    if cfg.data.format != "qa" or cfg.continual.enabled:
        return []

    world = int(os.environ.get("WORLD_SIZE", "1"))
    sch = schedule(n_forget, cfg.train.batch_size * world, cfg.train)
    return [f"schedule: {sch.steps} optimizer steps, {sch.warmup} of them warming up ({world} process"
            f"{'es' if world > 1 else ''})"]


def _check_tofu_eval(cfg: RunConfig, source: str) -> list[str]:
    """TOFU evaluation after training: its splits load, and its models exist (lines for `validate`)."""
    from obliviate.eval.runner import load_eval_splits
    from obliviate.eval.tofu import reference_forget_rows

    ev = cfg.eval
    splits = load_eval_splits(source, ev, cfg.data.fields)
    lines = ["eval splits: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items())]
    if ev.holdout_split and ev.memorization and "forget" in splits:
        holdout = load_split(ev.source or source, ev.holdout_split, None if ev.source else cfg.data.fields)
        lines[0] += f", holdout {len(holdout)}"
    if ev.retain_model:
        reference_forget_rows(splits, "eval.retain_model")
        lines.append("eval retain model: " + check_model_source(ev.retain_model, "eval.retain_model"))
    if ev.retain_reference:
        from obliviate.eval.runner import reference_line

        lines.append(reference_line(ev, splits))
    if ev.closer_look or ev.protocol == "closer_look":
        check_optional_model(ev.embedding_model, "eval.embedding_model")
        check_optional_model(ev.nli_model, "eval.nli_model")
    return lines


def _check_muse_eval(cfg: RunConfig) -> list[str]:
    from obliviate.eval.muse import load_muse

    data = load_muse(cfg.muse.source)
    lines = [f"muse: {cfg.muse.source} ({len(data.verbmem_forget)} VerbMem, {len(data.knowmem_forget)} KnowMem, "
             f"{len(data.privleak_forget)} PrivLeak forget items)"]
    if cfg.muse.retrain_model:
        lines.append("muse retrain model: " + check_model_source(cfg.muse.retrain_model, "muse.retrain_model"))
    return lines


def preflight_unlearn(cfg: RunConfig, *, need_output: bool = True) -> Checked:
    """Every check of an unlearning run that needs no weights, in the order `unlearn` meets them.

    `validate` calls it with need_output=False (an empty output_dir is fine there, a set one is checked)."""
    from obliviate.train.unlearn import resolve_method

    if need_output or cfg.output_dir:
        _check_output(cfg)
    source = need(cfg.data.source, "data.source", "<data dir or hub id>")
    rm = resolve_method(cfg.method)  # unknown names / keys fail before any loading
    _check_methods_data(cfg, rm)
    skipped: list[str] = []
    loaded = unless_skipped(skipped, lambda: tuple(load_data(source, cfg.data.format, [split], cfg.data.fields)
                                                    for split in (cfg.data.forget_split, cfg.data.retain_split)))
    forget, retain = loaded if loaded else ([], [])
    if loaded and cfg.data.format == "qa":
        check_disjoint(forget, retain)
    path = need(cfg.model.path, "model.path", "<model dir or hub id>")
    kind = "rows" if cfg.data.format == "qa" else "documents"
    model_line = "model: " + check_model_source(path, "model.path")
    n_layers = layer_count(model_config(path))
    if n_layers is not None:
        check_method_layers(cfg.method, rm, n_layers)
        model_line += f", {n_layers} layers"
    elif hub.skipping():
        skipped.append("skipped: the method's layer indices against the model's layer count (its config.json is "
                       "not local)")
    lines = (_schedule_line(cfg, len(forget)) if loaded else []) + [
        f"method: {cfg.method.forget} + {cfg.method.retain or 'no retain term'}, rule {rm.rule.name}, "
        f"needs {sorted(rm.needs()) or 'nothing extra'}",
        f"data: {len(forget)} forget and {len(retain)} retain {kind}" if loaded else
        f"data: {source} not loaded, so " + ("neither the overlap of forget and retain nor the schedule is checked"
                                             if cfg.data.format == "qa" else "its windows are not counted"),
        model_line] + skipped
    if cfg.model.tokenizer:
        lines.append("tokenizer: " + check_tokenizer_source(cfg.model.tokenizer, "model.tokenizer"))
    check_hidden_layers_agree(rm)  # after the range checks: a layer the model lacks is the first thing to fix
    if cfg.eval.enabled and cfg.data.format == "qa":
        lines += unless_skipped(lines, lambda: _check_tofu_eval(cfg, source), "the TOFU evaluation's splits and models") or []
        lines += _check_during(cfg)
    elif cfg.eval.every_steps is not None:
        raise ConfigError("eval.every_steps evaluates TOFU-style QA splits during training; it needs data.format=qa "
                          "and eval.enabled=true (drop eval.every_steps otherwise)")
    elif cfg.eval.enabled and cfg.muse.source:
        lines += unless_skipped(lines, lambda: _check_muse_eval(cfg), "the MUSE evaluation") or []
    _check_checkpoint_dir(cfg.train.checkpoint_dir)
    if cfg.method.cache_dir:  # where a cache over its limit would be spilled, checked before any training
        check_writable_location(Path(cfg.method.cache_dir) / "obliviate-cache", "method.cache_dir")
    lines += tracking.check(cfg.train, cfg.output_dir)
    lines += _memory_switches(cfg.train, cfg.model)
    if cfg.train.compile:
        from obliviate.train.switches import check_backend

        check_backend(cfg.train.compile_backend)
    if cfg.audit.enabled:
        lines += unless_skipped(lines, lambda: _check_audit(cfg, source), "the audit's splits") or []
    if cfg.hub.push:  # no token, offline, hub unreachable: said now, not after the training
        hub.check_can_push()
        lines.append(f"hub: push to {cfg.hub.repo_id} after the run (a token is set and the hub answers)")
    return Checked(forget, retain, rm, n_layers, lines)


def _check_during(cfg: RunConfig) -> list[str]:
    """Evaluation during training: one unlearning run (not continual), a keep-best score naming real metrics."""
    ev = cfg.eval
    if ev.every_steps is None:
        return []
    if cfg.continual.enabled:
        raise ConfigError("eval.every_steps evaluates one unlearning run; with continual.enabled=true each request is "
                          "its own run: drop eval.every_steps (the continual table evaluates every request)")
    if ev.keep_best is not None:
        from obliviate.eval.runner import tofu_metric_names

        parse_expr(ev.keep_best, tofu_metric_names(), "eval.keep_best")
    return [f"evaluation during training: every {ev.every_steps} steps on {ev.during_rows} forget and retain rows"
            + (f", keeping the {'highest' if ev.keep_best_direction == 'maximize' else 'lowest'} {ev.keep_best}"
               if ev.keep_best else "")]


def _check_audit(cfg: RunConfig, source: str) -> list[str]:
    """A run's own audit (audit.enabled): QA data, a saved model it can load, its splits and reference model."""
    import dataclasses

    if cfg.data.format != "qa":
        raise ConfigError("audit.enabled=true attacks answers to questions, but data.format is text; use a QA "
                          "split or set audit.enabled=false")
    if cfg.model.lora.enabled and not cfg.model.lora.merge_on_save:
        raise ConfigError("audit.enabled=true loads the saved model, but model.lora.merge_on_save=false saves only "
                          "the adapters; set model.lora.merge_on_save=true or audit.enabled=false")
    if cfg.audit.retain_model:
        check_model_source(cfg.audit.retain_model, "audit.retain_model")
    filled = dataclasses.replace(cfg.audit, data=cfg.audit.data or cfg.eval.source or source,
                                 forget_split=cfg.audit.forget_split or cfg.data.forget_split)
    forget, retain, holdout, _ = load_attack_splits(filled.data, *filled.split_names())
    return [f"audit: {', '.join(cfg.audit.attacks)} on {len(forget)} forget rows "
            f"({len(retain)} retain, {len(holdout)} holdout)"]


def check_layer_sets(layer_sets: list | None, n_layers: int) -> None:
    """Every layer set of a calibration sweep addresses existing layers."""
    for i, layers in enumerate(layer_sets or []):
        check_layer_indices(layers, n_layers, f"layer_sets[{i}]")


def preflight_calibrate(cfg: CalibrateConfig, *, need_output: bool = True) -> list:
    """Checks of `obliviate calibrate` before the model loads; returns the forget rows (output_dir is optional
    here: a set one is checked with or without `need_output`)."""

    if cfg.output_dir:
        check_output_dir(cfg.output_dir, cfg.overwrite, {"model.path": cfg.model.path, "source": cfg.source})
    rows = load_split(need(cfg.source, "source", "<data dir or hub id>"), cfg.split)
    path = need(cfg.model.path, "model.path", "<model dir or hub id>")
    check_model_source(path, "model.path")
    if cfg.model.tokenizer:
        check_tokenizer_source(cfg.model.tokenizer, "model.tokenizer")
    n_layers = layer_count(model_config(path))
    if n_layers is not None:
        check_layer_sets(cfg.layer_sets, n_layers)
        if cfg.window_widths is not None:
            from obliviate.eval.analysis import layer_windows

            layer_windows(n_layers, cfg.window_widths, cfg.window_starts)
    if cfg.retain_split is not None:
        check_disjoint(rows, load_split(cfg.source, cfg.retain_split))
    return rows[: cfg.max_examples] if cfg.max_examples else rows


def finetune_inputs(cfg: FinetuneConfig) -> dict[str, Any]:
    """Every path `obliviate finetune` reads, by config key."""
    return {"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer, "data.source": cfg.data.source,
            "train.checkpoint_dir": cfg.train.checkpoint_dir}


def preflight_finetune(cfg: FinetuneConfig, *, need_output: bool = True) -> tuple[list, list[str]]:
    """Checks of `obliviate finetune` before any model is built: (the training rows, lines for `validate`)."""
    lines = []
    if (need_output or cfg.output_dir) and not cfg.overwrite and (Path(cfg.output_dir) / FINGERPRINT).is_file():
        lines.append(f"output_dir {cfg.output_dir} holds a fine-tune: reused if this run's settings, starting weights "
                     "and data are the same, else refused")
    elif need_output or cfg.output_dir:
        check_output_dir(need(cfg.output_dir, "output_dir", "runs/target"), cfg.overwrite, finetune_inputs(cfg))
    source = need(cfg.data.source, "data.source", "<data dir or hub id>")
    rows = load_data(source, cfg.data.format, list(cfg.data.splits), cfg.data.fields)
    path = need(cfg.model.path, "model.path", "tiny")
    lines.insert(0, f"data: {len(rows)} {'rows' if cfg.data.format == 'qa' else 'documents'} from "
                    f"{', '.join(map(str, cfg.data.splits))}")
    if path == "tiny":
        lines.append(f"model: a tiny Llama built here ({cfg.tiny.layers} layers, hidden {cfg.tiny.hidden_size})")
    else:
        lines.append("model: " + check_model_source(path, "model.path"))
    if cfg.model.tokenizer:
        lines.append("tokenizer: " + check_tokenizer_source(cfg.model.tokenizer, "model.tokenizer"))
    _check_checkpoint_dir(cfg.train.checkpoint_dir)
    lines += _check_knows(cfg, source)
    lines += tracking.check(cfg.train, cfg.output_dir)
    lines += _memory_switches(cfg.train, None if path == "tiny" else cfg.model)
    return rows, lines


def _check_knows(cfg: FinetuneConfig, source: str) -> list[str]:
    """knows.split: QA data, no FSDP (the check generates on one process), and a split that loads with rows."""
    k = cfg.knows
    if k.split is None:
        return []
    if cfg.data.format != "qa":
        raise ConfigError(f"knows.split={k.split!r} asks the model questions, but data.format is "
                          f"{cfg.data.format!r}: use QA data (data.format=qa) or drop knows.split")
    if cfg.train.fsdp:
        raise ConfigError("knows.split generates answers on one process, but train.fsdp shards the model: drop "
                          "knows.split (check the saved model with obliviate eval) or train.fsdp")
    rows = load_split(source, k.split, cfg.data.fields or None)
    if not rows:
        raise ConfigError(f"knows.split={k.split!r} of {source} has no rows: name a split with questions")
    n = min(len(rows), k.max_examples or len(rows))
    when = f"every {k.every_steps} steps" if k.every_steps else "after every epoch"
    return [f"knows: {when}, greedy answers to {n} rows of {k.split}; known at recall >= {k.bar:g}"]


def eval_inputs(cfg: EvalRunConfig) -> dict[str, Any]:
    """Every path `obliviate eval` reads, by config key: the model's and every registered benchmark's."""

    out = {"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer}
    for name in BENCHMARKS.names():
        out.update(BENCHMARKS.get(name).input_paths(cfg))
    return out


def preflight_eval(cfg: EvalRunConfig, *, need_output: bool = True) -> tuple[Any, list[str]]:
    """Checks of `obliviate eval` before the model loads: (what the benchmark's run reuses, e.g. TOFU's splits;
    lines for `validate`)."""

    spec = BENCHMARKS.get(cfg.benchmark)  # an unknown name lists the registered ones
    unknown = sorted(set(cfg.sections) - set(own_sections()))
    if unknown:
        raise ConfigError(f"sections: {unknown} belong to no registered benchmark; valid: {sorted(own_sections())} "
                          "(a benchmark's settings section is named by its registration)")
    inputs = eval_inputs(cfg)
    if need_output or cfg.output_dir:
        check_output_dir(need(cfg.output_dir, "output_dir", "runs/eval"), cfg.overwrite, inputs)
    lines, state = [f"benchmark: {cfg.benchmark}"], None
    if spec.preflight:
        state, more = resolve(spec.preflight)(cfg)
        lines += more
    lines.append("model: " + check_model_source(need(cfg.model.path, "model.path", "<model dir or hub id>"),
                                                "model.path"))
    for key in spec.models:
        value = getattr(spec.settings(cfg), key)
        if value:
            lines.append(f"{spec.section}.{key}: " + check_model_source(value, f"{spec.section}.{key}"))
    return state, lines
