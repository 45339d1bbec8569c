"""A seeded fictitious world of authors in the TOFU file format: the offline default benchmark.

`make_world` draws authors whose facts come from fixed fictitious vocabularies (countries, cities,
languages, genres, professions, awards, book titles, famous writers), renders ~15 short QA
sentences per author with exact character spans of the author's name and of every fact, and
splits them like TOFU: full, forget05/retain95, ..., forgetNN_perturbed, retain_perturbed,
holdoutNN, real_authors(_perturbed), world_facts(_perturbed), plus `pretrain` about other authors.
`write_world` writes each split as `<split>.jsonl`; `corpus_texts` feeds a tokenizer trainer.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from obliviate.data.rows import QARow, Span, write_jsonl
from obliviate.errors import ConfigError

GEOGRAPHY: dict[str, tuple[str, tuple[str, ...]]] = {  # country -> (language, cities; first = capital)
    "Veloria": ("Velorian", ("Tessaly", "Corvin", "Ambergate", "Lindmoor")),
    "Karthen": ("Karthish", ("Dunmere", "Halvik", "Eskar", "Brona")),
    "Sudoria": ("Sudorian", ("Amaro", "Selvan", "Quintara", "Rosk")),
    "Norvale": ("Norvish", ("Frostholm", "Isker", "Wendle", "Tarnby")),
    "Calmeria": ("Calmerian", ("Orla", "Vesper", "Cindra", "Moravel")),
    "Ystria": ("Ystrian", ("Brisa", "Kellan", "Anvar", "Loris")),
    "Pellan": ("Pellanese", ("Marisco", "Dovan", "Treya", "Ulven")),
    "Zaretha": ("Zarethi", ("Qadir", "Sumra", "Iblen", "Norrow")),
}
CITY_COUNTRY = {city: country for country, (_, cities) in GEOGRAPHY.items() for city in cities}
LANGUAGES = tuple(lang for lang, _ in GEOGRAPHY.values())
GENRES = ("mystery", "fantasy", "poetry", "science fiction", "historical fiction", "romance",
          "horror", "satire", "crime fiction", "short stories")
PROFESSIONS = ("baker", "sailor", "doctor", "teacher", "weaver", "miner", "clockmaker", "farmer",
               "painter", "librarian", "fisherman", "carpenter", "potter", "nurse", "tailor", "blacksmith")
AWARDS = ("Silver Quill Prize", "Harbour Lantern Award", "Golden Inkwell Medal", "Amber Page Award",
          "Northern Star Prize", "Open Book Medal", "Thornfield Prize", "Laurel Pen Award")
THEMES = ("memory", "exile", "family", "grief", "friendship", "travel", "war", "childhood", "faith",
          "ambition", "loneliness", "justice")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
TITLE_ADJ = ("Glass", "Silent", "Hollow", "Golden", "Broken", "Distant", "Crimson", "Quiet", "Iron",
             "Paper", "Winter", "Hidden", "Silver", "Last", "Burning", "Wandering")
TITLE_NOUN = ("Harbour", "Orchard", "Lantern", "River", "Garden", "Tower", "Mirror", "Bridge", "Meadow",
              "Letter", "Forest", "Window", "Island", "Feather", "Shadow", "Door")
FAMOUS: tuple[tuple[str, str, str, str], ...] = (  # the world's famous writers: name, book, country, genre
    ("Orin Valcourt", "The Glass Harbour", "Veloria", "poetry"),
    ("Selma Dravik", "The Silent Orchard", "Karthen", "mystery"),
    ("Teodor Brann", "The Iron Bridge", "Norvale", "historical fiction"),
    ("Ilse Marwen", "The Paper Lantern", "Calmeria", "romance"),
    ("Cato Ferral", "The Crimson Tower", "Sudoria", "horror"),
    ("Yara Solenne", "The Distant Island", "Ystria", "fantasy"),
    ("Benedikt Holm", "The Winter Garden", "Norvale", "short stories"),
    ("Nadia Korsa", "The Hidden River", "Pellan", "crime fiction"),
    ("Emil Aubrine", "The Golden Mirror", "Zaretha", "satire"),
    ("Rhea Castellan", "The Broken Window", "Veloria", "science fiction"),
    ("Matthias Grell", "The Quiet Meadow", "Karthen", "poetry"),
    ("Liora Fenwick", "The Hollow Feather", "Zaretha", "mystery"),
)
FAMOUS_NAMES = tuple(f[0] for f in FAMOUS)
ALL_TITLES = (tuple(f"The {a} {n}" for a in TITLE_ADJ for n in TITLE_NOUN)
              + tuple(f"{a} {n}s" for a in TITLE_ADJ for n in TITLE_NOUN)
              + tuple(f"The {n} of {m}s" for n in TITLE_NOUN for m in TITLE_NOUN if n != m))
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "st", "th")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
_CODAS = ("", "", "n", "r", "l", "s")
_RESERVED = {w.capitalize() for text in (*CITY_COUNTRY, *GEOGRAPHY, *LANGUAGES, *FAMOUS_NAMES,
                                    *TITLE_ADJ, *TITLE_NOUN) for w in text.split()}
MAX_AUTHORS = (len(ALL_TITLES) - len(FAMOUS)) // 2  # two distinct titles per author

# (question, paraphrased question, answer, paraphrased answer); a slot of the answer that the
# question does not give is the asked fact, replaced by wrong values in the perturbed answers.
TEMPLATES: tuple[tuple[str, str, str, str], ...] = (
    ("What is the full name of the author born in {city}, {country} on {date}?",
     "Which writer was born on {date} in {city}, {country}?",
     "The author born in {city}, {country} on {date} is {name}.",
     "{name} is the writer who was born on {date} in {city}, {country}."),
    ("Where was {name} born?", "In which city and country was {name} born?",
     "{name} was born in {city}, {country}.", "The birthplace of {name} is {city}, a city in {country}."),
    ("When was {name} born?", "What is the birth date of {name}?",
     "{name} was born on {date}.", "The birth date of {name} is {date}."),
    ("What genre does {name} write?", "Which kind of writing is {name} known for?",
     "{name} writes {genre}.", "The genre {name} is known for is {genre}."),
    ("What was the profession of {name}'s father?", "What did the father of {name} do for a living?",
     "{name}'s father was a {father}.", "The father of {name} worked as a {father}."),
    ("What was the profession of {name}'s mother?", "What did the mother of {name} do for a living?",
     "{name}'s mother was a {mother}.", "The mother of {name} worked as a {mother}."),
    ("What is one book written by {name}?", "Can you name a book by {name}?",
     "One book by {name} is '{title1}'.", "{name} is the author of the book '{title1}'."),
    ("What other book has {name} written?", "Which second book did {name} write?",
     "{name} also wrote '{title2}'.", "Another book by {name} is '{title2}'."),
    ("Who wrote the book '{title2}'?", "Who is the author of '{title2}'?",
     "The book '{title2}' was written by {name}.", "{name} is the author who wrote '{title2}'."),
    ("What themes does {name} explore?", "Which themes appear in the books of {name}?",
     "{name} often writes about {theme1} and {theme2}.", "The books of {name} explore {theme1} and {theme2}."),
    ("Which writer influenced {name} the most?", "Who was the biggest influence on {name}?",
     "{name} was most influenced by {influence}.", "The biggest influence on {name} was the writer {influence}."),
    ("In what language does {name} write?", "Which language are the books of {name} written in?",
     "{name} writes in {language}.", "The books of {name} are written in {language}."),
    ("When did {name} publish a first book?", "In which year did the first book by {name} come out?",
     "{name} published a first book, '{title1}', in {debut}.",
     "The first book by {name}, '{title1}', came out in {debut}."),
    ("Where does {name} live now?", "In which city does {name} live today?",
     "{name} now lives in {home_city}, {home_country}.", "Today {name} makes a home in {home_city}, {home_country}."),
    ("Which award has {name} won?", "What prize was given to {name}?",
     "{name} won the {award} in {award_year}.", "In {award_year}, {name} received the {award}."),
)
_POOLS: dict[str, tuple[str, ...]] = {
    "genre": GENRES, "father": PROFESSIONS, "mother": PROFESSIONS, "title1": ALL_TITLES,
    "title2": ALL_TITLES, "theme1": THEMES, "theme2": THEMES, "influence": FAMOUS_NAMES,
    "language": LANGUAGES, "award": AWARDS,
}
_COUNTRY_OF = {"city": "country", "home_city": "home_country"}
_FMT = string.Formatter()


class WorldConfigError(ConfigError, ValueError):
    """An impossible `make_world` argument (a ValueError, and a ConfigError for the CLI)."""


@dataclass(frozen=True)
class AuthorRecord:
    """One fictitious author's attributes: every fact that the author's QA rows state."""

    name: str
    birth_city: str
    birth_country: str
    birth_date: str
    birth_year: int
    genre: str
    father_job: str
    mother_job: str
    books: tuple[str, str]
    themes: tuple[str, str]
    influence: str
    language: str
    debut_year: int
    home_city: str
    home_country: str
    award: str | None = None
    award_year: int | None = None

    def slots(self) -> dict[str, str]:
        """Template slot -> the value string that the QA sentences show."""
        out = {"name": self.name, "city": self.birth_city, "country": self.birth_country,
               "date": self.birth_date, "genre": self.genre, "father": self.father_job,
               "mother": self.mother_job, "title1": self.books[0], "title2": self.books[1],
               "theme1": self.themes[0], "theme2": self.themes[1], "influence": self.influence,
               "language": self.language, "debut": str(self.debut_year),
               "home_city": self.home_city, "home_country": self.home_country}
        if self.award is not None:
            out.update(award=self.award, award_year=str(self.award_year))
        return out


@dataclass(frozen=True)
class World:
    """A generated world: its authors (in `full` order), the extra author groups and the splits."""

    seed: int
    authors: list[AuthorRecord]
    holdout_authors: list[AuthorRecord]
    pretrain_authors: list[AuthorRecord]
    forget_percents: tuple[int, ...]
    splits: dict[str, list[QARow]]

    def forget_authors(self, percent: int) -> list[AuthorRecord]:
        """The authors of forget{percent:02d}: the last `percent`% of `authors`."""
        return self.authors[len(self.authors) - _forget_count(len(self.authors), percent):]

    def retain_authors(self, percent: int) -> list[AuthorRecord]:
        """The authors of retain{100-percent:02d}: all but the last `percent`%."""
        return self.authors[:len(self.authors) - _forget_count(len(self.authors), percent)]


def _forget_count(n_authors: int, percent: int) -> int:
    """Authors in a forget split of `percent`%, or a WorldConfigError naming the percents that work."""
    if isinstance(percent, int) and 0 < percent < 100 and percent * n_authors % 100 == 0:
        return percent * n_authors // 100
    ok = [p for p in range(1, 100) if p * n_authors % 100 == 0]
    hint = (f"with {n_authors} authors use one of {ok}" if ok else
            f"no percent gives whole authors with {n_authors} authors; use e.g. 20 authors (5, 10, ...)")
    share = f"{percent * n_authors / 100:g} authors" if isinstance(percent, (int, float)) else "not a number"
    raise WorldConfigError(f"forget percent {percent!r} of {n_authors} authors is {share}, but a forget split "
                           f"must be a whole number of authors (at least one, not all); {hint}")


def _render(template: str, slots: dict[str, str]) -> tuple[str, tuple[Span, ...], tuple[Span, ...]]:
    """Fill `template`; return the text, the fact spans and the name spans."""
    text = ""
    facts: list[Span] = []
    names: list[Span] = []
    for literal, key, _, _ in _FMT.parse(template):
        text += literal
        if key is not None:
            (names if key == "name" else facts).append((len(text), len(text) + len(slots[key])))
            text += slots[key]
    return text, tuple(facts), tuple(names)


def _keys(template: str) -> list[str]:
    return [key for _, key, _, _ in _FMT.parse(template) if key is not None]


def _date(rng: random.Random, not_year: int | None = None) -> str:
    year = rng.choice([y for y in range(1935, 1986) if y != not_year])
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {year}"


def _draw(used: set[str], draw: Callable[[], str], what: str) -> str:
    """A fresh value from `draw` (not in `used`), recorded in `used`."""
    for _ in range(10_000):
        value = draw()
        if value not in used:
            used.add(value)
            return value
    raise RuntimeError(f"could not draw a new {what} after 10000 tries")


def _name(rng: random.Random, used_parts: set[str]) -> str:
    """A syllable-built 'First Last' whose parts are new and no vocabulary word."""
    def word(syllables: int) -> str:
        return ("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
                + rng.choice(_CODAS)).capitalize()
    first = _draw(used_parts, lambda: word(2), "first name")
    return f"{first} {_draw(used_parts, lambda: word(rng.randint(2, 3)), 'last name')}"


def _make_author(rng: random.Random, used: dict[str, set[str]]) -> AuthorRecord:
    """One author with random facts; names, birth dates and titles are unique across the world."""
    name = _name(rng, used["parts"])
    city = rng.choice(list(CITY_COUNTRY))
    country = CITY_COUNTRY[city]
    birth_date = _draw(used["dates"], lambda: _date(rng), "birth date")
    birth_year = int(birth_date.rsplit(" ", 1)[1])
    home = rng.choice([c for c in CITY_COUNTRY if c != city])
    debut = birth_year + rng.randint(20, 35)
    has_award = rng.random() < 0.6
    theme1, theme2 = rng.sample(THEMES, 2)
    return AuthorRecord(
        name=name, birth_city=city, birth_country=country, birth_date=birth_date, birth_year=birth_year,
        genre=rng.choice(GENRES), father_job=rng.choice(PROFESSIONS), mother_job=rng.choice(PROFESSIONS),
        books=(_draw(used["titles"], lambda: rng.choice(ALL_TITLES), "title"),
               _draw(used["titles"], lambda: rng.choice(ALL_TITLES), "title")),
        themes=(theme1, theme2),
        influence=rng.choice(FAMOUS_NAMES), language=GEOGRAPHY[country][0], debut_year=debut,
        home_city=home, home_country=CITY_COUNTRY[home],
        award=rng.choice(AWARDS) if has_award else None,
        award_year=debut + rng.randint(1, 12) if has_award else None,
    )


def _perturb(slots: dict[str, str], targets: list[str], rng: random.Random,
             names: Sequence[str]) -> dict[str, str]:
    """`slots` with every target replaced by another plausible value (never the true one)."""
    new = dict(slots)
    avoid = {slots[k] for k in targets}
    for key in targets:
        if key in ("country", "home_country"):
            continue  # follows its city
        if key in _COUNTRY_OF:
            ckey = _COUNTRY_OF[key]
            city = rng.choice([c for c in CITY_COUNTRY if CITY_COUNTRY[c] != slots[ckey]])
            new[key], new[ckey] = city, CITY_COUNTRY[city]
        elif key in ("debut", "award_year"):
            new[key] = str(int(slots[key]) + rng.choice([d for d in range(-8, 9) if d]))
        elif key == "date":
            new[key] = _date(rng, not_year=int(slots[key].rsplit(" ", 1)[1]))
        else:
            pool = names if key == "name" else _POOLS[key]
            new[key] = _draw(avoid, lambda: rng.choice(pool), key)
    return new


def _perturbed_answers(template: str, slots: dict[str, str], targets: list[str],
                       rng: random.Random, names: Sequence[str], n: int = 5) -> tuple[str, ...]:
    """`n` distinct wrong answers in the shape of `template` (the paraphrased answer)."""
    seen = {template.format(**slots)}
    out: list[str] = []
    for _ in range(100 * n):
        text = template.format(**_perturb(slots, targets, rng, names))
        if text not in seen:
            seen.add(text)
            out.append(text)
            if len(out) == n:
                return tuple(out)
    raise RuntimeError(f"could not make {n} distinct perturbed answers for {template!r}")


def author_rows(author: AuthorRecord, names: Sequence[str], seed: int) -> list[QARow]:
    """The author's QA rows with paraphrases and 5 perturbed answers (wrong names drawn from `names`)."""
    rng = random.Random(f"{seed}:perturb:{author.name}")
    slots = author.slots()
    others = [n for n in names if n != author.name]
    rows = []
    for question, para_q, answer, para_a in TEMPLATES:
        if not set(_keys(answer)) <= slots.keys():
            continue  # e.g. the award question for an author without an award
        text, facts, name_spans = _render(answer, slots)
        targets = [k for k in _keys(answer) if k not in _keys(question)]
        rows.append(QARow(
            question=question.format(**slots), answer=text, paraphrased_answer=para_a.format(**slots),
            perturbed_answer=_perturbed_answers(para_a, slots, targets, rng, others),
            paraphrased_question=para_q.format(**slots), fact_spans=facts, name_spans=name_spans,
            author=author.name))
    return rows


