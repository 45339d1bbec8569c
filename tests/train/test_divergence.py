"""A diverging run stops with a DivergenceError naming the step: no optimizer step on non-finite gradients,
no checkpoint of the bad step (the last good one stays), bounded losses that explode are caught, GA is not."""
import math

import pytest
import torch

from obliviate.config import MethodConfig, TrainConfig
from obliviate.errors import DivergenceError, ObliviateError
from obliviate.train import loop, optim
from obliviate.train.guard import DivergenceGuard
from obliviate.train.unlearn import unlearn


def _cfg(**kw):
    return TrainConfig(**{"progress": False, "weight_decay": 0.0, "scheduler": "constant", **kw})


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


# --- the rules, on logged values -------------------------------------------------------------------------

def test_guard_names_the_term_and_the_fix():
    g = DivergenceGuard(lr=1e-3, max_grad_norm=None)
    g.check_step(1, {"step": 1.0, "lr": 1e-3, "forget": 2.0, "retain": 0.5, "loss": 2.5, "grad_norm": 1.0})
    with pytest.raises(DivergenceError, match=r"step 4: the retain loss is nan.*train\.lr \(now 0\.001\).*"
                                              r"enable gradient clipping") as err:
        g.check_step(4, {"forget": 1.0, "retain": math.nan, "loss": math.nan, "grad_norm": 1.0})
    assert isinstance(err.value, ObliviateError)  # the CLI prints it and exits 2
    with pytest.raises(DivergenceError, match="step 5: the gradient norm is inf"):
        g.check_step(5, {"forget": 1.0, "retain": 1.0, "loss": 2.0, "grad_norm": math.inf})


def test_guard_explosion_only_for_terms_bounded_below():
    g = DivergenceGuard(lr=1e-3, max_grad_norm=1.0)
    g.check_step(1, {"forget": -2.0, "retain": 0.0, "loss": -2.0, "grad_norm": 1.0})  # GA starts negative
    g.check_step(2, {"forget": -3.5e7, "retain": 9e3, "loss": -3.5e7, "grad_norm": 1.0})  # GA falls: fine
    with pytest.raises(DivergenceError, match=r"step 3: the retain loss exploded to 2e\+04 .*max_grad_norm=1 now"):
        g.check_step(3, {"forget": -4e7, "retain": 2e4, "loss": -4e7, "grad_norm": 1.0})
    with pytest.raises(DivergenceError, match="step 4: the forget loss is -inf"):
        g.check_step(4, {"forget": -math.inf, "retain": 1.0, "loss": -math.inf, "grad_norm": 1.0})


def test_guard_checks_the_weights_after_the_step():
    w = torch.nn.Parameter(torch.ones(4))
    g = DivergenceGuard(lr=1.0, max_grad_norm=None)
    g.start([], [w])
    with torch.no_grad():
        w.mul_(500.0)
    g.check_weights(1, [w])  # 500x: allowed
    with torch.no_grad():
        w.mul_(2000.0)
    with pytest.raises(DivergenceError, match="step 2: the weights' norm grew"):
        g.check_weights(2, [w])
    with torch.no_grad():
        w[0] = math.nan
    with pytest.raises(DivergenceError, match="step 3: the weights are non-finite"):
        g.check_weights(3, [w])


# --- the loop: a loss or gradient that turns NaN at step 3 -----------------------------------------------

