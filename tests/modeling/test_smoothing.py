"""Tests for ASU attention smoothing (arXiv 2603.01285): softmax(QKᵀ/(τ√d))V on chosen layers.

Tiny random models built from configs (no downloads). Weights use a large init range so attention is far from
uniform and a temperature visibly moves the logits.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoConfig,
    GPTNeoForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from obliviate.errors import ObliviateError
from obliviate.modeling.smoothing import (
    SmoothingError,
    attention_entropy,
    is_smoothed,
    remove_smoothing,
    smooth_attention,
    smoothed_teacher,
    smoothing_info,
)

VOCAB = 100
LLAMA_LIKE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, pad_token_id=0, bos_token_id=1,
    eos_token_id=2,
)
ARCHS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**LLAMA_LIKE)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**LLAMA_LIKE)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**LLAMA_LIKE)),  # GQA: 2 kv heads for 4 query heads
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.3,
        attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )),
}


def build(arch: str = "llama", backend: str = "sdpa", seed: int = 0) -> nn.Module:
    """A tiny random eval-mode model of `arch` running `backend`."""
    torch.manual_seed(seed)
    model = ARCHS[arch]().eval()
    model.set_attn_implementation(backend)
    return model


def make_batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """Two right-padded rows: lengths 9 and 6, pad id 0."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (2, 9), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    input_ids[1, 6:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@torch.no_grad()
def logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits [B, T, V] of `model` on `batch`."""
    return model(**batch).logits


def valid(batch: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Entries of x [B, T, ...] at non-pad positions."""
    return x[batch["attention_mask"].bool()]


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_tau_one_reproduces_stock_logits_exactly(arch: str, backend: str) -> None:
    model, batch = build(arch, backend), make_batch()
    stock = logits(model, batch)
    smooth_attention(model, 1.0)
    assert model.config._attn_implementation == f"obliviate_{backend}"
    assert torch.equal(logits(model, batch), stock)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Llama's rotary convention: (x1, x2) → (−x2, x1) on the two halves of the head dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hand_attention(attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tau: float) -> torch.Tensor:
    """softmax(QKᵀ·d^-1/2/τ + causal) V then o_proj, written out; x [B, T, C], cos/sin [1, 1, T, D]."""
    batch, length, _ = x.shape
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    q, k, v = (p(x).view(batch, length, -1, attn.head_dim).transpose(1, 2) for p in projections)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    groups = q.shape[1] // k.shape[1]  # GQA: each kv head serves `groups` query heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * attn.head_dim**-0.5 / tau
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    return attn.o_proj((probs @ v).transpose(1, 2).reshape(batch, length, -1))


@torch.no_grad()
def hand_llama_logits(model: LlamaForCausalLM, input_ids: torch.Tensor, taus: dict[int, float]) -> torch.Tensor:
    """Llama forward with the attention written out (hand_attention), τ per layer from `taus`, no padding."""
    inner = model.model
    hidden = inner.embed_tokens(input_ids)
    cos, sin = inner.rotary_emb(hidden, torch.arange(input_ids.shape[1])[None])  # [1, T, D]
    for index, layer in enumerate(inner.layers):
        x = layer.input_layernorm(hidden)
        hidden = hidden + hand_attention(layer.self_attn, x, cos[:, None], sin[:, None], taus.get(index, 1.0))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(inner.norm(hidden))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("layers", [[0], [1], [-1], None])
def test_matches_hand_written_attention(backend: str, layers: list[int] | None) -> None:
    model = build("llama", backend)
    input_ids = make_batch()["input_ids"][:1]
    assert torch.allclose(hand_llama_logits(model, input_ids, {}), model(input_ids).logits, atol=1e-5)
    taus = {i % 2: 2.5 for i in (layers if layers is not None else [0, 1])}
    smooth_attention(model, 2.5, layers)
    expected = hand_llama_logits(model, input_ids, taus)
    with torch.no_grad():
        got = model(input_ids).logits
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert (expected - hand_llama_logits(model, input_ids, {})).abs().max() > 1e-2  # τ really matters here


