"""Command line: obliviate demo | finetune | unlearn | eval | calibrate | validate | report | verify | ls.

User errors (bad data, config, paths) print one clear message and exit with status 2; no partial
output directory is left behind (runs write into a temporary directory that is renamed at the end).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from obliviate.errors import ObliviateError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="obliviate", description="Make a causal LM forget chosen data, and prove it.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("demo", "offline demo: synthetic world -> target/retain models -> ASU_KL vs GradDiff -> report"),
                        ("finetune", "train a model on QA data (e.g. the target or the retain model)"),
                        ("unlearn", "unlearn a forget split from a model, then evaluate it"),
                        ("eval", "evaluate a model on TOFU, MUSE, WMDP/MMLU (multiple choice) or RWKU"),
                        ("calibrate", "sweep attention temperature and layers with the smoothed teacher alone; recommend ASU's tau"),
                        ("sweep", "search each method's hyper-parameters (Optuna; one study per method, resumable, "
                                  "workers share a storage) and write the forget-utility comparison"),
                        ("validate", "check any command's config (unlearn, demo, finetune, eval, calibrate, sweep: keys, "
                                     "method, data, model files) with that command's own pre-flight, without training")):
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--config", help="YAML recipe (see configs/); optional for demo")
        sp.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.lr=1e-5")
        sp.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
        sp.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")
        if name == "validate":
            sp.add_argument("--as", dest="as_command", choices=VALIDATE_AS,
                            help="the command the config is for (default: told by its keys; `kind: knowledge` is "
                                 "the real-model demo)")
        if name == "sweep":
            sp.add_argument("--storage", help="Optuna storage shared by workers: a database URL (sqlite:///f.db, "
                                              "postgresql://user@host/db) or a journal file (journal:PATH); "
                                              "default: sqlite in output_dir (= storage)")
            sp.add_argument("--max-trials", type=int, help="stop this worker after N trials (the rest: other "
                                                           "workers, or the same command again)")
        if name == "eval":
            sp.add_argument("--benchmark", choices=("tofu", "muse", "mcq", "rwku"), help="what to evaluate on")
            sp.add_argument("--model", help="model directory or hub id (= model.path)")
            sp.add_argument("--data", help="data directory / file / hub id of the benchmark")
            sp.add_argument("--split", help="TOFU: forget split, e.g. forget01 (its _perturbed file and holdout01 "
                                            "are used); MCQ: hub config, e.g. wmdp-bio")
            sp.add_argument("--out", help="output directory (= output_dir)")
    sub.add_parser("ls", help="list forget objectives, retain terms, gradient rules and presets")
    cp = sub.add_parser("compare", help="one report over sweeps, demo and run directories: each method's "
                                        "forget-utility front and its best trial at matched utility")
    cp.add_argument("dirs", nargs="+", help="sweep directories (obliviate sweep), demo or unlearn output directories")
    cp.add_argument("--out", help="where report.md/html, frontier.png and compare.json go (default: the first "
                                  "directory when it is a sweep, else obliviate-compare)")
    rp = sub.add_parser("report", help="write report.html (tables, plots, answers) for a demo or run directory")
    rp.add_argument("run_dir", help="an obliviate-demo/ or unlearn/eval/finetune output directory")
    rp.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html)")
    from obliviate.audit.cli import add_audit_parser  # torch-free

    add_audit_parser(sub)
    vp = sub.add_parser("verify", help="recompute an unlearned model's hashes and compare them with its receipt.json",
                        description="Recompute the weight (and, with --data, the forget/retain row) hashes of a model "
                                    "directory and compare them with a receipt; exit 0 when all match, 1 when "
                                    "something differs, 2 on bad input.")
    vp.add_argument("receipt", help="receipt.json written by `obliviate unlearn`")
    vp.add_argument("model_dir", help="the model directory to check (its *.safetensors files)")
    vp.add_argument("--data", help="data directory / hub id: re-encode the receipt's forget and retain splits too")
    return p


def _config_class(command: str, config_file: str | None = None) -> type:
    """The config dataclass of a command; for `demo`, the YAML's `kind: knowledge` picks the real-model demo.

    Only the demos' modules import torch, and only for `demo`: every other command reads its config (and
    reports a missing file or an unknown key) without loading torch."""
    from obliviate import config

    if command == "demo":
        kind = config.read_yaml(config_file).get("kind") if config_file else None
        if kind == "knowledge":
            from obliviate.knowledge_demo import KnowledgeDemoConfig

            return KnowledgeDemoConfig
        from obliviate.demo import DemoConfig

        return DemoConfig
    if command == "sweep":
        from obliviate.sweep.config import SweepConfig

        return SweepConfig
    return {"finetune": config.FinetuneConfig, "unlearn": config.RunConfig, "eval": config.EvalRunConfig,
            "calibrate": config.CalibrateConfig, "validate": config.RunConfig}[command]


VALIDATE_AS = ("unlearn", "demo", "finetune", "eval", "calibrate", "sweep")  # in this order when a config's keys fit several


def _validate_class(config_file: str | None, overrides: Sequence[str], as_command: str | None) -> type:
    """The config class `obliviate validate` checks a file against: `--as COMMAND`, else the command whose config
    has every top-level key of the file and the overrides (a file that fits none gets the closest one, whose
    error then names the unknown keys)."""
    import dataclasses

    from obliviate import config

    if as_command:
        return _config_class(as_command, config_file)
    data = config.read_yaml(config_file) if config_file else {}
    if "kind" in data:  # only the demos have a kind
        return _config_class("demo", config_file)
    keys = set(data) | {o.split("=", 1)[0].split(".")[0] for o in overrides if "=" in o}

    def unknown(command: str) -> int:
        return len(keys - {f.name for f in dataclasses.fields(_config_class(command, config_file))})

    return _config_class(min(VALIDATE_AS, key=lambda c: (unknown(c), VALIDATE_AS.index(c))), config_file)


def command_class(args: argparse.Namespace) -> type:
    """The config class the parsed command line resolves to (`validate` finds it from the file)."""
    if args.command == "validate":
        return _validate_class(args.config, list(args.overrides), args.as_command)
    return _config_class(args.command, args.config)


def _eval_shortcuts(args: argparse.Namespace) -> list[str]:
    """`obliviate eval --benchmark tofu --data D --split forget01 --model M --out O` as key=value overrides."""
    import re
    from pathlib import Path

    out, bench = [], args.benchmark or "tofu"
    if args.benchmark:
        out.append(f"benchmark={bench}")
    if args.model:
        out.append(f"model.path={args.model}")
    if args.out:
        out.append(f"output_dir={args.out}")
    if args.data:
        out.append(f"{'eval' if bench == 'tofu' else bench}.source={args.data}")
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


def _quiet_libraries() -> None:
    """Hide transformers' per-file progress bars and info logs: our own progress bar says what runs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _run(args: argparse.Namespace) -> int:
    import yaml

    from obliviate.config import load_config, to_dict

    if args.command == "ls":
        from obliviate.commands import list_components

        print(list_components())
        return 0
    if args.command == "audit":
        from obliviate.audit.cli import run_audit_command

        return run_audit_command(args)
    if args.command == "compare":
        from pathlib import Path

        from obliviate.sweep.compare import write_compare

        out = args.out or (args.dirs[0] if (Path(args.dirs[0]) / "sweep.yaml").is_file() else "obliviate-compare")
        print(f"wrote {write_compare(args.dirs, Path(out), log=lambda s: None)}")
        return 0
    if args.command == "report":
        from obliviate.commands import run_report

        run_report(args.run_dir, args.out)
        return 0
    if args.command == "verify":
        from obliviate.receipt import format_result, verify

        res = verify(args.receipt, args.model_dir, args.data)
        print(format_result(res))
        return 0 if res.ok else 1
    if args.help_config:
        from obliviate.config import RunConfig, describe

        cls = command_class(args)
        rows = describe(cls)
        if cls is RunConfig:  # each objective's own keys, under method.forget_args / method.retain_args
            from obliviate.commands import objective_keys

            rows += objective_keys()
        for key, default, text in rows:
            print(f"{key:<36} {default!r:<24} {text}")
        return 0
    overrides = (_eval_shortcuts(args) if args.command == "eval" else []) + list(args.overrides)
    cfg = load_config(command_class(args), args.config, overrides)
    if args.show_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    if args.command == "demo" and getattr(cfg, "cpu_kernels", None) == "avx2":  # before torch loads
        from obliviate.demo import pin_cpu_kernels

        pin_cpu_kernels()
    if args.command != "validate":  # validate loads no weights: it need not import transformers at all
        _quiet_libraries()
    if args.command == "demo" and getattr(cfg, "kind", None) == "knowledge":
        from obliviate.knowledge_demo import run_knowledge_demo

        run_knowledge_demo(cfg)
    elif args.command == "demo":
        from obliviate.demo import run_demo

        run_demo(cfg)
    elif args.command == "sweep":
        from obliviate.sweep.run import run_sweep

        if args.max_trials is not None and args.max_trials < 1:
            raise ObliviateError(f"--max-trials must be >= 1, got {args.max_trials}")
        run_sweep(cfg, storage=args.storage, max_trials=args.max_trials)
    else:
        from obliviate import commands

        getattr(commands, f"run_{args.command}")(cfg)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `obliviate` console script; under torchrun every rank leaves through
    `train.loop.end_process`, which never returns (see there why)."""
    rc = _main(_parser().parse_args(argv))
    if "torch.distributed" in sys.modules:  # never imports torch for a light command
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from obliviate.train.loop import end_process

            end_process(rc)
    return rc


def _main(args: argparse.Namespace) -> int:
    """Run the parsed command; user errors become one line on stderr and exit status 2, Ctrl-C 130."""
    try:
        return _run(args)
    except ObliviateError as exc:
        print(f"obliviate: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, always
        return 2
    except KeyboardInterrupt as exc:
        print(f"obliviate: interrupted; {exc or 'nothing was written'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `obliviate ls | head`: the reader left; say nothing more, like other CLI tools
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
