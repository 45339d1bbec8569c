"""Forget objectives and retain terms: values worked out by hand, masking, registry errors."""
import math

import pytest
import torch

from obliviate.errors import ConfigError
from obliviate.modeling.logprobs import TokenStats, token_stats
from obliviate.objectives import FORGET, RETAIN


def stats(probs, mask):
    """TokenStats from explicit next-token distributions [B, T, V] and a mask [B, T]."""
    logits = torch.tensor(probs, dtype=torch.float64).log()
    mask = torch.tensor(mask, dtype=torch.bool)
    return TokenStats(logits=logits, token_logp=torch.zeros(mask.shape, dtype=torch.float64), mask=mask)


def test_asu_hand_value():
    # teacher (0.5, 0.5), student (0.25, 0.75): KL = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.143841
    teacher, student = stats([[[0.5, 0.5]]], [[1]]), stats([[[0.25, 0.75]]], [[1]])
    got = FORGET.get("asu").fn(student, teacher)
    assert got.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-9)


def test_asu_ignores_masked_positions_and_averages_per_example():
    # example 0: one counted token with KL k1, then a masked position with a huge KL that must not count;
    # example 1: two counted tokens, KL k1 and 0 -> per-example means k1 and k1/2 -> batch mean 0.75 k1
    # (the default, "example"); "token" pools the three tokens: (k1 + k1 + 0)/3 = 2 k1/3
    k1 = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    teacher = stats([[[0.5, 0.5], [0.999, 0.001]], [[0.5, 0.5], [0.3, 0.7]]], [[1, 0], [1, 1]])
    student = stats([[[0.25, 0.75], [0.001, 0.999]], [[0.25, 0.75], [0.3, 0.7]]], [[1, 0], [1, 1]])
    got = FORGET.get("asu").fn(student, teacher)
    assert got.item() == pytest.approx(0.75 * k1, abs=1e-9)
    assert FORGET.get("asu").fn(student, teacher, reduction="token").item() == pytest.approx(2 * k1 / 3, abs=1e-9)


def test_ga_and_nll_hand_values():
    # token log-probs -1, -2 counted, a padded position (-50) not: NLL = 1.5, GA = -1.5
    s = TokenStats(logits=None, token_logp=torch.tensor([[-1.0, -2.0, -50.0]]), mask=torch.tensor([[True, True, False]]))
    assert FORGET.get("ga").fn(s).item() == pytest.approx(-1.5)
    assert RETAIN.get("nll").fn(s).item() == pytest.approx(1.5)
    # two examples of 2 and 1 answer tokens: (-1, -2) and (-6): token mean (1 + 2 + 6)/3 = 3 (default),
    # example mean (1.5 + 6)/2 = 3.75
    s = TokenStats(logits=None, token_logp=torch.tensor([[-1.0, -2.0], [-6.0, 0.0]]),
                   mask=torch.tensor([[True, True], [True, False]]))
    assert FORGET.get("ga").fn(s).item() == pytest.approx(-3.0)
    assert RETAIN.get("nll").fn(s).item() == pytest.approx(3.0)
    assert FORGET.get("ga").fn(s, reduction="example").item() == pytest.approx(-3.75)
    assert RETAIN.get("nll").fn(s, reduction="example").item() == pytest.approx(3.75)


def test_retain_kl_is_zero_for_identical_and_hand_value():
    ref, pol = stats([[[0.5, 0.5]]], [[1]]), stats([[[0.25, 0.75]]], [[1]])
    assert RETAIN.get("kl").fn(ref, ref).item() == pytest.approx(0.0, abs=1e-12)
    assert RETAIN.get("kl").fn(pol, ref).item() == pytest.approx(0.143841, abs=1e-6)
    # two examples (KL k1, then k1 and 0): "token" (default) 2 k1/3, "example" (k1 + k1/2)/2 = 0.75 k1
    k1 = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    ref = stats([[[0.5, 0.5], [0.9, 0.1]], [[0.5, 0.5], [0.3, 0.7]]], [[1, 0], [1, 1]])
    pol = stats([[[0.25, 0.75], [0.1, 0.9]], [[0.25, 0.75], [0.3, 0.7]]], [[1, 0], [1, 1]])
    assert RETAIN.get("kl").fn(pol, ref).item() == pytest.approx(2 * k1 / 3, abs=1e-9)
    assert RETAIN.get("kl").fn(pol, ref, reduction="example").item() == pytest.approx(0.75 * k1, abs=1e-9)


def test_kl_from_real_logits_never_counts_prompt_or_padding():
    torch.manual_seed(0)
    labels = torch.tensor([[-100, -100, 5, 6, -100]])  # prompt, prompt, answer, answer, pad
    a, b = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    b2 = b.clone()
    b2[0, 0], b2[0, 3:] = torch.randn(8), torch.randn(2, 8)  # change only logits whose targets are not answers
    v1 = RETAIN.get("kl").fn(token_stats(b, labels), token_stats(a, labels))
    v2 = RETAIN.get("kl").fn(token_stats(b2, labels), token_stats(a, labels))
    assert v1.item() == pytest.approx(v2.item(), abs=1e-6)


