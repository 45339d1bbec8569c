"""Fluency metrics on hand-made texts, expected values worked out by hand in the comments."""
from __future__ import annotations

import math

import pytest
import torch

from obliviate.eval.fluency import (
    fluency_summary,
    generation_perplexity,
    is_degenerate,
    longest_run,
    repetition_rate,
    token_entropy,
    words,
)
from obliviate.modeling.tiny import tiny_llama, train_tokenizer


class CharTokenizer:
    """Stub tokenizer: one token per character (enough to test the tokenizer path)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def test_token_entropy_hand_values():
    # "a a b b": 4 tokens, p = (1/2, 1/2): H = ln 2; normalised by ln 4 = 2 ln 2 -> 0.5
    assert token_entropy("a a b b") == pytest.approx(0.5)
    # all distinct: H = ln 4 = ln n -> 1
    assert token_entropy("a b c d") == pytest.approx(1.0)
    # 5 distinct words: 5 x 0.2 ln 5 / ln 5 sums to 1 + 2e-16 in floats; clipped to exactly 1 (FE/MU need [0, 1])
    assert token_entropy("answer number 0 of retain") == 1.0
    # one token repeated: H = 0 -> 0
    assert token_entropy("of of of of") == 0.0
    # "a a b": p = (2/3, 1/3): H = 2/3 ln 1.5 + 1/3 ln 3 = 0.270310 + 0.366204 = 0.636514;
    # divided by ln 3 = 1.098612 -> 0.579380
    assert token_entropy("a a b") == pytest.approx(0.579380, abs=1e-6)
    # edge cases: 0 or 1 token -> 0 (log 1 = 0 would divide by zero)
    assert token_entropy("") == 0.0 and token_entropy("word") == 0.0


def test_token_entropy_uses_the_tokenizer():
    # characters of "abab": p = (1/2, 1/2) over 4 tokens -> ln 2 / ln 4 = 0.5
    assert token_entropy("abab", CharTokenizer()) == pytest.approx(0.5)
    # "aaab" whitespace-split is one word (-> 0); by characters p = (3/4, 1/4):
    # H = 3/4 ln(4/3) + 1/4 ln 4 = 0.215762 + 0.346574 = 0.562335; / ln 4 = 1.386294 -> 0.405639
    assert token_entropy("aaab") == 0.0
    assert token_entropy("aaab", CharTokenizer()) == pytest.approx(0.405639, abs=1e-6)


def test_repetition_rate_hand_values():
    # "of of of of": bigrams (of,of) x3, 1 unique -> 1 - 1/3 = 2/3
    assert repetition_rate("of of of of") == pytest.approx(2 / 3)
    # "a b a b": bigrams ab, ba, ab -> 2 unique of 3 -> 1/3
    assert repetition_rate("a b a b") == pytest.approx(1 / 3)
    # no repeated bigram ("the" twice is fine: the cat / on the / the mat are distinct) -> 0
    assert repetition_rate("The cat sat on the mat.") == 0.0
    # case and punctuation do not hide a repeat: words of, of, of -> 2 bigrams, 1 unique -> 1/2
    assert words("Of, of OF!") == ["of", "of", "of"]
    assert repetition_rate("Of, of OF!") == pytest.approx(0.5)
    assert repetition_rate("") == 0.0 and repetition_rate("alone") == 0.0


def test_longest_run():
    assert longest_run(list("ababab"), 2) == 3  # (a,b) three times in a row
    assert longest_run(list("ababab"), 1) == 1
    assert longest_run(list("aab"), 1) == 2
    assert longest_run([], 2) == 0


@pytest.mark.parametrize("text, expected", [
    ("", True),                                   # empty
    ("   ", True),                                # only whitespace
    ("!!! ...", True),                            # no word at all
    ("the the the end", True),                    # word repeated 3 times in a row
    ("the the end", False),                       # twice is not enough
    ("of the of the of the", True),               # bigram repeated 3 times in a row
    # trigram loop: bigrams 8, unique 3 (the book, book is, is the) -> rate 1 - 3/8 = 0.625 > 0.5
    ("the book is the book is the book is", True),
    ("a b a b", False),                           # rate 1/3, runs of 2
    ("The capital of France is Paris.", False),
])
def test_is_degenerate(text, expected):
    assert is_degenerate(text) is expected


def test_fluency_summary_hand_values():
    gens = ["a a b b", "of of of of", ""]
    out = fluency_summary(gens)
    # entropy: 0.5, 0, 0 -> 1/6; repetition: "a a b b" has bigrams aa, ab, bb (all unique) -> 0, then 2/3, 0 -> 2/9;
    # degenerate: no, yes (run of 4), yes (empty) -> 2/3
    assert out["token_entropy"] == pytest.approx(1 / 6)
    assert out["repetition_rate"] == pytest.approx(2 / 9)
    assert out["degenerate_share"] == pytest.approx(2 / 3)
    assert out["n"] == 3
    with pytest.raises(ValueError, match="at least one"):
        fluency_summary([])


def test_generation_perplexity_of_uniform_model_is_vocab_size():
    tok = train_tokenizer(["Who wrote it? Ana wrote it in Lima."], vocab_size=300)
    model = tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=4)
    with torch.no_grad():
        # Tied embeddings at zero: every hidden state and logit is 0, so p = 1/V for every token,
        # avg_loss = ln V for every answer and the perplexity is exactly V.
        model.get_input_embeddings().weight.zero_()
    vocab = model.config.vocab_size
    ppl = generation_perplexity(model, tok, ["Who wrote it?", "Where?", "x"], ["Ana wrote it.", "", "Lima"])
    assert ppl == pytest.approx(vocab, rel=1e-5)
    assert math.isfinite(ppl)
    # empty generations are left out; if all are empty there is nothing to score
    assert generation_perplexity(model, tok, ["q"], ["  "]) is None
    with pytest.raises(ValueError, match="questions"):
        generation_perplexity(model, tok, ["q"], ["a", "b"])
