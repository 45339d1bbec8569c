"""`obliviate unlearn`: pre-flight, load θ0, unlearn the forget split (once, or as continual requests), evaluate,
save the model with its config, metrics, receipt and model card; optionally audit it and push it to the Hub."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from obliviate.audit.run import audit_run_output
from obliviate.cli import configured, runs
from obliviate.config import RunConfig
from obliviate.errors import ObliviateError
from obliviate.preflight import check_method_layers, input_paths, preflight_unlearn
from obliviate.publish import push
from obliviate.receipt import attach_audit, model_hashes, write_receipt
from obliviate.train.student import load_model, saveable

HELP = "unlearn a forget split from a model, then evaluate it"


add_arguments = configured.add_config_arguments


def run(args: argparse.Namespace) -> int:
    return configured.run_with(run_unlearn, args)


def run_unlearn(cfg: RunConfig) -> dict[str, Any]:
    """Pre-flight (as `validate`), load θ0, unlearn the forget split, evaluate, save model + config + metrics +
    receipt.json + README.md model card atomically."""
    from obliviate.modeling.load import atomic_dir, save_model
    from obliviate.train.unlearn import unlearn

    plan = preflight_unlearn(cfg)  # hub.push: the token and the hub are checked there, before any training
    forget, retain, source = plan.forget, plan.retain, cfg.data.source
    model, tok = load_model(cfg.model)

    theta0 = model_hashes(model)  # before training: `unlearn` trains the model in place
    n_layers = runs.model_layers(model)
    if plan.n_layers is None and n_layers is not None:  # no config.json to read before (e.g. a hub id not cached)
        check_method_layers(cfg.method, plan.method, n_layers)
    track = runs.tracking(cfg, cfg.method.label)  # train.report_to: None without trackers
    if cfg.continual.enabled:
        metrics = _continual(model, tok, forget, retain, cfg, track)
        if not runs.main_process():
            return {}
    else:
        monitor = runs.monitor(model, tok, source, cfg)
        res = unlearn(model, tok, forget, retain, cfg.method, cfg.train, max_length=cfg.data.max_length,
                      monitor=monitor, tracking=track, windows=cfg.data.windows)
        if not runs.main_process():  # data-parallel runs: rank 0 evaluates and saves, the others are done
            return {}
        metrics = {"history": res.history, "train_seconds": res.seconds}
        if monitor is not None and cfg.eval.keep_best:
            metrics["best_step"] = monitor.restore_best(model)
            metrics["best_score"] = monitor.best_score
            print(f"kept the weights of step {metrics['best_step']} ({cfg.eval.keep_best} = {monitor.best_score:.4f})")
        if res.module_stats:
            metrics["module_stats"] = res.module_stats
    if cfg.eval.enabled and cfg.data.format == "qa":
        from obliviate.eval.runner import evaluate_tofu_run

        metrics.update(evaluate_tofu_run(model, tok, source, cfg.eval, cfg.data.max_length, fields=cfg.data.fields))
    elif cfg.eval.enabled and cfg.muse.source:
        from obliviate.eval.runner import evaluate_muse_run

        metrics["eval"] = evaluate_muse_run(model, tok, cfg.muse)
    with atomic_dir(cfg.output_dir, cfg.overwrite, input_paths(cfg)) as out:
        save_model(out, saveable(model, cfg.model), tok)
        runs.write_run(out, cfg, metrics, cfg.method.label)
        runs.keep_logs(out, track)
        write_receipt(out, cfg, tok, forget, retain, theta0, metrics)  # + README.md model card
    print(f"saved to {cfg.output_dir} (verify with: obliviate verify {Path(cfg.output_dir) / 'receipt.json'} "
          f"{cfg.output_dir})")
    if cfg.audit.enabled:
        metrics["audit"] = _audit_run(cfg)
    if cfg.hub.push:  # after the audit, so that the receipt pushed carries its verdict
        _push_run(cfg)
    return metrics


def _push_run(cfg: RunConfig) -> None:
    """hub.push: upload the saved output as `obliviate push` does; a failure says the run itself is saved."""

    h = cfg.hub
    try:
        url = push(cfg.output_dir, h.repo_id or "", private=h.private, revision=h.revision)
    except ObliviateError as exc:
        raise ObliviateError(f"{exc}. The run itself succeeded and is saved in {cfg.output_dir}; push it later with "
                             f"`obliviate push {cfg.output_dir} --repo-id {h.repo_id}`") from None
    print(f"pushed {cfg.output_dir} to {h.repo_id}: {url}")


def _audit_run(cfg: RunConfig) -> dict[str, Any]:
    """The run's own audit (audit.enabled): attacks on the saved model, the verdict added to its receipt.json."""

    res = audit_run_output(cfg.audit, cfg.output_dir, cfg.model.path, cfg.eval.source or cfg.data.source,
                           cfg.data.forget_split)
    summary = {"k_metric": res.k_metric, "ref0": res.ref0, "verdict": res.verdict,
               "report": str(Path(cfg.audit.output or Path(cfg.output_dir) / "audit") / "audit.json")}
    attach_audit(Path(cfg.output_dir) / "receipt.json", summary)
    return summary


def _continual(model: Any, tok: Any, forget: list, retain: list, cfg: RunConfig, track: Any = None) -> dict[str, Any]:
    """Unlearn the forget split as a sequence of requests, each from the previous result (docs/METHODS.md §1.5)."""
    import dataclasses

    from obliviate.continual import continual_table, run_continual, split_requests

    reqs = split_requests(forget, cfg.continual.requests, authors_per_request=cfg.continual.authors_per_request)
    from obliviate.train.loop import make_accelerator

    # the accelerator decides the launch (torchrun on CPU: gloo); a bare PartialState here would not
    main = make_accelerator(cfg.train).is_main_process
    res = run_continual(model, tok, reqs, retain, cfg.method, cfg.train, max_length=cfg.data.max_length,
                        config=cfg.continual, eval_fn=None if main else (lambda m, i, seen: {}),
                        log=print if main else (lambda s: None), tracking=track)
    table = continual_table(res)
    if main:
        print(table)
    return {"history": [h for hs in res.histories for h in hs], "train_seconds": res.total_seconds,
            "continual": dataclasses.asdict(res), "continual_table": table}
