"""The quantisation attack's formats: bitsandbytes NF4 / FP4 tables and blocks, GGUF Q8_0 / Q4_0 by hand, the scheme
registry, and the audit reporting each scheme by name on tiny models built here."""
from __future__ import annotations

import pytest
import torch

from obliviate.audit.quantize import (
    FP4_MAGNITUDES,
    FP4_PIVOTS,
    NF4_LEVELS,
    SCHEMES,
    fp4,
    get_scheme,
    gguf_roundtrip,
    nf4,
    quantize_weights,
    quantized_copy,
    unfit_layers,
)
from obliviate.config.audit import DEFAULT_QUANT, QUANT_SCHEMES, AuditConfig
from obliviate.errors import ConfigError

F32 = torch.float32

# bitsandbytes functional.get_4bit_type("nf4") / csrc/kernels.cu nf4_dequantization_lut, code 0b0000 .. 0b1111
PUBLISHED_NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                 -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0]
# csrc/kernels.cu fp4_dequantization_lut (get_4bit_type("fp4") divided by its max 12), codes 0b000 .. 0b111
PUBLISHED_FP4 = [0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25]
# csrc/kernels.cu dQuantizeFP4: the pivots its decision tree compares |x| with
PUBLISHED_FP4_PIVOTS = [0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333]


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F32)


# ---------------------------------------------------------------- tables
def test_nf4_and_fp4_tables_are_the_published_ones():
    assert torch.equal(f32(NF4_LEVELS), f32(PUBLISHED_NF4))
    assert torch.equal(f32(FP4_MAGNITUDES), f32(PUBLISHED_FP4))
    assert torch.equal(f32(FP4_PIVOTS), f32(PUBLISHED_FP4_PIVOTS))
    # the NF4 kernel's decision tree pivots are the float32 midpoints of neighbouring levels (two of them, by hand)
    assert f32(0.03979014977812767) == (f32(0.0) + f32(0.07958029955625534)) / 2
    assert f32(-0.6106329262256622) == (f32(-0.6961928009986877) + f32(-0.5250730514526367)) / 2


# ---------------------------------------------------------------- NF4 / FP4 by hand
def test_nf4_hand_worked_block():
    x = torch.zeros(64)  # one block of 64 (as [2, 32]: the block runs across the row boundary), absmax 2
    x[:10] = f32([-2.0, 2 * 0.33791524171829224, 0.0796, 0.0795, -0.0911, -0.0910,
                  2 * 0.03979014977812767, 2 * -0.045525018125772476, 1.0, 1.9])
    x[40] = 0.9  # in row 1: same block, same absmax
    expect = torch.zeros(64)
    expect[:10] = f32([
        -2.0,                      # the absmax itself: level -1
        2 * 0.33791524171829224,   # exactly on a level: unchanged
        2 * 0.07958029955625534,   # 0.0398 > pivot 0.0397901 -> up
        0.0,                       # 0.03975 < pivot -> 0
        2 * -0.09105003625154495,  # -0.04555 < pivot -0.045525 -> down
        0.0,                       # -0.0455 > pivot -> 0
        0.0,                       # exactly on the pivot: the level below (bitsandbytes' `x > pivot`)
        2 * -0.09105003625154495,  # exactly on the negative pivot: the level below too
        2 * 0.44070982933044434,   # 0.5 < pivot 0.5016634 -> 0.4407
        2.0,                       # 0.95 > pivot 0.8614784 -> 1
    ])
    expect[40] = 2 * 0.44070982933044434  # 0.45: nearest 0.4407
    q = nf4(x.reshape(2, 32))
    assert q.shape == (2, 32) and q.dtype == F32
    assert torch.equal(q.reshape(-1), expect)


def test_nf4_scales_by_the_reciprocal_of_the_absmax_as_the_kernel_does():
    x = torch.zeros(64)
    x[0], x[1] = 3.0, -1.83189857006073
    # x * (1 / 3) lands exactly on the pivot -0.6106329 (-> the level below, -0.6962); x / 3 would land just above
    assert x[1] * (1 / f32(3.0)) == f32(-0.6106329262256622) < x[1] / 3
    assert nf4(x)[1] == f32(-0.6961928009986877) * 3


