"""The spread of `obliviate demo` over model initialisations, and whether its claims hold on every one.

Runs the demo (audit off, each in a fresh process, output in a temporary folder) with `tiny.seed=0..N-1` (the
world stays the same), prints each headline metric's range over the seeds for every model, and the demo's own
claims (obliviate.demos.offline.demo_claims) per seed; exits 1 if a claim fails on any seed. The README's table of what a
user should see comes from this script. Usage: python benchmarks/demo_seeds.py [--seeds 5] [overrides ...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

KEYS = (("model_utility", "model utility"), ("forget_fact_recall", "forget fact recall"),
        ("forget_token_entropy", "token entropy"), ("forget_degenerate_share", "degenerate answers"),
        ("forget_quality", "forget quality"))


def run(seed: int, out: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "obliviate.cli", "demo", f"output_dir={out}", "audit=false", f"tiny.seed={seed}",
           *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads((out / "results.json").read_text())


def fmt(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    digits = ".1e" if 0 < hi < 0.01 else ".3f"
    return f"{lo:{digits}}" if lo == hi else f"{lo:{digits}}-{hi:{digits}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("overrides", nargs="*", help="demo overrides for every run")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            res = run(seed, Path(tmp) / f"seed{seed}", args.overrides)
            results.append(res)
            print(f"seed {seed}: {res['seconds']:.0f} s, kernels {res['cpu_kernels']}; " + "; ".join(
                f"{'holds' if c['holds'] else 'FAILS'}: {c['claim']}" for c in res["claims"]), flush=True)
    models = list(results[0]["runs"])
    print(f"\nrange over tiny.seed=0..{args.seeds - 1}:")
    print(f"{'model':<10} " + "  ".join(f"{title:>22}" for _, title in KEYS))
    for m in models:
        cells = []
        for key, _ in KEYS:
            vals = [r["runs"][m]["metrics"].get(key) for r in results]
            cells.append(fmt([float(v) for v in vals]) if all(v is not None for v in vals) else "-")
        print(f"{m:<10} " + "  ".join(f"{c:>22}" for c in cells))
    failed = [(i, c["claim"]) for i, r in enumerate(results) for c in r["claims"] if not c["holds"]]
    print("\nevery claim holds on every seed" if not failed else f"\nclaims that fail: {failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
