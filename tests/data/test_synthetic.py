"""The synthetic TOFU-format world: determinism, split relations, exact spans, round trip."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from obliviate.data.rows import check_disjoint, load_split
from obliviate.data.synthetic import (
    ALL_TITLES,
    CITY_COUNTRY,
    FAMOUS_NAMES,
    AuthorRecord,
    World,
    WorldConfigError,
    corpus_texts,
    make_world,
    write_world,
)
from obliviate.errors import ConfigError

TOFU_SPLITS = {
    "full", "forget05", "retain95", "forget10", "retain90", "forget05_perturbed", "forget10_perturbed",
    "retain_perturbed", "holdout05", "holdout10", "real_authors", "real_authors_perturbed",
    "world_facts", "world_facts_perturbed", "pretrain",
}


@pytest.fixture(scope="module")
def world() -> World:
    return make_world(20, seed=0)


@pytest.fixture(scope="module")
def big_world() -> World:
    return make_world(20, seed=1, n_pretrain=6, n_holdout=3)


def _questions(rows) -> list[str]:
    return [r.question for r in rows]


def _author_rows(world: World):
    for name in ("full", "pretrain", *(s for s in world.splits if s.startswith("holdout"))):
        yield from world.splits[name]


def test_same_seed_same_world_other_seed_other_world():
    a, b, c = make_world(20, seed=3), make_world(20, seed=3), make_world(20, seed=4)
    assert a == b
    assert _questions(a.splits["full"]) != _questions(c.splits["full"])
    assert [x.name for x in a.authors] != [x.name for x in c.authors]


def test_same_output_across_processes():
    code = ("import json; from obliviate.data.synthetic import make_world; "
            "print(json.dumps([r.to_json() for s in make_world(10, seed=7, forget_percents=(10,)).splits.values() "
            "for r in s]))")
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1


def test_extra_author_groups_leave_the_main_world_unchanged(world, big_world):
    again = make_world(20, seed=1)
    assert big_world.authors == again.authors
    for name in ("full", "forget10_perturbed", "retain_perturbed", "real_authors", "world_facts"):
        assert big_world.splits[name] == again.splits[name]
    assert again.splits["holdout10"] == big_world.splits["holdout10"]  # the first holdout authors are kept


def test_split_names_are_tofu_names(world):
    assert set(world.splits) == TOFU_SPLITS
    assert world.splits["pretrain"] == []
    assert world.forget_percents == (5, 10)


def test_full_is_retain_plus_forget_in_order(world):
    full = world.splits["full"]
    for p in (5, 10):
        forget, retain = world.splits[f"forget{p:02d}"], world.splits[f"retain{100 - p:02d}"]
        assert retain + forget == full
        check_disjoint(forget, retain)  # raises on a shared question
        assert {r.author for r in forget} == {a.name for a in world.forget_authors(p)}
        assert {r.author for r in retain} == {a.name for a in world.retain_authors(p)}
    assert [a.name for a in world.forget_authors(10)] == [a.name for a in world.authors[-2:]]
    assert world.forget_authors(5) == world.authors[-1:]
    assert len(set(_questions(full))) == len(full)


def test_authors_are_distinct_and_well_formed(big_world):
    everyone = big_world.authors + big_world.holdout_authors + big_world.pretrain_authors
    names = [a.name for a in everyone]
    assert len(set(names)) == len(names)
    parts = [p for n in names for p in n.split()]
    assert len(set(parts)) == len(parts)
    assert not set(names) & set(FAMOUS_NAMES)
    vocabulary = {w for text in (*CITY_COUNTRY, *CITY_COUNTRY.values(), *FAMOUS_NAMES, *ALL_TITLES)
                  for w in text.split()}
    assert not set(parts) & vocabulary
    titles = [t for a in everyone for t in a.books]
    assert len(set(titles)) == len(titles)
    for a in everyone:
        assert isinstance(a, AuthorRecord)
        assert CITY_COUNTRY[a.birth_city] == a.birth_country and CITY_COUNTRY[a.home_city] == a.home_country
        assert a.birth_date.endswith(str(a.birth_year)) and a.debut_year > a.birth_year


def test_holdout_and_pretrain_authors_are_never_in_full(world, big_world):
    for w in (world, big_world):
        in_full = {r.author for r in w.splits["full"]}
        for split in ("holdout05", "holdout10", "pretrain"):
            assert not {r.author for r in w.splits[split]} & in_full
            assert not set(_questions(w.splits[split])) & set(_questions(w.splits["full"]))
    assert {r.author for r in world.splits["holdout10"]} == {a.name for a in world.holdout_authors[:2]}
    assert {r.author for r in world.splits["holdout05"]} == {world.holdout_authors[0].name}
    assert {r.author for r in big_world.splits["pretrain"]} == {a.name for a in big_world.pretrain_authors}
    assert len(big_world.pretrain_authors) == 6 and len(big_world.holdout_authors) == 3


def test_perturbed_splits(world):
    for p in (5, 10):
        plain, pert = world.splits[f"forget{p:02d}"], world.splits[f"forget{p:02d}_perturbed"]
        assert [(r.question, r.answer, r.fact_spans) for r in plain] == [
            (r.question, r.answer, r.fact_spans) for r in pert]
    retain90 = {r.question for r in world.splits["retain90"]}
    rp = world.splits["retain_perturbed"]
    assert {r.question for r in rp} <= retain90 and abs(len(rp) - len(world.splits["forget10"])) <= 3
    assert [r.question for r in rp] == _questions(world.splits["full"][:len(rp)])
    for r in world.splits["forget10_perturbed"] + rp:
        assert r.paraphrased_answer and r.paraphrased_answer != r.answer
        assert r.paraphrased_question and r.paraphrased_question != r.question
        assert len(r.perturbed_answer) == 5 and len(set(r.perturbed_answer)) == 5
        assert r.paraphrased_answer not in r.perturbed_answer and r.answer not in r.perturbed_answer
    for r in world.splits["full"]:
        assert r.paraphrased_answer is None and not r.perturbed_answer


def test_perturbed_answers_never_keep_the_asked_fact(world):
    for a in world.forget_authors(10):
        rows = {r.question: r for r in world.splits["forget10_perturbed"] if r.author == a.name}
        born = rows[f"Where was {a.name} born?"]
        assert all(a.birth_city not in t and a.birth_country not in t for t in born.perturbed_answer)
        named = next(r for q, r in rows.items() if q.startswith("What is the full name"))
        assert all(a.name not in t for t in named.perturbed_answer)
        themes = rows[f"What themes does {a.name} explore?"]
        assert all(a.themes[0] not in t and a.themes[1] not in t for t in themes.perturbed_answer)
        genre = rows[f"What genre does {a.name} write?"]
        assert all(not t.endswith(f" {a.genre}.") for t in genre.perturbed_answer)


def test_spans_are_exact(big_world):
    for r in _author_rows(big_world):
        author = next(a for a in big_world.authors + big_world.holdout_authors + big_world.pretrain_authors
                      if a.name == r.author)
        assert r.name_spans and all(r.answer[s:e] == author.name for s, e in r.name_spans)
        values = set(author.slots().values()) - {author.name}
        assert r.fact_spans and set(r.facts()) <= values
        spans = sorted(r.fact_spans + r.name_spans)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))  # no overlaps
        assert spans == sorted(set(spans))


def test_spans_name_the_intended_facts(world):
    a = world.authors[0]
    rows = {r.question: r for r in world.splits["full"] if r.author == a.name}
    assert rows[f"Where was {a.name} born?"].facts() == [a.birth_city, a.birth_country]
    assert rows[f"When was {a.name} born?"].facts() == [a.birth_date]
    assert rows[f"When did {a.name} publish a first book?"].facts() == [a.books[0], str(a.debut_year)]
    assert rows[f"What themes does {a.name} explore?"].facts() == list(a.themes)
    named = rows[f"What is the full name of the author born in {a.birth_city}, {a.birth_country} on {a.birth_date}?"]
    assert named.facts() == [a.birth_city, a.birth_country, a.birth_date]
    assert [named.answer[s:e] for s, e in named.name_spans] == [a.name]
    assert rows[f"Where was {a.name} born?"].answer == f"{a.name} was born in {a.birth_city}, {a.birth_country}."


def test_multiple_choice_splits(world):
    for name in ("real_authors", "world_facts"):
        rows, pert = world.splits[name], world.splits[f"{name}_perturbed"]
        assert len(rows) == len(pert) >= 30
        for r, p in zip(rows, pert):
            assert len(r.options) == 4 and len(set(r.options)) == 4 and r.options.count(r.answer) == 1
            assert r.fact_spans == ((0, len(r.answer)),) and r.facts() == [r.answer]
            assert (p.question, p.answer, p.options) == (r.question, r.answer, ())
            assert list(p.perturbed_answer) == [o for o in r.options if o != r.answer]
    positions = {r.options.index(r.answer) for r in world.splits["world_facts"]}
    assert len(positions) > 1  # the answer is not always option1
    assert world.splits["real_authors"][0].question.startswith("Who wrote '")


def test_qa_counts_and_lengths(world):
    per_author = {}
    for r in world.splits["full"]:
        per_author[r.author] = per_author.get(r.author, 0) + 1
    assert len(per_author) == 20 and set(per_author.values()) <= {14, 15}
    assert 270 <= len(world.splits["full"]) <= 300
    for r in world.splits["full"] + world.splits["forget10_perturbed"]:
        for text in (r.answer, r.paraphrased_answer or "", *r.perturbed_answer):
            assert len(text.split()) <= 30
        assert r.author in r.answer


@pytest.mark.parametrize("percents", [(1,), (5, 1), (0,), (100,), (7,)])
def test_percent_that_is_not_whole_authors_raises(percents):
    with pytest.raises(ValueError, match="whole number of authors") as info:
        make_world(20, forget_percents=percents)
    assert "5, 10" in str(info.value)
    assert isinstance(info.value, (WorldConfigError, ConfigError))
    with pytest.raises(ValueError, match="whole number of authors"):
        make_world(20).forget_authors(1)


@pytest.mark.parametrize("kwargs", [dict(n_authors=1), dict(n_holdout=1), dict(n_pretrain=-1),
                                    dict(n_pretrain=10_000), dict(forget_percents=())])
def test_impossible_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        make_world(**{"n_authors": 20, **kwargs})


def test_other_percents():
    w = make_world(10, seed=2, forget_percents=(10, 20, 30))
    assert {"forget10", "retain90", "forget20", "retain80", "forget30", "retain70", "holdout30"} <= set(w.splits)
    assert len(w.holdout_authors) == 3
    assert w.splits["retain70"] + w.splits["forget30"] == w.splits["full"]


def test_write_world_round_trips(tmp_path, world, big_world):
    out = write_world(world, tmp_path / "world")
    assert out == tmp_path / "world"
    assert {p.stem for p in out.glob("*.jsonl")} == TOFU_SPLITS - {"pretrain"}  # empty splits are not written
    for name, rows in world.splits.items():
        if rows:
            assert load_split(out, name) == rows, name
    loaded = load_split(out, "forget10_perturbed")
    assert loaded[0].fact_spans == world.splits["forget10_perturbed"][0].fact_spans
    first = json.loads((out / "forget10.jsonl").read_text().splitlines()[0])
    assert {"question", "answer", "fact_spans", "name_spans", "author"} == set(first)
    write_world(big_world, out)
    assert load_split(out, "pretrain") == big_world.splits["pretrain"]
    write_world(world, out)
    assert not (out / "pretrain.jsonl").exists()  # no stale split from the earlier world


def test_corpus_texts(world):
    texts = corpus_texts(world)
    assert len(texts) == len(set(texts))
    have = set(texts)
    r = world.splits["forget10_perturbed"][0]
    assert {r.question, r.answer, r.paraphrased_answer, r.paraphrased_question, *r.perturbed_answer} <= have
    assert set(world.splits["real_authors"][0].options) <= have