def test_fp4_hand_worked_block():
    x = torch.zeros(4, 16)  # one block of 64, absmax 1: the scaled values are the values
    vals = f32([1.0, 0.3, 0.29, -0.29, -0.3, -0.29166667, 0.5833332, 0.0027, 0.0025, -0.9, 0.1])
    x.view(-1)[: len(vals)] = vals
    expect = torch.zeros(64)
    expect[: len(vals)] = f32([
        1.0,
        1 / 3,       # 0.3 > pivot 0.2916667
        0.25,
        -0.25,       # sign-magnitude: -0.29 -> -(0.25)
        -1 / 3,
        -0.25,       # |x| exactly on a pivot: the smaller magnitude (the CUDA kernel), not -1/3
        2 / 3,       # above the kernel's pivot 0.583333 though below the true midpoint 0.5833333
        1 / 192,     # 0.0625 / 12, the subnormal
        0.0,
        -1.0,
        1 / 6,
    ])
    assert torch.equal(fp4(x).reshape(-1), expect)


def test_blocks_of_64_over_the_row_major_weight():
    w = torch.zeros(3, 40)  # 120 values: block 0 = flat 0..63 (rows 0-1), block 1 = flat 64..119 (a partial block)
    flat = w.view(-1)
    flat[10], flat[64], flat[70], flat[100] = 4.0, 0.1, 0.25, 0.5
    q = nf4(w).reshape(-1)  # the default blocksize
    assert q[10] == 4.0 and q[100] == 0.5  # each block's absmax is exact
    assert q[70] == f32(0.5 * 0.44070982933044434)  # 0.25 / 0.5 -> level 0.4407 of block 1's absmax
    assert q[64] == f32(0.5 * 0.16093020141124725)  # 0.1 / 0.5 = 0.2 -> level 0.1609
    # other block boundaries give other values: 128 (one block, absmax 4), 32 (absmax 0.25), per row (row 1: 0.25)
    assert nf4(w, 128).reshape(-1)[70] == f32(4 * 0.07958029955625534) and nf4(w, 128).reshape(-1)[64] == 0.0
    assert nf4(w, 32).reshape(-1)[70] == 0.25
    assert torch.cat([nf4(row[None], 64) for row in w]).reshape(-1)[70] == 0.25
    assert fp4(w).reshape(-1)[70] == 0.25 and fp4(w).reshape(-1)[64] == f32(0.5 / 6)  # FP4: 0.5 and 1/6 of 0.5
    assert fp4(w, 128).reshape(-1)[70] == f32(4 / 192)  # 0.0625 < pivot 0.0859375: down to 1/192


def test_zero_blocks_stay_zero_and_dtype_is_kept():
    w = torch.zeros(2, 64)
    w[1, 5] = 0.5
    for f in (nf4, fp4):
        q = f(w)
        assert torch.equal(q[0], torch.zeros(64)) and q[1, 5] == 0.5
    wb = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert nf4(wb).dtype == torch.bfloat16 and torch.equal(nf4(wb), nf4(wb.float()).to(torch.bfloat16))


def test_nf4_and_fp4_equal_a_nearest_level_reference_on_random_weights():
    w = torch.randn(37, 100, generator=torch.Generator().manual_seed(3))  # 3700 values: 57 blocks + 52
    fp4_table = f32(PUBLISHED_FP4)
    for f, table in ((nf4, f32(PUBLISHED_NF4)), (fp4, torch.cat([fp4_table, -fp4_table]))):
        x = torch.nn.functional.pad(w.reshape(-1), (0, 64 * 58 - 3700)).reshape(58, 64)
        absmax = x.abs().amax(1, keepdim=True)
        s = x / absmax
        ref = table[(s[..., None] - table).abs().argmin(-1)] * absmax
        assert torch.equal(f(w), ref.reshape(-1)[:3700].reshape(37, 100))