def test_layer_choice_matters() -> None:
    model, batch = build("llama"), make_batch()
    stock = logits(model, batch)
    first = logits(smooth_attention(model, 3.0, [0]), batch)
    both = logits(smooth_attention(model, 3.0), batch)
    assert (valid(batch, first - stock)).abs().max() > 1e-2
    assert (valid(batch, both - first)).abs().max() > 1e-2
    assert smoothing_info(model)["tau"] == {0: 3.0, 1: 3.0}
    smooth_attention(model, 2.0, [1])  # a second call replaces the first setting
    assert smoothing_info(model)["tau"] == {0: 1.0, 1: 2.0}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_eager_and_sdpa_agree_when_smoothed(arch: str) -> None:
    batch = make_batch()
    eager = logits(smooth_attention(build(arch, "eager"), 2.5), batch)
    sdpa = logits(smooth_attention(build(arch, "sdpa"), 2.5), batch)
    assert torch.allclose(valid(batch, eager), valid(batch, sdpa), atol=1e-5)
    assert (valid(batch, eager - logits(build(arch, "eager"), batch))).abs().max() > 1e-3


@pytest.fixture
def flex_without_a_compiler(monkeypatch):
    """transformers runs flex_attention and builds its block mask through torch.compile (Inductor, which needs a C++
    compiler on a CPU); the test compiles flex_attention with dynamo's "eager" backend and builds the mask
    uncompiled instead: the same semantics, no compiler needed."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from transformers import masking_utils
    from transformers.integrations import flex_attention as wrapped

    monkeypatch.setattr(masking_utils, "create_block_mask",
                        lambda *a, _compile=False, **k: create_block_mask(*a, _compile=False, **k))

    monkeypatch.setattr(wrapped.WrappedFlexAttention, "_is_flex_compiled", True)
    monkeypatch.setattr(wrapped.WrappedFlexAttention, "training", False, raising=False)
    monkeypatch.setattr(wrapped.WrappedFlexAttention, "_compiled_flex_attention",
                        staticmethod(torch.compile(flex_attention, backend="eager")))


def test_flex_attention_smoothing_matches_eager(flex_without_a_compiler) -> None:
    """flex_attention runs on the CPU too: τ = 1 is the stock flex model bit for bit, and τ = 2.5 on layer [0] and on
    every layer gives eager's smoothed logits (eager itself is checked against hand-written attention above)."""
    batch = make_batch()
    flex, eager = build("llama", "flex_attention"), build("llama", "eager")
    stock = logits(flex, batch)
    assert torch.allclose(valid(batch, stock), valid(batch, logits(eager, batch)), atol=1e-5)
    smooth_attention(flex, 1.0)
    assert flex.config._attn_implementation == "obliviate_flex_attention"
    assert torch.equal(valid(batch, logits(flex, batch)), valid(batch, stock))
    for layers in ([0], None):
        smooth_attention(flex, 2.5, layers)
        want = valid(batch, logits(smooth_attention(eager, 2.5, layers), batch))
        got = valid(batch, logits(flex, batch))
        assert torch.allclose(got, want, atol=1e-5), (layers, (got - want).abs().max())
        assert (want - valid(batch, stock)).abs().max() > 1e-2  # τ moves the logits: a flex path ignoring it fails
    assert smoothing_info(flex) == {"backend": "flex_attention", "implementation": "obliviate_flex_attention",
                                    "smoothed": True, "tau": {0: 2.5, 1: 2.5}}
    assert torch.equal(valid(batch, logits(remove_smoothing(flex), batch)), valid(batch, stock))


