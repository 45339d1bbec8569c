"""Fluency of generated answers (docs/METRICS.md §5): is the output coherent, not gibberish?

Definitions (chosen here, fixed by the tests):
- token_entropy: Shannon entropy of the frequency distribution of the text's tokens divided by
  log(number of tokens) (closer-look protocol, Yuan et al. 2024). 1 = every token distinct, 0 = one
  token repeated. Tokens come from the given tokenizer (no special tokens), else whitespace words.
  Texts with at most one token score 0 (the normaliser log 1 = 0 leaves it undefined).
- repetition_rate: 1 - unique/total over the text's word BIGRAMS; words are lowercased `\\w+` runs,
  so punctuation and case do not hide a repeat. Bigrams (not unigrams) because function words
  repeat in any normal sentence; a repeated bigram is the first sign of a decoding loop. Texts with
  fewer than two words score 0.
- is_degenerate: empty (no word at all), or a word or a bigram repeated >= 3 times in a row
  ("the the the", "of the of the of the"), or repetition_rate > 0.5 (over half of the bigrams are
  repeats; covers longer loops such as "the book is the book is the book is").
- generation_perplexity: exp of the mean over non-empty generations of avg_loss(question,
  generation) under a given (usually the original) model, i.e. the geometric mean of per-answer
  perplexities, computed with `batched_avg_loss` (EOS counted, as in avg_loss).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from obliviate.eval.generate import batched_avg_loss

WORD = re.compile(r"\w+")
MAX_RUN = 3
DEGENERATE_REPETITION = 0.5


def _tokens(text: str, tokenizer: Any | None) -> list[Any]:
    if tokenizer is None:
        return text.split()
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def token_entropy(text: str, tokenizer: Any | None = None) -> float:
    """Normalised unigram entropy H(freq)/log(n) of the text's n tokens (closer-look Token Entropy); n <= 1 -> 0."""
    tokens = _tokens(text, tokenizer)
    n = len(tokens)
    if n <= 1:
        return 0.0
    p = np.array(list(Counter(tokens).values()), dtype=np.float64) / n
    # n distinct tokens give exactly 1, but the float sum can land at 1 + 2e-16 (breaking FE/MU's [0, 1] check)
    return min(1.0, float(-(p * np.log(p)).sum() / math.log(n)))


def words(text: str) -> list[str]:
    """Lowercased word tokens (`\\w+` runs) of a text."""
    return WORD.findall(text.lower())


def repetition_rate(text: str) -> float:
    """1 - unique/total word bigrams of the text (0 for fewer than two words)."""
    w = words(text)
    bigrams = list(zip(w, w[1:]))
    if not bigrams:
        return 0.0
    return 1.0 - len(set(bigrams)) / len(bigrams)


def longest_run(items: Sequence[str], n: int) -> int:
    """Most consecutive repeats of one n-gram (stride n) in `items`; 0 when shorter than n."""
    best = 0
    for start in range(len(items) - n + 1):
        gram, run, j = items[start:start + n], 1, start + n
        while items[j:j + n] == gram:
            run, j = run + 1, j + n
        best = max(best, run)
    return best


def is_degenerate(text: str) -> bool:
    """Empty, a word/bigram repeated >= 3 times in a row, or repetition_rate > 0.5 (module docstring)."""
    w = words(text)
    if not w:
        return True
    if longest_run(w, 1) >= MAX_RUN or longest_run(w, 2) >= MAX_RUN:
        return True
    return repetition_rate(text) > DEGENERATE_REPETITION


def fluency_rows(generations: Sequence[str], tokenizer: Any | None = None) -> dict[str, list[float]]:
    """Each generation's token entropy, repetition rate and degenerate flag (1.0 / 0.0), keyed as fluency_summary's
    means: [N] lists."""
    return {"token_entropy": [float(token_entropy(g, tokenizer)) for g in generations],
            "repetition_rate": [float(repetition_rate(g)) for g in generations],
            "degenerate_share": [float(is_degenerate(g)) for g in generations]}


def fluency_summary(generations: Sequence[str], tokenizer: Any | None = None,
                    per_row: Mapping[str, Sequence[float]] | None = None) -> dict[str, float]:
    """Mean token entropy, mean repetition rate and degenerate share over a list of generations (`per_row`:
    fluency_rows of the same generations, when the caller has them already)."""
    if len(generations) == 0:
        raise ValueError("fluency_summary needs at least one generation")
    per_row = fluency_rows(generations, tokenizer) if per_row is None else per_row
    return {**{k: float(np.mean(v)) for k, v in per_row.items()}, "n": float(len(generations))}


def generation_perplexity(model: Any, tokenizer: Any, questions: Sequence[str], generations: Sequence[str], *,
                          batch_size: int = 32, max_length: int = 256) -> float | None:
    """exp(mean avg_loss(q, g)) of the non-empty generations under `model`; None if all are empty."""

    if len(questions) != len(generations):
        raise ValueError(f"generation_perplexity: {len(questions)} questions but {len(generations)} generations")
    pairs = [(q, g) for q, g in zip(questions, generations) if g.strip()]
    if not pairs:
        return None
    losses = batched_avg_loss(model, tokenizer, pairs, batch_size=batch_size, max_length=max_length)
    return float(np.exp(losses.mean()))
