"""The loop is pinned to its own math: what it writes into .grad, and what the objective is handed.

Each test computes the expected quantity on a separate path (one collated batch of every example,
autograd on a fresh copy of θ0) and compares it with what `unlearn` actually did. The optimiser is
replaced by plain SGD with lr 1, no clipping and no decay, so one step moves θ by exactly −.grad.
"""
import copy
from dataclasses import replace

import pytest
import torch

from obliviate.config import CombineConfig, MethodConfig, TrainConfig
from obliviate.data.tokenize import collate, pad_id
from obliviate.gradients import RuleState, combine
from obliviate.modeling.logprobs import forward_stats
from obliviate.objectives import FORGET, RETAIN
from obliviate.train.unlearn import encode_rows, unlearn

N = 4  # forget and retain examples; batch_size N makes the one step's micro-batch all of them
ALPHA, GAMMA = 2.0, 0.5  # different, so swapping them changes every expected gradient


def _cfg(batch_size=N, grad_accum=1):
    return TrainConfig(max_steps=1, batch_size=batch_size, grad_accum=grad_accum, lr=1.0, max_grad_norm=None,
                       weight_decay=0.0, scheduler="constant", progress=False)


def _grads(model, loss):
    params = [p for p in model.parameters() if p.requires_grad]
    return list(torch.autograd.grad(loss, params, allow_unused=True))


def _side_grads(theta0, tok, rows, spec_name, registry, kwargs, max_length=64):
    """∇ of the registered loss on ONE batch holding every row, on a fresh copy of θ0 (train mode, as the loop)."""
    model = copy.deepcopy(theta0).train()
    batch = collate(encode_rows(tok, rows, max_length), pad_id(tok))
    spec = registry.get(spec_name)
    loss_kw, _ = spec.resolve(kwargs)
    return _grads(model, spec.fn(forward_stats(model, batch), **loss_kw))


@pytest.mark.parametrize("rule,separate", [("sum", False), ("sum", True), ("sago", True), ("pcgrad", True),
                                           ("pcgrad_global", True), ("sago_retain", True)])
def test_step_writes_combine_of_separate_gradients(rule, separate, plain_sgd, small_world, small_tok, trained_small):
    forget, retain = small_world.splits["forget10"][:N], small_world.splits["retain90"][:N]
    g_f = _side_grads(trained_small, small_tok, forget, "ga", FORGET, {})
    g_r = _side_grads(trained_small, small_tok, retain, "nll", RETAIN, {})
    expected, _ = combine(rule, g_f, g_r, alpha=ALPHA, gamma=GAMMA, state=RuleState())
    # the test can see a wrong rule or swapped weights: each alternative differs from the expectation
    for alt_rule, a, g in [("sum", ALPHA, GAMMA), (rule, GAMMA, ALPHA)]:
        if (alt_rule, a, g) != (rule, ALPHA, GAMMA):
            alt, _ = combine(alt_rule, g_f, g_r, alpha=a, gamma=g, state=RuleState())
            assert max(float((x - y).abs().max()) for x, y in zip(alt, expected)) > 1e-3

    model = copy.deepcopy(trained_small)
    before = [p.detach().clone() for p in model.parameters()]
    method = MethodConfig(forget="ga", retain="nll", alpha=ALPHA, gamma=GAMMA,
                          combine=CombineConfig(rule=rule, separate_backward=separate or None))
    unlearn(model, small_tok, forget, retain, method, _cfg(), max_length=64)
    for p0, p1, g in zip(before, model.parameters(), expected):
        torch.testing.assert_close(p0 - p1.detach(), g, rtol=2e-4, atol=2e-6)


