"""Tokenizer files that transformers 4.4x reads as well as 5.x: `save_tokenizer` saves as transformers does, then
rewrites what only 5.x understands in tokenizer_config.json (reference frameworks pin 4.x: open-unlearning 4.45).

What transformers 5 writes and 4.x cannot read, and what is written instead (each loads back the same in 5.x):
  tokenizer_class "TokenizersBackend"  5.x's name for the generic tokenizer over tokenizer.json; 4.x has no such class
      ("Tokenizer class TokenizersBackend does not exist or is not currently imported"). Written instead:
      "PreTrainedTokenizerFast", 4.x's name for that generic class, which 5.x keeps as an alias of the same class
      (only when tokenizer.json was saved: it is what that class loads). Other class names are kept: 4.x's
      AutoTokenizer reads a model's "XTokenizer" as its "XTokenizerFast".
  extra_special_tokens [list]  5.x's list of added special tokens; 4.45 ignores the key (the tokens lose their
      special status) and 4.48-4.57 read it as a dict of named tokens and fail ("'list' object has no attribute
      'keys'"). Written instead: additional_special_tokens, the list both read. A dict (named tokens) is kept.
  chat_template.jinja  5.x writes the chat template to this file only; 4.45 reads `chat_template` from
      tokenizer_config.json. The template is written there too (named templates as 4.x's list of {name, template});
      the .jinja files stay.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = "tokenizer_config.json"
# class names transformers 5 writes that 4.x lacks -> the 4.x name of the same class (5.x aliases it)
RENAMED_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def portable_config(config: dict[str, Any], chat_template: Any, has_tokenizer_json: bool) -> dict[str, Any]:
    """tokenizer_config.json's content as 4.x can read it too (see the module docstring); a new dict."""
    out = dict(config)
    cls = out.get("tokenizer_class")
    if cls in RENAMED_CLASSES and has_tokenizer_json:
        out["tokenizer_class"] = RENAMED_CLASSES[cls]
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        out.pop("extra_special_tokens")
        out["additional_special_tokens"] = list(dict.fromkeys([*(out.get("additional_special_tokens") or []), *extra]))
    if isinstance(chat_template, str) and chat_template:
        out["chat_template"] = chat_template
    elif isinstance(chat_template, dict) and chat_template:
        out["chat_template"] = [{"name": k, "template": v} for k, v in chat_template.items()]
    return out


def save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """`tokenizer.save_pretrained(directory)`, its tokenizer_config.json then made readable by transformers 4.x."""
    tokenizer.save_pretrained(directory)
    path = Path(directory) / CONFIG
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    new = portable_config(config, getattr(tokenizer, "chat_template", None), (Path(directory) / "tokenizer.json").is_file())
    if new != config:  # transformers' own layout: sorted keys, 2-space indent, UTF-8 as is
        path.write_text(json.dumps(new, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
