"""The work behind `obliviate finetune | unlearn | eval | ls`, on user models and data."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from obliviate.config import (CalibrateConfig, EvalRunConfig, FinetuneConfig, ModelConfig, RunConfig, method_label,
                              to_dict)
from obliviate.errors import ConfigError
from obliviate.paths import check_model_source, check_tokenizer_source, layer_count
from obliviate.preflight import (check_layer_sets, check_method_layers, eval_inputs, finetune_inputs, input_paths,
                                 load_data, need, preflight_calibrate, preflight_eval, preflight_finetune,
                                 preflight_unlearn)

# Heavy modules (torch, transformers) are imported inside the commands that need them, so that config errors,
# --help and `report` answer without loading them.
_need = need
_load_data = load_data


def _main_process() -> bool:
    """True on the process that evaluates and writes (rank 0; always true without data parallelism)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def _load(mc: ModelConfig) -> tuple[Any, Any]:
    from obliviate.modeling.load import load_pretrained

    _need(mc.path, "model.path", "<model dir or hub id>")
    if mc.tokenizer:
        check_tokenizer_source(mc.tokenizer, "model.tokenizer")
    model, tok = load_pretrained(mc.path, mc.tokenizer, dtype=mc.dtype, attn_implementation=mc.attn_implementation,
                                 trust_remote_code=mc.trust_remote_code)
    if mc.lora.enabled:
        from obliviate.modeling.lora import apply_lora

        model = apply_lora(model, r=mc.lora.r, alpha=mc.lora.alpha, dropout=mc.lora.dropout,
                           target_modules=list(mc.lora.target_modules) if mc.lora.target_modules else None)
    return model, tok


def _saveable(model: Any, mc: ModelConfig) -> Any:
    """What to write: the merged model for LoRA runs (unless merge_on_save is off), else the model."""
    if mc.lora.enabled and mc.lora.merge_on_save:
        from obliviate.modeling.lora import merged

        return merged(model)
    return model