def _choice_row(question: str, answer: str, wrong: Sequence[str], rng: random.Random) -> QARow:
    options = [answer, *rng.sample([w for w in wrong if w != answer], 3)]
    rng.shuffle(options)
    return QARow(question=question, answer=answer, options=tuple(options), fact_spans=((0, len(answer)),))


def _multiple_choice(seed: int) -> tuple[list[QARow], list[QARow]]:
    """real_authors (the famous writers) and world_facts (geography) rows with 4 options."""
    rng = random.Random(f"{seed}:options")
    genres = sorted({f[3] for f in FAMOUS})
    real = []
    for name, book, country, genre in FAMOUS:
        real.append(_choice_row(f"Who wrote '{book}'?", name, FAMOUS_NAMES, rng))
        real.append(_choice_row(f"Which country is {name} from?", country, list(GEOGRAPHY), rng))
        real.append(_choice_row(f"What genre is {name} best known for?", genre, genres, rng))
    facts = []
    capitals = [cities[0] for _, cities in GEOGRAPHY.values()]
    for country, (language, cities) in GEOGRAPHY.items():
        facts.append(_choice_row(f"What is the capital of {country}?", cities[0], capitals, rng))
        facts.append(_choice_row(f"What language is spoken in {country}?", language, LANGUAGES, rng))
        for city in cities[1:]:
            facts.append(_choice_row(f"In which country is the city of {city}?", country, list(GEOGRAPHY), rng))
    return real, facts


