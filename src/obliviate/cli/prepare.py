"""`obliviate prepare`: write a benchmark's training files in the layout the presets read (RWKU batches, TOFU cut
to its last N authors)."""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from obliviate.data.rows import builtin_dir
from obliviate.data.tofu_subset import describe, subset_splits
from obliviate.files import check_output_dir, current_umask

HELP = ("write a benchmark's training files where the presets read them (rwku: SAGO's batch of the first N targets; "
        "tofu: TOFU on its last N authors)")
DESCRIPTION = (HELP + ". `obliviate prepare rwku --targets 50` writes data/rwku/Batch/1-50/: passage.json (the "
               "original passages of RWKU's first 50 targets, the forget set), retain_passage.json (those of the last "
               "50), intro.json and the five probe levels of the first 50, as sustech-nlp/SAGO's setup_data.py does; "
               "configs/rwku/*.yaml train on it and `obliviate eval --benchmark rwku --data <that folder>` scores it. "
               "`obliviate prepare tofu --authors 20` writes data/tofu-20/: TOFU's splits for its last 20 authors "
               "(full, forget05/forget10 with their perturbed rows, retain95/retain90, retain_perturbed, holdout05/10, "
               "and the real-authors and world-facts splits), a world small enough for a small model to learn; "
               "configs/tofu/smollm2/ fine-tune and unlearn on it.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("benchmark", choices=("rwku", "tofu"), help="what to prepare")
    p.add_argument("--targets", type=int, default=50, help="the batch's size N: forget the first N targets, retain "
                                                           "the passages of the last N (default 50, SAGO's Batch50)")
    p.add_argument("--authors", type=int, default=20, help="tofu: keep TOFU's last N authors, 2 to 20 (default 20)")
    p.add_argument("--source", help="rwku: the hub id (default jinzhuoran/RWKU), or a local folder holding "
                                    "forget_target.json, train_original_passage.json and the probe levels "
                                    "(<level>.json); tofu: a folder of TOFU's splits (default: the shipped copy)")
    p.add_argument("--out", help="folder to write (default: data/rwku/Batch/1-N or data/tofu-N, where the presets "
                                 "look)")
    p.add_argument("--overwrite", action="store_true", help="replace --out when it already holds files")


def run(args: argparse.Namespace) -> int:
    if args.benchmark == "tofu":
        out = Path(args.out or f"data/tofu-{args.authors}")
        check_output_dir(out, args.overwrite, {"--source": args.source}, key="--out")
        splits = subset_splits(args.authors, args.source)  # read and checked before anything is written
        licence = Path(args.source or builtin_dir("tofu")) / "LICENSE"
        texts = {f"{name}.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
                 for name, rows in splits.items()}
        texts["README.md"] = describe(args.authors, splits)
        if licence.is_file():
            texts["LICENSE"] = licence.read_text(encoding="utf-8")
        _write(out, texts)
        for name, rows in splits.items():
            print(f"{out / name}.jsonl: {len(rows)} rows")
        return 0
    from obliviate.eval.rwku import batch_files

    out = Path(args.out or f"data/rwku/Batch/1-{args.targets}")
    check_output_dir(out, args.overwrite, {"--source": args.source}, key="--out")
    files = batch_files(args.source or "jinzhuoran/RWKU", args.targets)  # read and checked before anything is written
    _write(out, {name: json.dumps(records, indent=1, ensure_ascii=False) + "\n" for name, records in files.items()})
    for name, records in files.items():
        print(f"{out / name}: {len(records)} records")
    return 0


def _write(out: Path, texts: dict[str, str]) -> None:
    """The folder `out` with these files, whole or not at all: written beside it, then renamed into place (an
    existing `out`, which --overwrite allowed, is replaced only then)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, text in texts.items():
            (staging / name).write_text(text, encoding="utf-8")
        staging.chmod(0o777 & ~current_umask())
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
