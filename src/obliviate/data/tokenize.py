"""Prompt formatting, tokenisation with prompt masking, truncation and collation.

Template: a raw prompt template when the tokenizer's format sets one (`model.chat.prompt_template`, e.g.
`[INST] {q} [/INST]`): prompt + answer tokenised together with the tokenizer's own special tokens (BOS for
Llama), EOS appended, and as many leading tokens masked as the prompt alone tokenises to, as closer-look's and
open-unlearning's data code do; where a token merges across the boundary, the first answer token counts as
prompt there too, and generation starts from the prompt's own tokens (`_raw_encoding`). Else the tokenizer's
chat template when it has one (called with the prompt format it carries: system turn, template arguments, a
fixed date; obliviate.modeling.chat), else `Question: {q}\\nAnswer:` followed by ` {a}` and EOS; there prompt
and answer are tokenised separately so the label mask is exact.
Truncation policy (max_length tokens): the prompt is kept whole and the answer is cut at its right
end (EOS included in what may be cut); if the prompt alone leaves no room for one answer token,
the prompt is cut from the left (its end, next to the answer, is kept).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from obliviate.modeling import chat
from obliviate.modeling.logprobs import IGNORE_INDEX

PLAIN_PROMPT = "Question: {question}\nAnswer:"


def has_chat_template(tokenizer: Any) -> bool:
    """Whether prompts go through the tokenizer's chat template (a raw prompt template replaces it)."""
    return bool(getattr(tokenizer, "chat_template", None)) and chat.raw_template(tokenizer) is None


def prompt_text(tokenizer: Any, question: str) -> str:
    """The text the model sees before the answer."""
    raw = chat.raw_template(tokenizer)
    if raw is not None:
        return raw.format(question=question)
    if has_chat_template(tokenizer):
        return chat.render(tokenizer, chat.messages(tokenizer, [("user", question)]), add_generation_prompt=True)
    return PLAIN_PROMPT.format(question=question)


def _prefix_ids(tokenizer: Any) -> list[int]:
    """BOS for plain prompts when the tokenizer has one (chat templates write their own)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None and not has_chat_template(tokenizer) else []


def prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """Token ids of the prompt (what generation starts from)."""
    if chat.raw_template(tokenizer) is not None:
        return tokenizer(prompt_text(tokenizer, question), add_special_tokens=True)["input_ids"]
    return _prefix_ids(tokenizer) + tokenizer(prompt_text(tokenizer, question), add_special_tokens=False)["input_ids"]


def answer_ids(tokenizer: Any, question: str, answer: str) -> list[int]:
    """Token ids of the answer continuation, ending in EOS."""
    eos = tokenizer.eos_token_id
    if chat.raw_template(tokenizer) is not None:
        ids, n = _raw_encoding(tokenizer, question, answer)
        return ids[n:]
    if has_chat_template(tokenizer):
        p = prompt_text(tokenizer, question)
        full = chat.render(tokenizer, chat.messages(tokenizer, [("user", question), ("assistant", answer)]),
                           add_generation_prompt=False)
        text = full[len(p):] if full.startswith(p) else answer
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids if eos is None or eos in ids else ids + [eos]
    ids = tokenizer(" " + answer, add_special_tokens=False)["input_ids"]
    return ids + ([eos] if eos is not None else [])


def _raw_encoding(tokenizer: Any, question: str, answer: str) -> tuple[list[int], int]:
    """(ids, n) under a raw prompt template: prompt + answer tokenised together with the tokenizer's special tokens,
    EOS appended unless it ends the ids, and n = the prompt's own token count, the positions masked. closer-look's
    convert_raw_forget_data_to_model_format and open-unlearning's preprocess_chat_instance (no chat template)."""
    prompt = prompt_text(tokenizer, question)
    n = len(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    ids = tokenizer(prompt + answer, add_special_tokens=True)["input_ids"]
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids = ids + [eos]
    return ids, n


@dataclass(frozen=True)
class Encoded:
    """One tokenised example: input ids and labels (-100 on the prompt) of equal length."""

    input_ids: list[int]
    labels: list[int]
    truncated: bool


def _fit(p: list[int], a: list[int], max_length: int) -> Encoded:
    """Prompt ids + answer ids under the module's truncation policy."""
    truncated = len(p) + len(a) > max_length
    if len(p) > max_length - 1:
        p = p[len(p) - (max_length - 1):]
    a = a[: max_length - len(p)]
    return Encoded(p + a, [IGNORE_INDEX] * len(p) + a, truncated)


def encode_qa(tokenizer: Any, question: str, answer: str, max_length: int) -> Encoded:
    """Tokenise one QA pair under the module's truncation policy."""
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, got {max_length}")
    if chat.raw_template(tokenizer) is not None:
        ids, n = _raw_encoding(tokenizer, question, answer)
        return _fit(ids[:n], ids[n:], max_length)
    return _fit(prompt_ids(tokenizer, question), answer_ids(tokenizer, question, answer), max_length)


def encode_qa_many(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int) -> list[Encoded]:
    """`encode_qa` of every pair, each question's prompt tokenised once and (plain prompts) the answers in one
    batched tokenizer call; the same ids as pair by pair."""
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, got {max_length}")
    if chat.raw_template(tokenizer) is not None:  # the prompt's tokens may differ per answer (a boundary merge)
        return [encode_qa(tokenizer, q, a, max_length) for q, a in pairs]
    prompts: dict[str, list[int]] = {}
    for q, _ in pairs:
        if q not in prompts:
            prompts[q] = prompt_ids(tokenizer, q)
    if has_chat_template(tokenizer) or not pairs:
        answers = [answer_ids(tokenizer, q, a) for q, a in pairs]
    else:
        eos = tokenizer.eos_token_id
        tail = [eos] if eos is not None else []
        answers = [ids + tail for ids in tokenizer([" " + a for _, a in pairs], add_special_tokens=False)["input_ids"]]
    return [_fit(prompts[q], a, max_length) for (q, _), a in zip(pairs, answers)]


def pad_id(tokenizer: Any) -> int:
    pid = tokenizer.pad_token_id
    if pid is None:
        pid = tokenizer.eos_token_id
    if pid is None:
        raise ValueError("tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return int(pid)


def collate(examples: Sequence[Encoded], pad: int, left: bool = False) -> dict[str, Tensor]:
    """Pad a list of Encoded into input_ids / attention_mask / labels tensors [B, T]."""
    width = max(len(e.input_ids) for e in examples)
    ids, att, lab = [], [], []
    for e in examples:
        n = width - len(e.input_ids)
        fill_ids, fill_att, fill_lab = [pad] * n, [0] * n, [IGNORE_INDEX] * n
        if left:
            ids.append(fill_ids + e.input_ids)
            att.append(fill_att + [1] * len(e.input_ids))
            lab.append(fill_lab + e.labels)
        else:
            ids.append(e.input_ids + fill_ids)
            att.append([1] * len(e.input_ids) + fill_att)
            lab.append(e.labels + fill_lab)
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(att), "labels": torch.tensor(lab)}


