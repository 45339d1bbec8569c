"""`obliviate report`: write report.html (tables, plots, answers) for a demo or run directory."""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from obliviate.config import method_label

HELP = "write report.html (tables, plots, answers) for a demo or run directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="an obliviate-demo/ or unlearn/eval/finetune output directory")
    p.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html)")


def run(args: argparse.Namespace) -> int:
    run_report(args.run_dir, args.out)
    return 0


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