def test_gru_step_uses_its_state(plain_sgd, small_world, small_tok, trained_small):
    """gru from a fresh state: the loop's update equals combine('gru', ...) with a fresh RuleState."""
    forget, retain = small_world.splits["forget10"][:N], small_world.splits["retain90"][:N]
    g_f = _side_grads(trained_small, small_tok, forget, "ga", FORGET, {})
    g_r = _side_grads(trained_small, small_tok, retain, "nll", RETAIN, {})
    expected, _ = combine("gru", g_f, g_r, alpha=ALPHA, gamma=GAMMA, state=RuleState())
    model = copy.deepcopy(trained_small)
    before = [p.detach().clone() for p in model.parameters()]
    unlearn(model, small_tok, forget, retain, MethodConfig(forget="ga", retain="nll", alpha=ALPHA, gamma=GAMMA,
                                                           combine=CombineConfig(rule="gru")), _cfg(), max_length=64)
    for p0, p1, g in zip(before, model.parameters(), expected):
        torch.testing.assert_close(p0 - p1.detach(), g, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("tau,layers", [(3.0, [1]), (1.5, None), (6.0, [0])])
def test_objective_sees_the_configured_teacher(tau, layers, monkeypatch, small_world, small_tok, trained_small):
    """The teacher handed to the ASU loss equals smoothed_teacher(θ0, τ, layers) for the configured τ, layers."""
    from obliviate.modeling.smoothing import smoothed_teacher

    seen = []
    spec = FORGET.get("asu")

    def spy(policy, teacher, **kw):
        seen.append(teacher)
        return spec.fn(policy, teacher, **kw)

    monkeypatch.setitem(FORGET._items, "asu", replace(spec, fn=spy))
    forget, retain = small_world.splits["forget10"][:N], small_world.splits["retain90"][:N]
    model = copy.deepcopy(trained_small)
    args = {"tau": tau, "layers": layers}
    unlearn(model, small_tok, forget, retain, MethodConfig(forget="asu", forget_args=args, retain="kl"),
            TrainConfig(max_steps=1, batch_size=N, progress=False), max_length=64)
    assert len(seen) == 1
    batch = collate(encode_rows(small_tok, forget, 64), pad_id(small_tok))
    with torch.no_grad():
        want = forward_stats(smoothed_teacher(copy.deepcopy(trained_small), tau, layers), batch)
        plain = forward_stats(copy.deepcopy(trained_small).eval(), batch)
        other = forward_stats(smoothed_teacher(copy.deepcopy(trained_small), 2.0, None), batch)
    got = seen[0]
    # the loop's micro-batch is a permutation of the rows: compare each example by its token ids
    order = [next(j for j in range(N) if torch.equal(got.targets[i], want.targets[j])) for i in range(N)]
    assert sorted(order) == list(range(N))
    wanted = want.log_probs()[order]
    torch.testing.assert_close(got.log_probs(), wanted, rtol=1e-5, atol=1e-5)
    mask = got.mask.unsqueeze(-1)
    for alt in (plain, other):  # the test could tell: θ0 unsmoothed, or the paper default (2, all layers)
        assert float(((alt.log_probs()[order] - wanted).abs() * mask).max()) > 1e-3


@pytest.mark.parametrize("rule", ["sum", "sago"])
@pytest.mark.parametrize("reduction", ["token", "example"])
def test_accumulated_step_writes_the_same_combination(rule, reduction, plain_sgd, small_world, small_tok,
                                                      trained_small):
    """2 micro-batches of 2 accumulated = one batch of 4: token pooling counts the whole step's tokens."""
    forget, retain = small_world.splits["forget10"][:N], small_world.splits["retain90"][:N]
    args = {"reduction": reduction}
    g_f = _side_grads(trained_small, small_tok, forget, "ga", FORGET, args)
    g_r = _side_grads(trained_small, small_tok, retain, "nll", RETAIN, args)
    expected, _ = combine(rule, g_f, g_r, alpha=ALPHA, gamma=GAMMA, state=RuleState())
    model = copy.deepcopy(trained_small)
    before = [p.detach().clone() for p in model.parameters()]
    method = MethodConfig(forget="ga", forget_args=args, retain="nll", retain_args=args, alpha=ALPHA, gamma=GAMMA,
                          combine=CombineConfig(rule=rule, separate_backward=True))
    unlearn(model, small_tok, forget, retain, method, _cfg(batch_size=N // 2, grad_accum=2), max_length=64)
    for p0, p1, g in zip(before, model.parameters(), expected):
        torch.testing.assert_close(p0 - p1.detach(), g, rtol=2e-4, atol=2e-6)


def test_gru_gamma_reaches_the_rule_and_the_fingerprint(monkeypatch, small_world, small_tok, trained_small):
    """method.combine.args.gru_gamma is handed to the rule (its spec, looked up once) at every step and recorded in
    the run's settings; a rule that takes no such setting refuses it before the run starts."""
    from obliviate import gradients
    from obliviate.errors import ConfigError
    from obliviate.train import loop
    from obliviate.train.unlearn import resolve_method

    seen, original = [], gradients.combine_into

    def spy(rule, *a, params=None, **kw):
        seen.append((rule, params))
        return original(rule, *a, params=params, **kw)

    monkeypatch.setattr(loop, "combine_into", spy)
    method = MethodConfig(forget="ga", retain="nll", combine=CombineConfig(rule="gru", args={"gru_gamma": 0.9}))
    unlearn(copy.deepcopy(trained_small), small_tok, small_world.splits["forget10"][:N],
            small_world.splits["retain90"][:N], method, replace(_cfg(), max_steps=2), max_length=64)
    assert seen == [(gradients.RULES.get("gru"), {"gru_gamma": 0.9})] * 2
    assert resolve_method(method).settings()["combine"] == {"rule": "gru", "separate_backward": True, "gru_gamma": 0.9}
    default = MethodConfig(forget="ga", retain="nll", combine=CombineConfig(rule="gru"))
    assert resolve_method(default).settings()["combine"]["gru_gamma"] == 0.8
    sago = MethodConfig(forget="ga", retain="nll", combine=CombineConfig(rule="sago", args={"gru_gamma": 0.9}))
    with pytest.raises(ConfigError, match=r"method.combine.args: rule 'sago' takes no setting\(s\) \['gru_gamma'\]"):
        resolve_method(sago)
