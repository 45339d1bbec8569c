"""train.fsdp=true: two CPU processes (torchrun, gloo, FSDP2) give the same parameters as one process with the
same global batch, for every gradient rule, with and without vocabulary chunks on the shards; the shard reducer
sums partial dot products exactly."""
import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import worker

from obliviate.gradients import RuleState, combine, combine_into

WORKER = Path(__file__).with_name("fsdp_worker.py")
TOL = {"atol": 1e-9, "rtol": 1e-8}  # float64 models, 3 AdamW steps


def _worker():
    return worker("fsdp_worker")


def test_two_sharded_processes_equal_one(tmp_path):
    out2 = tmp_path / "two.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(WORKER), str(out2), "2"]
    import subprocess

    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads(out2.read_text())
    assert two["num_processes"] == 2, "torchrun must really start two processes"
    assert two["reduced"] == [3.0, 4.0]
    worker = _worker()
    assert two["optimizer_params"] == ["DTensor"] * len(worker.RULES), "AdamW must be built over the shards"
    assert two["again_plain"], "a gathered model can be sharded and trained again (continual unlearning)"

    out1 = tmp_path / "one.json"
    worker.run(out1, 4)
    one = json.loads(out1.read_text())
    assert one["num_processes"] == 1
    for rule in worker.RULES:
        assert two[rule]["plain"] and two[rule]["class"] == one[rule]["class"] == "LlamaForCausalLM", rule
        assert two[rule]["tied"] and one[rule]["tied"], "gathering keeps tied embeddings one tensor"
        assert len(two[rule]["head_rows"]) == 2, "the student's head and θ0 teacher's head both ran"
        if rule in worker.CHUNKED:  # train.vocab_chunk=5 on the shards: no head call saw more than 5 answer rows
            assert max(two[rule]["head_rows"]) == 5, rule
        assert min(one[rule]["head_rows"]) > 5, "one process runs unchunked: all answer rows at once"
        assert len(one[rule]["params"]) == len(two[rule]["params"]), rule
        for a, b in zip(one[rule]["params"], two[rule]["params"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), **TOL, msg=lambda m, rule=rule: f"{rule}: {m}")
        h1, h2 = one[rule]["history"][-1], two[rule]["history"][-1]
        assert set(h1) == set(h2), rule
        for key in {"forget", "retain", "grad_norm", "cos_f_r", "cos_g_r", "conflict_share"} & set(h1):  # sum: no cos
            assert h1[key] == pytest.approx(h2[key], rel=1e-8, abs=1e-10), (rule, key)


class _TwoShards:
    """An all-reduce between two threads: each passes its partial sums and gets the total back."""

    def __init__(self) -> None:
        self.slots: list = [None, None]
        self.barrier = threading.Barrier(2)
        self.calls = [0, 0]

    def reducer(self, rank: int):
        def reduce(v: torch.Tensor) -> torch.Tensor:
            self.calls[rank] += 1
            self.slots[rank] = v.clone()
            self.barrier.wait()
            total = self.slots[0] + self.slots[1]
            self.barrier.wait()
            return total
        return reduce


