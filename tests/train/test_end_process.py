"""Leaving a multi-process run (train.loop.end_process, and the CLI under torchrun): the exit status is kept,
output is flushed, and the interpreter's finalisation (where gloo's threads can abort the process) never runs."""
from __future__ import annotations

import subprocess
import sys

import pytest

GROUP = ("import atexit, os, sys, torch.distributed as dist; "
         "dist.init_process_group('gloo', init_method='file://' + sys.argv[1], rank=0, world_size=1); "
         "atexit.register(lambda: print('FINALISED', flush=True)); ")


def _run(tmp_path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GROUP + code, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("rc", [0, 3, 130])
def test_end_process_keeps_the_status_flushes_and_skips_finalisation(tmp_path, rc):
    proc = _run(tmp_path, f"print('before', end=''); from obliviate.train.loop import end_process; end_process({rc})")
    assert proc.returncode == rc and proc.stdout == "before", proc.stderr  # unflushed text arrives; no atexit
    assert "terminate called" not in proc.stderr


def test_end_process_destroys_the_group_on_success_only(tmp_path):
    code = ("from obliviate.train import loop; real = dist.destroy_process_group; "
            "dist.destroy_process_group = lambda: (print('destroyed', end=''), real()); loop.end_process({})")
    assert _run(tmp_path, code.format(0)).stdout == "destroyed"
    assert _run(tmp_path, code.format(2)).stdout == ""  # after an error the other ranks may be anywhere


def test_the_cli_leaves_through_end_process_when_a_group_exists(tmp_path):
    ok = _run(tmp_path, "from obliviate.cli import main; main(['ls'])")
    assert ok.returncode == 0 and "forget objectives" in ok.stdout and "FINALISED" not in ok.stdout
    bad = _run(tmp_path, "from obliviate.cli import main; main(['unlearn', 'train.lrr=1'])")
    assert bad.returncode == 2 and "unknown key(s) ['train.lrr']" in bad.stderr and "FINALISED" not in bad.stdout


def test_the_console_script_runs_atexit_then_skips_finalisation(tmp_path):
    """`obliviate` (cli.entry): the status and every line arrive, atexit handlers run (trackers, logging), the
    interpreter's finalisation is skipped once torch is loaded (a __del__ of a module-level object never runs)."""
    code = ("import atexit, sys, torch; atexit.register(lambda: print('ATEXIT', flush=True)); "
            "Late = type('Late', (), {'__del__': lambda self: print('FINALISED', flush=True)}); keep = Late(); "
            "sys.argv = ['obliviate'] + sys.argv[1:]; from obliviate.cli import entry; entry()")
    ok = subprocess.run([sys.executable, "-c", code, "ls"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "forget objectives" in ok.stdout and "ATEXIT" in ok.stdout, ok.stderr
    assert "FINALISED" not in ok.stdout
    bad = subprocess.run([sys.executable, "-c", code, "unlearn", "train.lrr=1"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "unknown key(s) ['train.lrr']" in bad.stderr and "ATEXIT" in bad.stdout
    light = subprocess.run([sys.executable, "-c", code.replace("import atexit, sys, torch;", "import atexit, sys;"),
                            "ls"], capture_output=True, text=True, timeout=120)
    assert light.returncode == 0 and "FINALISED" in light.stdout  # `ls` never loads torch: a plain exit
