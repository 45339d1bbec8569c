"""Small from-scratch models for offline runs and tests: a BPE tokenizer trained on the data and a
Llama-architecture model built from a config (no downloads)."""
from __future__ import annotations

from typing import Iterable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `texts`, wrapped as a transformers fast tokenizer (no chat template)."""
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL["pad_token"], SPECIAL["bos_token"], SPECIAL["eos_token"], SPECIAL["unk_token"]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **SPECIAL)


def tiny_llama(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    attn_implementation: str = "sdpa",
    seed: int = 0,
) -> LlamaForCausalLM:
    """A Llama-architecture causal LM sized for a CPU, with ids matching `tokenizer`."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.set_attn_implementation(attn_implementation)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model
