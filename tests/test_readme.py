"""The README cannot drift, and it needs nothing beside the repository: the repository is copied into an empty
temporary folder (no sibling folders) and every `obliviate …` command the README shows RUNS there as written, with
tiny-size overrides appended, and writes what it should; the real-model demo runs too (2 steps on a few facts). The
few that need a GPU, the hub or a quarter of an hour only resolve (`--show-config`, no training), each with its
reason in RESOLVED_ONLY. Scripts and configs the README names exist, and `.ci/run` calls exactly the README's test
command. Every command in a README bash block must be run, resolved, or listed in NOT_OBLIVIATE."""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEST_COMMAND = "python3 -m pytest -q -rs"


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [ln.split("  #")[0].strip() for b in blocks for ln in b.splitlines()]
    return [part.strip() for ln in lines if ln for part in ln.split("&&")]


# README commands that are not `obliviate …` and are not run here (they are checked by the tests named).
NOT_OBLIVIATE = {
    "bash install.sh": "installs packages (network, minutes); test_readme_shows_the_two_commands_... checks it is shown",
    TEST_COMMAND: "this test suite itself; .ci/run must call exactly it",
}

# `obliviate …` commands that only resolve (`--show-config`): a substring of the command -> why it is not run.
RESOLVED_ONLY = {
    "demo_real_audit": "the real-model demo again with an audit of each method (~14 min of CPU)",
    "demo_real_tofu": "fine-tunes the 135M model on TOFU authors before unlearning (~22 min of CPU)",
    "configs/gpu/": "a 1B model and published TOFU checkpoints from the hub: a GPU recipe",
    "configs/wmdp/": "a 7B model and the WMDP corpora from the hub: a GPU recipe",
    "muse-bench/": "MUSE data comes from the Hugging Face hub",
    "cais/wmdp": "WMDP comes from the Hugging Face hub",
    "jinzhuoran/RWKU": "RWKU comes from the Hugging Face hub",
    "configs/sweep/smollm2": "the SmolLM2 study: hours of CPU, and a database server or a shared file system",
    "configs/tofu/smollm2/": "fine-tunes SmolLM2-135M on 20 TOFU authors: hours of CPU",
}

# Appended to each README command (later overrides win): a few optimizer steps, 2 eval rows of 4 new tokens,
# a 32-wide model, and outputs replaced (the scratch directory is shared by the module's commands).
TINY_DEMO = ["tiny.hidden_size=32", "tiny.vocab_size=400", "max_length=64",
             "retain_train.max_steps=2", "target_train.max_steps=2", "unlearn.max_steps=1",
             "eval.max_examples=2", "eval.max_new_tokens=4", "overwrite=true"]
TINY = {
    "demo": TINY_DEMO,
    "unlearn": ["train.max_steps=1", "eval.max_examples=2", "eval.max_new_tokens=4", "continual.max_new_tokens=4",
                "overwrite=true"],
    "finetune": ["tiny.hidden_size=32", "tiny.vocab_size=400", "train.max_steps=1", "data.max_length=64",
                 "overwrite=true"],
    "eval": ["eval.max_examples=2", "eval.max_new_tokens=4", "overwrite=true"],
    "calibrate": ["max_examples=4", "taus=[2.0]", "layer_sets=[[0]]"],
    "validate": [],
    "sweep": ["trials=1", "repeats=0", *[f"set.{o}" for o in TINY_DEMO if not o.startswith("overwrite")],
              "eval_rows=2"],
    "audit": ["max_new_tokens=4", "relearn_steps=1", "max_examples=6", "overwrite=true"],
    "verify": [],
}

# The real-model demo (configs/demo_real.yaml, SmolLM2-135M): the first 3 facts of each family, 2 steps per method.
TINY_REAL = ["knowledge.tofu_source=null", "knowledge.max_per_family=3", "knowledge.max_new_tokens=8",
             "knowledge.max_eval=4", "unlearn.max_steps=2", "unlearn.batch_size=2", "calibrate.taus=[2.0, 4.0]",
             "calibrate.layer_sets=[[0, 1]]", "unlearn.progress=false", "overwrite=true"]

