"""Which machine differences move the digits of `obliviate demo`? Runs the demo (in a fresh process each time,
output in a temporary folder) under settings that stand in for another x86-64 machine, and prints each run's
headline table and whether it equals the first run's bit for bit.

Settings:
  pinned        the default: kernels pinned to AVX2 before torch loads (`cpu_kernels: avx2`)
  pinned-again  the same again: is one machine deterministic?
  avx2-machine  `cpu_kernels=native` with ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2, DNNL_MAX_CPU_ISA=AVX2 set
                outside: what a CPU without AVX-512 runs natively; equal to `pinned` when the pin works
  native        `cpu_kernels=native`: this CPU's best (AVX-512 where it has it)
  threads=1     pinned, but 1 torch thread instead of the demo's 2 (another core count without the thread pin)
Usage: python benchmarks/demo_digits.py [--variants pinned,pinned-again,avx2-machine,native]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}
VARIANTS = {"pinned": ({}, []), "pinned-again": ({}, []), "avx2-machine": (AVX2, ["cpu_kernels=native"]),
            "native": ({}, ["cpu_kernels=native"]), "threads=1": ({}, ["threads=1"])}
KEYS = ("forget_quality", "model_utility", "forget_rougeL_recall", "forget_fact_recall", "forget_degenerate_share")


def run(env: dict[str, str], overrides: list[str], out: Path) -> dict[str, dict[str, float]]:
    """One demo in a fresh process (no audit: the table is what is compared); {model: {metric: value}}."""
    cmd = [sys.executable, "-m", "obliviate.cli", "demo", f"output_dir={out}", "audit=false", *overrides]
    base = {k: v for k, v in os.environ.items() if k not in AVX2}  # no outer pin leaks into a variant
    proc = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    res = json.loads((out / "results.json").read_text())
    return {"kernels": res["cpu_kernels"], **{m: {k: r["metrics"].get(k) for k in KEYS} for m, r in res["runs"].items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="pinned,pinned-again,avx2-machine,native,threads=1")
    ap.add_argument("--overrides", nargs="*", default=[], help="extra demo overrides for every run")
    args = ap.parse_args()
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.variants.split(",")):
            env, extra = VARIANTS[name]
            table = run(env, extra + args.overrides, Path(tmp) / f"run{i}")
            kernels = table.pop("kernels")
            same = first is None or table == first
            first = first or table
            print(f"== {name} ({kernels}): {'identical to the first run' if same else 'DIFFERS from the first run'}")
            for model, metrics in table.items():
                print(f"   {model:<9} " + "  ".join(f"{k} {v:.4g}" if v is not None else f"{k} -" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
