"""Token classes, class shifts, τ calibration: hand-made inputs and a tiny model."""
import numpy as np
import pytest

from obliviate.data.rows import QARow
from obliviate.eval.analysis import (
    FACTUAL,
    FUNCTIONAL,
    OTHER,
    ClassShift,
    answer_token_classes,
    calibrate,
    class_shift,
    default_layer_sets,
    heuristic_spans,
    recommend,
)


def test_heuristic_spans_pick_numbers_quotes_and_mid_sentence_capitals():
    text = "She wrote 'Blue Door' in 1962. Later she moved to Orla."
    found = [text[s:e] for s, e in heuristic_spans(text)]
    assert "'Blue Door'" in found and "1962." in found or "1962" in found
    assert "Orla" in found and "She" not in found and "Later" not in found


def test_annotated_tokens_are_classified_by_span_overlap(small_tok, small_world):
    row = next(r for r in small_world.splits["forget10"] if r.fact_spans)
    ids = small_tok(" " + row.answer, add_special_tokens=False)["input_ids"]
    cls = answer_token_classes(small_tok, row, len(ids) + 1)  # + EOS
    assert cls[-1] == OTHER and FACTUAL in cls and FUNCTIONAL in cls
    assert all(not small_tok.decode([i]).strip() for i, c in zip(ids, cls) if c == OTHER)  # only whitespace
    facts = "".join(small_tok.decode([i]) for i, c in zip(ids, cls) if c == FACTUAL)
    for s, e in row.fact_spans:  # every fact's characters are inside the factual tokens' text
        assert row.answer[s:e].replace(" ", "") in facts.replace(" ", "")


def test_unannotated_row_uses_the_heuristic(small_tok):
    row = QARow("q?", "He was born in 1962.")
    ids = small_tok(" " + row.answer, add_special_tokens=False)["input_ids"]
    cls = answer_token_classes(small_tok, row, len(ids))
    factual = "".join(small_tok.decode([i]) for i, c in zip(ids, cls) if c == FACTUAL)
    functional = "".join(small_tok.decode([i]) for i, c in zip(ids, cls) if c == FUNCTIONAL)
    assert "1962" in factual.replace(" ", "") and "was born in" in functional


def test_class_shift_hand_values():
    # two examples; factual deltas -2 and -4 (mean -3), functional 0 and -1 (mean -0.5), OTHER ignored
    before = [np.array([-1.0, -1.0, -1.0]), np.array([-0.5, -2.0])]
    after = [np.array([-3.0, -1.0, -9.0]), np.array([-4.5, -3.0])]
    classes = [np.array([FACTUAL, FUNCTIONAL, OTHER]), np.array([FACTUAL, FUNCTIONAL])]
    s = class_shift(before, after, classes)
    assert (s.factual, s.functional, s.n_factual, s.n_functional) == (-3.0, -0.5, 2, 2)
    assert s.selectivity == pytest.approx(2.5)


def test_recommend_prefers_selectivity_within_budget():
    g = lambda tau, f, fn: {"tau": tau, "layers": None, "factual_shift": f, "functional_shift": fn,  # noqa: E731
                            "selectivity": fn - f, "n_factual": 5, "admissible": True}
    grid = [g(2, -0.1, -0.05), g(4, -0.5, -0.4), g(8, -0.6, -0.2), g(16, -2.0, -1.5)]
    assert recommend(grid, 0.7, 0.3)["tau"] == 8  # 16 breaks the budget; 8 beats 4 on selectivity
    assert recommend(grid, 0.7, 1.0)["tau"] == 8  # nothing loses 1 nat within budget: largest factual loss
    assert recommend([g(2, -0.1, -2.0)], 0.7, 0.3) is None


def test_default_layer_sets():
    assert default_layer_sets(2) == [[0], None]
    assert default_layer_sets(32) == [[0], [0, 1], list(range(8)), [6, 7, 8], None]


def test_calibrate_on_a_tiny_model(small_tok, small_world, trained_small):
    rows = small_world.splits["forget10"][:6]
    res = calibrate(trained_small, small_tok, rows, [1.0, 4.0], [[0], None])
    assert len(res["grid"]) == 4
    tau1 = [g for g in res["grid"] if g["tau"] == 1.0]
    assert all(abs(g["factual_shift"]) < 1e-5 and abs(g["functional_shift"]) < 1e-5 for g in tau1)  # τ=1: no change
    assert res["recommended"] is not None and ClassShift(-1.0, -0.25, 1, 1).selectivity == 0.75


def test_calibrate_cli(small_world, trained_small, small_tok, tmp_path, capsys):
    from obliviate.cli import main
    from obliviate.data.synthetic import write_world

    model_dir, world_dir = tmp_path / "m", write_world(small_world, tmp_path / "w")
    trained_small.save_pretrained(model_dir)
    small_tok.save_pretrained(model_dir)
    out = tmp_path / "cal"
    assert main(["calibrate", f"model.path={model_dir}", f"source={world_dir}", "split=forget10",
                 "taus=[2, 8]", "layer_sets=[[0], null]", f"output_dir={out}"]) == 0
    assert "Recommended for ASU" in capsys.readouterr().out
    assert (out / "calibration.json").is_file() and (out / "calibration.md").is_file()


def test_chat_template_answers_are_classified_on_their_own_tokens(small_tok):
    """With a chat template the answer is tokenised without a leading space (encode_qa); classes must align."""
    import copy

    from obliviate.data.tokenize import answer_ids

    tok = copy.deepcopy(small_tok)
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    words = ["Lanas", "Kalo", "Anvar", "Ystria", "Sudoria", "The", "She", "Her", "His", "Born"]
    first = next(w for w in words  # a first word whose tokens differ with a leading space: misalignment shows
                 if len(tok(" " + w, add_special_tokens=False)["input_ids"]) != len(tok(w, add_special_tokens=False)["input_ids"]))
    answer = f"{first} Kalo was born in Anvar."
    row = QARow("Where was Lanas Kalo born?", answer, fact_spans=((answer.index("Anvar"), len(answer) - 1),))
    ids = answer_ids(tok, row.question, row.answer)
    assert ids[:-1] == tok(row.answer, add_special_tokens=False)["input_ids"]  # the answer, then EOS
    cls = answer_token_classes(tok, row, len(ids))
    factual = "".join(tok.decode([i]) for i, c in zip(ids, cls) if c == FACTUAL).strip()
    assert factual == "Anvar" and cls[0] == FUNCTIONAL and cls[-1] == OTHER
