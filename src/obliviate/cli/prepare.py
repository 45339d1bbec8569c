"""`obliviate prepare`: write a benchmark's training files in the layout the presets read (today: RWKU batches)."""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from obliviate.files import check_output_dir, current_umask

HELP = "write a benchmark's training files where the presets read them (rwku: SAGO's batch of the first N targets)"
DESCRIPTION = (HELP + ". `obliviate prepare rwku --targets 50` writes data/rwku/Batch/1-50/: passage.json (the "
               "original passages of RWKU's first 50 targets, the forget set), retain_passage.json (those of the last "
               "50), intro.json and the five probe levels of the first 50, as sustech-nlp/SAGO's setup_data.py does; "
               "configs/rwku/*.yaml train on it and `obliviate eval --benchmark rwku --data <that folder>` scores it.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("benchmark", choices=("rwku",), help="what to prepare")
    p.add_argument("--targets", type=int, default=50, help="the batch's size N: forget the first N targets, retain "
                                                           "the passages of the last N (default 50, SAGO's Batch50)")
    p.add_argument("--source", default="jinzhuoran/RWKU",
                   help="the hub id, or a local folder holding forget_target.json, train_original_passage.json and "
                        "the probe levels (<level>.json)")
    p.add_argument("--out", help="folder to write (default: data/rwku/Batch/1-N, where the presets look)")
    p.add_argument("--overwrite", action="store_true", help="replace --out when it already holds files")


def run(args: argparse.Namespace) -> int:
    from obliviate.eval.rwku import batch_files

    out = Path(args.out or f"data/rwku/Batch/1-{args.targets}")
    check_output_dir(out, args.overwrite, {"--source": args.source}, key="--out")
    files = batch_files(args.source, args.targets)  # everything is read and checked before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, records in files.items():
            (staging / name).write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        staging.chmod(0o777 & ~current_umask())
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for name, records in files.items():
        print(f"{out / name}: {len(records)} records")
    return 0
