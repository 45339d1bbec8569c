"""Every command the README shows can run as written: its subcommand, flags, config files and overrides
resolve (`--show-config`, no training), scripts and configs it names exist, and `.ci/run` calls exactly the
README's test command."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [ln.split("  #")[0].strip() for b in blocks for ln in b.splitlines()]
    return [part.strip() for ln in lines if ln for part in ln.split("&&")]


def test_readme_shows_the_two_commands_and_ci_runs_the_test_command():
    cmds = _commands()
    assert "bash install.sh" in cmds and "obliviate demo" in cmds and "python3 -m pytest -q" in cmds
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ci[-1] == "python3 -m pytest -q"


@pytest.mark.parametrize("cmd", [c for c in _commands() if c.startswith("obliviate ") and "<" not in c])
def test_obliviate_commands_resolve(cmd, monkeypatch, capsys):
    from obliviate.cli import _parser, main

    monkeypatch.chdir(ROOT)
    args = shlex.split(cmd)[1:]
    if args[0] in ("ls",):
        assert main(args) == 0
        return
    if args[0] == "report":
        _parser().parse_args(args)
        return
    assert main(args + ["--show-config"]) == 0, capsys.readouterr().err


def test_named_files_exist():
    for path in re.findall(r"(?:configs|benchmarks|scripts)/[\w/.-]+\.(?:yaml|py)", README):
        assert (ROOT / path).is_file(), path
