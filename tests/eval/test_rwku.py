"""RWKU: loaders on local fixture files, prompt building, per-level ROUGE by hand, end to end on a tiny model."""
from __future__ import annotations

import json

import numpy as np
import pytest

import obliviate.eval.rwku as rwku
from obliviate.errors import DataError
from obliviate.eval.rwku import (
    BLANK_INSTRUCTION,
    LEVELS,
    QA_INSTRUCTION,
    RWKU_METRICS,
    Probe,
    evaluate_rwku,
    first_line,
    load_probes,
    load_rwku,
    load_targets,
    probe_question,
)
from obliviate.modeling.tiny import tiny_llama, train_tokenizer

PROBES = {
    "forget_level1": [{"query": "Zed Quinn was born in ___ .", "answer": "Berlin", "subject": "Zed Quinn",
                       "level": "1", "type": "fill"},
                      {"query": "Zed Quinn wrote ___ .", "answer": "The Long Road Home", "subject": "Zed Quinn",
                       "level": "1"}],
    "forget_level2": [{"query": "Where was Zed Quinn born?", "answer": "Berlin", "subject": "Zed Quinn", "level": 2}],
    "forget_level3": [{"query": "Q: Where did Zed Quinn grow up?", "answer": "Hamburg", "subject": "Zed Quinn",
                       "level": "3", "type": "incontext learning"}],
    "neighbor_level1": [{"query": "Ada Stone was born in ___ .", "answer": "Paris", "subject": "Zed Quinn"}],
    "neighbor_level2": [{"query": "What year did Ada Stone retire?", "answer": 1999, "subject": "Zed Quinn"}],
}


@pytest.fixture()
def rwku_dir(tmp_path):
    """One RWKU per-target folder: forget/neighbour levels as .json lists, intro.json with the target."""
    for level, records in PROBES.items():
        (tmp_path / f"{level}.json").write_text(json.dumps(records), encoding="utf-8")
    (tmp_path / "intro.json").write_text(json.dumps([{"target": "Zed Quinn", "intro": "Zed Quinn is a writer."}]))
    return tmp_path


def test_loads_an_rwku_target_folder(rwku_dir):
    probes = load_rwku(rwku_dir)
    assert list(probes) == list(LEVELS)
    assert probes["forget_level1"][0] == Probe("Zed Quinn was born in ___ .", "Berlin", "Zed Quinn", "1", "fill")
    assert probes["forget_level2"][0].level == "2"                 # int levels become strings
    assert probes["neighbor_level2"][0].answer == "1999"          # numeric answers become strings
    assert probes["neighbor_level1"][0].type is None
    targets = load_targets(rwku_dir)
    assert targets[0].target == "Zed Quinn" and targets[0].intro == "Zed Quinn is a writer."


def test_loads_a_file_and_filters_by_subject(tmp_path):
    f = tmp_path / "probes.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in
                         [{"query": "A ___", "answer": "x", "subject": "A"}, {"query": "B ___", "answer": "y", "subject": "B"}]))
    assert [p.answer for p in load_probes(f, "forget_level1", subject="B")] == ["y"]
    with pytest.raises(DataError, match="no probes about 'C'.*A, B"):
        load_probes(f, "forget_level1", subject="C")