@pytest.mark.parametrize("rule", ["sum", "sago", "sago_retain", "pcgrad", "pcgrad_global", "blur", "gru", "gru_ema"])
@pytest.mark.parametrize("streamed", [False, True])
def test_rules_on_two_shards_equal_whole(rule, streamed):
    """Hand vectors split like FSDP (dim 0, uneven last chunk): each shard's combined gradient is the
    matching slice of the whole one, and the stats agree (two chained steps for the stateful gru)."""
    f = [torch.tensor([[1.0, -2.0], [3.0, 0.5], [-1.0, 2.0]], dtype=torch.float64), torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)]
    r = [torch.tensor([[-1.0, 1.0], [2.0, -0.5], [1.0, 1.0]], dtype=torch.float64), torch.tensor([1.0, 1.0, -3.0], dtype=torch.float64)]
    def cut(ts, k):
        return [t[:2] if k == 0 else t[2:] for t in ts]  # torch.chunk(3, 2): 2 + 1 rows

    def run(grads_f, grads_r, reduce, state):
        outs, stats = [], []
        for step in range(2):
            sf, sr = [g * (1 + step) for g in grads_f], [g * (1 - 2 * step) for g in grads_r]
            if streamed:
                got: list = [None] * len(sf)
                st = combine_into(rule, list(sf), list(sr), got.__setitem__, alpha=0.5, gamma=1.5, state=state,
                                  per_module_names=["w", "b"], reduce=reduce)
            else:
                got, st = combine(rule, sf, sr, alpha=0.5, gamma=1.5, state=state, per_module_names=["w", "b"],
                                  reduce=reduce)
            outs.append(got)
            stats.append(st)
        return outs, stats

    whole, whole_stats = run(f, r, None, RuleState())
    group, results = _TwoShards(), [None, None]

    def shard(k: int) -> None:
        results[k] = run(cut(f, k), cut(r, k), group.reducer(k), RuleState())

    threads = [threading.Thread(target=shard, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results[0] is not None and results[1] is not None
    for step in range(2):
        for i in range(2):
            joined = torch.cat([results[0][0][step][i], results[1][0][step][i]])
            torch.testing.assert_close(joined, whole[step][i], atol=1e-12, rtol=1e-12)
        for k in (0, 1):
            got, want = results[k][1][step], whole_stats[step]
            assert set(got) == set(want)
            for key in ("cos_f_r", "cos_g_f", "cos_g_r", "conflict_share"):
                assert got[key] == pytest.approx(want[key], abs=1e-12), (key, k)
                for name in ("w", "b"):
                    assert got["modules"][name][key] == pytest.approx(want["modules"][name][key], abs=1e-12)
    assert group.calls[0] == group.calls[1] <= 4  # one call per rule + one for the stats, per step


def _torchrun(*args):
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
           *map(str, args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_sharded_checkpoints_resume_exactly_with_the_cache_and_across_process_counts(tmp_path):
    """2 FSDP processes stopped after step 2 and resumed = 1 process uninterrupted; the FSDP-written checkpoint
    (full state dicts) also resumes in one process; the θ0 cache is on (ranks agree before each frozen forward).

    The rule is pcgrad, not sago: with a KL retain term the first step's retain gradient is zero up to rounding
    (θ = θ0), and sago's per-coordinate sign test then follows float noise, which differs between 1 and 2
    processes (measured 3e-3 apart after 4 steps; sum and pcgrad agree to 2e-14)."""
    import shutil

    w = _worker()
    ck = tmp_path / "ck"
    _torchrun(tmp_path / "unused.json", "resume", 2, ck, 2)
    state = torch.load(ck / "checkpoint.pt", weights_only=True)
    assert state["step"] == 2 and state["format"] == 2
    names = set(state["optimizer"]["state"])  # AdamW state of every trained parameter, by name, gathered in full
    assert names and names <= set(state["model"]) and all(state["optimizer"]["state"][n]["exp_avg"].shape ==
                                                          state["model"][n].shape for n in names)
    shutil.copytree(ck, tmp_path / "ck_step2")
    _torchrun(tmp_path / "two.json", "resume", 2, ck, 0)
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["num_processes"] == 2 and two["steps"] == [1.0, 2.0, 3.0, 4.0]
    w.run_resume(tmp_path / "one.json", 4, str(tmp_path / "ck_one"), 0)
    one = json.loads((tmp_path / "one.json").read_text())
    w.run_resume(tmp_path / "cross.json", 4, str(tmp_path / "ck_step2"), 0)  # 1 process resumes FSDP's checkpoint
    cross = json.loads((tmp_path / "cross.json").read_text())
    for other in (two, cross):
        for a, b in zip(one["params"], other["params"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), **TOL)


def test_fsdp_checks_the_cache_on_every_rank(monkeypatch):
    """With the θ0 cache under FSDP, one rank's miss makes every rank run the live (collective) forward."""
    from types import SimpleNamespace

    from obliviate.modeling.cache import CacheBudget
    from obliviate.train import unlearn as u

    budget = CacheBudget("exact", 4.0, 64, False, log=lambda s: None)
    cache = budget.role("asu", "teacher", 10, "kl")
    cache.store[0] = ("stored",)
    calls = []
    monkeypatch.setattr(cache, "get", lambda batch, mine, model, live, force_live=False: calls.append(force_live))
    monkeypatch.setattr(u, "_sharded", lambda m: True)
    side = SimpleNamespace(caches={"teacher": cache})
    for others_miss in (True, False):
        monkeypatch.setattr(u, "_any_rank", lambda flag, o=others_miss: flag or o)
        u.Side._frozen(side, "teacher", {}, [0], None, lambda: "live")
    assert calls == [True, False]  # this rank holds example 0; another rank's miss forces the live forward
