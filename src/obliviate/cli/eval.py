"""`obliviate eval`: evaluate a saved model on TOFU, MUSE, WMDP/MMLU (multiple choice) or RWKU."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from obliviate.cli import configured, runs
from obliviate.config import EvalRunConfig
from obliviate.errors import ObliviateError
from obliviate.eval.benchmarks import BENCHMARKS, resolve
from obliviate.preflight import eval_inputs, preflight_eval
from obliviate.train.student import load_model

HELP = "evaluate a model on TOFU, MUSE, WMDP/MMLU (multiple choice) or RWKU"


def add_arguments(p: argparse.ArgumentParser) -> None:
    configured.add_config_arguments(p)
    p.add_argument("--benchmark", metavar="NAME", help="what to evaluate on: tofu, muse, mcq, rwku or a plugin's "
                                                       "benchmark (eval/benchmarks.py)")
    p.add_argument("--model", help="model directory or hub id (= model.path)")
    p.add_argument("--data", help="data directory / file / hub id of the benchmark")
    p.add_argument("--split", help="TOFU: forget split, e.g. forget01 (its _perturbed file and holdout01 "
                                   "are used); MCQ: hub config, e.g. wmdp-bio")
    p.add_argument("--out", help="output directory (= output_dir)")


def run(args: argparse.Namespace) -> int:
    return configured.run_with(run_eval, args, eval_shortcuts(args))


def eval_shortcuts(args: argparse.Namespace) -> list[str]:
    """`obliviate eval --benchmark tofu --data D --split forget01 --model M --out O` as key=value overrides."""
    import re

    out, bench = [], args.benchmark or "tofu"
    if args.benchmark:
        out.append(f"benchmark={bench}")
    if args.model:
        out.append(f"model.path={args.model}")
    if args.out:
        out.append(f"output_dir={args.out}")
    if args.data:
        out.append(f"{BENCHMARKS.get(bench).section}.source={args.data}")
    if args.split and bench == "tofu":
        split = args.split.removesuffix("_perturbed")
        out.append(f"eval.forget_split={split}_perturbed")
        m = re.fullmatch(r"forget(\d+)", split)
        if m and (not args.data or not Path(args.data).is_dir() or any(Path(args.data).glob(f"holdout{m[1]}.json*"))):
            out.append(f"eval.holdout_split=holdout{m[1]}")
    elif args.split and bench == "mcq":
        out.append(f"mcq.config={args.split}")
    elif args.split:
        raise ObliviateError(f"--split applies to tofu and mcq, not {bench}; use {bench}.* keys instead")
    return out


def run_eval(cfg: EvalRunConfig) -> dict[str, Any]:
    """Evaluate a saved model on one benchmark (eval/benchmarks.py) and write metrics.json + report.md."""
    from obliviate.modeling.load import atomic_dir, to_eval_device

    spec = BENCHMARKS.get(cfg.benchmark)
    inputs = eval_inputs(cfg)
    state, _ = preflight_eval(cfg)
    model, tok = load_model(cfg.model)
    to_eval_device(model)  # scoring only: a visible GPU does it (OBLIVIATE_EVAL_DEVICE=cpu keeps the CPU)
    label = Path(cfg.model.path).name or cfg.model.path
    metrics = resolve(spec.run)(model, tok, cfg, state)
    metrics["benchmark"] = cfg.benchmark
    with atomic_dir(cfg.output_dir, cfg.overwrite, inputs) as out:
        runs.write_run(out, cfg, metrics, label if spec.section == "eval" else f"{cfg.benchmark}: {label}")
    return metrics