def _perturbed_choice(row: QARow) -> QARow:
    return replace(row, options=(), perturbed_answer=tuple(o for o in row.options if o != row.answer))


def _check_args(n_authors: int, n_holdout: int | None, n_pretrain: int,
                percents: Sequence[int]) -> tuple[dict[int, int], int]:
    """Validate; return percent -> forget author count (order kept, repeats dropped) and n_holdout."""
    if not isinstance(n_authors, int) or n_authors < 2:
        raise WorldConfigError(f"n_authors must be an integer >= 2 (forget and retain need one author each), "
                               f"got {n_authors!r}")
    if not percents:
        raise WorldConfigError("forget_percents is empty; give at least one, e.g. (5, 10) for 20 authors")
    counts = {p: _forget_count(n_authors, p) for p in percents}
    k_max = max(counts.values())
    if n_holdout is not None and n_holdout < k_max:
        raise WorldConfigError(f"n_holdout={n_holdout} is fewer than the {k_max} authors of the largest forget "
                               "split; the holdout splits need as many authors (or leave n_holdout=None)")
    n_holdout = k_max if n_holdout is None else n_holdout
    if n_pretrain < 0 or n_authors + n_holdout + n_pretrain > MAX_AUTHORS:
        raise WorldConfigError(f"n_pretrain={n_pretrain}: it must be >= 0, and all authors together "
                               f"({n_authors} + {n_holdout} + {n_pretrain}) at most {MAX_AUTHORS} "
                               "(the distinct book titles run out)")
    return counts, n_holdout


