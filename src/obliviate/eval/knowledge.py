"""Real knowledge a pretrained model has: probe short factual questions, keep what it answers
correctly, forget a family (or entities) of those facts and measure what goes and what stays.

Facts come from the built-in set (`obliviate/resources/facts.jsonl`, FACTS.md: families such as
capitals, currencies, book authors, chemical symbols, planets; each fact names its entity) and
optionally TOFU's `world_facts` / `real_authors` splits. A reply is CORRECT when the normalised
gold answer or one of its aliases occurs in the normalised greedy reply as whole words
(`normalise`: lowercase, accents and punctuation removed, spaces collapsed).

Groups (RWKU's idea of neighbours, Jin et al. 2024), all among the facts the model knows:
  forget     — facts of the chosen families or about the chosen entities;
  neighbours — facts of OTHER families about the forget facts' entities (forgetting capitals keeps the
               currency of France) or, when forgetting entities, the same families' facts about other
               entities; neither trained on nor forgotten;
  retain     — a seeded `retain_share` of the remaining known facts: the retain term trains on them;
  heldout    — the rest: general knowledge that unlearning never sees.
The training answer of a known fact is the model's own correct reply, cut after the sentence that
holds the answer, with the answer annotated as a fact span (for the factual/functional analysis).
"""
from __future__ import annotations

import random
import re
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from obliviate.data.rows import QARow, parse_file
from obliviate.errors import DataError
from obliviate.eval.fluency import fluency_summary, is_degenerate, repetition_rate, token_entropy
from obliviate.eval.generate import batched_avg_loss, generate_answers
from obliviate.eval.mcq import MCQItem
from obliviate.eval.metrics import MetricInfo, register

FAMILY_OF_TOFU = {"world_facts": "tofu_world_facts", "real_authors": "tofu_real_authors"}


@dataclass(frozen=True)
class Fact:
    """One factual question with its gold answer; `entity` links facts across families ('' for none)."""

    id: str
    family: str
    entity: str
    question: str
    answer: str
    aliases: tuple[str, ...] = ()
    distractors: tuple[str, ...] = ()  # wrong options for the MCQ (TOFU gives them; else drawn from the family)

    def golds(self) -> list[str]:
        return [self.answer, *self.aliases]

    def forms(self) -> list[str]:
        """Every form a correct reply may name: the golds plus the forms derived from them (answer_forms)."""
        return answer_forms(self)


# Countries and the adjectives / nouns a reply may use for them ("located in the Australian state of ...").
# Ambiguous short forms (e.g. "US", which is also the pronoun "us") are left out on purpose.
DEMONYMS: dict[str, tuple[str, ...]] = {
    "Argentina": ("Argentine", "Argentinian"), "Australia": ("Australian",), "Austria": ("Austrian",),
    "Belgium": ("Belgian",), "Brazil": ("Brazilian",), "Cambodia": ("Cambodian",), "Canada": ("Canadian",),
    "Chile": ("Chilean",), "China": ("Chinese",), "Colombia": ("Colombian",), "Cuba": ("Cuban",),
    "Czech Republic": ("Czech",), "Denmark": ("Danish",), "Egypt": ("Egyptian",), "England": ("English",),
    "Finland": ("Finnish",), "France": ("French",), "Germany": ("German",), "Greece": ("Greek",),
    "Hungary": ("Hungarian",), "India": ("Indian",), "Iran": ("Iranian",), "Iraq": ("Iraqi",), "Ireland": ("Irish",),
    "Israel": ("Israeli",), "Italy": ("Italian",), "Japan": ("Japanese",), "Jordan": ("Jordanian",),
    "Kenya": ("Kenyan",), "Mexico": ("Mexican",), "Netherlands": ("Dutch",), "New Zealand": ("New Zealander",),
    "Nigeria": ("Nigerian",), "Norway": ("Norwegian",), "Peru": ("Peruvian",), "Poland": ("Polish",),
    "Portugal": ("Portuguese",), "Russia": ("Russian",), "Saudi Arabia": ("Saudi",), "Scotland": ("Scottish",),
    "South Africa": ("South African",), "South Korea": ("South Korean",), "Spain": ("Spanish",),
    "Sweden": ("Swedish",), "Switzerland": ("Swiss",), "Tanzania": ("Tanzanian",), "Thailand": ("Thai",),
    "Turkey": ("Turkish",), "United Arab Emirates": ("Emirati",), "United Kingdom": ("British",),
    "United States": ("American",), "Vatican City": ("Vatican",), "Wales": ("Welsh",),
}
_COUNTRY_OF = {normalise_d: country for country, ds in DEMONYMS.items() for normalise_d in (d.lower() for d in ds)}
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
NATIONALITY_FAMILIES = frozenset({"nationalities"})  # answers are demonyms: the country's name counts too


