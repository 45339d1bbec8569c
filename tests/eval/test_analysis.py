"""Token classes, class shifts, τ calibration: hand-made inputs and a tiny model."""
import json

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


def test_layer_windows_by_hand():
    """Widths 1 and 3 at 3 starts over 10 layers: starts 0, round(4.5)=4, 9 and 0, round(3.5)=4, 7."""
    from obliviate.errors import ConfigError
    from obliviate.eval.analysis import layer_windows

    assert layer_windows(10, [1, 3], 3) == [[0], [4], [9], [0, 1, 2], [4, 5, 6], [7, 8, 9]]
    assert layer_windows(4, [4, 2], 5) == [[0, 1, 2, 3], [0, 1], [1, 2], [2, 3]]  # fewer starts than asked
    assert layer_windows(30, [3], 1) == [[0, 1, 2]]
    for widths, starts in (([40], 2), ([0], 2), ([2], 0), ([], 2)):
        with pytest.raises(ConfigError, match="the model has"):
            layer_windows(30, widths, starts)


def test_reply_recall_uses_facts_when_annotated_else_rouge():
    from obliviate.eval.analysis import fluent_forgetting, reply_recall

    plain = [QARow("Where is Ash?", "in the north"), QARow("Who?", "Mia Lund")]
    assert reply_recall(["it is in the north", "nobody"], plain) == (0.5, "rougeL")  # 3/3 then 0/2 tokens
    answer = "Mia was born in Ash in 1990."
    row = QARow("Where was Mia born?", answer, fact_spans=((16, 19), (23, 27)))  # "Ash", "1990"
    assert row.asked_facts() == ["Ash", "1990"]
    assert reply_recall(["In ash, long ago."], [row]) == (0.5, "fact")  # one of two facts, case-insensitive
    base = {"forget": {"recall": 0.8, "degenerate": 0.0}}
    assert fluent_forgetting({"forget": {"recall": 0.4, "degenerate": 0.2}}, base, 0.5, 0.2)
    assert not fluent_forgetting({"forget": {"recall": 0.41, "degenerate": 0.0}}, base, 0.5, 0.2)
    assert not fluent_forgetting({"forget": {"recall": 0.0, "degenerate": 0.21}}, base, 0.5, 0.2)
    assert not fluent_forgetting({"forget": {"recall": 0.0, "degenerate": 0.0}}, {"forget": {"recall": 0.0}}, 0.5, 0.2)


def test_the_teacher_map_replies_per_setting(small_world, trained_small, small_tok, tmp_path, capsys):
    """calibrate with windows and replies: θ0's replies as the base row; at τ=1 the teacher is θ0, so its replies,
    recall and degenerate share equal the base's exactly; a map table and the JSON carry every point."""
    from obliviate.cli import main
    from obliviate.data.synthetic import write_world

    model_dir, world_dir = tmp_path / "m", write_world(small_world, tmp_path / "w")
    trained_small.save_pretrained(model_dir)
    small_tok.save_pretrained(model_dir)
    out = tmp_path / "map"
    assert main(["calibrate", f"model.path={model_dir}", f"source={world_dir}", "split=forget10",
                 "retain_split=retain90", "retain_examples=3", "max_examples=3", "taus=[1, 8]",
                 "window_widths=[1]", "window_starts=2", "replies=true", "max_new_tokens=6",
                 f"output_dir={out}"]) == 0
    printed = capsys.readouterr().out
    assert "| θ0 | — |" in printed and "facts drop, fluent" in printed
    assert (out / "teacher_map.png").read_bytes()[:4] == b"\x89PNG" and "teacher_map.png" in (out / "calibration.md").read_text()
    res = json.loads((out / "calibration.json").read_text())
    assert [g["layers"] for g in res["grid"]] == [[0], [0], [1], [1]]  # windows of width 1 at layers 0 and 1
    for g in res["grid"]:
        assert set(g["forget"]) == {"recall", "measure", "degenerate", "examples"} and g["retain"] is not None
        assert isinstance(g["fluent_forgetting"], bool)
        if g["tau"] == 1:
            assert g["forget"] == res["base"]["forget"] and g["retain"] == res["base"]["retain"]


@pytest.mark.parametrize("overrides, message", [
    (["window_widths=[3]"], "the model has 2 layers"),
    (["window_widths=[1]", "layer_sets=[[0]]"], "window_widths"),
    (["retain_split=retain90"], "null unless replies=true"),
    (["replies=true", "retain_split=forget10"], ""),
])
def test_teacher_map_bad_input(overrides, message, small_world, trained_small, small_tok, tmp_path, capsys):
    from obliviate.cli import main
    from obliviate.data.synthetic import write_world

    model_dir, world_dir = tmp_path / "m", write_world(small_world, tmp_path / "w")
    trained_small.save_pretrained(model_dir)
    small_tok.save_pretrained(model_dir)
    assert main(["calibrate", f"model.path={model_dir}", f"source={world_dir}", "split=forget10", *overrides,
                 f"output_dir={tmp_path / 'out'}"]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()