def test_remove_smoothing_restores_exact_logits() -> None:
    model, batch = build("mistral"), make_batch()
    stock = logits(model, batch)
    smooth_attention(model, 2.0, [0])
    assert is_smoothed(model) and not torch.equal(logits(model, batch), stock)
    remove_smoothing(model)
    assert model.config._attn_implementation == "sdpa" and not is_smoothed(model)
    assert torch.equal(logits(model, batch), stock)
    assert remove_smoothing(model) is model  # a no-op on a stock model


def test_smoothed_teacher_is_a_frozen_copy() -> None:
    model, batch = build("qwen2"), make_batch()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stock = logits(model.eval(), batch)
    model.train()
    teacher = smoothed_teacher(model, 2.0, [0])
    assert teacher is not model and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(p.requires_grad for p in model.parameters()) and model.training
    assert model.config._attn_implementation == "sdpa" and not is_smoothed(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(logits(model.eval(), batch), stock)
    expected = logits(smooth_attention(build("qwen2"), 2.0, [0]), batch)
    assert torch.equal(logits(teacher, batch), expected)
    assert smoothing_info(teacher) == {
        "backend": "sdpa", "implementation": "obliviate_sdpa", "smoothed": True, "tau": {0: 2.0, 1: 1.0},
    }


# ----------------------------------------------------------------------------- soft-capping (Gemma 2)


def test_gemma2_softcap_is_tempered_after_the_cap() -> None:
    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.3,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    model, batch = Gemma2ForCausalLM(config).eval(), make_batch()
    stock = logits(model, batch)
    assert torch.equal(logits(smooth_attention(model, 1.0), batch), stock)
    smooth_attention(model, 2.0, [0])
    attn, cap, tau = model.model.layers[0].self_attn, 0.5, 2.0  # a small cap so that tanh saturates
    q, k, v = torch.randn(1, 4, 5, 8) * 3, torch.randn(1, 2, 5, 8) * 3, torch.randn(1, 2, 5, 8)
    _, probs = ALL_ATTENTION_FUNCTIONS["obliviate_eager"](attn, q, k, v, None, scaling=attn.scaling, softcap=cap)
    capped = cap * torch.tanh((q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)) * attn.scaling / cap)
    assert torch.allclose(probs, (capped / tau).softmax(-1), atol=1e-6)


# ----------------------------------------------------------------------------- GPT-2 reorder_and_upcast_attn