# ---------------------------------------------------------------- GGUF by hand
def test_gguf_q8_0_hand_worked_blocks():
    w = torch.zeros(2, 32)
    w[0, :5] = f32([127 / 128, 2.5 / 128, -2.5 / 128, 10.4 / 128, -0.5])  # absmax 127/128: d = 1/128 exactly
    w[1, :3] = f32([1.0, 0.25, -0.6])  # absmax 1: d = 1/127, stored as float16 0.00787353515625
    q = gguf_roundtrip(w, "Q8_0")
    d16 = 0.00787353515625
    assert q[0, :5].tolist() == [127 / 128, 3 / 128, -3 / 128, 10 / 128, -0.5]  # 2.5 rounds away from zero to 3
    assert q[1, :3].tolist() == [127 * d16, 32 * d16, -76 * d16]  # 31.75 -> 32, -76.2 -> -76; the fp16 scale
    assert (q[:, 5:] == 0).all()


def test_gguf_q4_0_hand_worked_blocks():
    w = torch.zeros(2, 32)
    w[0, :7] = f32([-1.0, 0.9, 0.0625, -0.0625, 0.3, -0.3, 0.2])  # signed max -1: d = -1 / -8 = 0.125
    w[1, :6] = f32([2.0, -2.0, -1.9, 1.0, 0.125, -0.125])  # signed max +2 (the first of |2|): d = -0.25
    q = gguf_roundtrip(w, "Q4_0")
    # q = min(15, trunc(x / d + 8.5)), w' = (q - 8) * d
    assert q[0, :7].tolist() == [-1.0, 0.875, 0.125, 0.0, 0.25, -0.25, 0.25]  # +-0.5 steps round up (toward +inf)
    assert q[1, :6].tolist() == [2.0, -1.75, -1.75, 1.0, 0.0, -0.25]  # -2 would be code 16: clipped to 15
    assert (q[:, 7:] == 0).all()


def test_gguf_round_trips_follow_the_rule_and_stay_within_the_scale():
    w = torch.randn(16, 96, generator=torch.Generator().manual_seed(4))
    blocks = w.reshape(-1, 32)
    # Q8_0
    d = blocks.abs().amax(1, keepdim=True) / 127
    d16 = d.half().float()
    a = (blocks * (1 / d)).abs()
    q = torch.sign(blocks) * (a.floor() + torch.floor(2 * (a - a.floor())))  # round half away from zero
    out = gguf_roundtrip(w, "Q8_0").reshape(-1, 32)
    assert torch.equal(out, q * d16)
    assert ((out - blocks).abs() <= d / 2 + 127 * (d - d16).abs() + 1e-7).all()
    # Q4_0
    m = blocks.gather(1, blocks.abs().argmax(1, keepdim=True))
    d = m / -8
    d16 = d.half().float()
    q = torch.clamp(torch.floor(blocks * (1 / d) + 8.5), 0, 15)
    out = gguf_roundtrip(w, "Q4_0").reshape(-1, 32)
    assert torch.equal(out, (q - 8) * d16)
    err = (out - blocks).abs()
    assert (err <= d.abs() + 8 * (d - d16).abs() + 1e-7).all()  # the clipped end: up to one step
    inner = blocks / d < 7
    assert (err[inner] <= (d.abs() / 2 + 8 * (d - d16).abs()).expand_as(err)[inner] + 1e-7).all()


def test_gguf_rows_that_do_not_fit_stay_float16():
    # rows of 96 = 3 blocks of 32 fit (a multiple of 32, not of 64); rows of 30 do not
    model = torch.nn.Sequential(torch.nn.Linear(30, 8), torch.nn.Linear(96, 16))
    before = [m.weight.detach().clone() for m in model]
    assert unfit_layers(model, "gguf_q4_0") == ["0"] and unfit_layers(model, "nf4") == []
    assert quantize_weights(model, "gguf_q4_0") == 2
    assert torch.equal(model[0].weight, before[0].half().float())  # as llama.cpp's converter: F16
    assert torch.equal(model[1].weight, gguf_roundtrip(before[1], "Q4_0"))
    assert not torch.equal(model[1].weight, before[1].half().float())
    with pytest.raises(Exception, match="Q4_0"):
        gguf_roundtrip(before[0], "Q4_0")


