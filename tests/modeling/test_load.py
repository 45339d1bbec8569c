"""Tests for obliviate.modeling.load: the attention backend chosen for architectures without sdpa."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

from obliviate.modeling.load import choose_attn_implementation, load_model
from obliviate.modeling.smoothing import remove_smoothing, smooth_attention

SMALL = dict(
    vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


def saved(tmp_path: Path, model: torch.nn.Module) -> str:
    """`model` written to tmp_path as a model directory (config.json + safetensors)."""
    model.save_pretrained(tmp_path, safe_serialization=True)
    return str(tmp_path)


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(**SMALL, head_dim=8, initializer_range=0.3))
    return saved(tmp_path_factory.mktemp("gemma2"), model)


def test_gemma2_loads_with_eager_under_the_sdpa_default(gemma2_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="obliviate.modeling.load"):
        model = load_model(gemma2_dir)  # attn_implementation defaults to sdpa, which Gemma 2 lacks
    assert model.config._attn_implementation == "eager"
    assert any("Gemma2ForCausalLM" in r.message and "'eager'" in r.message for r in caplog.records)
    ids = torch.randint(3, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # and the ASU teacher works on it: τ = 1 is the stock model
        stock = model(ids).logits
        assert torch.equal(smooth_attention(model, 1.0)(ids).logits, stock)
        assert not torch.equal(smooth_attention(model, 2.0)(ids).logits, stock)
    assert remove_smoothing(model).config._attn_implementation == "eager"


def test_supported_choices_are_kept(gemma2_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    llama_dir = saved(tmp_path, LlamaForCausalLM(LlamaConfig(**SMALL)))
    with caplog.at_level(logging.WARNING, logger="obliviate.modeling.load"):
        assert choose_attn_implementation(llama_dir, "sdpa") == "sdpa"
        assert choose_attn_implementation(gemma2_dir, "eager") == "eager"
        assert choose_attn_implementation(gemma2_dir, "flex_attention") == "flex_attention"  # Gemma 2 has flex
        assert choose_attn_implementation(str(tmp_path / "missing"), "sdpa") == "sdpa"  # loading reports that
    assert not caplog.records
    assert load_model(llama_dir).config._attn_implementation == "sdpa"


def test_eval_device_prefers_this_process_gpu_and_the_environment_overrides(monkeypatch):
    """θ0, retain and reference models score on cuda:LOCAL_RANK when a GPU is visible, on the CPU otherwise;
    OBLIVIATE_EVAL_DEVICE wins, and a value that is no device is a ConfigError naming the variable."""
    import torch

    from obliviate.errors import ConfigError
    from obliviate.modeling.load import eval_device, to_eval_device

    monkeypatch.delenv("OBLIVIATE_EVAL_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert eval_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert eval_device() == torch.device("cuda", 1)
    monkeypatch.setenv("OBLIVIATE_EVAL_DEVICE", "cpu")
    assert eval_device() == torch.device("cpu")
    model = torch.nn.Linear(2, 2)
    assert to_eval_device(model) is model and model.weight.device.type == "cpu"
    monkeypatch.setenv("OBLIVIATE_EVAL_DEVICE", "gpu7")
    with pytest.raises(ConfigError, match="OBLIVIATE_EVAL_DEVICE='gpu7'.*cpu, cuda or cuda:N"):
        eval_device()

    class Placed(torch.nn.Linear):  # a model bitsandbytes placed: never moved
        is_loaded_in_4bit = True

        def to(self, *a, **kw):
            raise AssertionError("moved")

    monkeypatch.setenv("OBLIVIATE_EVAL_DEVICE", "cuda")
    placed = Placed(2, 2)
    assert to_eval_device(placed) is placed and to_eval_device(None) is None
