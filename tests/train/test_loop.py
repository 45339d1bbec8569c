"""The loop: learning happens, accumulation 1x4 == 4x1, seeded runs repeat, atomic output."""
import copy

import pytest
import torch
from helpers import interrupt_after

from obliviate.config import CombineConfig, MethodConfig, TrainConfig
from obliviate.errors import ObliviateError
from obliviate.modeling.load import atomic_dir
from obliviate.modeling.teacher import Teacher
from obliviate.train.unlearn import finetune, unlearn


def _cfg(**kw):
    return TrainConfig(**{"progress": False, "weight_decay": 0.0, "scheduler": "constant", **kw})


def test_finetune_lowers_nll(small_world, small_tok):
    from obliviate.modeling.tiny import tiny_llama

    model = tiny_llama(small_tok, hidden_size=32, num_layers=1, seed=1)
    res = finetune(model, small_tok, small_world.splits["full"][:32], _cfg(max_steps=30, batch_size=8, lr=1e-2), max_length=64)
    assert res.history[-1]["nll"] < 0.5 * res.history[0]["nll"]


@pytest.mark.parametrize("method", [
    MethodConfig(forget="asu", forget_args={"tau": 3.0, "layers": [0]}, retain="kl"),
    MethodConfig(forget="ga", retain="nll"),
    # nll, not kl: at θ0 the KL retain gradient is exactly zero in theory and ~1e-20 float noise,
    # whose sign would decide SAGO's conflict mask differently in the two runs
    MethodConfig(forget="asu", forget_args={"tau": 3.0, "layers": [0]}, retain="nll", combine=CombineConfig(rule="sago")),
    MethodConfig(forget="npo", retain="nll", combine=CombineConfig(rule="pcgrad")),
], ids=["asu_kl", "graddiff", "asu_gd_sago", "npo_pcgrad"])
def test_accumulation_1x4_equals_4x1(method, small_world, small_tok, trained_small):
    forget, retain = small_world.splits["forget10"], small_world.splits["retain90"]
    # float64: Adam divides by sqrt(v), so float32 rounding in near-zero gradients becomes lr-sized noise
    a, b = copy.deepcopy(trained_small).double(), copy.deepcopy(trained_small).double()
    unlearn(a, small_tok, forget, retain, method, _cfg(max_steps=3, batch_size=4, grad_accum=1, lr=1e-3), max_length=64)
    unlearn(b, small_tok, forget, retain, method, _cfg(max_steps=3, batch_size=1, grad_accum=4, lr=1e-3), max_length=64)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-10, rtol=1e-9)
    assert any(not torch.equal(pa, p0) for pa, p0 in zip(a.parameters(), trained_small.parameters()))


def test_asu_moves_student_towards_teacher_and_keeps_teacher(small_world, small_tok, trained_small):
    from obliviate.data.tokenize import collate, pad_id
    from obliviate.modeling.frozen import FrozenModels
    from obliviate.modeling.logprobs import forward_stats, masked_token_kl
    from obliviate.train.unlearn import encode_rows

    forget = small_world.splits["forget10"]
    batch = collate(encode_rows(small_tok, forget, 64), pad_id(small_tok))
    frozen = FrozenModels(trained_small, Teacher(4.0, (0,)))
    teacher = frozen.teacher_stats(batch)
    student = copy.deepcopy(trained_small)
    with torch.no_grad():
        before = masked_token_kl(teacher, forward_stats(student, batch)).mean().item()
    unlearn(student, small_tok, forget, small_world.splits["retain90"],
            MethodConfig(forget="asu", forget_args={"tau": 4.0, "layers": [0]}, retain="kl"),
            _cfg(max_steps=8, batch_size=8, lr=3e-4), max_length=64)
    with torch.no_grad():
        after = masked_token_kl(teacher, forward_stats(student, batch)).mean().item()
    assert after < 0.5 * before
    torch.testing.assert_close(frozen.teacher_stats(batch).logits, teacher.logits)  # θ0 untouched


def test_seeded_runs_repeat(small_world, small_tok, trained_small):
    runs = []
    for _ in range(2):
        m = copy.deepcopy(trained_small)
        runs.append(unlearn(m, small_tok, small_world.splits["forget10"], small_world.splits["retain90"],
                            MethodConfig(forget="ga", retain="nll"), _cfg(max_steps=2, batch_size=4, lr=1e-3),
                            max_length=64).history)
    strip = [[{k: v for k, v in h.items() if k != "step_seconds"} for h in run] for run in runs]
    assert strip[0] == strip[1]


def test_atomic_dir_leaves_nothing_on_error_and_keeps_old(tmp_path):
    target = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as d:
            (d / "half.txt").write_text("x")
            raise RuntimeError("boom")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(ObliviateError, match="already exists"):
        with atomic_dir(target):
            pass
    with atomic_dir(target, overwrite=True) as d:
        (d / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]


@pytest.mark.parametrize("forget,rule", [("npo", "gru"), ("npo", "sum"), ("idk_dpo", "sum")])
def test_resumed_run_equals_uninterrupted(forget, rule, small_world, small_tok, trained_small, tmp_path):
    """Stop after 2 of 4 steps (checkpoint), resume in a fresh call: same parameters and history (idk_dpo: the
    refusals drawn per access at steps 3 and 4 are those of the uninterrupted run).

    In-process (KeyboardInterrupt from the loop); test_checkpoint.py kills real processes (SIGKILL, SIGINT)."""
    method = MethodConfig(forget=forget, retain="nll", combine=CombineConfig(rule=rule))
    forget, retain = small_world.splits["forget10"], small_world.splits["retain90"]
    full = copy.deepcopy(trained_small)
    ref = unlearn(full, small_tok, forget, retain, method, _cfg(max_steps=4, batch_size=2, grad_accum=2, lr=1e-3),
                  max_length=64)
    ck = tmp_path / "ck"
    part = copy.deepcopy(trained_small)
    with pytest.raises(KeyboardInterrupt):
        interrupt_after(2, lambda: unlearn(part, small_tok, forget, retain, method,
                                            _cfg(max_steps=4, batch_size=2, grad_accum=2, lr=1e-3,
                                                 checkpoint_dir=str(ck), checkpoint_every=2), max_length=64))
    assert (ck / "checkpoint.pt").is_file()
    resumed_model = copy.deepcopy(trained_small)  # resuming starts from θ0 again, like a new process
    from obliviate.train import loop

    original, calls = loop._finish_step, []
    loop._finish_step = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        res = unlearn(resumed_model, small_tok, forget, retain, method,
                      _cfg(max_steps=4, batch_size=2, grad_accum=2, lr=1e-3, checkpoint_dir=str(ck),
                           checkpoint_every=2), max_length=64)
    finally:
        loop._finish_step = original
    assert len(calls) == 2, "the resumed run must only do the 2 remaining steps"
    for a, b in zip(full.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    key = [k for k in ref.history[0] if k != "step_seconds"]
    assert [[h[k] for k in key] for h in res.history] == [[h[k] for k in key] for h in ref.history]