# What a run leaves in its output_dir (relative paths), by subcommand.
OUTPUTS = {
    "demo": ["results.json", "report.md", "report.html", "world/forget10_perturbed.jsonl",
             "models/target/model.safetensors", "models/retain/model.safetensors"],
    "demo (knowledge)": ["results.json", "report.md", "report.html", "facts/forget.jsonl"],
    "unlearn": ["model.safetensors", "obliviate.yaml", "metrics.json", "receipt.json", "README.md"],
    "finetune": ["model.safetensors", "obliviate.yaml", "metrics.json"],
    "eval": ["obliviate.yaml", "metrics.json", "report.md"],
    "sweep": ["sweep.yaml", "sweep.db", "report.md", "report.html", "frontier.png", "compare.json"],
}

# What a command without an output directory prints.
PRINTS = {"prepare": "forget10.jsonl: 40 rows", "compare": "wrote", "ls": "forget objectives", "validate": "valid (", "calibrate": "| tau | layers |", "audit": "recovered",
          "verify": "match"}

DEMO = "obliviate demo"  # the README's first command: run once per module, the later commands start from its output


def _resolve_only_reason(cmd: str) -> str | None:
    if cmd.startswith("obliviate validate --offline"):
        return None  # validate --offline checks a GPU or hub recipe here without the hub: it is run
    return next((why for key, why in RESOLVED_ONLY.items() if key in cmd), None)


def _obliviate_commands() -> list[str]:
    return [c for c in _commands() if c.startswith("obliviate ") and "<" not in c]


def _cli(args: list[str]) -> tuple[int, str, str]:
    """`obliviate ARGS` in this process (no second torch import): exit status, stdout, stderr."""
    from obliviate.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def _tiny_args(cmd: str) -> list[str]:
    args = shlex.split(cmd)[1:]
    if args[0] in ("ls", "report") or "--show-config" in args:
        return args
    if "configs/demo_real.yaml" in args:
        return args + TINY_REAL
    return args + TINY.get(args[0], [])


def _resolved(args: list[str]) -> Any:
    """The config the CLI would run with (what `--show-config` prints), as the dataclass."""
    from obliviate.cli import parser
    from obliviate.cli.configured import command_class
    from obliviate.cli.eval import eval_shortcuts
    from obliviate.config import load_config

    ns = parser().parse_args(args)
    overrides = (eval_shortcuts(ns) if ns.command == "eval" else []) + list(ns.overrides)
    return load_config(command_class(ns), ns.config, overrides)


def _copy_repository(dest: Path) -> None:
    """What a fresh clone holds (git's tracked and not-ignored files; without git, the tree minus outputs)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not
                 {".git", "__pycache__", "runs"} & set(p.relative_to(ROOT).parts)]
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, real_model_cache):
    """The repository copied into an empty folder (nothing beside it); then the README's `obliviate demo` run there
    with tiny sizes (its output is what the later commands start from). Nothing else is prepared: the TOFU
    walkthrough builds its own target and retain model, in the README's order."""
    alone = tmp_path_factory.mktemp("alone")
    work = alone / "obliviate"
    _copy_repository(work)
    assert [p.name for p in alone.iterdir()] == ["obliviate"]
    before, t0 = Path.cwd(), time.time()
    os.chdir(work)
    try:
        assert DEMO in _commands(), "the README no longer shows `obliviate demo`"
        demo = _cli(_tiny_args(DEMO))
        assert demo[0] == 0, demo[2]
    finally:
        os.chdir(before)
    return {"dir": work, "demo": demo, "started": t0}


def test_readme_shows_the_two_commands_and_ci_runs_the_test_command():
    cmds = _commands()
    assert "bash install.sh" in cmds and "obliviate demo" in cmds and TEST_COMMAND in cmds
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ci[-1] == TEST_COMMAND


def test_every_readme_command_is_run_resolved_or_explained():
    for cmd in _commands():
        assert cmd.startswith("obliviate ") or cmd in NOT_OBLIVIATE, (
            f"README command {cmd!r} is neither `obliviate …` nor listed in NOT_OBLIVIATE with a reason")
    for key in RESOLVED_ONLY:  # no stale entries
        assert any(key in c for c in _obliviate_commands()), f"RESOLVED_ONLY[{key!r}] matches no README command"


