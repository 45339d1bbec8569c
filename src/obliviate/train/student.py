"""The model a run trains, per its `model:` section: θ0 loaded from a directory, a GGUF file or a hub id (LoRA
adapters attached when model.lora.enabled), a trainable copy of a loaded θ0, and the model a run saves."""
from __future__ import annotations

from typing import Any

from obliviate.config import ModelConfig
from obliviate.config.fields import need
from obliviate.modeling import chat
from obliviate.modeling.lora import apply_lora, merged
from obliviate.modeling.sources import check_tokenizer_source


def _with_lora(model: Any, mc: ModelConfig) -> Any:
    return apply_lora(model, r=mc.lora.r, alpha=mc.lora.alpha, dropout=mc.lora.dropout,
                      target_modules=list(mc.lora.target_modules) if mc.lora.target_modules else None)


def load_model(mc: ModelConfig) -> tuple[Any, Any]:
    """(model, tokenizer) of `mc.path` (and `mc.tokenizer`), with fresh LoRA adapters when mc.lora.enabled."""
    from obliviate.modeling.load import load_pretrained

    need(mc.path, "model.path", "<model dir or hub id>")
    if mc.tokenizer:
        check_tokenizer_source(mc.tokenizer, "model.tokenizer")
    model, tok = load_pretrained(mc.path, mc.tokenizer, dtype=mc.dtype, attn_implementation=mc.attn_implementation,
                                 trust_remote_code=mc.trust_remote_code, load_in_4bit=mc.load_in_4bit)
    if mc.load_in_4bit:  # QLoRA: norms in float32, inputs' gradients on, before the adapters go in
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return (_with_lora(model, mc) if mc.lora.enabled else model), with_chat(tok, mc)


def with_chat(tokenizer: Any, mc: ModelConfig) -> Any:
    """The tokenizer with the config's prompt format (model.chat) when it sets one; else it keeps the format a
    saved model carried (modeling/chat.py)."""

    if mc.chat.given():
        chat.set_format(tokenizer, mc.chat.system, mc.chat.template_args, mc.chat.prompt_template)
    return tokenizer


def student_copy(model: Any, mc: ModelConfig) -> Any:
    """A trainable copy of θ0 (full fine-tuning) or θ0 wrapped in fresh LoRA adapters."""
    from obliviate.modeling.frozen import frozen_copy

    student = frozen_copy(model)
    if mc.lora.enabled:
        return _with_lora(student, mc)
    for p in student.parameters():
        p.requires_grad_(True)
    return student


def saveable(model: Any, mc: ModelConfig) -> Any:
    """What to write: the merged model for LoRA runs (unless merge_on_save is off), else the model."""
    if mc.lora.enabled and mc.lora.merge_on_save:
        return merged(model)
    return model
