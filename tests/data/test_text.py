"""Raw-text corpora: loading from files, directories and (mocked) hub ids, validation, chunking."""
from __future__ import annotations

import json

import pytest

from obliviate.data.text import chunk_texts, document_ids, load_texts, stream_windows, window_ids
from obliviate.data.tokenize import collate, pad_id
from obliviate.errors import DataError
from obliviate.modeling.logprobs import IGNORE_INDEX
from obliviate.modeling.tiny import train_tokenizer

SENTENCE = "the cat sat on the mat"  # 6 tokens under TOK: every word is one token


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([SENTENCE, "a dog ran far away", "the bird flew over the old house"] * 3, vocab_size=300)


def test_every_word_is_one_token(tok):
    assert len(tok(SENTENCE, add_special_tokens=False)["input_ids"]) == 6
    assert document_ids(tok, SENTENCE)[0] == tok.bos_token_id and len(document_ids(tok, SENTENCE)) == 7


def test_chunking_exact_window_sizes(tok):
    doc = " ".join([SENTENCE] * 5)  # BOS + 30 tokens = 31 -> windows 8, 8, 8, 7
    short = "the cat"  # BOS + 2 tokens: one window, shorter than min_tokens, still kept
    kept = chunk_texts(tok, [doc, short], max_length=8, min_tokens=7)
    assert [len(e.input_ids) for e in kept] == [8, 8, 8, 7, 3]
    assert [e.truncated for e in kept] == [True] * 4 + [False]
    assert sum((e.input_ids for e in kept[:4]), []) == document_ids(tok, doc)  # nothing lost, nothing repeated
    assert all(e.labels == e.input_ids for e in kept)  # every token is a label
    dropped = chunk_texts(tok, [doc, short], max_length=8, min_tokens=8)  # the 7-token tail goes
    assert [len(e.input_ids) for e in dropped] == [8, 8, 8, 3]
    assert [len(e.input_ids) for e in chunk_texts(tok, [doc], max_length=31)] == [31]
    # Default min_tokens = min(32, max_length): the 15-token tail of a 16-token cut goes.
    assert [len(e.input_ids) for e in chunk_texts(tok, [doc], max_length=16)] == [16]
    assert [len(e.input_ids) for e in chunk_texts(tok, [doc], max_length=12)] == [12, 12]


def test_stream_windows_cut_the_joined_corpus_as_open_unlearning_does(tok):
    """By hand: "the cat" + "\\n\\n" and "a dog ran" + "\\n\\n" are one stream of 10 tokens (the, cat, 2 newlines;
    a, do, g, ran, 2 newlines); max_length 4 gives floor(10 / 4) = 2 windows, the two last newlines dropped; each
    window is decoded and re-encoded with BOS in front: 5 ids, every one a label."""
    out = stream_windows(tok, ["the cat", "a dog ran"], max_length=4)
    assert [len(e.input_ids) for e in out] == [5, 5]
    assert [e.input_ids[0] for e in out] == [tok.bos_token_id] * 2
    assert [tok.decode(e.input_ids[1:]) for e in out] == ["the cat\n\n", "a dog ran"]
    assert all(e.labels == e.input_ids and e.truncated for e in out)
    per_doc = chunk_texts(tok, ["the cat", "a dog ran"], max_length=5, min_tokens=2)
    assert [tok.decode(e.input_ids[1:]) for e in per_doc] == ["the cat", "a dog ran"]  # each document its own window
    assert len(stream_windows(tok, ["the cat", "a dog ran"], max_length=3)) == 3  # 10 // 3, one token dropped
    with pytest.raises(DataError, match="fewer than one window of data.max_length=11.*data.windows=document"):
        stream_windows(tok, ["the cat", "a dog ran"], max_length=11)


def test_stream_windows_reach_training_and_are_checked(tok):
    from obliviate.config import RunConfig, load_config
    from obliviate.errors import ConfigError
    from obliviate.train.unlearn import encode_rows

    docs = [SENTENCE, "a dog ran far away"]
    assert encode_rows(tok, docs, 4, "stream") == stream_windows(tok, docs, 4)
    assert encode_rows(tok, docs, 4) == chunk_texts(tok, docs, 4)
    with pytest.raises(ConfigError, match="data.windows"):
        load_config(RunConfig, None, overrides=["data.windows=stream"])  # QA data has no windows
    with pytest.raises(ConfigError, match="data.windows"):
        load_config(RunConfig, None, overrides=["data.format=text", "data.windows=joined"])
    assert load_config(RunConfig, None, overrides=["data.format=text", "data.windows=stream"]).data.windows == "stream"