def answer_forms(fact: Fact) -> list[str]:
    """The golds plus forms derived from them: a country's demonym ("Australia" -> "Australian"), in families whose
    answers are nationalities the country of a demonym ("English" -> "England"), a number as digits or word
    ("eight" <-> "8"), and a gold without a leading "the". In order, without repeats."""
    out = []
    for gold in fact.golds():
        out.append(gold)
        key = normalise(gold)
        for country, demonyms in DEMONYMS.items():
            if key == normalise(country):
                out += demonyms
        if fact.family in NATIONALITY_FAMILIES and key in _COUNTRY_OF:
            out.append(_COUNTRY_OF[key])
        if key in NUMBER_WORDS:
            out.append(str(NUMBER_WORDS.index(key)))
        elif key.isdigit() and int(key) < len(NUMBER_WORDS):
            out.append(NUMBER_WORDS[int(key)])
        if key.startswith("the ") and len(key) > 4:
            out.append(gold.strip()[4:])
    return list(dict.fromkeys(out))


def _fact_from_record(rec: Any, where: str) -> Fact:
    """Validate one {id, family, entity, question, answer, aliases} record."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for key in ("id", "family", "question", "answer"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            raise DataError(f"{where}: field {key!r} must be a non-empty string "
                            "(every fact needs id, family, question, answer; entity and aliases are optional)")
    aliases = rec.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and normalise(a) for a in aliases):
        raise DataError(f"{where}: field 'aliases' must be a list of non-empty strings")
    if not normalise(rec["answer"]):
        raise DataError(f"{where}: answer {rec['answer']!r} has no letters or digits to match")
    entity = rec.get("entity", "")
    if not isinstance(entity, str):
        raise DataError(f"{where}: field 'entity' must be a string")
    return Fact(rec["id"], rec["family"], entity, rec["question"], rec["answer"], tuple(aliases))


def load_facts(path: str | Path | None = None) -> list[Fact]:
    """Facts of a JSONL/JSON file (None: the built-in set); ids must be unique, errors name file:line."""
    if path is None:
        path = Path(str(resources.files("obliviate") / "resources" / "facts.jsonl"))
    facts = parse_file(path, _fact_from_record, "no facts in the file")
    seen: set[str] = set()
    for f in facts:
        if f.id in seen:
            raise DataError(f"{path}: fact id {f.id!r} appears twice; ids must be unique")
        seen.add(f.id)
    return facts


def facts_from_rows(rows: Sequence[QARow], family: str) -> list[Fact]:
    """TOFU world_facts / real_authors rows as facts of `family` (no entity; options as MCQ distractors)."""
    out = []
    for i, r in enumerate(rows):
        wrong = tuple(o for o in (r.options or r.perturbed_answer) if normalise(o) != normalise(r.answer))
        out.append(Fact(f"{family}-{i}", family, "", r.question, r.answer, (), wrong))
    return out


def unique_questions(facts: Sequence[Fact]) -> list[Fact]:
    """The facts with the first of each normalised question kept (TOFU's world_facts repeats some built-in ones)."""
    seen: set[str] = set()
    out = []
    for f in facts:
        if normalise(f.question) not in seen:
            seen.add(normalise(f.question))
            out.append(f)
    return out


def first_per_family(facts: Sequence[Fact], n: int | None) -> list[Fact]:
    """The first `n` facts of each family, in order (None: all): a quick probe of every family."""
    if n is None:
        return list(facts)
    count: dict[str, int] = {}
    out = []
    for f in facts:
        count[f.family] = count.get(f.family, 0) + 1
        if count[f.family] <= n:
            out.append(f)
    return out


def normalise(text: str) -> str:
    """Lowercase, accents stripped, every non-alphanumeric run -> one space, trimmed."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return re.sub(r"[^0-9a-z]+", " ", text).strip()


def answer_span(reply: str, fact: Fact) -> tuple[int, int] | None:
    """Character span in `reply` of the first gold answer / alias found as whole words, else None."""
    best = None
    for gold in answer_forms(fact):
        words = normalise(gold).split()
        if not words:
            continue
        pattern = r"(?<![0-9a-z])" + r"[^0-9a-z]+".join(map(re.escape, words)) + r"(?![0-9a-z])"
        m = re.search(pattern, _fold(reply))
        if m and (best is None or m.start() < best[0]):
            best = m.span()
    return best


def _fold(text: str) -> str:
    """Per character: lowercase ASCII letter/digit with accents stripped, anything else a space (positions kept)."""
    out = []
    for c in text:
        base = "".join(x for x in unicodedata.normalize("NFKD", c) if not unicodedata.combining(x)).lower()[:1]
        out.append(base if base.isascii() and base.isalnum() else " ")
    return "".join(out)


def is_correct(reply: str, fact: Fact) -> bool:
    """The normalised gold answer, an alias or a derived form (answer_forms) occurs in the normalised reply as
    whole words."""
    r = f" {normalise(reply)} "
    return any(f" {normalise(g)} " in r for g in answer_forms(fact) if normalise(g))


def training_answer(reply: str, fact: Fact) -> QARow:
    """The model's own correct reply, cut after the sentence holding the answer, the answer annotated."""
    span = answer_span(reply, fact)
    if span is None:
        raise ValueError(f"reply {reply!r} does not contain the answer to {fact.id}")
    end = re.search(r"[.!?](\s|$)", reply[span[1]:])
    text = reply[: span[1] + end.end()].strip() if end else reply.strip()
    return QARow(fact.question, text, fact_spans=(span,), author=fact.entity or None)


@dataclass
class KnowledgeSplit:
    """Known facts by group, with the rows the unlearning runs train on."""

    forget: list[Fact]
    neighbours: list[Fact]
    retain: list[Fact]
    heldout: list[Fact]
    rows: dict[str, QARow] = field(default_factory=dict)  # fact id -> training row (known facts only)
    pool: list[Fact] = field(default_factory=list)  # every probed fact: MCQ distractors come from its families

    def groups(self) -> dict[str, list[Fact]]:
        return {"forget": self.forget, "neighbours": self.neighbours, "retain": self.retain, "heldout": self.heldout}

    def train_rows(self, group: str) -> list[QARow]:
        return [self.rows[f.id] for f in self.groups()[group]]

    def max_eval_groups(self, max_eval: int | None) -> dict[str, list[Fact]]:
        """The groups as evaluate_knowledge scores them: forget whole, the others' first max_eval facts."""
        return {k: (v if k == "forget" or max_eval is None else v[:max_eval]) for k, v in self.groups().items()}

    def without(self, ids: set[str]) -> "KnowledgeSplit":
        """The same split with the facts whose ids are in `ids` left out of every group (the held-out rows)."""
        keep = {k: [f for f in v if f.id not in ids] for k, v in self.groups().items()}
        return KnowledgeSplit(keep["forget"], keep["neighbours"], keep["retain"], keep["heldout"], self.rows, self.pool)


def split_known(facts: Sequence[Fact], replies: Sequence[str], *, forget_families: Sequence[str] = (),
                forget_entities: Sequence[str] = (), retain_share: float = 0.5, max_forget: int | None = None,
                seed: int = 0) -> KnowledgeSplit:
    """Group the facts the model answered correctly (module docstring); errors when a group is empty."""
    if len(facts) != len(replies):
        raise ValueError(f"{len(facts)} facts but {len(replies)} replies")
    if not forget_families and not forget_entities:
        raise DataError("choose what to forget: knowledge.forget_families=[capitals] or knowledge.forget_entities=[France]")
    families = {f.family for f in facts}
    unknown = sorted(set(forget_families) - families)
    if unknown:
        raise DataError(f"unknown fact families {unknown}; valid: {sorted(families)}")
    known = [f for f, r in zip(facts, replies) if is_correct(r, f)]
    rows = {f.id: training_answer(r, f) for f, r in zip(facts, replies) if is_correct(r, f)}
    ents = {e.lower() for e in forget_entities}
    forget = [f for f in known if f.family in forget_families or (f.entity and f.entity.lower() in ents)]
    if max_forget is not None:
        forget = forget[:max_forget]
    if not forget:
        raise DataError(f"the model answers none of the facts to forget ({list(forget_families) or list(forget_entities)}) "
                        "correctly: there is nothing to unlearn; choose a family it knows (see the probe table)")
    ids = {f.id for f in forget}
    if forget_families:  # other families, same entities
        f_ents = {f.entity for f in forget if f.entity}
        neighbours = [f for f in known if f.id not in ids and f.family not in forget_families and f.entity in f_ents]
    else:  # same families, other entities
        f_fams = {f.family for f in forget}
        neighbours = [f for f in known if f.id not in ids and f.family in f_fams and f.entity.lower() not in ents]
    asked = {normalise(f.question) for f in forget}  # a question asked twice must not be forgotten and kept
    neighbours = [f for f in neighbours if normalise(f.question) not in asked]
    taken = ids | {f.id for f in neighbours}
    rest = [f for f in known if f.id not in taken and normalise(f.question) not in asked]
    random.Random(seed).shuffle(rest)
    n_retain = int(round(retain_share * len(rest)))
    retain, heldout = rest[:n_retain], rest[n_retain:]
    if not retain:
        raise DataError("no known facts are left for the retain term; forget fewer families or raise knowledge.retain_share")
    return KnowledgeSplit(forget, neighbours, retain, heldout, rows, list(facts))


def mcq_items(facts: Sequence[Fact], pool: Sequence[Fact], seed: int = 0) -> list[Any]:
    """4-way items: the gold answer and 3 distractors (the fact's own, else other answers of its family
    in `pool`), the gold's position drawn per item; facts with fewer than 3 distinct distractors are skipped."""

    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for f in pool:
        by_family.setdefault(f.family, []).append(f.answer)
    items = []
    for f in facts:
        golds = {normalise(g) for g in f.golds()}
        cands = list(f.distractors) or sorted(set(by_family.get(f.family, [])))
        cands = list(dict.fromkeys(c for c in cands if normalise(c) not in golds))
        if len(cands) < 3:
            continue
        wrong = rng.sample(cands, 3)
        pos = rng.randrange(4)
        choices = wrong[:pos] + [f.answer] + wrong[pos:]
        items.append(MCQItem(f.question, tuple(choices), pos, f.family))  # type: ignore[arg-type]
    return items


def accuracy(facts: Sequence[Fact], replies: Sequence[str]) -> float | None:
    """Share of facts answered correctly (None for no facts)."""
    return float(np.mean([is_correct(r, f) for f, r in zip(facts, replies)])) if facts else None


def family_table(facts: Sequence[Fact], replies: Sequence[str]) -> list[tuple[str, int, int]]:
    """(family, known, total) per family, in first-seen order (the probe's summary)."""
    out: dict[str, list[int]] = {}
    for f, r in zip(facts, replies):
        c = out.setdefault(f.family, [0, 0])
        c[0] += is_correct(r, f)
        c[1] += 1
    return [(k, v[0], v[1]) for k, v in out.items()]


KNOWLEDGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("forget_accuracy", "forget acc ↓"),
    ("neighbours_accuracy", "neighbour acc ↑"),
    ("retain_accuracy", "retain acc ↑"),
    ("heldout_accuracy", "held-out acc ↑"),
    ("forget_mcq_accuracy", "forget MCQ ↓"),
    ("other_mcq_accuracy", "other MCQ ↑"),
    ("forget_token_entropy", "token entropy ↑"),
    ("forget_repetition_rate", "repetition ↓"),
    ("forget_degenerate_share", "degenerate ↓"),
)