def _write_run(out: Path, cfg: Any, metrics: dict[str, Any], label: str) -> None:
    from obliviate.jsonio import write_json
    from obliviate.report.markdown import console_table, metrics_markdown, write_report

    (out / "obliviate.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
    write_json(out / "metrics.json", metrics)
    if metrics.get("continual_table"):
        (out / "continual.md").write_text("# Continual unlearning\n\n" + metrics["continual_table"] + "\n",
                                          encoding="utf-8")
    if metrics.get("eval") and "model_utility" not in metrics["eval"]:  # not TOFU: a plain metric table
        text = metrics_markdown(metrics["eval"], title=label)
        (out / "report.md").write_text(text + "\n", encoding="utf-8")
        print(text)
    elif "eval" in metrics and metrics["eval"]:
        results = {"runs": {label: {"metrics": metrics["eval"]}}, "questions": metrics.get("questions", []),
                   "answers": metrics.get("answers", [])}
        write_report(out / "report.md", results)
        print(console_table(results))


def _evaluate(model: Any, tok: Any, source: str, cfg: Any, max_length: int,
              splits: dict[str, list] | None = None) -> dict[str, Any]:
    """TOFU evaluation on the configured splits (loaded here unless the pre-flight already did); eval.retain_model
    gives forget quality, PrivLeak's retrained reference and the MIA reference model."""
    from obliviate.eval.runner import evaluate_model, forget_truth_ratios, load_eval_splits
    from obliviate.modeling.load import load_pretrained

    splits = load_eval_splits(source, cfg) if splits is None else splits
    retain_tr = retain_model = None
    if cfg.retain_model:
        if "forget" not in splits:
            raise ConfigError("eval.retain_model is set but eval.forget_split is null: forget quality needs a forget split")
        retain_model, rtok = load_pretrained(cfg.retain_model)
        retain_tr = forget_truth_ratios(retain_model, rtok, splits["forget"], cfg, max_length)
        if rtok.get_vocab() != tok.get_vocab():  # token-level comparisons need one tokenizer
            retain_model = None
    metrics = evaluate_model(model, tok, splits, cfg, retain_tr, max_length, source=source, retain_model=retain_model)
    if cfg.retain_model and retain_model is None:
        metrics["notes"].append("retain model has another tokenizer: not used as PrivLeak / MIA reference")
    fr = splits.get("forget", [])
    return {"eval": metrics, "questions": [r.question for r in fr], "answers": [r.answer for r in fr]}


def _monitor(model: Any, tok: Any, source: str, cfg: RunConfig) -> Any:
    """The evaluation during training of `obliviate unlearn` (eval.every_steps), or None."""
    ev = cfg.eval
    if ev.every_steps is None:
        return None
    from obliviate.eval.runner import load_eval_splits, quick_tofu
    from obliviate.eval.score import parse_expr
    from obliviate.train.monitor import Monitor

    splits = load_eval_splits(ev.source or source, ev)
    score = parse_expr(ev.keep_best) if ev.keep_best else None
    return Monitor(ev.every_steps, lambda m: quick_tofu(m, tok, splits, ev.during_rows, ev, cfg.data.max_length),
                   score=score, maximize=ev.keep_best_direction == "maximize", keep_best=score is not None)


def _model_layers(model: Any) -> int | None:
    config = getattr(model, "config", None)
    return layer_count(config.to_dict()) if hasattr(config, "to_dict") else None


def run_unlearn(cfg: RunConfig) -> dict[str, Any]:
    """Pre-flight (as `validate`), load θ0, unlearn the forget split, evaluate, save model + config + metrics +
    receipt.json + README.md model card atomically."""
    from obliviate.modeling.load import atomic_dir, save_model
    from obliviate.train.unlearn import unlearn

    plan = preflight_unlearn(cfg)
    forget, retain, source = plan.forget, plan.retain, cfg.data.source
    model, tok = _load(cfg.model)
    from obliviate.receipt import model_hashes, write_receipt

    theta0 = model_hashes(model)  # before training: `unlearn` trains the model in place
    n_layers = _model_layers(model)
    if plan.n_layers is None and n_layers is not None:  # no config.json to read before (e.g. a hub id not cached)
        check_method_layers(cfg.method, plan.method, n_layers)
    if cfg.continual.enabled:
        metrics = _continual(model, tok, forget, retain, cfg)
        if not _main_process():
            return {}
    else:
        monitor = _monitor(model, tok, source, cfg)
        res = unlearn(model, tok, forget, retain, cfg.method, cfg.train, max_length=cfg.data.max_length,
                      monitor=monitor)
        if not _main_process():  # data-parallel runs: rank 0 evaluates and saves, the others are done
            return {}
        metrics = {"history": res.history, "train_seconds": res.seconds}
        if monitor is not None and cfg.eval.keep_best:
            metrics["best_step"] = monitor.restore_best(model)
            metrics["best_score"] = monitor.best_score
            print(f"kept the weights of step {metrics['best_step']} ({cfg.eval.keep_best} = {monitor.best_score:.4f})")
        if res.module_stats:
            metrics["module_stats"] = res.module_stats
    if cfg.eval.enabled and cfg.data.format == "qa":
        metrics.update(_evaluate(model, tok, source, cfg.eval, cfg.data.max_length))
    elif cfg.eval.enabled and cfg.muse.source:
        from obliviate.eval.runner import evaluate_muse_run

        metrics["eval"] = evaluate_muse_run(model, tok, cfg.muse)
    with atomic_dir(cfg.output_dir, cfg.overwrite, input_paths(cfg)) as out:
        save_model(out, _saveable(model, cfg.model), tok)
        _write_run(out, cfg, metrics, cfg.method.label)
        write_receipt(out, cfg, tok, forget, retain, theta0, metrics)  # + README.md model card
    print(f"saved to {cfg.output_dir} (verify with: obliviate verify {Path(cfg.output_dir) / 'receipt.json'} "
          f"{cfg.output_dir})")
    if cfg.audit.enabled:
        metrics["audit"] = _audit_run(cfg)
    return metrics


def _audit_run(cfg: RunConfig) -> dict[str, Any]:
    """The run's own audit (audit.enabled): attacks on the saved model, the verdict added to its receipt.json."""
    from obliviate.audit.run import audit_run_output
    from obliviate.receipt import attach_audit

    res = audit_run_output(cfg.audit, cfg.output_dir, cfg.model.path, cfg.eval.source or cfg.data.source,
                           cfg.data.forget_split)
    summary = {"k_metric": res.k_metric, "ref0": res.ref0, "verdict": res.verdict,
               "report": str(Path(cfg.audit.output or Path(cfg.output_dir) / "audit") / "audit.json")}
    attach_audit(Path(cfg.output_dir) / "receipt.json", summary)
    return summary


def _continual(model: Any, tok: Any, forget: list, retain: list, cfg: RunConfig) -> dict[str, Any]:
    """Unlearn the forget split as a sequence of requests, each from the previous result (docs/METHODS.md §1.5)."""
    import dataclasses

    from obliviate.train.continual import continual_table, run_continual, split_requests

    reqs = split_requests(forget, cfg.continual.requests, authors_per_request=cfg.continual.authors_per_request)
    from obliviate.train.loop import make_accelerator

    # the accelerator decides the launch (torchrun on CPU: gloo); a bare PartialState here would not
    main = make_accelerator(cfg.train).is_main_process
    res = run_continual(model, tok, reqs, retain, cfg.method, cfg.train, max_length=cfg.data.max_length,
                        config=cfg.continual, eval_fn=None if main else (lambda m, i, seen: {}),
                        log=print if main else (lambda s: None))
    table = continual_table(res)
    if main:
        print(table)
    return {"history": [h for hs in res.histories for h in hs], "train_seconds": res.total_seconds,
            "continual": dataclasses.asdict(res), "continual_table": table}


def run_finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune a model (or a freshly built tiny one) on QA splits and save it with its tokenizer."""
    from obliviate.modeling.load import atomic_dir, load_tokenizer, save_model
    from obliviate.train.unlearn import finetune

    inputs = finetune_inputs(cfg)
    rows, _ = preflight_finetune(cfg)
    if cfg.model.path == "tiny":
        from obliviate.modeling.tiny import tiny_llama, train_tokenizer

        if cfg.model.tokenizer:  # share a tokenizer, e.g. the target model's (checked in the pre-flight)
            tok = load_tokenizer(cfg.model.tokenizer)
        else:
            texts = rows if cfg.data.format == "text" else [t for r in rows for t in (r.question, r.answer)]
            tok = train_tokenizer(texts, vocab_size=cfg.tiny.vocab_size)
        model = tiny_llama(tok, hidden_size=cfg.tiny.hidden_size, num_layers=cfg.tiny.layers,
                           num_heads=cfg.tiny.heads, seed=cfg.tiny.seed)
    else:
        model, tok = _load(cfg.model)
    res = finetune(model, tok, rows, cfg.train, max_length=cfg.data.max_length)
    if not _main_process():
        return {}
    with atomic_dir(cfg.output_dir, cfg.overwrite, inputs) as out:
        save_model(out, _saveable(model, cfg.model), tok)
        _write_run(out, cfg, {"history": res.history, "train_seconds": res.seconds, "n_rows": len(rows)}, "finetune")
    print(f"trained on {len(rows)} rows in {res.seconds:.0f} s; final nll {res.history[-1]['nll']:.4f}; saved to {cfg.output_dir}")
    return {"history": res.history}


def run_eval(cfg: EvalRunConfig) -> dict[str, Any]:
    """Evaluate a saved model on one benchmark and write metrics.json + report.md."""
    from obliviate.eval.runner import evaluate_mcq_run, evaluate_muse_run, evaluate_rwku_run
    from obliviate.modeling.load import atomic_dir

    inputs = eval_inputs(cfg)
    splits, _ = preflight_eval(cfg)
    source = cfg.eval.source or ""
    model, tok = _load(cfg.model)
    label = Path(cfg.model.path).name or cfg.model.path
    if cfg.benchmark == "tofu":
        metrics = _evaluate(model, tok, source, cfg.eval, cfg.max_length, splits)
    else:
        run = {"muse": evaluate_muse_run, "mcq": evaluate_mcq_run, "rwku": evaluate_rwku_run}[cfg.benchmark]
        metrics = {"eval": run(model, tok, getattr(cfg, cfg.benchmark))}
    metrics["benchmark"] = cfg.benchmark
    with atomic_dir(cfg.output_dir, cfg.overwrite, inputs) as out:
        _write_run(out, cfg, metrics, label if cfg.benchmark == "tofu" else f"{cfg.benchmark}: {label}")
    return metrics


def _preset_line(path: Path) -> str:
    """A preset's relative path and the first line of its header comment."""
    first = path.read_text(encoding="utf-8").splitlines()[0] if path.stat().st_size else ""
    return f"  {path.relative_to(path.parents[1] if path.parent.name != 'configs' else path.parent)!s:<28} {first.lstrip('# ')}"


def list_components() -> str:
    """One line per forget objective, retain term, gradient rule and preset recipe (no torch import)."""
    from obliviate.catalogue import builtin

    lines = []
    for kind, title in (("forget", "forget objectives (method.forget):"), ("retain", "retain terms (method.retain):"),
                        ("rule", "gradient rules (method.combine.rule):")):
        lines += [title] + [f"  {n:<12} {summary}" for n, summary in builtin(kind).items()]
    configs = Path(__file__).resolve().parents[2] / "configs"
    presets = sorted(configs.glob("*.yaml")) + sorted(configs.glob("*/*.yaml"))
    if presets:
        lines += [f"presets ({configs}):"] + [_preset_line(p) for p in presets]
    return "\n".join(lines)


def run_calibrate(cfg: CalibrateConfig) -> dict[str, Any]:
    """Sweep τ and layer sets with the smoothed teacher alone; print and optionally save the table."""
    from obliviate.eval.analysis import calibrate, default_layer_sets
    from obliviate.modeling.load import atomic_dir
    from obliviate.jsonio import write_json
    from obliviate.report.markdown import calibration_table

    rows = preflight_calibrate(cfg)
    model, tok = _load(cfg.model)
    n_layers = _model_layers(model) or model.config.num_hidden_layers
    check_layer_sets(cfg.layer_sets, n_layers)
    layer_sets = cfg.layer_sets if cfg.layer_sets is not None else default_layer_sets(n_layers)
    res = calibrate(model, tok, rows, [float(t) for t in cfg.taus], layer_sets, functional_budget=cfg.functional_budget,
                    min_factual=cfg.min_factual, max_length=cfg.max_length)
    text = calibration_table(res)
    print(text)
    if cfg.output_dir:
        with atomic_dir(cfg.output_dir, cfg.overwrite, {"model.path": cfg.model.path, "source": cfg.source}) as out:
            write_json(out / "calibration.json", {"config": to_dict(cfg), **res})
            (out / "calibration.md").write_text(text + "\n", encoding="utf-8")
    return res


def run_report(run_dir: str, out: str | None = None) -> Path:
    """Write report.html (tables, plots, sample answers, every metric) for a demo or run directory."""
    from obliviate.report.html import load_results, write_html

    path = Path(out) if out else Path(run_dir) / "report.html"
    label = None
    cfg_file = Path(run_dir) / "obliviate.yaml"
    if cfg_file.is_file():
        method = (yaml.safe_load(cfg_file.read_text(encoding="utf-8")) or {}).get("method") or {}
        rule = (method.get("combine") or {}).get("rule", "sum")
        label = method_label(method.get("forget"), method.get("retain"), rule) if method.get("forget") else None
    results = load_results(run_dir, label=label)
    tmp = path.with_name(path.name + ".tmp")
    write_html(tmp, results)
    tmp.replace(path)
    print(f"wrote {path}")
    return path


def validation_lines(cfg: Any) -> list[str]:
    """The pre-flight of the command that `cfg` configures (unlearn, finetune, eval, calibrate, either demo),
    without its output-directory checks: what that command would reject before any weights load."""
    from obliviate.demo import DemoConfig, preflight_demo
    from obliviate.knowledge_demo import KnowledgeDemoConfig, preflight_knowledge

    if isinstance(cfg, RunConfig):
        return preflight_unlearn(cfg, need_output=False).lines
    if isinstance(cfg, FinetuneConfig):
        return preflight_finetune(cfg, need_output=False)[1]
    if isinstance(cfg, EvalRunConfig):
        return preflight_eval(cfg, need_output=False)[1]
    if isinstance(cfg, CalibrateConfig):
        rows = preflight_calibrate(cfg, need_output=False)
        return [f"data: {len(rows)} rows of {cfg.split}", "model: " + check_model_source(cfg.model.path, "model.path")]
    if isinstance(cfg, DemoConfig):
        return preflight_demo(cfg, need_output=False)
    if isinstance(cfg, KnowledgeDemoConfig):
        return preflight_knowledge(cfg, need_output=False)[1]
    from obliviate.sweep.config import SweepConfig

    if isinstance(cfg, SweepConfig):
        from obliviate.sweep.run import plan_sweep

        return plan_sweep(cfg).lines
    raise TypeError(f"no pre-flight for {type(cfg).__name__}")


def run_validate(cfg: Any) -> dict[str, Any]:
    """Check a recipe without training: the pre-flight of the command it configures, then a summary."""
    lines = validation_lines(cfg)
    print(f"valid ({COMMAND_OF.get(type(cfg).__name__, 'unlearn')} config):\n  " + "\n  ".join(lines))
    return {"lines": lines}


COMMAND_OF = {"RunConfig": "unlearn", "FinetuneConfig": "finetune", "EvalRunConfig": "eval",
              "CalibrateConfig": "calibrate", "DemoConfig": "demo", "KnowledgeDemoConfig": "demo (knowledge)",
              "SweepConfig": "sweep"}


KEY_HELP = {
    "tau": "attention temperature of the teacher (> 1 smooths; <= 1 needs method.allow_unusual_tau=true)",
    "layers": "layers whose attention is smoothed (null: all; negative indices count from the last layer)",
    "reduction": "token: mean over all tokens of the batch | example: mean per example, then over examples",
    "beta": "inverse temperature of the loss",
    "delta": "reward margin",
    "layer": "decoder layer whose output is steered (0-based)",
    "steering_coef": "norm c of the steering vector c·u",
    "seed": "seed of the random steering direction",
    "trainable_params": "wmdp (mlp.down_proj of the trainable layers) | layers | list of parameter-name regexes",
    "trainable_layers": "layers trained (null: layer-2..layer)",
}


def objective_keys() -> list[tuple[str, Any, str]]:
    """(key, default, help) of every registered forget objective's and retain term's own hyper-parameters."""
    from obliviate.objectives import FORGET, RETAIN

    rows = []
    for section, reg, what in (("method.forget_args", FORGET, "method.forget"), ("method.retain_args", RETAIN,
                                                                                 "method.retain")):
        for name in reg.names():
            spec = reg.get(name)
            for key, default in spec.defaults().items():
                allowed = spec.allowed().get(key)
                text = KEY_HELP.get(key, "hyper-parameter of the loss") + (f" ({' | '.join(map(str, allowed))})"
                                                                           if allowed else "")
                rows.append((f"{section}.{key}", default, f"[{what}={name}] {text}"))
    return rows
