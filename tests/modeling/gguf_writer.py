"""Write a tiny Llama + its BPE tokenizer as a GGUF file (what llama.cpp's converter would produce), for tests."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary row order for q/k (transformers undoes it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, model: Any, tok: Any, *, arch: str = "llama", chat_template: str | None = CHAT_TEMPLATE,
                    q8_embeddings: bool = False) -> Path:
    """GGUF v3 with the model's weights (F32, or the embedding as Q8_0) and a gpt2-style BPE tokenizer."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_unk_token_id(tok.unk_token_id)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, t in model.state_dict().items():
        a = t.detach().float().numpy()
        if key == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif key == "model.norm.weight":
            name = "output_norm.weight"
        elif key == "lm_head.weight":
            continue  # tied: llama.cpp writes no output.weight, transformers ties it back
        else:
            _, _, i, rest = key.split(".", 3)
            module = rest.rsplit(".", 1)[0]
            name = f"blk.{i}.{names[module]}.weight"
            if module == "self_attn.q_proj":
                a = _permute(a, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                a = _permute(a, cfg.num_key_value_heads)
        if q8_embeddings and name == "token_embd.weight":
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