def _run_toy(tmp_path, bad, checkpoint=True, steps=5):
    """A linear model trained by run_loop; `bad(step, loss, weight)` spoils step 3. Returns model, snapshots, error."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    step = [0]

    def compute(micro, part):
        loss = ((model(x) - y) ** 2).mean()
        return 1.0, bad(step[0] + 1, loss, model.weight) if step[0] + 1 == 3 else loss

    cfg = _cfg(max_steps=steps, lr=1e-2, max_grad_norm=None,
               **({"checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every": 1} if checkpoint else {}))
    acc = loop.make_accelerator(cfg)
    opt, sched = optim.make_optimizer(model, cfg, steps, 0)
    snaps, original = [], loop._finish_step

    def finish(*a, **k):
        entry = original(*a, **k)
        step[0] += 1
        snaps.append(_params(model))
        return entry

    loop._finish_step = finish
    try:
        with pytest.raises(DivergenceError) as err:
            loop.run_loop(model, iter(range(100)), loop.LossPlan(parts=("forget",), compute=compute), cfg, steps,
                          acc, opt, sched, fingerprint=lambda: {"task": "toy"})
    finally:
        loop._finish_step = original
    return model, snaps, err.value


@pytest.mark.parametrize("spoil", ["loss", "grad"])
def test_no_step_on_non_finite_and_last_good_checkpoint_kept(spoil, tmp_path):
    def nan_loss(step, loss, w):
        return loss * math.nan

    def nan_grad(step, loss, w):  # finite loss (+0), but d sqrt(u)/du at u = 0 is inf, times 0: a NaN gradient
        return loss + torch.sqrt(((w - w.detach()) ** 2).sum())

    model, snaps, err = _run_toy(tmp_path, nan_loss if spoil == "loss" else nan_grad)
    assert len(snaps) == 2, "steps 1 and 2 succeed, step 3 raises"
    what = "the forget loss is nan" if spoil == "loss" else "the gradient norm is nan"
    assert f"step 3: {what}" in str(err) and "still holds step 2" in str(err)
    for now, after2 in zip(_params(model), snaps[1]):  # the optimizer never stepped on the NaN gradients
        assert torch.equal(now, after2)
    saved = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 2 and [p.name for p in (tmp_path / "ck").iterdir()] == ["checkpoint.pt"]
    for (name, value), after2 in zip(saved["model"].items(), snaps[1]):
        assert torch.isfinite(value).all() and torch.equal(value, after2), name


# --- a tiny LM with train.lr=1e6 / inf -------------------------------------------------------------------

@pytest.mark.parametrize("lr", [1e6, math.inf], ids=["1e6", "inf"])
def test_huge_lr_raises_at_step_one(lr, small_world, small_tok):
    from obliviate.modeling.tiny import tiny_llama

    model = tiny_llama(small_tok, hidden_size=32, num_layers=1, seed=1)
    cfg = _cfg(max_steps=4, batch_size=4)
    object.__setattr__(cfg, "lr", lr)  # the loop's guard, whether or not the config accepts inf
    with pytest.raises(DivergenceError, match=r"diverged at optimizer step 1: the weights.*Lower train\.lr"):
        unlearn(model, small_tok, small_world.splits["forget10"], small_world.splits["retain90"],
                MethodConfig(forget="ga", retain="nll"), cfg, max_length=64)


def test_huge_lr_after_warmup_keeps_the_last_good_checkpoint(small_world, small_tok, tmp_path):
    """Linear warm-up: lr 0 at step 1 (a good step, checkpointed), 5e5 at step 2 (diverges)."""
    from obliviate.modeling.tiny import tiny_llama

    model = tiny_llama(small_tok, hidden_size=32, num_layers=1, seed=1)
    snaps, original = [], loop._finish_step
    loop._finish_step = lambda *a, **k: (original(*a, **k), snaps.append(_params(model)))[0]
    try:
        with pytest.raises(DivergenceError, match=r"optimizer step 2: .*still holds step 1"):
            unlearn(model, small_tok, small_world.splits["forget10"], small_world.splits["retain90"],
                    MethodConfig(forget="ga", retain="nll"),
                    _cfg(max_steps=4, batch_size=4, lr=1e6, scheduler="linear", warmup_ratio=0.5,
                         checkpoint_dir=str(tmp_path), checkpoint_every=1), max_length=64)
    finally:
        loop._finish_step = original
    assert len(snaps) == 1
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 1 and len(saved["history"]) == 1
    named = dict(zip([n for n, _ in model.named_parameters()], snaps[0]))
    for name, value in saved["model"].items():
        assert torch.isfinite(value).all(), name
        if name in named:
            assert torch.equal(value, named[name]), name
    assert max(float(p.detach().abs().max()) for p in model.parameters()) > 1e3  # in memory: the diverged step 2