@pytest.mark.parametrize("cmd", [c for c in _obliviate_commands() if _resolve_only_reason(c) is None])
def test_readme_command_runs(cmd, sandbox, monkeypatch):
    args = _tiny_args(cmd)
    monkeypatch.chdir(sandbox["dir"])
    if cmd == DEMO:  # run once by the fixture
        rc, out, err = sandbox["demo"]
        assert "ASU_KL" in out and "GradDiff" in out
        started = sandbox["started"]
    else:
        started = time.time()
        rc, out, err = _cli(args)
    assert rc == 0, f"`{shlex.join(['obliviate', *args])}` failed:\n{err}"
    command = args[0]
    if "configs/demo_real.yaml" in args:
        command = "demo (knowledge)"
    if "--show-config" in args:
        assert f"output_dir: {_resolved(args).output_dir}" in out
        return
    if command in PRINTS:
        assert PRINTS[command] in out, out
    if command == "sweep":
        assert "this worker ran 3 trial(s)" in out, out  # one trial of each of the three methods
    if command in OUTPUTS:
        cfg = _resolved(args)
        out_dir = sandbox["dir"] / cfg.output_dir
        expected = list(OUTPUTS[command])
        if command == "demo (knowledge)":
            res = __import__("json").loads((out_dir / "results.json").read_text())
            assert set(res["runs"]) == {"original", *cfg.methods} and res["calibration"]["recommended"]
            assert all(len(res["runs"][m]["history"]) == 2 for m in cfg.methods)
        if command == "demo":
            expected += [f"models/{name.lower()}/model.safetensors" for name in cfg.methods]
            _each_card_holds_its_own_models_metrics(out_dir, list(cfg.methods))
            expected += [f"audit/{name.lower()}/audit.json" for name in cfg.methods] if cfg.audit else []
        if command == "unlearn" and cfg.continual.enabled:
            expected.append("continual.md")
        if command == "unlearn" and cfg.audit.enabled:
            expected += ["audit/audit.json", "audit/report.md"]
        for rel in expected:
            path = out_dir / rel
            assert path.is_file(), f"`{cmd}` did not write {path}"
            assert path.stat().st_mtime >= started - 1, f"{path} is older than the run of `{cmd}`"


def _each_card_holds_its_own_models_metrics(out_dir: Path, methods: list[str]) -> None:
    """Each unlearned model's card (model-index) and receipt carry that model's own evaluation, not another's."""
    import json

    from huggingface_hub import metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    runs = json.loads((out_dir / "results.json").read_text())["runs"]
    values = {}
    for name in methods:
        index = metadata_load(out_dir / "models" / name.lower() / "README.md")["model-index"]
        values[name] = {r.metric_type: r.metric_value for r in model_index_to_eval_results(index)[1]}
        assert values[name] and all(runs[name]["metrics"][k] == v for k, v in values[name].items()), name
        receipt = json.loads((out_dir / "models" / name.lower() / "receipt.json").read_text())
        after = receipt["metrics"]["after"]
        assert after and all(runs[name]["metrics"][k] == v for k, v in after.items() if v == v), name
    assert len({json.dumps(v, sort_keys=True) for v in values.values()}) == len(methods)  # each its own numbers


def test_readme_python_runs_after_its_commands(sandbox):
    """Every Python block of the README that calls the API (imports from `obliviate` itself), in a fresh
    interpreter in the folder the commands above left (runs/tofu-target-tiny from the TOFU walkthrough)."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "from obliviate import" in b]
    assert blocks, "the README shows no Python API snippet"
    for code in blocks:
        proc = subprocess.run([sys.executable, "-c", code], cwd=sandbox["dir"], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "5 steps, last forget loss" in proc.stdout
    assert (sandbox["dir"] / "runs" / "mine" / "config.json").is_file()


@pytest.mark.parametrize("cmd", [c for c in _obliviate_commands() if _resolve_only_reason(c) is not None])
def test_readme_command_resolves(cmd, monkeypatch, capsys):
    """Not run (see RESOLVED_ONLY): its subcommand, flags, config file and overrides resolve."""
    from obliviate.cli import main

    monkeypatch.chdir(ROOT)
    assert main(shlex.split(cmd)[1:] + ["--show-config"]) == 0
    capsys.readouterr()


def test_named_files_exist():
    for path in re.findall(r"(?:configs|benchmarks|scripts)/[\w/.-]+\.(?:yaml|py)", README):
        assert (ROOT / path).is_file(), path
