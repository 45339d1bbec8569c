"""`obliviate finetune`: train a model (or a freshly built tiny one) on QA data, e.g. the target or the retain model."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from obliviate.cli import configured, runs
from obliviate.config import FinetuneConfig
from obliviate.data.rows import load_split
from obliviate.errors import ConfigError
from obliviate.files import FINGERPRINT
from obliviate.preflight import finetune_inputs, preflight_finetune
from obliviate.train.student import load_model, saveable, with_chat

HELP = "train a model on QA data (e.g. the target or the retain model)"


add_arguments = configured.add_config_arguments


def run(args: argparse.Namespace) -> int:
    return configured.run_with(run_finetune, args)


def run_finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune a model (or a freshly built tiny one) on QA splits and save it with its tokenizer."""
    from obliviate.modeling.load import atomic_dir, load_tokenizer, save_model
    from obliviate.train.loop import launched_processes
    from obliviate.train.unlearn import as_rows, finetune, finetune_fingerprint

    inputs = finetune_inputs(cfg)
    rows, _ = preflight_finetune(cfg)
    if cfg.model.path == "tiny":
        from obliviate.modeling.tiny import tiny_llama, train_tokenizer

        if cfg.model.tokenizer:  # share a tokenizer, e.g. the target model's (checked in the pre-flight)
            tok = with_chat(load_tokenizer(cfg.model.tokenizer), cfg.model)
        else:
            texts = rows if cfg.data.format == "text" else [t for r in rows for t in (r.question, r.answer)]
            tok = train_tokenizer(texts, vocab_size=cfg.tiny.vocab_size)
        model = tiny_llama(tok, hidden_size=cfg.tiny.hidden_size, num_layers=cfg.tiny.layers,
                           num_heads=cfg.tiny.heads, seed=cfg.tiny.seed)
    else:
        model, tok = load_model(cfg.model)
    fp = finetune_fingerprint(model, tok, as_rows(rows), cfg.train, max_length=cfg.data.max_length,
                              processes=launched_processes())
    done = reused(cfg, fp)
    if done is not None:
        return done
    track = runs.tracking(cfg, "finetune")  # train.report_to: None without trackers
    check, epoch_steps = knows_monitor(cfg, tok, len(rows), launched_processes())
    res = finetune(model, tok, rows, cfg.train, max_length=cfg.data.max_length, tracking=track, monitor=check)
    if not runs.main_process():
        return {}
    metrics: dict[str, Any] = {"history": res.history, "train_seconds": res.seconds, "n_rows": len(rows)}
    if check is not None:
        from obliviate.eval.known import known_line, known_summary

        metrics["knows"] = known_summary(res.history, str(cfg.knows.split), cfg.knows.bar, epoch_steps)
    with atomic_dir(cfg.output_dir, cfg.overwrite, inputs) as out:
        save_model(out, saveable(model, cfg.model), tok)
        runs.write_run(out, cfg, metrics, "finetune")
        (out / FINGERPRINT).write_text(json.dumps(fp, indent=1) + "\n", encoding="utf-8")
        runs.keep_logs(out, track)
    print(f"trained on {len(rows)} rows in {res.seconds:.0f} s; final nll {res.history[-1]['nll']:.4f}; saved to {cfg.output_dir}")
    if check is not None:
        print(known_line(metrics["knows"]))
    return {"history": res.history}


def reused(cfg: FinetuneConfig, fp: dict[str, Any]) -> dict[str, Any] | None:
    """A finished fine-tune in output_dir made with the same fingerprint (settings, starting weights, data): its
    history, kept as it is (printed so); None when there is none or overwrite=true; another fingerprint is refused."""
    from obliviate.train.fingerprint import differences

    out = Path(cfg.output_dir)
    if cfg.overwrite or not (out / FINGERPRINT).is_file():
        return None
    diffs = differences(json.loads((out / FINGERPRINT).read_text(encoding="utf-8")), fp)
    if diffs:
        raise ConfigError(f"output directory {out} holds another fine-tune ({len(diffs)} difference(s): "
                          f"{'; '.join(diffs[:4])}); choose another output_dir or pass overwrite=true to replace it")
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    if runs.main_process():
        print(f"{out} already holds this fine-tune (the same settings, starting weights and data): reusing it; "
              "overwrite=true trains it again")
        if "knows" in metrics:
            from obliviate.eval.known import known_line

            print(known_line(metrics["knows"]))
        elif cfg.knows.split is not None:
            print(f"it was trained without a knows check, so knows.split={cfg.knows.split} was not run: "
                  "overwrite=true trains it again with the check")
    return {"history": metrics.get("history", []), "reused": True}


def knows_monitor(cfg: FinetuneConfig, tok: Any, n_rows: int, processes: int = 1) -> tuple[Any, float]:
    """The check of knows.split after every epoch (or knows.every_steps steps), and the steps of one pass over the
    rows, n / (B · processes · accum); (None, 0.0) without knows.split."""
    k = cfg.knows
    if k.split is None:
        return None, 0.0
    from obliviate.eval.known import recall_check, steps_per_epoch
    from obliviate.train.monitor import Monitor

    rows = load_split(cfg.data.source, k.split, cfg.data.fields or None)[:k.max_examples]
    rows_per_step = cfg.train.batch_size * processes * cfg.train.grad_accum
    check = Monitor(k.every_steps or steps_per_epoch(n_rows, rows_per_step),
                    lambda m: recall_check(m, tok, rows, max_new_tokens=k.max_new_tokens, batch_size=k.batch_size))
    return check, n_rows / rows_per_step
