"""How fast sweeps run: trials per hour and wall time, measured in one run.

Without arguments: runs `obliviate sweep --config configs/sweep/demo.yaml` in a fresh process into a temporary
folder and prints its wall time (the issue's target: <= 10 minutes on 2 cores), the time to prepare the track
(world, retain and target models) and the trials per hour of the trial phase. With --study DIR: reads a sweep
directory that already ran (e.g. obliviate-sweep-smollm2) and prints the same figures from its storage: the
trials' own start and end times (per method, and the whole study's span across all its workers and resumptions).

Usage: python benchmarks/sweep_rate.py [--config configs/sweep/demo.yaml] [--keep DIR] [--study DIR] [overrides ...]
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def study_rates(directory: Path) -> None:
    """Per method and overall: trials, their mean duration, and the span from the first start to the last end."""
    import optuna
    import yaml

    from obliviate.sweep.storage import STORAGE_FILE, open_storage

    cfg = yaml.safe_load((directory / "sweep.yaml").read_text(encoding="utf-8"))
    storage = open_storage(cfg.get("storage") or f"sqlite:///{directory.resolve() / STORAGE_FILE}")
    prefix = f"{cfg.get('study', 'sweep')}/"
    starts, ends, total = [], [], 0
    print(f"{'method':<12} {'trials':>6} {'mean s':>8} {'sd s':>7}")
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if not summary.study_name.startswith(prefix):
            continue
        trials = [t for t in optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()
                  if t.datetime_complete and t.state.name in ("COMPLETE", "PRUNED", "FAIL")
                  and not {"stale", "interrupted", "surplus"} & set(t.user_attrs)]
        secs = [(t.datetime_complete - t.datetime_start).total_seconds() for t in trials]
        starts += [t.datetime_start for t in trials]
        ends += [t.datetime_complete for t in trials]
        total += len(trials)
        sd = statistics.stdev(secs) if len(secs) > 1 else 0.0
        print(f"{summary.study_name[len(prefix):]:<12} {len(trials):>6} {statistics.mean(secs) if secs else 0:>8.1f} "
              f"{sd:>7.1f}")
    if not total:
        raise SystemExit(f"{directory}: no finished trials")
    span = (max(ends) - min(starts)).total_seconds()
    busy = sum((e - s).total_seconds() for s, e in zip(starts, ends))
    print(f"{total} trials; span first start -> last end {span / 3600:.2f} h; trials per hour over the span "
          f"{total / span * 3600:.1f}; per hour of trial time {total / busy * 3600:.1f}")


def run_demo_sweep(config: str, overrides: list[str], keep: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(keep) if keep else Path(tmp) / "sweep"
        if out.exists():
            raise SystemExit(f"--keep {keep}: it exists; name a new directory")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "obliviate.cli", "sweep", "--config", config,
                               f"output_dir={out}", *overrides], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(proc.stdout[-2000:] + proc.stderr[-2000:])
        prep = re.search(r"prepared the \w+ track in (\d+) s", proc.stdout)
        print(f"obliviate sweep --config {config}: wall {wall:.0f} s ({wall / 60:.1f} min), preparing the track "
              f"{prep.group(1) if prep else '?'} s")
        study_rates(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/sweep/demo.yaml")
    ap.add_argument("--study", help="a sweep directory that already ran: read its rates instead of running one")
    ap.add_argument("--keep", help="run the sweep into this new directory and keep it (its report, its storage)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.study:
        study_rates(Path(args.study))
    else:
        run_demo_sweep(args.config, args.overrides, args.keep)


if __name__ == "__main__":
    main()
