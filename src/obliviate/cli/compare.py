"""`obliviate compare`: one report over sweeps, demo and run directories: each method's forget-utility front and
its best trial at matched utility."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("one report over sweeps, demo and run directories: each method's forget-utility front and its best trial at "
        "matched utility")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="sweep directories (obliviate sweep), demo or unlearn output directories")
    p.add_argument("--out", help="where report.md/html, frontier.png and compare.json go (default: the first "
                                 "directory when it is a sweep, else obliviate-compare)")
    p.add_argument("--level", type=float, default=0.95,
                   help="confidence of the intervals (bootstrap over rows and seeds), strictly between 0 and 1")


def run(args: argparse.Namespace) -> int:
    from obliviate.sweep.compare import write_compare

    out = args.out or (args.dirs[0] if (Path(args.dirs[0]) / "sweep.yaml").is_file() else "obliviate-compare")
    print(f"wrote {write_compare(args.dirs, Path(out), log=lambda s: None, level=args.level)}")
    return 0
