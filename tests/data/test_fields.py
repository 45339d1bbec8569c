"""Any dataset: the data's own column names mapped to obliviate's fields (data.fields), in files, on the hub and in
memory (a datasets.Dataset or a list of dicts through the Python API)."""
import json

import pytest

from obliviate.columns import FIELDS, check_fields
from obliviate.data.rows import QARow, load_split, rows_from
from obliviate.errors import ConfigError, DataError

MAP = {"question": "prompt", "answer": "response"}
RECORDS = [{"prompt": "Where was Ann born?", "response": "In Orla.", "id": 1},
           {"prompt": "What does Bo write?", "response": "Poems.", "id": 2}]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_file_and_a_directory_with_other_column_names(tmp_path):
    f = _jsonl(tmp_path / "train.jsonl", RECORDS)
    want = [QARow("Where was Ann born?", "In Orla."), QARow("What does Bo write?", "Poems.")]
    assert [(r.question, r.answer) for r in load_split(f, fields=MAP)] == [(w.question, w.answer) for w in want]
    assert [r.question for r in load_split(tmp_path, "train", MAP)] == ["Where was Ann born?", "What does Bo write?"]


def test_unmapped_other_names_say_which_columns_there_are_and_how_to_map_them(tmp_path):
    f = _jsonl(tmp_path / "train.jsonl", RECORDS)
    with pytest.raises(DataError, match=r"missing field 'question'.*its columns: prompt, response, id.*"
                                        r"data.fields=\{question: prompt, answer: response\}"):
        load_split(f)


def test_a_mapping_to_a_missing_column_lists_the_columns_present(tmp_path):
    f = _jsonl(tmp_path / "train.jsonl", RECORDS)
    with pytest.raises(DataError, match=r"train.jsonl:1: data.fields maps 'answer' to column 'reply', which the data "
                                        r"lacks; its columns: prompt, response, id"):
        load_split(f, fields={"question": "prompt", "answer": "reply"})


def test_optional_fields_map_too():
    rec = {"q": "Q?", "a": "A.", "para": "A, said otherwise.", "wrong": ["B.", "C."]}
    (row,) = rows_from([rec], {"question": "q", "answer": "a", "paraphrased_answer": "para", "perturbed_answer": "wrong"})
    assert (row.paraphrased_answer, row.perturbed_answer) == ("A, said otherwise.", ("B.", "C."))


def test_in_memory_datasets_and_lists_of_dicts():
    import datasets

    ds = datasets.Dataset.from_list(RECORDS)
    assert [r.answer for r in rows_from(ds, MAP)] == ["In Orla.", "Poems."]
    assert [r.question for r in rows_from([{"question": "Q?", "answer": "A."}])] == ["Q?"]
    rows = [QARow("Q?", "A.")]
    assert rows_from(rows) == rows
    with pytest.raises(DataError, match="forget rows: no rows"):
        rows_from([], what="forget rows")
    with pytest.raises(DataError, match=r"rows row 0: data.fields maps 'question' to column 'prompt'.*its columns: "
                                        r"question, answer"):
        rows_from([{"question": "Q?", "answer": "A."}], MAP)


def test_hub_datasets_are_mapped_as_they_load(monkeypatch):
    import datasets

    calls = []

    def fake_load(repo, config, split):
        calls.append((repo, config, split))
        return datasets.Dataset.from_list(RECORDS)

    monkeypatch.setattr("obliviate.data.rows.require_hub", lambda what: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    rows = load_split("someone/qa", "train", MAP)
    assert calls == [("someone/qa", "train", "train")] and rows[1].question == "What does Bo write?"


def test_the_config_checks_the_mapping():
    from obliviate.config import DataConfig, FinetuneDataConfig

    assert DataConfig(fields=MAP).fields == MAP
    with pytest.raises(ConfigError, match=r"data.fields: unknown field 'questions'; fields: question, answer"):
        DataConfig(fields={"questions": "prompt"})
    with pytest.raises(ConfigError, match=r"data.fields.answer must name a column"):
        DataConfig(fields={"answer": ""})
    with pytest.raises(ConfigError, match=r"data.format is 'text'; drop data.fields"):
        DataConfig(fields=MAP, format="text")
    with pytest.raises(ConfigError, match="unknown field"):
        FinetuneDataConfig(fields={"prompt": "question"})
    assert check_fields({}) == {} and "paraphrased_answer" in FIELDS


def test_the_python_api_unlearns_a_dataset_with_its_own_columns(small_world, small_tok, trained_small):
    import copy

    import datasets

    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.train.unlearn import unlearn

    def records(rows):
        return datasets.Dataset.from_list([{"prompt": r.question, "response": r.answer} for r in rows])

    forget, retain = records(small_world.splits["forget10"][:4]), records(small_world.splits["retain90"][:4])
    res = unlearn(copy.deepcopy(trained_small), small_tok, forget, retain, MethodConfig(forget="ga", retain="nll"),
                  TrainConfig(max_steps=1, batch_size=2, progress=False), max_length=64, fields=MAP)
    assert len(res.history) == 1 and res.history[0]["forget"] < 0  # GA: minus the forget NLL
    with pytest.raises(ConfigError, match="already QA rows"):
        unlearn(copy.deepcopy(trained_small), small_tok, small_world.splits["forget10"][:2], [],
                MethodConfig(forget="ga", retain=None), TrainConfig(max_steps=1, progress=False), fields=MAP)


def test_the_cli_trains_and_evaluates_on_renamed_columns_and_refuses_a_bad_mapping(small_world, model_dir, tmp_path,
                                                                                  capsys):
    from obliviate.cli import main

    data = tmp_path / "data"
    data.mkdir()
    for split in ("forget10", "retain90"):
        _jsonl(data / f"{split}.jsonl", [{"prompt": r.question, "response": r.answer}
                                         for r in small_world.splits[split][:6]])
    out = tmp_path / "run"
    base = ["unlearn", f"model.path={model_dir}", f"data.source={data}", "data.forget_split=forget10",
            "data.retain_split=retain90", "data.max_length=64", "method.forget=ga", "method.retain=nll",
            "train.max_steps=1", "train.progress=false", "eval.forget_split=forget10", "eval.retain_split=retain90",
            "eval.real_authors_split=null", "eval.world_facts_split=null", "eval.holdout_split=null",
            "eval.max_new_tokens=4",
            f"output_dir={out}"]
    assert main(base + ["data.fields={question: prompt, answer: response}"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 1 and metrics["eval"]["forget_rougeL_recall"] is not None
    bad = tmp_path / "never"
    assert main(base[:-1] + [f"output_dir={bad}", "data.fields={question: prompt, answer: reply}"]) == 2
    err = capsys.readouterr().err
    assert "data.fields maps 'answer' to column 'reply'" in err and "its columns: prompt, response" in err
    assert not bad.exists()
