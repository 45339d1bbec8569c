"""LoRA students (peft): only adapters train; θ0 for teacher and reference is the same network with
adapters disabled, so unlearning a large model needs no second copy of its weights."""
from __future__ import annotations

from typing import Any

from obliviate.errors import ConfigError


def apply_lora(model: Any, *, r: int, alpha: int, dropout: float, target_modules: list[str] | None) -> Any:
    """Wrap `model` in fresh LoRA adapters (B = 0, so the wrapped model starts exactly at θ0)."""
    from peft import LoraConfig, get_peft_model

    if r < 1:
        raise ConfigError(f"model.lora.r={r} is impossible: it must be >= 1")
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, task_type="CAUSAL_LM",
                     target_modules=target_modules or "all-linear")
    try:
        return get_peft_model(model, cfg)
    except ValueError as exc:
        raise ConfigError(f"cannot add LoRA adapters: {exc}; set model.lora.target_modules to module names "
                          "of this model (e.g. [q_proj, v_proj])") from None


def merged(model: Any) -> Any:
    """The model with adapters folded into the weights (a plain transformers model), or `model` itself."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
