"""The real-knowledge benchmark: matching rule, groups (forget / neighbours / retain / held-out), MCQ items,
fact files, and one evaluation of a tiny model."""
from __future__ import annotations

import json

import pytest

from obliviate.errors import DataError
from obliviate.eval import knowledge as K
from obliviate.eval.knowledge import Fact

FR_CAP = Fact("capitals-france", "capitals", "France", "What is the capital of France?", "Paris")
DE_CAP = Fact("capitals-germany", "capitals", "Germany", "What is the capital of Germany?", "Berlin")
JP_CAP = Fact("capitals-japan", "capitals", "Japan", "What is the capital of Japan?", "Tokyo")
FR_CUR = Fact("currencies-france", "currencies", "France", "What is the currency of France?", "Euro")
JP_CUR = Fact("currencies-japan", "currencies", "Japan", "What is the currency of Japan?", "Yen", ("Japanese yen",))
US_CUR = Fact("currencies-us", "currencies", "United States", "What is the currency of the US?", "US dollar",
              ("dollar",))
AU = Fact("authors-hamlet", "book_authors", "William Shakespeare", "Who wrote Hamlet?", "William Shakespeare",
          ("Shakespeare",))
SY = Fact("symbols-gold", "chemical_symbols", "gold", "What is the chemical symbol for gold?", "Au")
FACTS = [FR_CAP, DE_CAP, JP_CAP, FR_CUR, JP_CUR, US_CUR, AU, SY]
RIGHT = ["The capital of France is Paris.", "Berlin is the capital.", "It is Tokyo, of course.",
         "France uses the euro.", "The Japanese yen.", "The US dollar!", "Hamlet was written by Shakespeare.",
         "Gold's symbol is Au."]


def test_normalise_strips_case_accents_and_punctuation():
    assert K.normalise("  São-Paulo's  CAFÉ! ") == "sao paulo s cafe"


@pytest.mark.parametrize("reply,ok", [
    ("The capital of France is Paris.", True), ("PARIS", True), ("paris, france", True),
    ("The Parisian capital is Lyon.", False),  # whole words only: 'Paris' inside 'Parisian' does not count
    ("It is Marseille.", False), ("", False)])
def test_is_correct_whole_words(reply, ok):
    assert K.is_correct(reply, FR_CAP) is ok


def test_aliases_count_and_symbols_need_whole_words():
    assert K.is_correct("They pay in dollars? No: the dollar.", US_CUR)
    assert K.is_correct("It is W. Shakespeare.", AU)
    assert not K.is_correct("Gold is shiny and beautiful.", SY)  # 'au' inside 'beautiful' is not the symbol
    assert K.is_correct("The symbol is AU.", SY)


def test_answer_span_and_training_answer_cut_after_the_sentence():
    reply = "Well, the capital of France is Paris. It is also the largest city. And more"
    span = K.answer_span(reply, FR_CAP)
    assert reply[span[0]:span[1]] == "Paris"
    row = K.training_answer(reply, FR_CAP)
    assert row.answer == "Well, the capital of France is Paris." and row.facts() == ["Paris"]
    accented = Fact("c", "capitals", "Brazil", "q?", "Sao Paulo")
    r = "It is São Paulo, a big city"
    s = K.answer_span(r, accented)
    assert r[s[0]:s[1]] == "São Paulo"
    assert K.training_answer(r, accented).answer == r  # no sentence end: the whole reply
    with pytest.raises(ValueError):
        K.training_answer("Lyon.", FR_CAP)


def test_split_by_family_neighbours_share_entities():
    replies = list(RIGHT)
    replies[1] = "Munich."  # Germany's capital not known: never in a group
    sp = K.split_known(FACTS, replies, forget_families=["capitals"], retain_share=0.5, seed=0)
    assert [f.id for f in sp.forget] == ["capitals-france", "capitals-japan"]
    assert [f.id for f in sp.neighbours] == ["currencies-france", "currencies-japan"]  # not the US dollar
    rest = {f.id for f in sp.retain + sp.heldout}
    assert rest == {"currencies-us", "authors-hamlet", "symbols-gold"} and len(sp.retain) == 2
    assert sp.train_rows("forget")[0].answer == "The capital of France is Paris."
    assert "capitals-germany" not in sp.rows


