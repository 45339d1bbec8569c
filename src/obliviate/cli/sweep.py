"""`obliviate sweep`: search each method's hyper-parameters (Optuna; one study per method, resumable, workers share
a storage) and write the forget-utility comparison."""
from __future__ import annotations

import argparse

from obliviate.cli import configured
from obliviate.errors import ObliviateError
from obliviate.sweep.run import run_sweep

HELP = ("search each method's hyper-parameters (Optuna; one study per method, resumable, workers share a storage) "
        "and write the forget-utility comparison")


def add_arguments(p: argparse.ArgumentParser) -> None:
    configured.add_config_arguments(p)
    p.add_argument("--storage", help="Optuna storage shared by workers: a database URL (sqlite:///f.db, "
                                     "postgresql://user@host/db) or a journal file (journal:PATH); "
                                     "default: sqlite in output_dir (= storage)")
    p.add_argument("--max-trials", type=int, help="stop this worker after N trials (the rest: other "
                                                  "workers, or the same command again)")
    p.add_argument("--start-before", type=float, metavar="SECONDS",
                   help="start no trial once SECONDS have passed since this worker began; the one it runs goes on to "
                        "its end (so that a deadline later than that cuts no trial)")


def run(args: argparse.Namespace) -> int:
    cfg = configured.resolve(args)
    if cfg is None:
        return 0
    configured.quiet_libraries()

    if args.max_trials is not None and args.max_trials < 1:
        raise ObliviateError(f"--max-trials must be >= 1, got {args.max_trials}")
    if args.start_before is not None and not args.start_before >= 0:
        raise ObliviateError(f"--start-before must be a number of seconds >= 0, got {args.start_before}")
    run_sweep(cfg, storage=args.storage, max_trials=args.max_trials, start_before_s=args.start_before)
    return 0
