"""Checkpoints: a leftover checkpoint of another run is refused with what differs (or replaced with
train.resume=never); writes are atomic; a run killed by SIGKILL or Ctrl-C resumes to bit-identical weights."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import interrupt_after, worker

from obliviate.config import MethodConfig, TrainConfig
from obliviate.errors import CheckpointMismatchError, ConfigError
from obliviate.train import checkpoint, loop
from obliviate.train.fingerprint import differences
from obliviate.train.unlearn import unlearn

WORKER = Path(__file__).with_name("kill_worker.py")
kill_worker = worker("kill_worker")


def _cfg(ck, **kw):
    return TrainConfig(**{"progress": False, "weight_decay": 0.0, "scheduler": "constant", "max_steps": 4,
                          "batch_size": 2, "lr": 1e-3, "checkpoint_dir": str(ck), "checkpoint_every": 2, **kw})


def _model(tok, seed=1):
    from obliviate.modeling.tiny import tiny_llama

    return tiny_llama(tok, hidden_size=32, num_layers=1, seed=seed)


def _counting(fn):
    """Run fn; return (its result, how many optimizer steps it took)."""
    original, calls = loop._finish_step, []
    loop._finish_step = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        return fn(), len(calls)
    finally:
        loop._finish_step = original


def test_differences_list_old_and_new():
    old = {"train.lr": 1e-3, "method.forget": "ga", "data.forget_sha256": "a" * 64, "gone": 1}
    new = {"train.lr": 1e-2, "method.forget": "ga", "data.forget_sha256": "b" * 64, "added": 2}
    assert differences(old, new) == ["train.lr: 0.001 → 0.01",
                                     "data.forget_sha256: aaaaaaaaaaaa… → bbbbbbbbbbbb…",
                                     "added: (absent) → 2", "gone: 1 → (absent)"]


def test_leftover_checkpoint_of_another_run_is_refused(small_world, small_tok, tmp_path):
    forget, retain = small_world.splits["forget10"], small_world.splits["retain90"]
    ga = MethodConfig(forget="ga", retain="nll")
    unlearn(_model(small_tok), small_tok, forget, retain, ga, _cfg(tmp_path), max_length=64)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2
    with pytest.raises(CheckpointMismatchError) as err:  # another method and lr; the logging keys may differ
        unlearn(_model(small_tok), small_tok, forget, retain, MethodConfig(forget="npo", retain="nll"),
                _cfg(tmp_path, lr=1e-2, checkpoint_every=1, progress=True), max_length=64)
    lines = [line.strip() for line in str(err.value).splitlines()[1:-1]]
    assert sorted(lines) == ["method.forget: 'ga' → 'npo'", "method.forget_args.beta: (absent) → 0.1",
                             "method.forget_args.reduction: 'token' → (absent)", "train.lr: 0.001 → 0.01"]
    assert "train.resume=never" in str(err.value)
    with pytest.raises(CheckpointMismatchError, match=r"model\.weights_sha256: .*\n.*data\.forget_sha256"):
        unlearn(_model(small_tok, seed=2), small_tok, small_world.splits["forget10"][:-1], retain, ga,
                _cfg(tmp_path), max_length=64)
    with pytest.raises(CheckpointMismatchError, match=r"data\.max_length: 64 → 48"):
        unlearn(_model(small_tok), small_tok, forget, retain, ga, _cfg(tmp_path), max_length=48)
    # the same run with other logging / checkpoint frequency resumes: 2 of 4 steps are left
    _, steps = _counting(lambda: unlearn(_model(small_tok), small_tok, forget, retain, ga,
                                         _cfg(tmp_path, checkpoint_every=3, progress=True), max_length=64))
    assert steps == 2


def test_resume_never_replaces_the_old_checkpoint_only_when_a_new_one_is_written(small_world, small_tok, tmp_path):
    forget, retain = small_world.splits["forget10"], small_world.splits["retain90"]
    unlearn(_model(small_tok), small_tok, forget, retain, MethodConfig(forget="ga", retain="nll"), _cfg(tmp_path),
            max_length=64)
    old = (tmp_path / "checkpoint.pt").read_bytes()
    npo = MethodConfig(forget="npo", retain="nll")
    fresh = _cfg(tmp_path, resume="never")
    with pytest.raises(KeyboardInterrupt):
        interrupt_after(1, lambda: unlearn(_model(small_tok), small_tok, forget, retain, npo, fresh, max_length=64))
    assert (tmp_path / "checkpoint.pt").read_bytes() == old, "no new checkpoint yet: the old one stays"
    res, steps = _counting(lambda: unlearn(_model(small_tok), small_tok, forget, retain, npo, fresh, max_length=64))
    assert steps == 4 and len(res.history) == 4
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["fingerprint"]["method.forget"] == "npo"
    _, steps = _counting(lambda: unlearn(_model(small_tok), small_tok, forget, retain, npo,
                                         _cfg(tmp_path, resume="require"), max_length=64))
    assert steps == 2  # and now auto/require resume the new run
    with pytest.raises(ConfigError, match="train.resume=require, but .* holds no checkpoint.pt"):
        unlearn(_model(small_tok), small_tok, forget, retain, npo, _cfg(tmp_path / "empty", resume="require"),
                max_length=64)
    with pytest.raises(ConfigError, match="train.resume"):
        _cfg(tmp_path, resume="yes")


def test_interrupted_write_keeps_the_old_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    class Acc:  # the accelerator calls of save and load, single process
        is_main_process = True

        def wait_for_everyone(self):
            pass

        def unwrap_model(self, m):
            return m

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ck = checkpoint.Checkpointer(tmp_path, every=1, fingerprint={"task": "t"})
    ck.save(1, model, opt, sched, None, [], Acc())
    good = (tmp_path / "checkpoint.pt").read_bytes()
    (tmp_path / "checkpoint.pt.tmp-99999").write_bytes(b"left by a SIGKILL")
    real_save = torch.save

    def torn(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.torch, "save", torn)
    with pytest.raises(KeyboardInterrupt):
        ck.save(2, model, opt, sched, None, [], Acc())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # partial and stale files gone
    assert (tmp_path / "checkpoint.pt").read_bytes() == good
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert ck.load(model, opt, sched, None, Acc()) == (1, [])


@pytest.fixture(scope="module")
def uninterrupted(small_world, small_tok):
    model = kill_worker.model_for(small_tok)
    res = kill_worker.run(model, small_tok, small_world, None)
    return [p.detach().clone() for p in model.parameters()], res.history


def _strip(history):
    return [{k: v for k, v in h.items() if k != "step_seconds"} for h in history]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killed_run_resumes_bit_identical(sig, small_world, small_tok, uninterrupted, tmp_path):
    """A real process is killed after a random checkpoint; resuming in a new process gives the same bits."""
    ck, done, err = tmp_path / "ck", tmp_path / "done", tmp_path / "stderr.txt"
    at, delay = random.randint(1, kill_worker.STEPS - 3), random.uniform(0.0, 0.35)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent) + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(WORKER), str(ck), str(done)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=stderr)
        try:
            for line in proc.stdout:
                if line.strip() == f"saved {at}":
                    break
            else:
                pytest.fail(f"worker ended before step {at}: {err.read_text()[-2000:]}")
            time.sleep(delay)
            proc.send_signal(sig)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert not done.exists(), f"the run finished before the signal (step {at}, delay {delay:.2f} s)"
    assert proc.returncode != 0
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err.read_text()
        assert [p.name for p in ck.iterdir()] == ["checkpoint.pt"], "Ctrl-C left a temporary file"
    saved = torch.load(ck / "checkpoint.pt", weights_only=True)["step"]
    assert at <= saved < kill_worker.STEPS
    model = kill_worker.model_for(small_tok)  # a new process starts from θ0 again
    res, steps = _counting(lambda: kill_worker.run(model, small_tok, small_world, str(ck)))
    assert steps == kill_worker.STEPS - saved
    params, history = uninterrupted
    for a, b in zip(params, model.parameters()):
        assert torch.equal(a, b.detach()), f"killed after step {at} (+{delay:.2f} s): weights differ"
    assert _strip(res.history) == _strip(history)
    assert [p.name for p in ck.iterdir()] == ["checkpoint.pt"]
