"""What the run commands (unlearn, finetune, eval, calibrate) share: the main process, writing a run directory,
the trackers, the TOFU evaluation after a run, the evaluation during training, a loaded model's layer count."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from obliviate.config import RunConfig, to_dict
from obliviate.eval.metrics import metrics_markdown
from obliviate.eval.score import parse_expr
from obliviate.files import write_json
from obliviate.modeling.sources import layer_count
from obliviate.train.tracking import staging_dir, trackers


def main_process() -> bool:
    """True on the process that evaluates and writes (rank 0; always true without data parallelism)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def write_run(out: Path, cfg: Any, metrics: dict[str, Any], label: str) -> None:
    """obliviate.yaml, metrics.json and report.md (plus continual.md) of a run into `out`."""
    from obliviate.report.markdown import console_table, write_report

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


def tracking(cfg: Any, label: str) -> Any:
    """The trackers of a run command (train.report_to; None without), named after output_dir (else `label`), with
    the whole resolved config; without train.tracking_dir they write beside output_dir, see `keep_logs`."""

    return trackers(cfg.train, name=Path(cfg.output_dir).name or label, directory=staging_dir(cfg.output_dir),
                config=cfg, staged=True)


def keep_logs(out: Path, track: Any) -> None:
    """Move the trackers' staging directory (train.tracking_dir null) into the run's output as logs/."""
    if track is not None and track.staged and Path(track.directory).is_dir():
        Path(track.directory).rename(out / "logs")


def monitor(model: Any, tok: Any, source: str, cfg: RunConfig) -> Any:
    """The evaluation during training of `obliviate unlearn` (eval.every_steps), or None."""
    ev = cfg.eval
    if ev.every_steps is None:
        return None
    from obliviate.eval.runner import load_eval_splits, quick_tofu
    from obliviate.train.monitor import Monitor

    splits = load_eval_splits(ev.source or source, ev)
    score = parse_expr(ev.keep_best) if ev.keep_best else None
    return Monitor(ev.every_steps, lambda m: quick_tofu(m, tok, splits, ev.during_rows, ev, cfg.data.max_length),
                   score=score, maximize=ev.keep_best_direction == "maximize", keep_best=score is not None)


def model_layers(model: Any) -> int | None:
    """Decoder layers of a loaded model (None when its config does not say)."""
    config = getattr(model, "config", None)
    return layer_count(config.to_dict()) if hasattr(config, "to_dict") else None