def upcast_gpt2(dtype: torch.dtype, backend: str = "eager", upcast: bool = True, dropout: float = 0.0) -> nn.Module:
    """A tiny GPT-2 asking for fp32 attention scores (reorder_and_upcast_attn), in `dtype`."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=4, n_head=4, n_positions=64, initializer_range=0.5,
        attn_pdrop=dropout, embd_pdrop=dropout, resid_pdrop=dropout, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, reorder_and_upcast_attn=upcast,
    )
    model = GPT2LMHeadModel(config).eval().to(dtype)
    model.set_attn_implementation(backend)
    return model


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpt2_upcast_tau_one_is_stock(dtype: torch.dtype, backend: str) -> None:
    """Stock eager runs QKᵀ and softmax in fp32 for this model; the renamed backend must keep doing so."""
    model, batch = upcast_gpt2(dtype, backend), make_batch()
    stock = logits(model, batch)
    assert torch.equal(logits(smooth_attention(model, 1.0), batch), stock)
    if dtype == torch.bfloat16 and backend == "eager":  # the upcast is visible: without it logits move
        plain = logits(upcast_gpt2(dtype, backend, upcast=False), batch)
        assert valid(batch, (plain - stock).float()).abs().max() > 0.05


def test_gpt2_upcast_dropout_matches_stock_in_train_mode() -> None:
    model, batch = upcast_gpt2(torch.float32, dropout=0.3), make_batch()
    model.train()
    torch.manual_seed(5)
    stock = logits(model, batch)
    smooth_attention(model, 1.0)
    torch.manual_seed(5)
    assert torch.equal(logits(model, batch), stock)


def test_gpt2_upcast_tempers_in_fp32() -> None:
    """τ ≠ 1: softmax(QKᵀ·scaling/τ + mask) computed in fp32 from bf16 inputs, then cast to bf16."""
    model = smooth_attention(upcast_gpt2(torch.bfloat16), 2.5, [1])
    attn = model.transformer.h[1].attn
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 7, 16, generator=g).mul(4).to(torch.bfloat16) for _ in range(3))
    mask = torch.zeros(1, 1, 7, 7).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    out, probs = ALL_ATTENTION_FUNCTIONS["obliviate_eager"](attn, q, k, v, mask, scaling=attn.scaling, dropout=0.0)
    exact = ((q.float() @ k.float().transpose(-1, -2)) * attn.scaling / 2.5 + mask).softmax(-1)  # fp32
    assert probs.dtype == torch.bfloat16 and out.shape == (2, 7, 4, 16)
    assert torch.allclose(probs.float(), exact, atol=4e-3, rtol=0)  # bf16 rounding of the probabilities only
    assert torch.equal(out, (probs @ v).transpose(1, 2))
    low = ((q @ k.transpose(-1, -2)) * (attn.scaling / 2.5) + mask.to(torch.bfloat16)).softmax(-1)  # bf16 scores
    assert (low.float() - exact).abs().max() > 2 * (probs.float() - exact).abs().max()


# ----------------------------------------------------------------------------- attention entropy


def test_attention_entropy_matches_stock_attentions() -> None:
    model, batch = build("mistral", "eager"), make_batch()
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions  # L × [B, H, T, T]
    mask = batch["attention_mask"].bool()
    expected = torch.stack([
        torch.special.entr(a).sum(-1).permute(0, 2, 1)[mask].mean(0) for a in attentions
    ])  # [L, H]: mean over non-pad queries
    model.set_attn_implementation("sdpa")
    got = attention_entropy(model, batch, per_head=True)
    assert got.shape == (2, 4) and torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(attention_entropy(model, batch), expected.mean(1), atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # the probe left the backend as it was


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_attention_entropy_rises_with_tau(arch: str) -> None:
    model, batch = build(arch), make_batch()
    model.train()
    entropies = [attention_entropy(smooth_attention(model, tau), batch) for tau in (1.0, 2.0, 4.0)]
    assert model.training and model.config._attn_implementation == "obliviate_sdpa"
    assert all(torch.all(low < high) for low, high in zip(entropies, entropies[1:])), entropies
    assert torch.all(entropies[-1] <= math.log(9) + 1e-6)  # at most log(#keys)


# ----------------------------------------------------------------------------- generation with a KV cache


def greedy(model: nn.Module, prompt: dict[str, torch.Tensor], use_cache: bool) -> torch.Tensor:
    """Eight greedy tokens after `prompt`."""
    return model.generate(**prompt, max_new_tokens=8, do_sample=False, use_cache=use_cache, pad_token_id=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generate_with_and_without_cache(arch: str) -> None:
    model = build(arch)
    ids = make_batch()["input_ids"]
    prompt = {"input_ids": ids[:, :5], "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    prompt["attention_mask"][1, :2] = 0  # left padding, as generate expects
    stock = greedy(model, prompt, use_cache=True)
    smooth_attention(model, 1.0)
    assert torch.equal(greedy(model, prompt, True), stock)
    assert torch.equal(greedy(model, prompt, False), stock)
    smooth_attention(model, 3.0)
    cached = greedy(model, prompt, True)
    assert torch.equal(cached, greedy(model, prompt, False))
    assert not torch.equal(cached, stock)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_tau_raises_value_error(tau: float) -> None:
    model = build("llama")
    with pytest.raises(ValueError, match="tau"):
        smooth_attention(model, tau)
    with pytest.raises(ValueError, match="tau"):
        smoothed_teacher(model, tau)
    assert not is_smoothed(model)


@pytest.mark.parametrize("layers", [[2], [-3], [], [0.5]])
def test_bad_layer_raises_value_error(layers: list) -> None:
    model = build("llama")
    with pytest.raises(ValueError, match="layer"):
        smooth_attention(model, 2.0, layers)
    assert not is_smoothed(model)


def test_negative_layer_index_counts_from_the_end() -> None:
    batch = make_batch()
    expected = logits(smooth_attention(build("llama"), 2.0, [1]), batch)
    assert torch.equal(logits(smooth_attention(build("llama"), 2.0, [-1]), batch), expected)
    assert torch.equal(logits(smooth_attention(build("llama"), 2.0, [torch.tensor(1)]), batch), expected)


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")  # peft 0.21 on transformers 5
def test_lora_base_teacher_by_toggling_smoothing() -> None:
    """The LoRA-base teacher: smooth the student itself, run with adapters disabled, then remove smoothing."""
    import peft
    model, batch = build("llama"), make_batch()
    stock, teacher = logits(model, batch), logits(smoothed_teacher(model, 2.0), batch)
    student = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    smooth_attention(student, 2.0)
    with student.disable_adapter():
        assert torch.equal(logits(student, batch), teacher)
    remove_smoothing(student)
    assert torch.equal(logits(student, batch), stock)  # LoRA B starts at zero


class StubAttention(nn.Module):
    """An attention module without `layer_idx`, as custom or legacy code has."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_unsupported_architectures_raise_smoothing_error() -> None:
    torch.manual_seed(0)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4))
    with pytest.raises(SmoothingError, match="BloomForCausalLM.*BloomAttention.*AttentionInterface"):
        smooth_attention(bloom, 2.0)
    neo = GPTNeoForCausalLM(GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global"], 2]],
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
    ))
    with pytest.raises(SmoothingError, match="GPTNeoForCausalLM.*layer_idx"):
        smoothed_teacher(neo, 2.0)
    stub = nn.Sequential(StubAttention())
    with pytest.raises(SmoothingError, match="Sequential"):
        smooth_attention(stub, 2.0)
    assert issubclass(SmoothingError, ObliviateError)


