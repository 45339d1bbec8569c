"""Mutation check: one-line changes to the core math must each make the test suite fail.

Each mutant replaces one exact snippet (it must occur exactly once in its file) and runs the test
files that mirror the module (`pytest -x`, stop at the first failure). A mutant the tests do not
notice "survives"; the check passes only when every mutant is killed.

    python scripts/mutants.py            # all mutants (about 10-15 minutes on 2 cores)
    python scripts/mutants.py --list     # names only
    python scripts/mutants.py -k sago    # mutants whose name contains "sago"

Files are mutated in place and restored in a `finally`; a backup is kept beside the file
(`<file>.mutant-backup`) until it is restored, and `--restore` puts any leftover backup back.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = "src/obliviate/"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to src/obliviate/
    old: str
    new: str
    tests: tuple[str, ...]


T_LOOP = ("tests/train/test_loop_math.py",)
T_SYN = ("tests/test_synthesis.py",)
T_OBJ = ("tests/objectives",)
T_LOGP = ("tests/modeling/test_logprobs.py", "tests/objectives")
T_SMOOTH = ("tests/modeling/test_smoothing.py",)
T_TOFU = ("tests/eval/test_tofu.py",)
T_MEM = ("tests/eval/test_memorization.py", "tests/eval/test_mia.py")
T_CL = ("tests/eval/test_closer_look.py",)

MUTANTS: list[Mutant] = [
    # the loop (train/loop.py)
    Mutant("loop: rule always sum", "train/loop.py", "combine_into(plan.rule, g_f, g_r", "combine_into('sum', g_f, g_r", T_LOOP),
    Mutant("loop: alpha and gamma swapped", "train/loop.py", "alpha=plan.alpha, gamma=plan.gamma",
           "alpha=plan.gamma, gamma=plan.alpha", T_LOOP),
    Mutant("loop: fused step ignores weights", "train/loop.py", "loss = sum(w * t for w, t in terms.values())",
           "loss = sum(t for w, t in terms.values())", T_LOOP),
    Mutant("loop: forget and retain buffers not separated", "train/loop.py",
           "            _swap(params, forget_buf)\n            _, lr_", "            _, lr_", T_LOOP),
]


def _restore(path: Path) -> None:
    backup = path.with_name(path.name + ".mutant-backup")
    if backup.exists():
        backup.replace(path)


def run_mutant(m: Mutant, timeout: int) -> tuple[bool, float, str]:
    """Apply `m`, run its tests, restore; returns (killed, seconds, last line of pytest's output)."""
    path = ROOT / SRC / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutant {m.name!r}: the snippet occurs {text.count(m.old)} times in {m.file} (need 1); "
                         "update scripts/mutants.py to the current code")
    backup = path.with_name(path.name + ".mutant-backup")
    backup.write_text(text)
    start = time.perf_counter()
    try:
        path.write_text(text.replace(m.old, m.new))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        return proc.returncode != 0, time.perf_counter() - start, lines[-1] if lines else ""
    except subprocess.TimeoutExpired:
        return True, time.perf_counter() - start, "timed out (counted as killed)"
    finally:
        path.write_text(text)
        backup.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("-k", default="", help="only mutants whose name contains this text")
    ap.add_argument("--restore", action="store_true", help="put back files left mutated by an interrupted run")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutant")
    args = ap.parse_args(argv)
    if args.restore:
        for m in MUTANTS:
            _restore(ROOT / SRC / m.file)
        return 0
    chosen = [m for m in MUTANTS if args.k in m.name]
    if args.list:
        print("\n".join(f"{m.name}  ({m.file})" for m in chosen))
        return 0
    leftovers = sorted({m.file for m in MUTANTS if (ROOT / SRC / (m.file + ".mutant-backup")).exists()})
    if leftovers:
        raise SystemExit(f"backups of an interrupted run exist for {leftovers}: run with --restore first")
    survived = []
    for i, m in enumerate(chosen, 1):
        killed, secs, tail = run_mutant(m, args.timeout)
        print(f"[{i:2d}/{len(chosen)}] {'killed  ' if killed else 'SURVIVED'} {secs:6.1f}s  {m.name}  | {tail}", flush=True)
        if not killed:
            survived.append(m.name)
    print(f"{len(chosen) - len(survived)}/{len(chosen)} mutants killed")
    if survived:
        print("survivors: " + "; ".join(survived))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
