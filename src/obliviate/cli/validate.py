"""`obliviate validate`: check any command's config with that command's own pre-flight, without training."""
from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any

from obliviate import hub
from obliviate.cli import configured
from obliviate.config import CalibrateConfig, EvalRunConfig, FinetuneConfig, RunConfig
from obliviate.modeling.sources import check_model_source
from obliviate.preflight import (
    preflight_calibrate,
    preflight_eval,
    preflight_finetune,
    preflight_unlearn,
    without_device_checks,
)
from obliviate.setups.world import DemoConfig, preflight_demo
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.run import plan_sweep

HELP = ("check any command's config (unlearn, demo, finetune, eval, calibrate, sweep: keys, method, data, model "
        "files) with that command's own pre-flight, without training")


def add_arguments(p: argparse.ArgumentParser) -> None:
    configured.add_config_arguments(p)
    p.add_argument("--as", dest="as_command", choices=configured.VALIDATE_AS,
                   help="the command the config is for (default: told by its keys; `kind: knowledge` is "
                        "the real-model demo)")
    p.add_argument("--offline", action="store_true",
                   help="no hub access: hub models, tokenizers and data sets are named, not fetched, and every check "
                        "that needs them is listed as skipped; everything else is checked")
    p.add_argument("--no-device-checks", action="store_true",
                   help="for a config meant for another machine: what needs this machine's accelerator (bitsandbytes' "
                        "optimizers and 4-bit weights on a CUDA GPU) is listed as skipped, not refused")


def run(args: argparse.Namespace) -> int:
    with hub.skipping_hub() if getattr(args, "offline", False) else nullcontext(), \
            without_device_checks() if getattr(args, "no_device_checks", False) else nullcontext():
        return configured.run_with(run_validate, args, quiet=False)  # loads no weights: transformers stays unloaded


def validation_lines(cfg: Any) -> list[str]:
    """The pre-flight of the command that `cfg` configures (unlearn, finetune, eval, calibrate, either demo),
    without its output-directory checks: what that command would reject before any weights load."""
    from obliviate.setups.knowledge import KnowledgeDemoConfig, preflight_knowledge

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

    if isinstance(cfg, SweepConfig):
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