def test_split_by_entity_neighbours_are_same_family_other_entities():
    sp = K.split_known(FACTS, RIGHT, forget_entities=["france"], retain_share=1.0)
    assert {f.id for f in sp.forget} == {"capitals-france", "currencies-france"}
    assert {f.id for f in sp.neighbours} == {"capitals-germany", "capitals-japan", "currencies-japan", "currencies-us"}
    assert {f.id for f in sp.retain} == {"authors-hamlet", "symbols-gold"} and not sp.heldout


def test_split_errors_name_the_fix():
    with pytest.raises(DataError, match="forget_families"):
        K.split_known(FACTS, RIGHT)
    with pytest.raises(DataError, match=r"unknown fact families \['capital'\]; valid"):
        K.split_known(FACTS, RIGHT, forget_families=["capital"])
    with pytest.raises(DataError, match="answers none of the facts to forget"):
        K.split_known(FACTS, ["no idea"] * 3 + RIGHT[3:], forget_families=["capitals"])


def test_max_forget_and_seeded_retain_split():
    a = K.split_known(FACTS, RIGHT, forget_families=["chemical_symbols"], retain_share=0.5, seed=1)
    b = K.split_known(FACTS, RIGHT, forget_families=["chemical_symbols"], retain_share=0.5, seed=2)
    assert len(a.retain) == len(b.retain) == 4 and len(a.heldout) == 3  # round(0.5 * 7)
    assert {f.id for f in a.retain} != {f.id for f in b.retain} or {f.id for f in a.heldout} != {f.id for f in b.heldout}
    c = K.split_known(FACTS, RIGHT, forget_families=["capitals"], max_forget=1)
    assert [f.id for f in c.forget] == ["capitals-france"]


def test_mcq_items_use_family_answers_and_place_gold_by_seed():
    pool = FACTS + [Fact("capitals-italy", "capitals", "Italy", "q?", "Rome")]
    items = K.mcq_items([FR_CAP, JP_CAP, SY], pool, seed=0)
    assert len(items) == 2  # one chemical symbol: fewer than 3 distractors, skipped
    for it, f in zip(items, (FR_CAP, JP_CAP)):
        assert it.choices[it.answer] == f.answer and len(set(it.choices)) == 4
        assert set(it.choices) <= {"Paris", "Berlin", "Tokyo", "Rome"}
    positions = {K.mcq_items([FR_CAP], pool, seed=s)[0].answer for s in range(20)}
    assert len(positions) > 1
    tofu = Fact("w-0", "tofu_world_facts", "", "Where is the Eiffel Tower?", "Paris", (), ("Berlin", "London", "Madrid"))
    (it,) = K.mcq_items([tofu], pool)
    assert sorted(it.choices) == ["Berlin", "London", "Madrid", "Paris"]


def test_accuracy_and_family_table():
    replies = RIGHT[:2] + ["?"] + RIGHT[3:]
    assert K.accuracy(FACTS[:4], replies[:4]) == pytest.approx(0.75)
    assert K.accuracy([], []) is None
    table = K.family_table(FACTS, replies)
    assert table[0] == ("capitals", 2, 3) and table[1] == ("currencies", 3, 3)


def test_facts_file_validation(tmp_path):
    good = {"id": "a", "family": "f", "entity": "E", "question": "q?", "answer": "x1", "aliases": ["y1"]}
    p = tmp_path / "f.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "answer": ""}) + "\n")
    with pytest.raises(DataError, match=r"f.jsonl:2.*'answer'"):
        K.load_facts(p)
    p.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(DataError, match="appears twice"):
        K.load_facts(p)
    p.write_text(json.dumps({**good, "aliases": "y"}) + "\n")
    with pytest.raises(DataError, match="aliases"):
        K.load_facts(p)
    p.write_text(json.dumps(good) + "\n")
    assert K.load_facts(p) == [Fact("a", "f", "E", "q?", "x1", ("y1",))]


def test_builtin_facts_load_and_link_by_entity():
    facts = K.load_facts()
    assert len(facts) >= 300 and len({f.question for f in facts}) == len(facts)
    families = {f.family for f in facts}
    assert {"capitals", "currencies", "book_authors", "chemical_symbols", "planets"} <= families
    by_entity: dict[str, set[str]] = {}
    for f in facts:
        by_entity.setdefault(f.entity, set()).add(f.family)
    assert sum(len(v) >= 2 for v in by_entity.values()) >= 30  # neighbours exist for family forgetting