def test_hyperparameter_typo_names_valid_keys():
    with pytest.raises(ConfigError, match=r"valid keys: \['layers', 'reduction', 'tau'\]"):
        FORGET.get("asu").resolve({"taus": 2.0})


def test_unknown_objective_lists_valid_names():
    with pytest.raises(KeyError, match="valid names: .*asu.*ga"):
        FORGET.get("gradient_ascent")


# What one step of each objective must do on the forget batch (docs/METHODS.md §3 / the issue's contract).
DIRECTION = {"ga": "forget_down", "npo": "forget_down", "simnpo": "forget_down", "wga": "forget_down",
             "satimp": "forget_down", "undial": "forget_down", "me": "entropy_up", "asu": "teacher",
             "idk": "refusal_up", "dpo": "prefer_refusal", "idk_dpo": "prefer_refusal", "rmu": "hidden_to_target"}
ARGS = {"asu": {"tau": 4.0, "layers": [0]}, "rmu": {"layer": 1, "steering_coef": 2.0}}


def test_every_objective_has_a_contract_direction():
    assert set(DIRECTION) == set(FORGET.names()), "add the new objective's intended direction to DIRECTION"


@pytest.fixture(scope="module")
def memorised(small_world, small_tok):
    """A tiny model that has memorised the forget author (forget NLL well below 1), as unlearning assumes."""
    from obliviate.config import TrainConfig
    from obliviate.modeling.tiny import tiny_llama
    from obliviate.train.unlearn import finetune

    model = tiny_llama(small_tok, hidden_size=48, num_layers=2, num_heads=4, seed=3)
    rows = small_world.splits["forget10"] + small_world.splits["retain90"][:30]
    finetune(model, small_tok, rows, TrainConfig(max_steps=80, batch_size=16, lr=5e-3, progress=False, weight_decay=0.0),
             max_length=64)
    return model.eval()


def _measure(kind, model, side, frozen, acc, idx):
    """The quantity the objective should move: forget NLL, refusal NLL, KL to the teacher, or entropy."""
    from obliviate.modeling.logprobs import forward_stats, masked_token_kl
    from obliviate.train.unlearn import _shard_batch

    with torch.no_grad():
        b, _ = _shard_batch(side.enc, idx, acc, 0)
        s = forward_stats(model, b)
        if kind == "hidden_to_target":  # minus the RMU loss itself: the hidden states approach c·u
            from obliviate.objectives.forget import rmu

            return -rmu(forward_stats(model, b, hidden_layer=side.kwargs["layer"]), **side.kwargs).item()
        if kind in ("refusal_up", "prefer_refusal"):  # log-likelihood of the refusal (minus the answer's)
            refusal = forward_stats(model, _shard_batch(side.refusal_enc.at(0), idx, acc, 0)[0])
            return (refusal.logp - (s.logp if kind == "prefer_refusal" else 0)).mean().item()
        if kind == "forget_down":
            return s.nll.mean().item()
        if kind == "teacher":
            return -masked_token_kl(frozen.teacher_stats(b), s).item()
        ent = torch.special.entr(s.log_probs().exp()).sum(-1)  # -p·log p, 0 where p = 0
        return s.mean(ent, "token").item()


@pytest.mark.parametrize("name", FORGET.names())
def test_contract_every_forget_objective(name, small_world, small_tok, memorised):
    """Finite scalar, gradient to the student only, θ0 untouched, and one step moves the intended way."""
    import copy

    from accelerate import Accelerator

    from obliviate.config import MethodConfig
    from obliviate.modeling.frozen import FrozenModels
    from obliviate.train.unlearn import _sides, resolve_method

    rm = resolve_method(MethodConfig(forget=name, forget_args=ARGS.get(name, {}), retain=None))
    side, _ = _sides(rm, MethodConfig(forget=name), small_tok, small_world.splits["forget10"], [], 64, 0)
    student = copy.deepcopy(memorised).train()
    frozen = FrozenModels(student, rm.teacher) if rm.needs_frozen else None
    frozen_before = [p.clone() for p in frozen.model.parameters()] if frozen else []
    acc, idx = Accelerator(cpu=True), list(range(len(side.enc)))
    kind = DIRECTION[name]
    before = _measure(kind, student, side, frozen, acc, idx)
    loss = side.loss(student, frozen, idx, acc, 0)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    if frozen:
        assert all(p.grad is None and not p.requires_grad for p in frozen.model.parameters())
    opt = torch.optim.SGD(student.parameters(), lr=0.05 if name not in ("simnpo", "satimp") else 0.5)
    opt.step()
    after = _measure(kind, student, side, frozen, acc, idx)
    if kind == "forget_down":
        assert after > before, f"{name}: forget NLL {before:.4f} -> {after:.4f} should rise"
    else:
        assert after > before, f"{name}: {kind} measure {before:.4f} -> {after:.4f} should rise"
    for p0, p in zip(frozen_before, frozen.model.parameters() if frozen else []):
        assert torch.equal(p0, p)