@pytest.mark.parametrize("record, message", [
    ({"answer": "x"}, "missing field 'query'"),
    ({"query": "q ___"}, "missing field 'answer'"),
    ({"query": "q ___", "answer": ""}, "'answer' is empty"),
    ({"query": "q ___", "answer": ["x"]}, "'answer' must be a string"),
    ({"query": "q ___", "answer": "x", "subject": 3}, "'subject' must be a string"),
])
def test_bad_probes_name_file_and_line(tmp_path, record, message):
    f = tmp_path / "forget_level2.jsonl"
    f.write_text(json.dumps({"query": "ok", "answer": "ok"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=message) as err:
        load_probes(tmp_path, "forget_level2")
    assert f"{f}:2" in str(err.value)


def test_bad_levels_and_sources(rwku_dir, tmp_path):
    with pytest.raises(DataError, match="unknown RWKU level 'forget_level4'"):
        load_probes(rwku_dir, "forget_level4")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="no split 'forget_level1'"):
        load_probes(tmp_path / "empty_dir", "forget_level1")
    with pytest.raises(DataError, match="neither"):
        load_probes("./missing", "forget_level1")
    (tmp_path / "t.jsonl").write_text(json.dumps({"intro": "x"}) + "\n")
    with pytest.raises(DataError, match="missing field 'target'"):
        load_targets(tmp_path / "t.jsonl")


def test_questions_follow_rwku_instructions():
    p = Probe(" Zed Quinn was born in ___ . ", "Berlin")
    assert probe_question(p, "forget_level1") == f"{BLANK_INSTRUCTION}\nZed Quinn was born in ___ ."
    assert probe_question(p, "neighbor_level1").startswith(BLANK_INSTRUCTION)
    assert probe_question(p, "forget_level3") == f"{QA_INSTRUCTION}\nZed Quinn was born in ___ ."
    assert first_line("  Berlin, in 1950.\nQuestion: next") == "Berlin, in 1950."
    assert first_line("\n") == ""


def test_per_level_means_by_hand(rwku_dir, monkeypatch):
    probes = load_rwku(rwku_dir)
    canned = {  # query -> generation; ROUGE-L recall of the answer worked out by hand
        "Zed Quinn was born in ___ .": "He was born in Berlin.\nMore text",   # Berlin: 1
        "Zed Quinn wrote ___ .": "The Road",                                 # the long road home: LCS the,road = 2/4
        "Where was Zed Quinn born?": "Munich",                               # 0
        "Q: Where did Zed Quinn grow up?": "Hamburg",                        # 1
        "Ada Stone was born in ___ .": "",                                   # empty answer: 0
        "What year did Ada Stone retire?": "In 1999",                        # 1
    }
    seen = []

    def fake_generate(model, tokenizer, questions, *, max_new_tokens, batch_size):
        seen.extend(questions)
        return [canned[q.split("\n", 1)[1]] for q in questions]

    monkeypatch.setattr(rwku, "generate_answers", fake_generate)
    res = evaluate_rwku(None, None, probes)
    assert res["rwku_forget_level1_rougeL_recall"] == pytest.approx((1 + 0.5) / 2)
    assert res["rwku_forget_level2_rougeL_recall"] == 0.0
    assert res["rwku_forget_level3_rougeL_recall"] == 1.0
    assert res["rwku_neighbor_level1_rougeL_recall"] == 0.0
    assert res["rwku_neighbor_level2_rougeL_recall"] == 1.0
    assert res["rwku_forget_rougeL_recall"] == pytest.approx((0.75 + 0 + 1) / 3)
    assert res["rwku_neighbor_rougeL_recall"] == pytest.approx(0.5)
    assert res["generations"]["forget_level1"][0] == "He was born in Berlin."   # cut at the newline
    assert res["n"] == {lv: len(PROBES[lv]) for lv in LEVELS} and res["notes"] == []
    assert len(seen) == 6 and seen[0].startswith(BLANK_INSTRUCTION) and seen[2].startswith(QA_INSTRUCTION)
    # a partial level set: the 'All' mean of the incomplete group is undefined and said so
    part = evaluate_rwku(None, None, {"forget_level1": probes["forget_level1"]})
    assert part["rwku_forget_rougeL_recall"] is None and part["rwku_forget_level2_rougeL_recall"] is None
    assert any("rwku_forget_rougeL_recall undefined" in n for n in part["notes"])


def test_evaluate_rejects_unknown_or_empty_levels():
    with pytest.raises(DataError, match="unknown: retain"):
        evaluate_rwku(None, None, {"retain": [Probe("q", "a")]})
    with pytest.raises(DataError, match="without probes: forget_level2"):
        evaluate_rwku(None, None, {"forget_level2": []})


def test_metrics_table_directions():
    assert set(RWKU_METRICS) == {f"rwku_{lv}_rougeL_recall" for lv in LEVELS} | {
        "rwku_forget_rougeL_recall", "rwku_neighbor_rougeL_recall"}
    for name, info in RWKU_METRICS.items():
        assert info.higher_is_better == ("neighbor" in name) and info.version == 1


def test_evaluate_rwku_end_to_end_on_a_tiny_model(rwku_dir):
    probes = load_rwku(rwku_dir)
    texts = [probe_question(p, lv) + " " + p.answer for lv, ps in probes.items() for p in ps]
    tok = train_tokenizer(texts * 3, vocab_size=400)
    model = tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=4, seed=0)
    res = evaluate_rwku(model, tok, probes, max_new_tokens=6, batch_size=4)
    for name in RWKU_METRICS:
        assert 0.0 <= res[name] <= 1.0
    for lv in LEVELS:
        assert len(res["generations"][lv]) == len(PROBES[lv])
        assert all("\n" not in g for g in res["generations"][lv])
        assert all(0.0 <= r <= 1.0 for r in res["rougeL_recall_per_example"][lv])
    assert np.isfinite(res["rwku_forget_rougeL_recall"])


def test_hub_loader_falls_back_to_the_parquet_export(monkeypatch):
    import datasets

    calls = []

    def fake_load(repo_id, config, *, split, revision=None):
        calls.append((repo_id, config, split, revision))
        if revision is None:
            raise RuntimeError("Dataset scripts are no longer supported, but found RWKU.py")
        return [{"query": "Zed Quinn was born in ___ .", "answer": "Berlin", "level": "1"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    probes = load_probes("jinzhuoran/RWKU", "forget_level1")
    assert probes == [Probe("Zed Quinn was born in ___ .", "Berlin", None, "1", None)]
    assert calls == [("jinzhuoran/RWKU", "forget_level1", "test", None),
                     ("jinzhuoran/RWKU", "forget_level1", "test", "refs/convert/parquet")]

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'jinzhuoran/RWKU' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="could not load 'jinzhuoran/RWKU' config 'forget_target'.*Offline"):
        load_targets("jinzhuoran/RWKU")
