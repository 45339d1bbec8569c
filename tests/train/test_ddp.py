"""Two CPU processes (torchrun, gloo) give the same parameters as one process with the same global batch."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.skipif(shutil.which("torchrun") is None and not shutil.which(sys.executable), reason="no torchrun")
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