def _hidden_stats(h, labels, layer=0):
    """TokenStats carrying decoder layer `layer`'s output h [B, T, H] and the label positions of `labels` [B, T]."""
    labels = torch.tensor(labels)
    return TokenStats(logits=None, token_logp=torch.zeros(h.shape[0], h.shape[1] - 1), mask=labels[:, 1:] != -100,
                      hidden=h, hidden_layer=layer, hidden_mask=labels != -100)


def test_rmu_and_hidden_mse_hand_values():
    from obliviate.objectives.forget import steering_vector

    u = steering_vector(2, seed=0).double()
    # one label token whose layer-0 output is exactly c·u, one prompt token far away: loss 0
    h = torch.stack([torch.tensor([100.0, -100.0], dtype=torch.float64), 5.0 * u]).unsqueeze(0)
    s = _hidden_stats(h, [[-100, 7]])
    assert FORGET.get("rmu").fn(s, layer=0, steering_coef=5.0).item() == pytest.approx(0.0, abs=1e-12)
    # shift the label token by (1, 1): MSE = (1 + 1) / 2 = 1 (the prompt token never counts)
    s.hidden = h + torch.tensor([[[0.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    assert FORGET.get("rmu").fn(s, layer=0, steering_coef=5.0).item() == pytest.approx(1.0)
    ref = _hidden_stats(h, [[-100, 7]])
    assert RETAIN.get("hidden_mse").fn(s, ref, layer=0).item() == pytest.approx(1.0)
    assert abs(u.norm().item() - 1) < 1e-6 and (u >= 0).all()
    with pytest.raises(ValueError, match="layer 0's output, not layer 3's"):
        FORGET.get("rmu").fn(s, layer=3)


def test_rmu_reductions_per_example_and_pooled():
    # hidden_mse against a zero reference, H = 2. Example 0: label tokens with squared errors (per-token means
    # over H) 1 and 3; example 1: one label token with 8, then padding (error 100, never counted).
    # "example" (open-unlearning, default): mean(mean(1, 3), 8) = (2 + 8)/2 = 5; "token": (1 + 3 + 8)/3 = 4
    h = torch.tensor([[[1.0, 1.0], [1.0, 2.2360679774997896964], [0.0, 0.0]],
                      [[4.0, 0.0], [10.0, 10.0], [0.0, 0.0]]], dtype=torch.float64)
    # per-token MSE: (1+1)/2 = 1, (1+5)/2 = 3, 0 | (16+0)/2 = 8, 100, 0
    labels = [[3, 4, -100], [5, -100, -100]]
    pol, ref = _hidden_stats(h, labels), _hidden_stats(torch.zeros_like(h), labels)
    fn = RETAIN.get("hidden_mse").fn
    assert fn(pol, ref, layer=0).item() == pytest.approx(5.0, abs=1e-9)
    assert fn(pol, ref, layer=0, reduction="token").item() == pytest.approx(4.0, abs=1e-9)
    pol.hidden_total = 6.0  # the loop's step-wide count replaces the batch's 3 label tokens
    assert fn(pol, ref, layer=0, reduction="token").item() == pytest.approx(2.0, abs=1e-9)


def test_rmu_trains_only_the_chosen_parameters(small_world, small_tok, memorised):
    import copy

    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.train.unlearn import unlearn

    def changed_by(forget_args, retain_args=None, retain=None):
        model = copy.deepcopy(memorised)
        before = {n: p.clone() for n, p in model.named_parameters()}
        unlearn(model, small_tok, small_world.splits["forget10"], small_world.splits["retain90"],
                MethodConfig(forget="rmu", forget_args=forget_args, retain=retain, retain_args=retain_args or {},
                             alpha=10.0),
                TrainConfig(max_steps=2, batch_size=4, lr=1e-3, progress=False), max_length=64)
        return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}

    # default "wmdp": mlp.down_proj.weight of layers layer-2..layer = 0, 1 (WMDP: param_ids [6] of layers 5-7)
    assert changed_by({"layer": 1, "steering_coef": 2.0}, {"layer": 1}, "hidden_mse") == {
        "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    changed = changed_by({"layer": 1, "trainable_layers": [1], "trainable_params": "layers"})
    assert changed and all(n.startswith("model.layers.1.") for n in changed) and len(changed) > 1
    assert changed_by({"layer": 1, "trainable_params": [r"model\.layers\.0\.self_attn\.o_proj\.weight"]}) == {
        "model.layers.0.self_attn.o_proj.weight"}