def test_window_ids_pure():
    assert window_ids(list(range(10)), 4, 2) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert window_ids(list(range(10)), 4, 3) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert window_ids([5], 4, 3) == []  # a single token has no next-token target


def test_chunks_collate_like_qa_examples(tok):
    enc = chunk_texts(tok, [" ".join([SENTENCE] * 2), "a dog"], max_length=32)
    batch = collate(enc, pad_id(tok))
    assert batch["input_ids"].shape == (2, 13)
    assert (batch["labels"][1, 4:] == IGNORE_INDEX).all()  # only padding is ignored
    assert (batch["labels"][1, :4] == batch["input_ids"][1, :4]).all()


def test_chunking_rejects_bad_arguments(tok):
    with pytest.raises(ValueError, match="max_length"):
        chunk_texts(tok, ["x"], max_length=1)
    with pytest.raises(ValueError, match="min_tokens"):
        chunk_texts(tok, ["x"], max_length=8, min_tokens=9)
    with pytest.raises(DataError, match="empty"):
        chunk_texts(tok, [], max_length=8)


def test_load_file_kinds(tmp_path):
    txt = tmp_path / "book.txt"
    txt.write_text("Chapter one.\n\nIt was dark.\n")
    assert load_texts(txt) == ["Chapter one.\n\nIt was dark.\n"]  # a .txt file is one document
    jl = tmp_path / "a.jsonl"
    jl.write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n')
    assert load_texts(jl) == ["one", "two"]
    js = tmp_path / "b.json"
    js.write_text(json.dumps(["plain", {"text": "object"}]))
    assert load_texts(js) == ["plain", "object"]


def test_load_directory_layouts(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "forget.jsonl").write_text('{"text": "f1"}\n{"text": "f2"}\n')
    (tmp_path / "raw" / "holdout.json").write_text('[{"text": "h"}]')
    assert load_texts(tmp_path, "raw/forget") == ["f1", "f2"]
    assert load_texts(tmp_path, "holdout", config="raw") == ["h"]
    books = tmp_path / "books"
    books.mkdir()
    (books / "b.txt").write_text("second")
    (books / "a.txt").write_text("first")
    assert load_texts(books) == ["first", "second"]  # sorted by file name
    assert load_texts(tmp_path, "books") == ["first", "second"]  # a split may be a folder of .txt files
    with pytest.raises(DataError, match="no split 'raw/retain'.*splits there: forget, holdout"):
        load_texts(tmp_path, "raw/retain")
    with pytest.raises(DataError, match="no .txt documents"):
        load_texts(tmp_path / "raw")


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\n{"body": "no text"}\n', r"a\.jsonl:2: missing field 'text'"),
    ('{"text": "ok"}\n{"text": 5}\n', r"a\.jsonl:2: field 'text' must be a string"),
    ('{"text": "ok"}\n\n{"text": "   "}\n', r"a\.jsonl:3: the document is empty"),
    ('{"text": "ok"}\n[1]\n', r"a\.jsonl:2: expected an object"),
    ("", r"a\.jsonl: the corpus is empty"),
])
def test_bad_inputs_name_file_and_line(tmp_path, content, message):
    p = tmp_path / "a.jsonl"
    p.write_text(content)
    with pytest.raises(DataError, match=message):
        load_texts(p)


def test_other_bad_sources(tmp_path):
    (tmp_path / "e.json").write_text("[]")
    with pytest.raises(DataError, match="corpus is empty"):
        load_texts(tmp_path / "e.json")
    (tmp_path / "x.csv").write_text("text\nhi\n")
    with pytest.raises(DataError, match="unsupported raw-text file type"):
        load_texts(tmp_path / "x.csv")
    with pytest.raises(DataError, match="no such file or folder"):
        load_texts(tmp_path / "nope" / "deeper")
    with pytest.raises(DataError, match="needs a split"):
        load_texts("muse-bench/MUSE-News")


def test_hub_path_splits_config_and_validates(monkeypatch):
    import datasets
    calls = []

    def fake_load(repo, config=None, split=None):
        calls.append((repo, config, split))
        return [{"text": "news one"}, {"text": "news two"}] if split == "forget" else [{"text": ""}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    assert load_texts("muse-bench/MUSE-News", "raw/forget") == ["news one", "news two"]
    assert calls == [("muse-bench/MUSE-News", "raw", "forget")]
    with pytest.raises(DataError, match="muse-bench/MUSE-News/raw/holdout row 0: the document is empty"):
        load_texts("muse-bench/MUSE-News", "raw/holdout")
