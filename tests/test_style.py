"""The linter the project keeps (ruff, configured in pyproject.toml) finds nothing in src, tests, scripts and
benchmarks: unused or undefined names, unsorted imports, statements jammed on one line, lines past the ceiling."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "scripts", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