def knowledge_metric_infos() -> dict[str, Any]:
    """MetricInfo (direction, version, meaning) of the knowledge benchmark's metrics."""
    rows = [("forget_accuracy", False, "share of the forget facts answered correctly (gold or alias in the greedy reply)"),
            ("neighbours_accuracy", True, "known facts about the forget facts' entities, other families (not trained on)"),
            ("retain_accuracy", True, "known facts the retain term trains on"),
            ("heldout_accuracy", True, "known facts unlearning never sees (general knowledge kept)"),
            ("forget_mcq_accuracy", False, "4-way accuracy on the forget facts: the option whose answer sentence (the "
             "original reply with the answer swapped) has the lowest mean NLL (chance 0.25)"),
            ("other_mcq_accuracy", True, "4-way accuracy on the known non-forget facts (chance 0.25)"),
            ("all_degenerate_share", False, "share of all replies that are empty or loops")]
    return {n: MetricInfo(n, hib, 1, d) for n, hib, d in rows}


def evaluate_knowledge(model: Any, tokenizer: Any, split: KnowledgeSplit, *, max_new_tokens: int = 24,
                       batch_size: int = 32, max_eval: int | None = None, seed: int = 0,
                       replies: dict[str, str] | None = None, other_mcq: bool = True) -> dict[str, Any]:
    """Accuracy per group, fluency of the forget replies, MCQ accuracy (forget vs other) of one model.

    `max_eval` caps neighbours / retain / heldout (first N; the forget group is always whole). `replies`
    (fact id -> greedy reply, e.g. the probe's replies of the same model) skips generating them again.
    `other_mcq` False: the probe runs on the forget facts only (other_mcq_accuracy is None, other_mcq_n 0)."""

    groups = split.max_eval_groups(max_eval)
    facts = [f for g in groups.values() for f in g]
    if replies is not None:
        replies = [replies[f.id] for f in facts]  # type: ignore[assignment]
    else:
        replies = generate_answers(model, tokenizer, [f.question for f in facts], max_new_tokens=max_new_tokens,
                                   batch_size=batch_size, desc="evaluating: answers")
    out: dict[str, Any] = {"generations": {}, "rows": {}, "row_ids": {}}

    def per_row(name: str, values: Sequence[float], fs: Sequence[Fact]) -> None:
        """Per-row values of a metric averaged over facts, with each row's fact id (intervals, held-out parts)."""
        out["rows"][name], out["row_ids"][name] = [float(v) for v in values], [f.id for f in fs]

    start = 0
    for name, fs in groups.items():
        r = replies[start:start + len(fs)]
        start += len(fs)
        out[f"{name}_accuracy"], out["generations"][name] = accuracy(fs, r), r
        per_row(f"{name}_accuracy", [is_correct(x, f) for f, x in zip(fs, r)], fs)
    flu = fluency_summary(out["generations"]["forget"], tokenizer)
    out.update({f"forget_{k}": v for k, v in flu.items() if k != "n"})
    out["all_degenerate_share"] = fluency_summary(list(replies), tokenizer)["degenerate_share"]
    forget_replies = out["generations"]["forget"]
    per_row("forget_token_entropy", [token_entropy(g, tokenizer) for g in forget_replies], groups["forget"])
    per_row("forget_repetition_rate", [repetition_rate(g) for g in forget_replies], groups["forget"])
    per_row("forget_degenerate_share", [is_degenerate(g) for g in forget_replies], groups["forget"])
    per_row("all_degenerate_share", [is_degenerate(g) for g in replies], facts)
    out["forget_generations"] = out["generations"]["forget"]
    pool = split.pool or [f for g in split.groups().values() for f in g]
    others = [f for k in ("neighbours", "retain", "heldout") for f in groups[k]]
    by_question = {split.rows[f.id].question: split.rows[f.id] for g in groups.values() for f in g}
    for name, fs in (("forget", groups["forget"]), ("other", others if other_mcq else [])):
        items = mcq_items(fs, pool, seed=seed)
        right = (option_correct(model, tokenizer, items, [by_question[it.question] for it in items],
                                batch_size=batch_size) if items else [])
        out[f"{name}_mcq_accuracy"] = float(np.mean(right)) if right else None
        of_question = {f.question: f for f in fs}
        per_row(f"{name}_mcq_accuracy", right, [of_question[it.question] for it in items])
        out[f"{name}_mcq_n"] = len(items)
    return out


