"""Row loading/validation (JSONL, JSON, TOFU directory), prompt masking, truncation and pairing."""
import json

import pytest

from obliviate.data.pairing import batches, paired_batches, shard
from obliviate.data.rows import QARow, check_disjoint, load_split
from obliviate.data.tokenize import collate, encode_qa, encode_qa_many, pad_id, prompt_ids
from obliviate.errors import DataError


def test_tofu_directory_loads_every_field(tofu_dir):
    rows = load_split(tofu_dir, "forget01_perturbed")
    assert len(rows) == 40 and all(len(r.perturbed_answer) == 5 and r.paraphrased_answer for r in rows)
    ra = load_split(tofu_dir, "real_authors")
    assert len(ra) == 100 and all(len(r.options) == 4 and r.answer in r.options for r in ra)
    assert len(load_split(tofu_dir, "world_facts_perturbed")[0].perturbed_answer) == 3


def test_tofu_splits_are_consistent(tofu_dir):
    full, f10, r90 = (load_split(tofu_dir, s) for s in ("full", "forget10", "retain90"))
    assert [r.question for r in full] == [r.question for r in r90 + f10]
    check_disjoint(f10, r90)
    with pytest.raises(DataError, match="also appear in the retain set"):
        check_disjoint(f10, full)


@pytest.mark.parametrize("line, message", [
    ('{"question": "q"}', "missing field 'answer'"),
    ('{"question": 3, "answer": "a"}', "field 'question' must be a string"),
    ('{"question": "q", "answer": "  "}', "field 'answer' is empty"),
    ('{"question": "q", "answer": "a", "perturbed_answer": [1]}', "perturbed_answer"),
    ('{"question": "q", "answer": "a"', "invalid JSON"),
    ('[1, 2]', "expected a JSON object"),
])
def test_bad_rows_name_file_and_line(tmp_path, line, message):
    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "ok?", "answer": "yes"}\n' + line + "\n")
    with pytest.raises(DataError, match=message) as err:
        load_split(p)
    assert "d.jsonl:2" in str(err.value)


def test_empty_missing_and_json_list(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="split is empty"):
        load_split(tmp_path, "empty")
    with pytest.raises(DataError, match="no split 'nope'.*splits there: empty"):
        load_split(tmp_path, "nope")
    (tmp_path / "l.json").write_text(json.dumps([{"question": "a?", "answer": "b"}]))
    assert load_split(tmp_path / "l.json") == [QARow("a?", "b")]
    with pytest.raises(DataError, match="neither a file"):
        load_split("no/such/place.jsonl")


def test_prompt_is_masked_and_answer_ends_in_eos(small_tok):
    e = encode_qa(small_tok, "Where was Ann born?", "Ann was born in Orla.", 64)
    n_prompt = len(prompt_ids(small_tok, "Where was Ann born?"))
    assert e.labels[:n_prompt] == [-100] * n_prompt
    assert e.labels[n_prompt:] == e.input_ids[n_prompt:] and e.input_ids[-1] == small_tok.eos_token_id
    assert small_tok.decode(e.input_ids[n_prompt:], skip_special_tokens=True).strip() == "Ann was born in Orla."


def test_truncation_keeps_prompt_and_cuts_answer(small_tok):
    q, a = "Where was Ann born?", "Ann was born in Orla, a city in Calmeria, in the year 1962."
    n_prompt = len(prompt_ids(small_tok, q))
    e = encode_qa(small_tok, q, a, n_prompt + 3)
    assert e.truncated and len(e.input_ids) == n_prompt + 3 and e.labels[n_prompt:] == e.input_ids[n_prompt:]
    tiny = encode_qa(small_tok, q, a, 4)  # prompt alone too long: its end is kept, one answer token remains
    assert len(tiny.input_ids) == 4 and tiny.labels[:3] == [-100] * 3 and tiny.labels[3] != -100


def test_collate_pads_right_and_left(small_tok):
    es = [encode_qa(small_tok, "a?", "b", 32), encode_qa(small_tok, "a longer question?", "a longer answer", 32)]
    right, left = collate(es, pad_id(small_tok)), collate(es, pad_id(small_tok), left=True)
    assert right["attention_mask"][0, -1] == 0 and left["attention_mask"][0, 0] == 0
    assert (right["labels"][right["attention_mask"] == 0] == -100).all()


def test_pairing_is_seeded_covers_every_example_and_shards():
    plan = paired_batches(5, 7, 2, seed=3)
    first = [next(plan) for _ in range(5)]
    again = paired_batches(5, 7, 2, seed=3)
    assert first == [next(again) for _ in range(5)]
    seen = [i for f, _ in first for i in f]
    assert sorted(seen[:5]) == list(range(5))  # one epoch = each forget example once
    assert all(len(f) == len(r) == 2 for f, r in first)
    assert next(paired_batches(5, 7, 2, seed=4)) != first[0] or next(batches(5, 2, seed=5)) != first[0][0]
    assert shard([1, 2, 3, 4, 5], 0, 2) == [1, 3, 5] and shard([1, 2, 3, 4, 5], 1, 2) == [2, 4]


def test_hub_loader_converts_records_and_fails_clearly(monkeypatch):
    import datasets

    calls = []

    def fake_load(repo, config, split):
        calls.append((repo, config, split))
        return datasets.Dataset.from_list([{"question": "q?", "answer": "a", "perturbed_answer": ["b", "c"]}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    rows = load_split("locuslab/TOFU", "forget01_perturbed")
    assert calls == [("locuslab/TOFU", "forget01_perturbed", "train")] and rows[0].perturbed_answer == ("b", "c")

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="could not load 'locuslab/TOFU'.*local directory"):
        load_split("locuslab/TOFU", "forget01")


def test_chat_template_prompt_is_masked(small_tok):
    import copy

    tok = copy.deepcopy(small_tok)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}<s>User: {{ m['content'] }}\n"
                         "{% else %}Bot: {{ m['content'] }}</s>{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}Bot:{% endif %}")
    e = encode_qa(tok, "Where was Ann born?", "In Orla.", 64)
    n_prompt = len(prompt_ids(tok, "Where was Ann born?"))
    assert e.labels[:n_prompt] == [-100] * n_prompt and all(x != -100 for x in e.labels[n_prompt:])
    assert tok.decode(e.input_ids[:n_prompt]).endswith("Bot:")
    assert e.input_ids[-1] == tok.eos_token_id and tok.decode(e.labels[n_prompt:]).strip().startswith("In Orla.")
    pairs = [("Where was Ann born?", "In Orla."), ("Who?", "Ann."), ("Where was Ann born?", "Far away, in Orla.")]
    assert encode_qa_many(tok, pairs, 64) == [encode_qa(tok, q, a, 64) for q, a in pairs]


def test_a_missing_source_says_that_tofu_ships_with_obliviate(tmp_path):
    """An old preset's path to a TOFU copy that is not there: the error names data.source=tofu."""
    from obliviate.data.rows import load_split
    from obliviate.errors import DataError

    with pytest.raises(DataError, match="data.source=tofu"):
        load_split(str(tmp_path / "data" / "tofu"), "forget01")