def test_flash_backend_is_refused_with_a_hint() -> None:
    model = build("llama")
    model.config._attn_implementation_internal = "flash_attention_2"  # cannot load flash on CPU; fake the name
    with pytest.raises(SmoothingError, match="flash_attention_2.*sdpa"):
        smooth_attention(model, 2.0)
    assert model.config._attn_implementation == "flash_attention_2"


def test_tempered_kwargs_divide_the_backend_default_scaling() -> None:
    """Backends read scaling=None as 1/sqrt(head_dim): head_dim 16, tau 2 -> 0.25 / 2 = 0.125; an explicit
    0.3 -> 0.15; a soft-cap 50 -> 25; other keyword arguments pass through untouched."""
    from obliviate.modeling.smoothing import _tempered_kwargs

    assert _tempered_kwargs({"scaling": None, "dropout": 0.1}, 2.0, 16) == {"scaling": 0.125, "dropout": 0.1}
    assert _tempered_kwargs({"scaling": 0.3, "softcap": 50.0}, 2.0, 16) == pytest.approx({"scaling": 0.15, "softcap": 25.0})


def test_models_that_branch_on_the_backend_name_are_refused() -> None:
    """DeepSeek-V3.2 builds its sparse top-k mask only when the backend is named 'eager'/'sdpa': refuse, don't drop it."""
    import importlib

    from obliviate.modeling.smoothing import branches_on_backend_name

    importlib.import_module("transformers.models.deepseek_v32.modeling_deepseek_v32")
    importlib.import_module("transformers.models.llama.modeling_llama")
    assert branches_on_backend_name("transformers.models.deepseek_v32.modeling_deepseek_v32")
    assert not branches_on_backend_name("transformers.models.llama.modeling_llama")
    assert not branches_on_backend_name("transformers.models.gpt2.modeling_gpt2")  # `== "eager"`: handled itself