def option_sentences(item: Any, row: QARow) -> list[str]:
    """The model's own answer sentence `row` with its annotated answer span replaced by each option."""
    s, e = row.fact_spans[0]
    return [row.answer[:s] + choice + row.answer[e:] for choice in item.choices]


def option_correct(model: Any, tokenizer: Any, items: Sequence[Any], rows: Sequence[QARow], *,
                   batch_size: int = 32, max_length: int = 256) -> list[float]:
    """Per item, 1.0 when the right option wins (option_accuracy's rule), else 0.0: [N]."""

    pairs = [(it.question, text) for it, row in zip(items, rows) for text in option_sentences(it, row)]
    loss = batched_avg_loss(model, tokenizer, pairs, batch_size=batch_size, max_length=max_length).reshape(-1, 4)
    return [float(int(p) == int(it.answer)) for p, it in zip(loss.argmin(1), items)]


def option_accuracy(model: Any, tokenizer: Any, items: Sequence[Any], rows: Sequence[QARow], *,
                    batch_size: int = 32, max_length: int = 256) -> float:
    """4-way accuracy: each option is put into the original model's own answer sentence (as TOFU's perturbed
    answers share the answer's wording) and the option whose sentence has the lowest mean answer NLL under
    the chat prompt is chosen (TOFU's length-normalised probability, argmax); chance 0.25."""
    return float(np.mean(option_correct(model, tokenizer, items, rows, batch_size=batch_size, max_length=max_length)))


register("knowledge", knowledge_metric_infos())
