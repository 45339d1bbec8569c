"""Two CPU processes (torchrun, gloo) give the same parameters as one process with the same global batch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import worker

WORKER = Path(__file__).with_name("ddp_worker.py")


def test_two_processes_equal_one(tmp_path):
    out2 = tmp_path / "two.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(WORKER), str(out2), "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads(out2.read_text())
    assert two["num_processes"] == 2, "torchrun must really start two processes"

    sys.path.insert(0, str(WORKER.parent))
    try:
        import ddp_worker
    finally:
        sys.path.pop(0)
    out1 = tmp_path / "one.json"
    ddp_worker.run(out1, 4)
    one = json.loads(out1.read_text())
    assert one["num_processes"] == 1
    for rule in ddp_worker.RULES:
        for a, b in zip(one[rule]["params"], two[rule]["params"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-9, rtol=1e-8)
        assert one[rule]["history"][-1]["forget"] == pytest.approx(two[rule]["history"][-1]["forget"], rel=1e-9)


def _worker():
    return worker("ddp_worker")


def test_torchrun_without_train_cpu_is_data_parallel(tmp_path):
    """`torchrun --nproc_per_node 2 obliviate unlearn ...` without train.cpu=true: one group of 2, rank 0 writes.
    The GPUs of a GPU machine are hidden from it: this is the CPU-only machine's launch (accelerate would pick
    CUDA otherwise)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("ACCELERATE_USE_CPU", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(WORKER), str(tmp_path / "two"), "2", "auto"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["num_processes"], r["process_index"], r["is_main"]) for r in ranks] == [(2, 0, True), (2, 1, False)]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["rank0.json", "rank1.json", "result.json"]
    two = json.loads((tmp_path / "two" / "result.json").read_text())

    _worker().run_auto(tmp_path / "one", 4)
    one = json.loads((tmp_path / "one" / "result.json").read_text())
    for a, b in zip(one["params"], two["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-9, rtol=1e-8)
    assert one["history"][-1]["forget"] == pytest.approx(two["history"][-1]["forget"], rel=1e-9)


def test_inconsistent_launches_are_refused(monkeypatch):
    from accelerate import Accelerator

    from obliviate.config import TrainConfig
    from obliviate.errors import LaunchError, ObliviateError
    from obliviate.train.loop import make_accelerator

    cfg = TrainConfig(progress=False)
    Accelerator(cpu=not torch.cuda.is_available())  # this process is already a single-process state
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LaunchError, match="2 processes were launched, but .* formed a data-parallel group of 1"):
        make_accelerator(cfg)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(LaunchError, match=r"2 processes per node .* 1 GPU\(s\).*--nproc_per_node 1") as err:
        make_accelerator(cfg)
    assert isinstance(err.value, ObliviateError)


def test_a_deepspeed_launch_is_refused_with_the_supported_engines(monkeypatch):
    from obliviate.config import TrainConfig
    from obliviate.errors import LaunchError
    from obliviate.train.loop import make_accelerator

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(LaunchError, match="launched with DeepSpeed.*train.fsdp=true"):
        make_accelerator(TrainConfig(progress=False))
