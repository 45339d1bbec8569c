"""eval/known.py: when a fine-tuned model first knows a split, read from the checks kept in its history."""
from __future__ import annotations

import pytest

from obliviate.eval.known import known_curve, known_line, known_summary, knows, steps_per_epoch


def _history(checks: dict[int, tuple[float, float | None]], steps: int) -> list[dict]:
    out = []
    for s in range(1, steps + 1):
        h = {"step": s, "nll": 1.0 / s}
        if s in checks:
            h["eval_rougeL_recall"], h["eval_fact_recall"] = checks[s]
        out.append(h)
    return out


@pytest.mark.parametrize("n, batch, accum, expected", [(400, 16, 1, 25), (401, 16, 1, 26), (400, 8, 2, 25),
                                                       (5, 16, 1, 1)])
def test_one_epoch_is_a_pass_over_the_rows_counting_the_partial_batch(n, batch, accum, expected):
    assert steps_per_epoch(n, batch, accum) == expected


def test_known_needs_rouge_and_where_measured_fact_recall_at_the_bar():
    assert knows({"rougeL_recall": 0.8, "fact_recall": None}, 0.8)
    assert knows({"rougeL_recall": 0.8, "fact_recall": 0.8}, 0.8)
    assert not knows({"rougeL_recall": 0.79, "fact_recall": 1.0}, 0.8)
    assert not knows({"rougeL_recall": 1.0, "fact_recall": 0.79}, 0.8)


def test_the_first_epoch_at_the_bar_is_reported_even_if_recall_dips_later():
    # 10 steps an epoch, checks at every epoch end; fact recall holds epoch 2 back although ROUGE-L reaches 0.85
    history = _history({10: (0.40, 0.30), 20: (0.85, 0.70), 30: (0.90, 0.80), 40: (0.75, 0.90), 45: (0.95, 0.95)}, 45)
    s = known_summary(history, "forget10", 0.8, 10)
    assert [c["step"] for c in s["curve"]] == [10, 20, 30, 40, 45]
    assert [c["epoch"] for c in s["curve"]] == [1.0, 2.0, 3.0, 4.0, 4.5]
    assert (s["first_step"], s["first_epoch"]) == (30, 3.0)
    assert (s["last_rougeL_recall"], s["last_fact_recall"]) == (0.95, 0.95)
    assert known_line(s) == ("forget10: recall >= 0.8 from epoch 3 (step 30); last check: ROUGE-L recall 0.950, "
                             "fact recall 0.950")


def test_a_model_that_never_knows_the_split_says_so_with_its_last_values():
    s = known_summary(_history({25: (0.30, None), 50: (0.378, None)}, 50), "forget10", 0.8, 25)
    assert s["first_step"] is None and s["first_epoch"] is None
    assert known_line(s) == "forget10: recall never reached 0.8 (last check: ROUGE-L recall 0.378)"
    assert known_curve([{"step": 3, "nll": 0.1}], 2) == []
    assert known_line(known_summary([], "x", 0.5, 1)) == "x: recall never reached 0.5 (last check: no check ran)"


def test_the_check_scores_greedy_answers_by_their_mean_recall(monkeypatch):
    """Answers fixed by hand: ROUGE-L recall 2/4, 1, 0, 1 (mean 0.625, not the median 0.75); fact recall over the
    annotated row only: both facts found -> 1.0, then 'Tessaly' found and '1962' not -> 0.5 (ROUGE-L 3/5 there)."""
    from obliviate.data.rows import QARow
    from obliviate.eval import known

    rows = [QARow("q1", "alpha beta gamma delta"), QARow("q2", "epsilon zeta"), QARow("q3", "eta theta"),
            QARow("q4", "born in Tessaly in 1962", fact_spans=((8, 15), (19, 23)))]
    answers = ["alpha beta", "epsilon zeta", "nothing", "born in Tessaly in 1962"]
    seen = {}

    def fake(model, tok, questions, **kw):
        seen.update(questions=questions, **kw)
        return answers

    monkeypatch.setattr(known, "generate_answers", fake)
    out = known.recall_check(None, None, rows, max_new_tokens=7, batch_size=3)
    assert out["rougeL_recall"] == pytest.approx(0.625)
    assert out["fact_recall"] == pytest.approx(1.0)
    assert seen["questions"] == ["q1", "q2", "q3", "q4"] and (seen["max_new_tokens"], seen["batch_size"]) == (7, 3)
    answers[3] = "born in Tessaly"
    out = known.recall_check(None, None, rows)
    assert out["fact_recall"] == pytest.approx(0.5) and out["rougeL_recall"] == pytest.approx((0.5 + 1 + 0 + 0.6) / 4)