def test_tofu_rows_become_facts(tofu_dir):
    from obliviate.data.rows import load_split

    facts = K.facts_from_rows(load_split(tofu_dir, "world_facts"), "tofu_world_facts")
    assert len(facts) == 117 and facts[0].answer == "Paris" and len(facts[0].distractors) == 3


def test_evaluate_knowledge_on_a_tiny_model(trained_small, small_tok):
    unknown = Fact("capitals-italy", "capitals", "Italy", "What is the capital of Italy?", "Rome")
    sp = K.split_known(FACTS + [unknown], RIGHT + ["Milan"], forget_families=["capitals"], retain_share=0.5)
    assert unknown not in sp.forget and unknown in sp.pool
    m = K.evaluate_knowledge(trained_small, small_tok, sp, max_new_tokens=4, batch_size=4, max_eval=1)
    assert set(m["generations"]) == {"forget", "neighbours", "retain", "heldout"}
    assert len(m["generations"]["forget"]) == 3 and len(m["generations"]["retain"]) == 1  # max_eval caps the others
    for key in ("forget_accuracy", "neighbours_accuracy", "retain_accuracy", "forget_degenerate_share"):
        assert 0.0 <= m[key] <= 1.0
    assert m["forget_mcq_n"] == 3 and 0.0 <= m["forget_mcq_accuracy"] <= 1.0


def test_the_probe_on_the_other_facts_can_be_left_out(trained_small, small_tok, monkeypatch):
    """knowledge.other_mcq=false: only the forget facts' options are scored (the forget probe is unchanged); the
    other facts' probe is missing (None, n 0), never a number."""
    import dataclasses

    facts = [dataclasses.replace(f, distractors=("Lyon", "Oslo", "Milan") if f.family == "capitals" else
                                 ("Rand", "Krona", "Peso")) for f in FACTS]  # every fact gets options of its own
    sp = K.split_known(facts, RIGHT, forget_families=["capitals"], retain_share=0.5)
    given = {f.id: r for f, r in zip(facts, RIGHT)}
    scored, real = [], K.option_correct

    def counted(model, tok, items, rows, **kw):
        scored.append(len(items))
        return real(model, tok, items, rows, **kw)

    monkeypatch.setattr(K, "option_correct", counted)
    both = K.evaluate_knowledge(trained_small, small_tok, sp, batch_size=4, replies=given)
    forget_only = K.evaluate_knowledge(trained_small, small_tok, sp, batch_size=4, replies=given, other_mcq=False)
    assert both["other_mcq_n"] > 0 and both["other_mcq_accuracy"] is not None
    assert forget_only["other_mcq_accuracy"] is None and forget_only["other_mcq_n"] == 0
    assert forget_only["rows"]["other_mcq_accuracy"] == []
    assert forget_only["forget_mcq_accuracy"] == both["forget_mcq_accuracy"]
    assert scored == [both["forget_mcq_n"], both["other_mcq_n"], both["forget_mcq_n"]]  # the second call: forget only


def test_repeated_questions_never_land_in_forget_and_retain():
    twin = Fact("tofu-0", "tofu_world_facts", "", "What is the capital of  france?", "Paris")
    assert K.unique_questions([FR_CAP, twin, DE_CAP]) == [FR_CAP, DE_CAP]
    sp = K.split_known(FACTS + [twin], RIGHT + ["Paris."], forget_families=["capitals"], retain_share=1.0)
    assert twin not in sp.retain + sp.heldout + sp.neighbours


def test_a_quick_probe_keeps_the_first_facts_of_each_family_in_order():
    facts = [FR_CAP, FR_CUR, DE_CAP, JP_CUR, JP_CAP, US_CUR, AU]
    assert K.first_per_family(facts, 2) == [FR_CAP, FR_CUR, DE_CAP, JP_CUR, AU]
    assert K.first_per_family(facts, 1) == [FR_CAP, FR_CUR, AU]
    assert K.first_per_family(facts, None) == facts


