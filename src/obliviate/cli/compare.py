"""`obliviate compare`: one report over sweeps, demo and run directories: each method's forget-utility front and
its best trial at matched utility."""
from __future__ import annotations

import argparse
from pathlib import Path

from obliviate.errors import ObliviateError

HELP = ("one report over sweeps, demo and run directories: each method's forget-utility front and its best trial at "
        "matched utility")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="sweep directories (obliviate sweep), demo or unlearn output directories")
    p.add_argument("--out", help="where report.md/html, frontier.png and compare.json go (default: the first "
                                 "directory when it is a sweep, else obliviate-compare)")
    p.add_argument("--level", type=float, default=0.95,
                   help="confidence of the intervals (bootstrap over rows and seeds), strictly between 0 and 1")
    p.add_argument("--best-configs", metavar="DIR",
                   help="also write each method's best trial of the (first) sweep as DIR/<method>.yaml, a config that "
                        "`obliviate unlearn` (or `obliviate demo`) runs alone, e.g. to keep its weights and audit them")
    p.add_argument("--transfer", metavar="FILE.yaml",
                   help="also write a sweep file that runs each method of the (first) sweep at the point it selected "
                        "(its best, else its nearest miss) with the same bar and repeats: change its `set` to see "
                        "whether the selection holds on other rows (another family of facts, another forget split)")
    p.add_argument("--bar", metavar="YAML",
                   help="judge the bests by this matched-utility bar instead of the sweep's own (the report, "
                        "--best-configs and --transfer follow it): a YAML mapping {forget: EXPR, keep: {metric: share "
                        "of θ0's}, at_most: {metric: ceiling}}, e.g. '{keep: {retain_rougeL_recall: 0.9}}'")
    p.add_argument("--audits", metavar="DIR",
                   help="add each best's audit to the report: DIR/<method>/audit/audit.json, as `obliviate unlearn "
                        "--config BEST.yaml audit.enabled=true output_dir=DIR/<method>` writes it")


def _bar(text: str | None) -> dict | None:
    """--bar's YAML as a mapping (its keys and metrics are checked against the trials later); None without it."""
    if text is None:
        return None
    import yaml

    example = "e.g. --bar '{keep: {retain_rougeL_recall: 0.9}, at_most: {forget_degenerate_share: 0.1}}'"
    try:
        bar = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ObliviateError(f"--bar: {text!r} is not YAML ({getattr(exc, 'problem', exc)}); {example}") from None
    if not isinstance(bar, dict):
        raise ObliviateError(f"--bar: expected a mapping {{forget, keep, at_most}}, got {text!r}; {example}")
    return bar


def run(args: argparse.Namespace) -> int:
    from obliviate.sweep.compare import write_compare

    sweep = Path(args.dirs[0])
    for flag, given in (("--best-configs", args.best_configs), ("--transfer", args.transfer)):
        if given and not (sweep / "sweep.yaml").is_file():
            raise ObliviateError(f"{flag}: {sweep} is not a sweep directory (no sweep.yaml); put the sweep's "
                                 "output_dir first")
    if args.transfer:
        from obliviate.sweep.export import check_transfer_file

        check_transfer_file(Path(args.transfer))
    bar = _bar(args.bar)
    if bar is not None and not args.out and (sweep / "sweep.yaml").is_file():
        raise ObliviateError(f"--bar: give --out DIR too, so that the report in {sweep}, made with the sweep's own "
                             "bar, stays as it is")
    out = args.out or (args.dirs[0] if (sweep / "sweep.yaml").is_file() else "obliviate-compare")
    audits = Path(args.audits) if args.audits else None
    if audits is not None and not audits.is_dir():
        raise ObliviateError(f"--audits: {audits} is not a folder; it holds one <method>/ run folder per audited best")
    print(f"wrote {write_compare(args.dirs, Path(out), log=lambda s: None, level=args.level, audits=audits, bar=bar)}")
    if args.best_configs:
        from obliviate.sweep.export import write_best_configs

        written = write_best_configs(sweep, Path(args.best_configs), bar=bar)
        print(f"wrote {len(written)} best config{'s' if len(written) != 1 else ''} into {args.best_configs}")
    if args.transfer:
        from obliviate.sweep.export import write_transfer_config

        print(f"wrote {write_transfer_config(sweep, Path(args.transfer), bar=bar)}: run it with obliviate sweep --config "
              f"{args.transfer}")
    return 0
