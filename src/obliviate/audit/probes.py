"""Knowledge score K on forget rows, and the prompts of the indirect probes.

K per row (`k_metric`): with annotated facts (the synthetic world, data with `fact_spans`), the share of the
row's asked facts that the greedy answer contains, leaving out facts the prompt itself states ("fact_recall");
without annotations, the ROUGE-L recall of the greedy answer against the gold answer ("rougeL_recall").
A row with no fact left to ask scores NaN and is left out of means. Probes:
  direct                the question in the model's usual prompt (chat template, else "Question: ...\\nAnswer:")
  paraphrased_question  the row's paraphrased question (TOFU and the synthetic world ship one per row: the
                        same fact asked from another angle), in the usual prompt
  few_shot              k retain QA pairs (seeded) as earlier turns, then the forget question
  completion            no chat template: "Question: q\\nAnswer: <first words of the gold answer>", the words
                        up to the first asked fact (annotated data) or the first third of the answer
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from obliviate.data.rows import QARow
from obliviate.data.tokenize import PLAIN_PROMPT, has_chat_template, prompt_ids
from obliviate.eval.generate import batched_avg_loss, greedy_ids
from obliviate.eval.tofu import rouge_recall
from obliviate.modeling import chat


def k_metric(rows: Sequence[QARow]) -> str:
    """'fact_recall' when the rows annotate facts, else 'rougeL_recall'."""
    return "fact_recall" if any(r.fact_spans or r.name_spans for r in rows) else "rougeL_recall"


@dataclass(frozen=True)
class Probe:
    """Prompts of one probe: token ids per row, the text the model was given, and what its answer should hold."""

    name: str
    prompts: list[list[int]]
    given: list[str]
    targets: list[str]


def _plain_ids(tokenizer: Any, text: str) -> list[int]:
    """BOS + the text's tokens: a prompt outside any chat template. No BOS when the tokenizer has none, or when
    its chat template uses the BOS token as a per-turn marker (SmolLM2's <|im_start|>): that would open a turn."""
    bos, bos_text = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
    template = getattr(tokenizer, "chat_template", None) or ""
    turn_marker = bool(bos_text) and isinstance(template, str) and template.count(bos_text) > 1
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ([bos] if bos is not None and not turn_marker else []) + ids


def direct_probe(tokenizer: Any, rows: Sequence[QARow]) -> Probe:
    """The plain question in the model's usual prompt format."""
    return Probe("direct", [prompt_ids(tokenizer, r.question) for r in rows], [r.question for r in rows],
                 [r.answer for r in rows])


def paraphrase_probe(tokenizer: Any, rows: Sequence[QARow]) -> Probe | None:
    """The paraphrased question of each row (rows without one keep theirs); None when no row has one."""
    if not any(r.paraphrased_question for r in rows):
        return None
    qs = [r.paraphrased_question or r.question for r in rows]
    return Probe("paraphrased_question", [prompt_ids(tokenizer, q) for q in qs], qs, [r.answer for r in rows])


def few_shot_shots(retain: Sequence[QARow], k: int, seed: int) -> list[QARow]:
    """k retain rows drawn with `seed` (all of them when there are fewer)."""
    return random.Random(f"{seed}:few_shot").sample(list(retain), min(k, len(retain)))


def few_shot_text(tokenizer: Any, question: str, shots: Sequence[QARow]) -> str:
    """The few-shot prompt text: shots as earlier chat turns (or Question/Answer blocks), then the question."""
    if has_chat_template(tokenizer):
        turns = [t for s in shots for t in (("user", s.question), ("assistant", s.answer))] + [("user", question)]
        return chat.render(tokenizer, chat.messages(tokenizer, turns), add_generation_prompt=True)
    raw = chat.raw_template(tokenizer)
    if raw is not None:  # the answer follows the raw prompt directly, as in training
        return "\n\n".join([raw.format(question=s.question) + s.answer for s in shots] + [raw.format(question=question)])
    blocks = [PLAIN_PROMPT.format(question=s.question) + " " + s.answer for s in shots]
    return "\n\n".join(blocks + [PLAIN_PROMPT.format(question=question)])


def few_shot_probe(tokenizer: Any, rows: Sequence[QARow], shots: Sequence[QARow]) -> Probe:
    """Each forget question after the same retain QA pairs."""
    texts = [few_shot_text(tokenizer, r.question, shots) for r in rows]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] if has_chat_template(tokenizer)
           else _plain_ids(tokenizer, t) for t in texts]
    return Probe("few_shot", ids, [r.question for r in rows], [r.answer for r in rows])


def answer_prefix(row: QARow) -> str:
    """The gold answer's first words: up to the first asked fact when annotated, else its first third of words."""
    asked = set(row.asked_facts())
    starts = [s for s, e in sorted(row.fact_spans + row.name_spans) if row.answer[s:e] in asked]
    if starts:
        return row.answer[:starts[0]].rstrip()
    words = row.answer.split()
    return " ".join(words[:max(0, min(len(words) - 1, len(words) // 3))])


def completion_probe(tokenizer: Any, rows: Sequence[QARow]) -> Probe:
    """"Question: q\\nAnswer: <prefix>" outside any chat template; the answer must continue the prefix."""
    prefixes = [answer_prefix(r) for r in rows]
    texts = [PLAIN_PROMPT.format(question=r.question) + (" " + p if p else "") for r, p in zip(rows, prefixes)]
    targets = [r.answer[len(p):].strip() or r.answer for r, p in zip(rows, prefixes)]
    return Probe("completion", [_plain_ids(tokenizer, t) for t in texts],
                 [f"{r.question} {p}" for r, p in zip(rows, prefixes)], targets)


@torch.no_grad()
def greedy_from_ids(model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, max_new_tokens: int,
                    batch_size: int, max_length: int) -> list[str]:
    """Greedy answers to prompt ids (left-cut to leave room for the answer), in input order."""
    keep = max(1, max_length - max_new_tokens)
    return greedy_ids(model, tokenizer, [p[-keep:] for p in prompts], max_new_tokens=max_new_tokens,
                      batch_size=batch_size)


def item_scores(generations: Sequence[str], rows: Sequence[QARow], probe: Probe, metric: str) -> np.ndarray:
    """K of each row [N]: asked facts (not in the prompt) found in the answer, or ROUGE-L recall vs the target."""
    if metric == "rougeL_recall":
        return rouge_recall(list(generations), probe.targets)
    out = np.full(len(rows), np.nan)
    for i, (gen, row, given) in enumerate(zip(generations, rows, probe.given)):
        facts = [f for f in row.asked_facts() if f.lower() not in given.lower()]
        if facts:
            out[i] = sum(f.lower() in gen.lower() for f in facts) / len(facts)
    return out


def answer_probs(model: Any, tokenizer: Any, rows: Sequence[QARow], *, batch_size: int, max_length: int) -> np.ndarray:
    """exp(-avg_loss) of each gold answer under the direct prompt [N] (TOFU's forget Prob per row)."""
    return np.exp(-batched_avg_loss(model, tokenizer, [(r.question, r.answer) for r in rows],
                                    batch_size=batch_size, max_length=max_length))


def mean_k(scores: np.ndarray, idx: Sequence[int] | None = None) -> float | None:
    """Mean of the defined scores (over `idx` when given); None when none is defined."""
    s = np.asarray(scores, dtype=np.float64)
    s = s[list(idx)] if idx is not None else s
    s = s[np.isfinite(s)]
    return float(s.mean()) if s.size else None
