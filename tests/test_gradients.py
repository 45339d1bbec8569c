"""Gradient rules (docs/METHODS.md §2): hand-worked examples, properties, None/shape handling, stats, state."""
from __future__ import annotations

import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from obliviate.gradients import RULES, RuleState, combine, per_module_stats, stats
from obliviate.registry import UnknownNameError

ALL_RULES = ["blur", "gru", "gru_ema", "pcgrad", "pcgrad_global", "sago", "sago_retain", "sum"]
STATEFUL = ("gru", "gru_ema")
SETTINGS = settings(max_examples=50, deadline=None)


def t(*xs: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


def run(rule, f, r, alpha=0.5, gamma=2.0, state=None):
    """Call a rule directly, giving gru / gru_ema a fresh state unless one is passed."""
    if rule in STATEFUL and state is None:
        state = RuleState()
    return RULES.get(rule)(f, r, alpha=alpha, gamma=gamma, state=state)


def close(got, want, tol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.allclose(g.double(), torch.as_tensor(w, dtype=torch.float64), atol=tol), (g, w)


# The running example: g_f = [1, -2, 0], g_r = [-1, 1, 3], α = 0.5, γ = 2.
# Coordinates 0 and 1 conflict (1·-1 < 0, -2·1 < 0); coordinate 2 does not (0·3 = 0).
F, R = [t(1, -2, 0)], [t(-1, 1, 3)]


def test_registry_names():
    assert RULES.names() == ALL_RULES


def test_sum_by_hand():
    # 2·[1,-2,0] + 0.5·[-1,1,3] = [2,-4,0] + [-0.5,0.5,1.5]
    close(run("sum", F, R), [[1.5, -3.5, 1.5]])


def test_sago_by_hand():
    # conflicts take α·g_r = [-0.5, 0.5]; coordinate 2 takes γ·g_f = 0 (g_r dropped there)
    close(run("sago", F, R), [[-0.5, 0.5, 0.0]])


def test_sago_retain_by_hand():
    # α·g_r = [-0.5,0.5,1.5] plus γ·g_f on non-conflicting coordinates only (= 0 here)
    close(run("sago_retain", F, R), [[-0.5, 0.5, 1.5]])


def test_pcgrad_by_hand():
    # <g_f,g_r> = -1-2+0 = -3, ||g_r||² = 11: g_f' = g_f + 3/11·g_r = [8/11, -19/11, 9/11]
    # g = 2·g_f' + 0.5·g_r = [32/22-11/22, -76/22+11/22, 36/22+33/22] = [21/22, -65/22, 69/22]
    want = [[21 / 22, -65 / 22, 69 / 22]]
    close(run("pcgrad", F, R), want)
    close(run("pcgrad_global", F, R), want)  # one tensor: global = per tensor


def test_pcgrad_per_tensor_vs_global_by_hand():
    f, r = [t(1, -2, 0), t(2)], [t(-1, 1, 3), t(4)]
    # per tensor: tensor 0 as above; tensor 1 has <2,4> = 8 > 0, so g = 2·2 + 0.5·4 = 6
    close(run("pcgrad", f, r), [[21 / 22, -65 / 22, 69 / 22], [6.0]])
    # global: <g_f,g_r> = -3 + 8 = 5 >= 0, no projection: plain sum
    close(run("pcgrad_global", f, r), [[1.5, -3.5, 1.5], [6.0]])


def test_pcgrad_global_projection_by_hand():
    f, r = [t(1, -2, 0), t(1)], [t(-1, 1, 3), t(-1)]
    # global <g_f,g_r> = -3 - 1 = -4, ||g_r||² = 12: g_f' = g_f + 1/3·g_r = [2/3, -5/3, 1], [2/3]
    # g = 2·g_f' + 0.5·g_r = [4/3-1/2, -10/3+1/2, 2+3/2], [4/3-1/2] = [5/6, -17/6, 7/2], [5/6]
    close(run("pcgrad_global", f, r), [[5 / 6, -17 / 6, 3.5], [5 / 6]])


def test_blur_by_hand():
    # <g_r,g_f> = -3, ||g_f||² = 5: g_r' = g_r + 3/5·g_f = [-0.4, -0.2, 3]
    # g = 2·[1,-2,0] + 0.5·[-0.4,-0.2,3] = [1.8, -4.1, 1.5]
    close(run("blur", F, R), [[1.8, -4.1, 1.5]])


def test_blur_projects_even_without_conflict():
    # Unconditional (docs/METHODS.md §2.2 table, BLUR's code): g_f = [1,0], g_r = [1,1], <g_r,g_f> = 1 > 0
    # g_r' = [1,1] - 1·[1,0] = [0,1]; g = 2·[1,0] + 0.5·[0,1] = [2, 0.5] (sum would be [2.5, 0.5])
    close(run("blur", [t(1, 0)], [t(1, 1)]), [[2.0, 0.5]])


def test_gru_authors_two_steps_by_hand():
    # The authors' GRU (open-unlearning gru.py): ema = 0.8·g_r + 0.2·ema_prev from ema = 0; only the
    # rectified g_f is written (times γ = 2 here); α = 0.5 must not appear anywhere.
    state = RuleState()
    # step 1: ema = 0.8·[-1,1,3] = [-0.8, 0.8, 2.4]; <g_f,ema> = -0.8 - 1.6 = -2.4 < 0, ||ema||² = 7.04
    # g_f' = g_f + (2.4/7.04)·ema = g_f + (3/11)·g_r = [8/11, -19/11, 9/11]; g = 2·g_f' = [16/11, -38/11, 18/11]
    close(run("gru", F, R, state=state), [[16 / 11, -38 / 11, 18 / 11]])
    close(state.ema, [[-0.8, 0.8, 2.4]])
    # step 2, g_r = [1,1,-1]: ema = 0.8·[1,1,-1] + 0.2·[-0.8,0.8,2.4] = [0.64, 0.96, -0.32]
    # <g_f,ema> = 0.64 - 1.92 = -1.28, ||ema||² = 0.4096 + 0.9216 + 0.1024 = 1.4336, k = 1.28/1.4336 = 25/28
    # g_f' = [1 + 0.64·25/28, -2 + 0.96·25/28, -0.32·25/28] = [11/7, -8/7, -2/7]; g = [22/7, -16/7, -4/7]
    close(run("gru", F, [t(1, 1, -1)], state=state), [[22 / 7, -16 / 7, -4 / 7]], tol=1e-5)
    close(state.ema, [[0.64, 0.96, -0.32]])
    assert state.step == 2


def test_gru_gamma_is_a_rule_parameter_by_hand():
    # method.combine.gru_gamma = 0.9 (the authors sweep 0.8 / 0.9 / 0.95): ema = 0.9·g_r + 0.1·ema_prev from 0
    from obliviate.config import CombineConfig
    from obliviate.errors import ConfigError
    from obliviate.gradients import combine_into

    state, params = RuleState(), {"gru_gamma": 0.9}
    # step 1: ema = 0.9·[-1,1,3] = [-0.9, 0.9, 2.7], parallel to g_r: the projection of the 0.8 case, g = 2·g_f'
    out, _ = combine("gru", F, R, alpha=0.5, gamma=2.0, state=state, params=params)
    close(out, [[16 / 11, -38 / 11, 18 / 11]])
    close(state.ema, [[-0.9, 0.9, 2.7]])
    # step 2, g_r = [1,1,-1]: ema = 0.9·[1,1,-1] + 0.1·[-0.9,0.9,2.7] = [0.81, 0.99, -0.63]
    # <g_f,ema> = 0.81 - 1.98 = -1.17, ||ema||² = 0.6561 + 0.9801 + 0.3969 = 2.0331, k = 1.17/2.0331 = 1300/2259
    # g_f' = [1 + 0.81k, -2 + 0.99k, -0.63k] = [368/251, -359/251, -91/251]; g = 2·g_f'
    out, _ = combine("gru", F, [t(1, 1, -1)], alpha=0.5, gamma=2.0, state=state, params=params)
    close(out, [[736 / 251, -718 / 251, -182 / 251]], tol=1e-5)
    close(state.ema, [[0.81, 0.99, -0.63]])
    # the default 0.8 gives [22/7, -16/7, -4/7] at step 2 (test_gru_authors_two_steps_by_hand): γ_gru matters
    default = RuleState()
    for r in (R, [t(1, 1, -1)]):
        plain, _ = combine("gru", F, r, alpha=0.5, gamma=2.0, state=default)
    close(plain, [[22 / 7, -16 / 7, -4 / 7]], tol=1e-5)
    assert (plain[0] - out[0]).abs().max() > 0.1
    # the streamed entry point (the loop's) passes it on too
    streamed, got = RuleState(), [None]
    for r in (R, [t(1, 1, -1)]):
        combine_into("gru", list(F), list(r), got.__setitem__, alpha=0.5, gamma=2.0, state=streamed, params=params)
    close(got, out[:1], tol=1e-6)
    # a setting the rule does not take (another rule's, or a misspelt one) and a γ_gru outside (0, 1) are refused
    with pytest.raises(ValueError, match=r"rule 'sum' takes no setting\(s\) \['gru_gamma'\]; .*: none"):
        combine("sum", F, R, alpha=0.5, gamma=2.0, params=params)
    with pytest.raises(ValueError, match=r"rule 'gru' takes no setting\(s\) \['gru_gama'\]; .*\['gru_gamma'\]"):
        combine("gru", F, R, alpha=0.5, gamma=2.0, state=RuleState(), params={"gru_gama": 0.9})
    with pytest.raises(ValueError, match="gru_gamma must lie strictly between 0 and 1"):
        combine("gru", F, R, alpha=0.5, gamma=2.0, state=RuleState(), params={"gru_gamma": 1.0})
    assert CombineConfig().args == {}
    with pytest.raises(ConfigError, match=r"method.combine.args=\[0.9\] is impossible"):
        CombineConfig(rule="gru", args=[0.9])


def test_rule_settings_come_from_the_rule_function_alone():
    """A rule's settings (method.combine.args) are its keyword-only parameters with defaults, the loop's own
    (alpha, gamma, state, reduce, masks, coefs) excepted: gru has gru_gamma = 0.8, every other built-in rule none."""
    from obliviate.gradients import GRU_GAMMA, RULES

    assert RULES.get("gru").defaults() == {"gru_gamma": GRU_GAMMA} and GRU_GAMMA == 0.8
    assert RULES.get("gru").params == ("gru_gamma",)
    assert {n: RULES.get(n).defaults() for n in RULES.names() if n != "gru"} == \
        {n: {} for n in RULES.names() if n != "gru"}
    assert RULES.get("gru").resolve({}) == {"gru_gamma": 0.8}
    assert RULES.get("gru").resolve({"gru_gamma": 0.95}) == {"gru_gamma": 0.95}
    for bad in (0.0, 1.0, True, "0.9"):
        with pytest.raises(ValueError, match="gru_gamma must lie strictly between 0 and 1"):
            RULES.get("gru").resolve({"gru_gamma": bad})


def test_gru_authors_has_no_epsilon():
    # scaled by 1e-6 the projection is scale-free: g = 1e-6·[16/11, -38/11, 18/11] exactly as at scale 1;
    # with ε = 1e-10 added to ||ema||² = 7.04e-12 the coefficient would shrink to ~7% of its value
    f, r = [t(1e-6, -2e-6, 0, dtype=torch.float64)], [t(-1e-6, 1e-6, 3e-6, dtype=torch.float64)]
    out = run("gru", f, r)
    torch.testing.assert_close(out[0], torch.tensor([16 / 11, -38 / 11, 18 / 11], dtype=torch.float64) * 1e-6,
                               rtol=1e-12, atol=0)


def test_gru_authors_keeps_a_decayed_ema_for_parameters_without_gradient():
    # The authors store zeros for a parameter without gradient: its EMA decays by 0.2 and still projects.
    state = RuleState()
    run("gru", [t(1, -2, 0), t(1)], [t(-1, 1, 3), t(-1)], state=state)  # ema = [0.8·g_r], [-0.8]
    out = run("gru", [t(1, -2, 0), None], [t(1, 1, -1), None], state=state)
    # ema = [0.64, 0.96, -0.32], [0.2·-0.8 = -0.16]; <g_f,ema> = -1.28 + 0; ||ema||² = 1.4336 + 0.0256 = 1.4592
    # k = 1.28/1.4592 = 50/57: g_f' = [1 + 32/57, -2 + 48/57, -16/57], [0 - 0.16·50/57 = -8/57]; g = 2·g_f'
    close(out, [[178 / 57, -132 / 57, -32 / 57], [-16 / 57]], tol=1e-5)
    close([state.ema[1]], [[-0.16]])


def test_gru_ema_two_steps_by_hand():
    state = RuleState()
    # step 1: ema = g_r (first value seen), so it equals pcgrad on the running example
    close(run("gru_ema", F, R, state=state), [[21 / 22, -65 / 22, 69 / 22]])
    assert state.step == 1
    # step 2 with g_r = [1,1,-1]: ema = 0.8·[-1,1,3] + 0.2·[1,1,-1] = [-0.6, 1.0, 2.2] (updated first)
    # <g_f,ema> = -0.6 - 2 + 0 = -2.6 < 0, ||ema||² = 0.36 + 1 + 4.84 = 6.2
    # g_f' = g_f + (2.6/6.2)·ema; g = 2·g_f' + 0.5·[1,1,-1]
    k = 2.6 / 6.2
    gf = [1 - 0.6 * k, -2 + 1.0 * k, 2.2 * k]
    want = [2 * gf[0] + 0.5, 2 * gf[1] + 0.5, 2 * gf[2] - 0.5]
    close(run("gru_ema", F, [t(1, 1, -1)], state=state), [want], tol=1e-5)
    close(state.ema, [[-0.6, 1.0, 2.2]], tol=1e-6)
    assert state.step == 2


def test_gru_ema_makes_it_differ_from_pcgrad():
    # g_f = g_r = [1,0,0] at step 2 does not conflict now, but the EMA still remembers step 1
    state = RuleState()
    run("gru_ema", [t(1, 0, 0)], [t(-1, 0, 0)], state=state)  # ema = [-1,0,0]
    out = run("gru_ema", [t(1, 0, 0)], [t(1, 0, 0)], state=state)  # ema = [-0.6,0,0]: <g_f,ema> < 0
    # g_f' = [1,0,0] - (-0.6/0.36)·[-0.6,0,0] = [0,0,0]; g = 0.5·[1,0,0]
    close(out, [[0.5, 0.0, 0.0]])
    close(run("pcgrad", [t(1, 0, 0)], [t(1, 0, 0)]), [[2.5, 0.0, 0.0]])
    # the authors' gru at the same two steps: ema = 0.8·[1,0,0] + 0.2·0.8·[-1,0,0] = [0.64,0,0], no conflict:
    # g = γ·g_f = [2,0,0]
    authors = RuleState()
    run("gru", [t(1, 0, 0)], [t(-1, 0, 0)], state=authors)
    close(run("gru", [t(1, 0, 0)], [t(1, 0, 0)], state=authors), [[2.0, 0.0, 0.0]])


@pytest.mark.parametrize("rule", STATEFUL)
def test_gru_without_state_is_an_error(rule):
    with pytest.raises(ValueError, match="RuleState"):
        combine(rule, F, R, alpha=1.0, gamma=1.0)


def test_unknown_rule_lists_valid_names():
    with pytest.raises(UnknownNameError, match="valid names: blur, gru, gru_ema, pcgrad"):
        combine("sagoo", F, R, alpha=1.0, gamma=1.0)
    _, s = combine("SAGO", F, R, alpha=1.0, gamma=1.0)  # lookup is case-insensitive
    assert set(s) == {"cos_f_r", "cos_g_f", "cos_g_r", "conflict_share"}


@pytest.mark.parametrize("rule", ALL_RULES)
def test_none_entries(rule):
    f = [None, t(1, -2, 0), None]
    r = [None, None, t(-1, 1, 3)]
    zf = [None, t(1, -2, 0), t(0, 0, 0)]
    zr = [None, t(0, 0, 0), t(-1, 1, 3)]
    out, want = run(rule, f, r), run(rule, zf, zr)
    assert out[0] is None
    close(out[1:], want[1:])


@pytest.mark.parametrize("rule", ALL_RULES)
def test_length_and_shape_mismatch(rule):
    with pytest.raises(ValueError, match="length"):
        run(rule, [t(1, 2)], [t(1, 2), t(3)])
    with pytest.raises(ValueError, match=r"gradient 1: forget shape \(2,\) != retain shape \(3,\)"):
        run(rule, [t(1), t(1, 2)], [t(1), t(1, 2, 3)])


@pytest.mark.parametrize("rule", STATEFUL)
def test_gru_state_length_mismatch(rule):
    state = RuleState()
    run(rule, F, R, state=state)
    with pytest.raises(ValueError, match="gru state holds 1"):
        run(rule, F + F, R + R, state=state)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("rule", ALL_RULES)
def test_dtype_kept_and_no_aliasing(rule, dtype):
    f, r = [t(1, -2, 0, dtype=dtype)], [t(-1, 1, 3, dtype=dtype)]
    state = RuleState()
    out = run(rule, f, r, state=state)
    assert out[0].dtype == dtype
    assert out[0].data_ptr() not in {f[0].data_ptr(), r[0].data_ptr()}
    if rule in STATEFUL:  # EMA kept in >= float32 and never a view of the caller's gradient
        assert state.ema[0].dtype == torch.promote_types(dtype, torch.float32)
        assert state.ema[0].data_ptr() != r[0].data_ptr()


@pytest.mark.parametrize("rule", STATEFUL)
def test_rule_state_round_trip(rule):
    a, b = RuleState(), RuleState()
    g_r2 = [t(1, 1, -1), None]
    run(rule, F + [None], R + [None], state=a)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert b.step == 1 and b.ema[1] is None and torch.equal(b.ema[0], a.ema[0])
    out_a, out_b = run(rule, F + [None], g_r2, state=a), run(rule, F + [None], g_r2, state=b)
    assert torch.equal(out_a[0], out_b[0]) and out_a[1] is None and out_b[1] is None
    with pytest.raises(ValueError, match="keys"):
        RuleState().load_state_dict({"ema": None})


def test_stats_by_hand():
    g = run("sum", F, R)  # [1.5, -3.5, 1.5]
    s = stats(F, R, g)
    # <f,r> = -3, |f|² = 5, |r|² = 11; <g,f> = 1.5+7 = 8.5; <g,r> = -1.5-3.5+4.5 = -0.5; |g|² = 16.75
    assert s["cos_f_r"] == pytest.approx(-3 / math.sqrt(55))
    assert s["cos_g_f"] == pytest.approx(8.5 / math.sqrt(16.75 * 5))
    assert s["cos_g_r"] == pytest.approx(-0.5 / math.sqrt(16.75 * 11))
    assert s["conflict_share"] == pytest.approx(2 / 3)
    # orthogonal vectors: cos 0; a zero gradient has no direction: cos reported as 0.0
    assert stats([t(3, 0)], [t(0, 4)], [t(3, 4)])["cos_f_r"] == 0.0
    assert stats([t(3, 0)], [t(3, 4)], [t(3, 4)])["cos_f_r"] == pytest.approx(0.6)
    assert stats([t(0, 0)], [t(1, 1)], [t(1, 1)])["cos_g_f"] == 0.0


def test_per_module_stats():
    f, r = [t(1, -2, 0), t(3, 0), None], [t(-1, 1, 3), t(0, 4), None]
    out, s = combine("sum", f, r, alpha=0.5, gamma=2.0, per_module_names=["a", "b", "c"])
    assert set(s["modules"]) == {"a", "b"}  # no gradient at all: no entry
    assert s["modules"]["a"]["cos_f_r"] == pytest.approx(-3 / math.sqrt(55))
    assert s["modules"]["b"]["conflict_share"] == 0.0
    assert s["conflict_share"] == pytest.approx(2 / 5)  # 2 conflicting of 5 coordinates
    assert per_module_stats(["a", "b", "c"], f, r, out) == s["modules"]
    with pytest.raises(ValueError, match="same length"):
        combine("gru", f, r, alpha=1.0, gamma=1.0, state=RuleState(), per_module_names=["a"])


# ---- properties ----------------------------------------------------------------------------
# Values are 0 or at least 1e-2 in magnitude, so the 1e-10 in the projections stays negligible.
VALUE = st.floats(-10, 10, width=32).filter(lambda x: x == 0 or abs(x) >= 1e-2)
WEIGHT = st.floats(0, 5)


@st.composite
def grad_lists(draw, aligned: bool = False):
    """Two lists of 1-4 tensors of 1-6 values; aligned=True gives g_f ⊙ g_r >= 0 everywhere."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    f, r = [], []
    for n in sizes:
        a = torch.tensor(draw(st.lists(VALUE, min_size=n, max_size=n)))
        b = torch.tensor(draw(st.lists(VALUE, min_size=n, max_size=n)))
        if aligned:
            b = b.abs() * torch.where(a < 0, -1.0, 1.0)
        f.append(a)
        r.append(b)
    return f, r


@SETTINGS
@given(grad_lists(), WEIGHT, WEIGHT)
def test_sago_never_opposes_retain(fr, alpha, gamma):
    f, r = fr
    for g, gr, gf in zip(run("sago", f, r, alpha, gamma), r, f):
        assert bool((g * gr >= 0).all())
        keep = gf * gr >= 0  # non-conflicting coordinates carry γ·g_f only
        assert torch.allclose(g[keep], (gamma * gf.double())[keep].float())


@SETTINGS
@given(grad_lists())
def test_pcgrad_removes_conflict_per_tensor(fr):
    f, r = fr
    projected = run("pcgrad", f, r, alpha=0.0, gamma=1.0)  # α=0, γ=1: the output is g_f'
    for p, gr, gf in zip(projected, r, f):
        assert float(p.double() @ gr.double()) >= -1e-5 * float(gf.norm() * gr.norm()) - 1e-12


@SETTINGS
@given(grad_lists())
def test_pcgrad_global_removes_conflict_globally(fr):
    f, r = fr
    projected = run("pcgrad_global", f, r, alpha=0.0, gamma=1.0)
    dot = sum(float(p.double() @ gr.double()) for p, gr in zip(projected, r))
    scale = math.sqrt(sum(float(x.norm()) ** 2 for x in f) * sum(float(x.norm()) ** 2 for x in r))
    assert dot >= -1e-5 * scale - 1e-12


@SETTINGS
@given(grad_lists())
def test_blur_makes_retain_orthogonal_to_forget(fr):
    f, r = fr
    projected = run("blur", f, r, alpha=1.0, gamma=0.0)  # α=1, γ=0: the output is g_r'
    dot = sum(float(p.double() @ gf.double()) for p, gf in zip(projected, f))
    scale = math.sqrt(sum(float(x.norm()) ** 2 for x in f) * sum(float(x.norm()) ** 2 for x in r))
    assert abs(dot) <= 1e-5 * scale + 1e-12


@SETTINGS
@given(grad_lists(aligned=True), WEIGHT, WEIGHT)
def test_rules_equal_sum_without_conflict(fr, alpha, gamma):
    f, r = fr
    want = run("sum", f, r, alpha, gamma)
    for rule in ["sago_retain", "pcgrad", "pcgrad_global", "gru_ema"]:  # gru_ema with a fresh state
        for g, w in zip(run(rule, f, r, alpha, gamma), want):
            assert torch.equal(g, w), rule


@SETTINGS
@given(grad_lists(aligned=True), WEIGHT, WEIGHT)
def test_gru_without_conflict_is_the_scaled_forget_gradient(fr, alpha, gamma):
    f, r = fr  # the authors' update is γ·g_f when nothing conflicts: g_r is never added
    for g, gf in zip(run("gru", f, r, alpha, gamma), f):
        assert torch.allclose(g.double(), gamma * gf.double(), rtol=1e-6, atol=1e-7)


@SETTINGS
@given(grad_lists(), WEIGHT, WEIGHT)
def test_blur_equals_sum_when_orthogonal(fr, alpha, gamma):
    f, r = fr  # disjoint supports make <g_r,g_f> = 0 exactly
    r = [torch.where(x != 0, torch.zeros_like(y), y) for x, y in zip(f, r)]
    for g, w in zip(run("blur", f, r, alpha, gamma), run("sum", f, r, alpha, gamma)):
        assert torch.equal(g, w)


@SETTINGS
@given(grad_lists(), WEIGHT, WEIGHT)
def test_inputs_not_modified(fr, alpha, gamma):
    f, r = fr
    f0, r0 = [x.clone() for x in f], [x.clone() for x in r]
    for rule in ALL_RULES:
        combine(rule, f, r, alpha=alpha, gamma=gamma, state=RuleState())
    assert all(torch.equal(a, b) for a, b in zip(f + r, f0 + r0))


@pytest.mark.parametrize("rule", ["sum", "sago", "sago_retain", "pcgrad", "pcgrad_global", "blur"])
def test_combine_into_streams_the_same_result_and_releases_inputs(rule):
    from obliviate.gradients import combine, combine_into

    torch.manual_seed(0)
    f = [torch.randn(3, 4), None, torch.randn(5)]
    r = [torch.randn(3, 4), torch.randn(2), torch.randn(5)]
    expect, expect_stats = combine(rule, f, r, alpha=0.5, gamma=2.0, per_module_names=["a", "b", "c"])
    got: dict[int, torch.Tensor | None] = {}
    fb, rb = list(f), list(r)
    out = combine_into(rule, fb, rb, lambda i, g: got.__setitem__(i, g), alpha=0.5, gamma=2.0,
                       per_module_names=["a", "b", "c"])
    for i, e in enumerate(expect):
        torch.testing.assert_close(got[i], e)
    assert fb == [None] * 3 and rb == [None] * 3
    for k in ("cos_f_r", "cos_g_f", "cos_g_r", "conflict_share"):
        assert out[k] == pytest.approx(expect_stats[k], abs=1e-6)
    assert out["modules"].keys() == expect_stats["modules"].keys()


def test_only_sum_may_share_one_fused_backward():
    """RuleSpec.separate decides the loop's backward: every rule but `sum` combines separate g_f and g_r."""
    from obliviate.config import CombineConfig, MethodConfig
    from obliviate.errors import ConfigError
    from obliviate.train.unlearn import resolve_method

    for rule in ALL_RULES:
        method = MethodConfig(forget="ga", retain="nll", combine=CombineConfig(rule=rule))
        assert resolve_method(method).separate is (rule != "sum"), rule
        if rule != "sum":
            with pytest.raises(ConfigError, match="separate forget and retain backward"):
                resolve_method(MethodConfig(forget="ga", retain="nll",
                                            combine=CombineConfig(rule=rule, separate_backward=False)))


def test_rule_traits():
    """Elementwise rules are exact on shards and get the conflict masks only when they use them (the SAGO pair);
    pcgrad alone streams with whole-tensor coefficients; every non-elementwise rule reduces over shards."""
    spec = {n: RULES.get(n) for n in ALL_RULES}
    assert {n for n, s in spec.items() if s.elementwise} == {"sum", "sago", "sago_retain"}
    assert {n for n, s in spec.items() if s.conflict_masks} == {"sago", "sago_retain"}
    assert {n for n, s in spec.items() if s.per_tensor} == {"sum", "sago", "sago_retain", "pcgrad"}
    assert {n for n, s in spec.items() if s.reduces} == set(ALL_RULES) - {"sum", "sago", "sago_retain"}
    assert [n for n, s in spec.items() if s.coefficients is not None] == ["pcgrad"]
