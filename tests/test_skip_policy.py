"""The suite's skip policy (tests/conftest.py): a skip for an allowed reason passes and is listed with its reason;
any other skip fails the run and is named."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MARK = "# ---------------------------------------------------------------- skips:"


def _run(tmp_path: Path, reason: str) -> subprocess.CompletedProcess:
    conftest = (Path(__file__).with_name("conftest.py")).read_text()
    (tmp_path / "conftest.py").write_text(conftest[conftest.index(MARK):])
    (tmp_path / "test_x.py").write_text(f"import pytest\n\ndef test_ok():\n    pass\n\n"
                                        f"def test_skipped():\n    pytest.skip({reason!r})\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_an_allowed_skip_passes_and_is_listed_with_its_reason(tmp_path):
    proc = _run(tmp_path, "optional extra not installed: lm-eval")
    assert proc.returncode == 0, proc.stdout
    assert "SKIPPED [1] test_x.py:7: optional extra not installed: lm-eval" in proc.stdout


def test_a_skip_for_a_missing_file_fails_the_run(tmp_path):
    proc = _run(tmp_path, "TOFU data not found at /somewhere")
    assert proc.returncode == 1, proc.stdout
    assert "skips with a reason that is not allowed" in proc.stdout
    assert "test_x.py::test_skipped: TOFU data not found at /somewhere" in proc.stdout