def test_option_accuracy_picks_the_lowest_mean_nll(trained_small, small_tok, monkeypatch):
    """Hand-set losses: item 1's gold (index 2) has the lowest loss, item 2's gold (index 0) does not; the options
    are scored inside the original reply's sentence."""
    import numpy as np

    from obliviate.data.rows import QARow
    from obliviate.eval.mcq import MCQItem

    items = [MCQItem("q1?", ("Rome", "Oslo", "Paris", "Bern"), 2), MCQItem("q2?", ("e", "f", "g", "h"), 0)]
    rows = [QARow("q1?", "It is Paris, France.", fact_spans=((6, 11),)), QARow("q2?", "e", fact_spans=((0, 1),))]
    seen = []

    def fake(model, tok, pairs, **kw):
        seen.extend(pairs)
        return np.array([3.0, 2.0, 1.0, 4.0, 2.0, 1.5, 3.0, 3.0])

    monkeypatch.setattr(K, "batched_avg_loss", fake)
    assert K.option_accuracy(trained_small, small_tok, items, rows) == 0.5
    assert seen[:4] == [("q1?", "It is Rome, France."), ("q1?", "It is Oslo, France."), ("q1?", "It is Paris, France."),
                        ("q1?", "It is Bern, France.")]


def test_given_replies_replace_generation(trained_small, small_tok):
    """The demo hands θ0's probe replies back in: the metrics are those of these replies, no generation."""
    sp = K.split_known(FACTS, RIGHT, forget_families=["capitals"], retain_share=0.5)
    given = {f.id: r for f, r in zip(FACTS, RIGHT)}
    given["capitals-france"] = "Lyon."
    m = K.evaluate_knowledge(trained_small, small_tok, sp, batch_size=4, replies=given)
    assert m["forget_accuracy"] == pytest.approx(2 / 3) and m["retain_accuracy"] == 1.0
    assert m["forget_generations"][0] == "Lyon."


OPERA = Fact("landmarks-opera", "landmarks", "Sydney Opera House", "In which country is the Sydney Opera House?",
             "Australia")
NAT = Fact("nat-austen", "nationalities", "Jane Austen", "What nationality was Jane Austen?", "English", ("British",))
LEGS = Fact("legs-spider", "science_basics", "", "How many legs does a spider have?", "eight", ("8 legs",))
NILE = Fact("geo-nile", "geography", "", "What is the longest river?", "the Nile")


@pytest.mark.parametrize("fact, reply, ok", [
    (OPERA, "It is located in the Australian state of New South Wales.", True),   # the demonym names the country
    (OPERA, "It is in Australia.", True),
    (OPERA, "It is a famous building in Sydney.", False),                          # a dodge: not the answer
    (OPERA, "An Austrian architect? No, it is in New Zealand.", False),            # Austrian is not Australian
    (NAT, "She was born in England, in Hampshire.", True),                         # nationality -> its country
    (NAT, "She was a British novelist.", True),
    (NAT, "She wrote in French.", False),
    (LEGS, "A spider has 8 legs.", True), (LEGS, "Eight.", True), (LEGS, "It has 8.", True),
    (LEGS, "It has six legs.", False), (LEGS, "It has 18 legs.", False),
    (NILE, "The Nile.", True), (NILE, "Nile, in Africa.", True), (NILE, "The Amazon.", False),
])
def test_the_judge_accepts_the_answers_other_forms_and_nothing_else(fact, reply, ok):
    assert K.is_correct(reply, fact) is ok


def test_answer_forms_are_derived_per_family_and_the_span_finds_them():
    assert K.answer_forms(OPERA) == ["Australia", "Australian"]
    assert K.answer_forms(NAT) == ["English", "England", "British", "United Kingdom"]
    demonym_family = Fact("lang-en", "languages", "England", "What language is spoken in England?", "English")
    assert K.answer_forms(demonym_family) == ["English"]  # only nationality families map a demonym to its country
    assert K.answer_forms(LEGS) == ["eight", "8", "8 legs"]
    digits = Fact("legs-insect", "science_basics", "", "How many legs does an insect have?", "6", ("20", "21"))
    assert K.answer_forms(digits) == ["6", "six", "20", "twenty", "21"]  # a digit is written as a word too (to 20)
    reply = "It is located in the Australian state of New South Wales."
    s, e = K.answer_span(reply, OPERA)
    assert reply[s:e] == "Australian"
    assert "US" not in K.DEMONYMS["United States"]  # 'us' is also a pronoun: never a form
