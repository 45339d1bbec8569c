"""A model directory obliviate saves names a tokenizer class transformers 4.45 has (the version open-unlearning pins),
lists its added special tokens and its chat template where 4.45 reads them (tokenizer_config.json), and still loads
with the installed transformers (5.x) into the same tokenizer: same ids, special tokens and chat template."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from obliviate.modeling.load import save_model
from obliviate.modeling.tokenizer_files import portable_config, save_tokenizer

# Tokenizer classes transformers v4.45.2 defines, read from its source: the generic class over tokenizer.json in
# tokenization_utils_fast.py, and the classes of the model families obliviate is used on in
# models/auto/tokenization_auto.py (TOKENIZER_MAPPING_NAMES; 4.45's AutoTokenizer reads "X" as "XFast" first).
KNOWN_TO_4_45 = {"PreTrainedTokenizerFast", "LlamaTokenizer", "LlamaTokenizerFast", "GPT2Tokenizer",
                 "GPT2TokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"}
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SAMPLES = ["Who wrote the novel?", "<|user|> hello <|assistant|> the author was born in 1950</s>", "  spaced  out ",
           "Ünïcödé and digits 12345", ""]
CHAT = [{"role": "user", "content": "Where was the author born?"}, {"role": "assistant", "content": "In Paris."}]


def _config(directory) -> dict:
    return json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))


def _same_tokenizer(a, b) -> None:
    for text in SAMPLES:
        assert a(text)["input_ids"] == b(text)["input_ids"], text
    assert a.all_special_tokens == b.all_special_tokens
    assert (a.bos_token, a.eos_token, a.pad_token, a.unk_token) == (b.bos_token, b.eos_token, b.pad_token, b.unk_token)
    assert a.chat_template == b.chat_template
    if a.chat_template is not None:
        assert a.apply_chat_template(CHAT, tokenize=False) == b.apply_chat_template(CHAT, tokenize=False)


@pytest.fixture()
def chat_tok(model_dir):
    """The small tokenizer (as loaded back from a saved model) with a chat template and two added special tokens."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = TEMPLATE
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    return tok


def test_a_saved_model_names_a_class_4_45_has_and_reloads_the_same(model_dir, small_tok):
    cfg = _config(model_dir)  # written by save_model (tests/conftest.py)
    assert cfg["tokenizer_class"] in KNOWN_TO_4_45, cfg["tokenizer_class"]
    assert type(small_tok).__name__ == "TokenizersBackend"  # the transformers 5 class this is about
    assert "chat_template" not in cfg and not isinstance(cfg.get("extra_special_tokens"), list)
    _same_tokenizer(AutoTokenizer.from_pretrained(model_dir), small_tok)


def test_chat_template_and_added_special_tokens_are_where_4_45_reads_them(chat_tok, trained_small, tmp_path):
    save_model(tmp_path, trained_small, chat_tok)
    cfg = _config(tmp_path)
    assert cfg["tokenizer_class"] in KNOWN_TO_4_45
    assert cfg["chat_template"] == TEMPLATE  # 4.45 reads it here; 5.x also wrote chat_template.jinja
    assert (tmp_path / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    assert cfg["additional_special_tokens"] == ["<|user|>", "<|assistant|>"] and "extra_special_tokens" not in cfg
    back = AutoTokenizer.from_pretrained(tmp_path)
    _same_tokenizer(back, chat_tok)
    assert back("<|user|>")["input_ids"] == [chat_tok.convert_tokens_to_ids("<|user|>")]


def test_named_chat_templates_are_written_as_4_45s_list(chat_tok, tmp_path):
    chat_tok.chat_template = {"default": TEMPLATE, "short": "{{ messages[0]['content'] }}"}
    save_tokenizer(chat_tok, tmp_path)
    assert _config(tmp_path)["chat_template"] == [{"name": "default", "template": TEMPLATE},
                                                  {"name": "short", "template": "{{ messages[0]['content'] }}"}]
    _same_tokenizer(AutoTokenizer.from_pretrained(tmp_path), chat_tok)


def test_only_what_4_x_cannot_read_is_rewritten():
    v5 = {"tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["<a>", "<b>"],
          "additional_special_tokens": ["<a>", "<c>"], "eos_token": "</s>"}
    assert portable_config(v5, None, True) == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>",
                                               "additional_special_tokens": ["<a>", "<c>", "<b>"]}
    assert portable_config(v5, None, False)["tokenizer_class"] == "TokenizersBackend"  # nothing for the other to load
    kept = {"tokenizer_class": "GPT2Tokenizer", "extra_special_tokens": {"image_token": "<img>"}}
    assert portable_config(kept, "", True) == kept  # a model's own class, named tokens (a dict), no template