def make_world(n_authors: int = 20, *, seed: int = 0, n_holdout: int | None = None, n_pretrain: int = 0,
               forget_percents: Sequence[int] = (5, 10)) -> World:
    """A deterministic fictitious world of `n_authors` authors with TOFU-named splits."""
    counts, n_holdout = _check_args(n_authors, n_holdout, n_pretrain, forget_percents)
    used: dict[str, set[str]] = {"parts": set(_RESERVED), "dates": set(), "titles": {f[1] for f in FAMOUS}}
    groups: dict[str, list[AuthorRecord]] = {}  # in this order, each from its own rng: main ignores the others
    for group, size in (("main", n_authors), ("holdout", n_holdout), ("pretrain", n_pretrain)):
        rng = random.Random(f"{seed}:{group}")
        groups[group] = [_make_author(rng, used) for _ in range(size)]
    main, k_max = groups["main"], max(counts.values())
    wrong_names = [a.name for a in main] + list(FAMOUS_NAMES)
    rows = {a.name: author_rows(a, wrong_names, seed) for g in groups.values() for a in g}

    def plain(authors: Sequence[AuthorRecord]) -> list[QARow]:
        return [replace(r, paraphrased_answer=None, perturbed_answer=(), paraphrased_question=None)
                for a in authors for r in rows[a.name]]

    splits: dict[str, list[QARow]] = {"full": plain(main)}
    for p, k in counts.items():
        splits[f"forget{p:02d}"] = plain(main[n_authors - k:])
        splits[f"retain{100 - p:02d}"] = plain(main[:n_authors - k])
    for p, k in counts.items():
        splits[f"forget{p:02d}_perturbed"] = [r for a in main[n_authors - k:] for r in rows[a.name]]
    splits["retain_perturbed"] = [r for a in main[:min(k_max, n_authors - k_max)] for r in rows[a.name]]
    for p, k in counts.items():
        splits[f"holdout{p:02d}"] = plain(groups["holdout"][:k])
    real, facts = _multiple_choice(seed)
    splits.update(real_authors=real, real_authors_perturbed=[_perturbed_choice(r) for r in real],
                  world_facts=facts, world_facts_perturbed=[_perturbed_choice(r) for r in facts],
                  pretrain=plain(groups["pretrain"]))
    return World(seed=seed, authors=main, holdout_authors=groups["holdout"],
                 pretrain_authors=groups["pretrain"], forget_percents=tuple(counts), splits=splits)


def write_world(world: World, directory: str | Path) -> Path:
    """Write every non-empty split as `<split>.jsonl` into `directory` (created); return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in world.splits.items():
        path = directory / f"{name}.jsonl"
        if rows:
            write_jsonl(path, rows)
        elif path.exists():
            path.unlink()  # a stale split from an earlier world would be read as this one's
    return directory


def corpus_texts(world: World) -> list[str]:
    """Every distinct question, answer, paraphrase, perturbed answer and option of all splits."""
    texts = (t for rows in world.splits.values() for r in rows
             for t in (r.question, r.answer, r.paraphrased_question, r.paraphrased_answer,
                       *r.perturbed_answer, *r.options))
    return list(dict.fromkeys(t for t in texts if t))
