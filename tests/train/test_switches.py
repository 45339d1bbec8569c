"""train.group_by_length, gradient_checkpointing, compile and precision: what each changes, and what it must not."""
import copy
import os

import pytest
import torch

from obliviate.config import MethodConfig, TrainConfig
from obliviate.data.pairing import paired_batches
from obliviate.data.tokenize import collate, pad_id
from obliviate.train.unlearn import by_length, encode_rows, unlearn, with_steps


def _run(model, small_world, small_tok, steps=2, **train):
    forget, retain = small_world.splits["forget10"][:8], small_world.splits["retain90"][:8]
    cfg = TrainConfig(max_steps=steps, lr=1e-3, weight_decay=0.0, scheduler="constant", progress=False,
                      **{"batch_size": 2, "grad_accum": 2, "share_prefix": False, **train})  # only the switch differs
    res = unlearn(model, small_tok, forget, retain, MethodConfig(forget="ga", retain="nll"), cfg, max_length=64)
    return res, model


def _max_diff(a, b):
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def test_by_length_sorts_the_step_and_keeps_sizes():
    # lengths 5 1 4 2 3 -> order 1 3 4 2 0, cut into micro-batches of the original sizes (2, 3)
    assert by_length([[0, 1], [2, 3, 4]], [5, 1, 4, 2, 3]) == [[1, 3], [4, 2, 0]]


def test_group_by_length_pads_less_with_the_same_step(small_world, small_tok, trained_small):
    enc = encode_rows(small_tok, small_world.splits["forget10"] + small_world.splits["retain90"][:40], 64)
    lengths = [len(e.input_ids) for e in enc]
    n = len(enc)

    def padding(group):
        plan = with_steps(paired_batches(n, 0, 2, seed=0), 4, (lengths, []) if group else None)
        pads, steps = 0, []
        for _ in range(4 * 6):  # 6 optimizer steps of 4 micro-batches
            f, _, (fstep, _), _ = next(plan)
            b = collate([enc[i] for i in f], pad_id(small_tok))
            pads += int((b["attention_mask"] == 0).sum())
            steps.append(sorted(fstep[0]))
        return pads, steps

    (p_on, s_on), (p_off, s_off) = padding(True), padding(False)
    assert s_on == s_off  # the same examples in every optimizer step
    assert p_on < 0.7 * p_off, (p_on, p_off)


def test_group_by_length_leaves_the_trajectory(small_world, small_tok, trained_small):
    base = copy.deepcopy(trained_small).double()
    _, on = _run(copy.deepcopy(base), small_world, small_tok, group_by_length=True)
    _, off = _run(copy.deepcopy(base), small_world, small_tok, group_by_length=False)
    assert _max_diff(on, off) < 1e-10 and _max_diff(on, base) > 1e-4


def _count_mlp_calls(model, calls):
    """Count layer 0's down_proj forwards (module hooks do not fire in checkpoint recomputation; the method does)."""
    proj = model.model.layers[0].mlp.down_proj
    inner = proj.forward
    proj.forward = lambda x: (calls.append(1), inner(x))[1]


def test_gradient_checkpointing_recomputes_layers_with_the_same_result(small_world, small_tok, trained_small):
    base = copy.deepcopy(trained_small).double()
    on, off = [], []
    ck, plain = copy.deepcopy(base), copy.deepcopy(base)
    _count_mlp_calls(ck, on)
    _count_mlp_calls(plain, off)
    _run(ck, small_world, small_tok, gradient_checkpointing=True)
    _run(plain, small_world, small_tok)
    assert len(on) == 2 * len(off) > 0  # layer 0 runs again in each backward
    assert _max_diff(ck, plain) < 1e-10 and _max_diff(plain, base) > 1e-4


def test_compile_compiles_every_decoder_layer_with_the_same_result(small_world, small_tok, trained_small):
    base = copy.deepcopy(trained_small)
    comp = copy.deepcopy(base)
    _run(comp, small_world, small_tok, compile=True, compile_backend="aot_eager")
    assert all(layer._compiled_call_impl is not None for layer in comp.model.layers)
    plain = copy.deepcopy(base)
    _run(plain, small_world, small_tok)
    assert _max_diff(comp, plain) < 1e-5 and _max_diff(plain, base) > 1e-4


def test_bf16_autocast_runs_matmuls_in_bf16_and_keeps_fp32_weights_and_loss(small_world, small_tok, trained_small):
    from obliviate.modeling.logprobs import forward_stats
    from obliviate.train.switches import autocast

    batch = collate(encode_rows(small_tok, small_world.splits["forget10"][:4], 64), pad_id(small_tok))
    model = copy.deepcopy(trained_small)
    with torch.no_grad():
        ref = forward_stats(model, batch)
        with autocast("bf16", torch.device("cpu")):
            half = forward_stats(model, batch)
    assert half.logits.dtype == torch.bfloat16  # the LM head ran in bf16 ...
    assert half.token_logp.dtype == torch.float32 and half.answer_log_probs().dtype == torch.float32  # ... softmax in fp32
    rel = float((half.nll - ref.nll).abs().max() / ref.nll.abs().max())
    assert 0 < rel < 0.05
    res, trained = _run(copy.deepcopy(trained_small), small_world, small_tok, precision="bf16")
    assert all(p.dtype == torch.float32 for p in trained.parameters())
    _, fp32 = _run(copy.deepcopy(trained_small), small_world, small_tok)
    assert 0 < _max_diff(trained, fp32) < 5e-3


def test_precision_is_checked():
    with pytest.raises(Exception, match="train.precision"):
        TrainConfig(precision="fp8")


def test_deterministic_training_turns_on_torchs_deterministic_algorithms_and_cublas_workspace(monkeypatch):
    """train.deterministic: the accelerator's process runs torch's deterministic algorithms (warning, not failing,
    where an op has none) with cuBLAS's fixed workspace; off by default, and a workspace set by the user is kept."""
    import torch

    from obliviate.config import TrainConfig
    from obliviate.train.loop import make_accelerator

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        make_accelerator(TrainConfig(progress=False))
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        make_accelerator(TrainConfig(progress=False, deterministic=True))
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        make_accelerator(TrainConfig(progress=False, deterministic=True))
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)