# ---------------------------------------------------------------- registry and config
def test_scheme_registry_matches_the_config_and_refuses_unknown_names():
    assert tuple(SCHEMES) == QUANT_SCHEMES and set(DEFAULT_QUANT) <= set(QUANT_SCHEMES)
    assert AuditConfig().quant_schemes == list(DEFAULT_QUANT)
    assert {"nf4", "fp4", "gguf_q4_0", "rtn_int8", "rtn_int4"} <= set(DEFAULT_QUANT)
    with pytest.raises(ValueError, match="valid: rtn_int8, rtn_int4, nf4, fp4, gguf_q8_0, gguf_q4_0"):
        get_scheme("nf5")
    with pytest.raises(ConfigError, match="audit.quant_schemes"):
        AuditConfig(quant_schemes=["int4"])
    with pytest.raises(ConfigError, match="audit.bits.*quant_schemes"):  # the retired key names its successor
        AuditConfig(bits=[8])


def test_each_scheme_changes_the_linear_weights_its_own_way():
    model = torch.nn.Sequential(torch.nn.Linear(128, 64))
    w = model[0].weight.detach().clone()
    outs = {name: quantized_copy(model, name)[0].weight for name in SCHEMES}
    assert torch.equal(model[0].weight, w)
    assert torch.equal(outs["nf4"], nf4(w)) and torch.equal(outs["fp4"], fp4(w))
    assert torch.equal(outs["gguf_q8_0"], gguf_roundtrip(w, "Q8_0"))
    assert torch.equal(outs["gguf_q4_0"], gguf_roundtrip(w, "Q4_0"))
    names = list(outs)
    for i, a in enumerate(names):
        assert not torch.equal(outs[a], w), a
        for b in names[i + 1:]:
            assert not torch.equal(outs[a], outs[b]), (a, b)


# ---------------------------------------------------------------- the audit reports each scheme by name
def test_audit_runs_and_reports_every_scheme(tmp_path):
    from obliviate.audit import run_audit
    from obliviate.audit.verdict import markdown_verdict
    from obliviate.data.synthetic import corpus_texts, make_world
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer

    world = make_world(4, seed=1, forget_percents=(25,))
    tok = train_tokenizer(corpus_texts(world), vocab_size=400)
    original, unlearned, never = (tiny_llama(tok, hidden_size=64, num_layers=2, num_heads=4, seed=s).eval()
                                  for s in (0, 1, 2))
    cfg = AuditConfig(attacks=["quantize"], quant_schemes=list(QUANT_SCHEMES), max_new_tokens=4, max_length=48)
    res = run_audit(unlearned, original, tok, world.splits["forget25"][:6], retain_model=never, cfg=cfg,
                    log=lambda s: None)
    assert [r.variant for r in res.rows] == list(QUANT_SCHEMES)
    for r in res.rows:
        assert r.attack == "quantize" and r.extra["format"] == SCHEMES[r.variant].describe
        assert r.extra["kept_float16"] == []
        assert f"unlearned-{r.variant} / direct" in res.settings["samples"]
        assert f"retain-{r.variant} / direct" in res.settings["samples"]
    # each scheme's model answers with its own probabilities (its own weights), reference included
    assert len({r.extra["prob"]["attacked"] for r in res.rows}) == len(res.rows)
    assert len({r.extra["prob"]["ref0"] for r in res.rows}) == len(res.rows)
    assert res.settings["quant_schemes"] == list(QUANT_SCHEMES) and res.verdict["quantize"]["variant"] in QUANT_SCHEMES
    table = markdown_verdict(res.rows)
    assert all(f"| {name} |" in table for name in QUANT_SCHEMES)
