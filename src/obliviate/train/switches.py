"""Precision and memory switches for real GPUs: bf16 autocast, gradient checkpointing, torch.compile.

What each one changes (train.* keys):
- precision "bf16": the forward passes (student, frozen teacher/reference) run under torch.autocast, so
  matmuls and attention run in bfloat16. Stays float32: the weights, gradients and AdamW state (master
  weights), the log-softmax over the vocabulary (`logprobs._wide` upcasts half logits), every KL, entropy
  and loss reduction, the gradient rules (SAGO/PCGrad arithmetic on float32 .grad) and the backward's
  accumulation into .grad. "fp32" (default) runs everything in the model's own dtype. This is autocast,
  not bf16 weights: `model.dtype=bfloat16` loads the weights themselves in bf16 (pure bf16 training).
- gradient_checkpointing: transformers' non-reentrant activation checkpointing of every decoder layer
  (activations recomputed in the backward: ~1/3 more compute, activation memory of one layer). Same math.
- compile: each decoder layer compiled in place with torch.compile (per-block, as large-model trainers do;
  the LM head stays eager because it runs on a data-dependent number of answer rows). Same math up to
  float reassociation; the first steps pay the compile time. `compile_backend` picks the backend
  (inductor by default; aot_eager compiles without generating code, which the tests use).
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from obliviate.errors import ConfigError
from obliviate.modeling.load import require_bitsandbytes
from obliviate.modeling.logprobs import decoder_layers
from obliviate.train.optim import optimizer_class

PRECISIONS = ("fp32", "bf16")


def autocast(precision: str, device: torch.device) -> AbstractContextManager[Any]:
    """The context the forward passes run in: bf16 autocast on `device`, or nothing for fp32."""
    if precision == "fp32":
        return nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ConfigError(f"train.precision must be one of {list(PRECISIONS)}, got {precision!r}")


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Activation checkpointing of every decoder layer (transformers, non-reentrant), PEFT unwrapped."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(inner, "supports_gradient_checkpointing", False):
        raise ConfigError(f"train.gradient_checkpointing=true, but {type(inner).__name__} does not support gradient "
                          "checkpointing in transformers; set train.gradient_checkpointing=false")
    kwargs = {"use_reentrant": False}
    if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5's name
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def check_backend(backend: str) -> None:
    """ConfigError unless torch.compile knows `backend` (the list it offers is in the message)."""
    import torch._dynamo

    try:
        torch._dynamo.lookup_backend(backend)
    except Exception:  # InvalidBackend, or a backend whose package is missing
        valid = ", ".join(torch._dynamo.list_backends(exclude_tags=()))
        raise ConfigError(f"train.compile_backend={backend!r} is not a torch.compile backend here; valid: {valid}") from None


def compile_layers(model: torch.nn.Module, backend: str) -> int:
    """torch.compile each decoder layer in place (nn.Module.compile); returns how many were compiled."""

    check_backend(backend)
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(backend=backend)
    return len(layers)


def check_memory_switches(train: Any, model: Any = None) -> list[str]:
    """bitsandbytes' switches checked before any weights load (installed, a CUDA GPU present): train.optimizer and
    model.load_in_4bit (QLoRA). Lines for `validate`; a ConfigError naming the key and the fix otherwise."""
    lines = []
    if train.optimizer != "adamw":
        lines.append(f"optimizer: bitsandbytes {optimizer_class(train.optimizer).__name__}")
    if model is not None and model.load_in_4bit:
        require_bitsandbytes("model.load_in_4bit=true (QLoRA)", "set model.load_in_4bit=false")
        lines.append("model: base weights in 4-bit NF4 under LoRA adapters (QLoRA)")
    return lines


def apply_switches(model: torch.nn.Module, cfg: Any) -> None:
    """Gradient checkpointing and compilation of the student as the train config asks (before it is wrapped)."""
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    if cfg.compile:
        compile_layers(model, cfg.compile_backend)
