"""QA rows from JSONL / JSON files, TOFU-style split directories or the Hugging Face hub, validated."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from obliviate.columns import FIELDS, Fields, check_fields  # noqa: F401 (re-exported)
from obliviate.errors import DataError
from obliviate.hub import require_hub

Span = tuple[int, int]
T = TypeVar("T")


@dataclass(frozen=True)
class QARow:
    """One question/answer pair with the optional TOFU evaluation fields.

    `options` holds option1..4 (real_authors / world_facts); `fact_spans` / `name_spans` are
    character spans of `answer` that the synthetic world annotates (empty for real data).
    """

    question: str
    answer: str
    paraphrased_answer: str | None = None
    perturbed_answer: tuple[str, ...] = ()
    paraphrased_question: str | None = None
    options: tuple[str, ...] = ()
    fact_spans: tuple[Span, ...] = ()
    name_spans: tuple[Span, ...] = ()
    author: str | None = None

    def facts(self) -> list[str]:
        """The annotated fact strings of the answer (empty when not annotated)."""
        return [self.answer[s:e] for s, e in self.fact_spans]

    def asked_facts(self) -> list[str]:
        """The annotated fact and name strings the question does not itself give (what recall must test).

        "Where was Mara Quellen born?" asks for the place, not the name; "Who was born in Tessaly
        in 1962?" asks for the name. Strings the question contains (case-insensitive) are left out.
        """
        q = self.question.lower()
        spans = sorted(self.fact_spans + self.name_spans)
        return [t for t in dict.fromkeys(self.answer[s:e] for s, e in spans) if t.lower() not in q]

    def to_json(self) -> dict[str, Any]:
        """The TOFU field names (plus our annotations when present), ready for JSONL."""
        out: dict[str, Any] = {"question": self.question, "answer": self.answer}
        if self.paraphrased_answer is not None:
            out["paraphrased_answer"] = self.paraphrased_answer
        if self.perturbed_answer:
            out["perturbed_answer"] = list(self.perturbed_answer)
        if self.paraphrased_question is not None:
            out["paraphrased_question"] = self.paraphrased_question
        for i, opt in enumerate(self.options, start=1):
            out[f"option{i}"] = opt
        if self.fact_spans:
            out["fact_spans"] = [list(s) for s in self.fact_spans]
        if self.name_spans:
            out["name_spans"] = [list(s) for s in self.name_spans]
        if self.author is not None:
            out["author"] = self.author
        return out


def _need_str(rec: dict, key: str, where: str, optional: bool = False) -> str | None:
    if key not in rec or rec[key] is None:
        if optional:
            return None
        raise DataError(f"{where}: missing field {key!r} (every row needs 'question' and 'answer'); its columns: "
                        f"{', '.join(map(str, rec)) or 'none'}. Other column names? Map them with data.fields, "
                        "e.g. data.fields={question: prompt, answer: response}")
    val = rec[key]
    if not isinstance(val, str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(val).__name__}")
    if not optional and not val.strip():
        raise DataError(f"{where}: field {key!r} is empty")
    return val


def _spans(rec: dict, key: str, answer: str, where: str) -> tuple[Span, ...]:
    raw = rec.get(key) or []
    try:
        spans = tuple((int(s), int(e)) for s, e in raw)
    except (TypeError, ValueError):
        raise DataError(f"{where}: field {key!r} must be a list of [start, end] pairs") from None
    for s, e in spans:
        if not 0 <= s < e <= len(answer):
            raise DataError(f"{where}: span [{s}, {e}] in {key!r} lies outside the answer ({len(answer)} chars)")
    return spans


def map_fields(rec: Any, fields: Fields | None, where: str) -> Any:
    """The record with its columns renamed to obliviate's fields (`fields`: field -> column); a mapped column the
    record lacks is a DataError listing the columns it has."""
    if not fields or not isinstance(rec, dict):
        return rec
    for ours, theirs in fields.items():
        if theirs not in rec:
            raise DataError(f"{where}: data.fields maps {ours!r} to column {theirs!r}, which the data lacks; its "
                            f"columns: {', '.join(map(str, rec)) or 'none'}")
    return {**rec, **{ours: rec[theirs] for ours, theirs in fields.items()}}


def row_from_record(rec: Any, where: str, fields: Fields | None = None) -> QARow:
    """Validate one raw record (a dict in TOFU field names, or in the data's own names mapped by `fields`) and build
    a QARow."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    rec = map_fields(rec, fields, where)
    question = _need_str(rec, "question", where)
    answer = _need_str(rec, "answer", where)
    perturbed = rec.get("perturbed_answer") or []
    if isinstance(perturbed, str):
        perturbed = [perturbed]
    if not isinstance(perturbed, list) or not all(isinstance(p, str) for p in perturbed):
        raise DataError(f"{where}: field 'perturbed_answer' must be a list of strings")
    options = []
    for i in range(1, 5):
        opt = _need_str(rec, f"option{i}", where, optional=True)
        if opt is not None:
            options.append(opt)
    return QARow(
        question=question,
        answer=answer,
        paraphrased_answer=_need_str(rec, "paraphrased_answer", where, optional=True),
        perturbed_answer=tuple(perturbed),
        paraphrased_question=_need_str(rec, "paraphrased_question", where, optional=True),
        options=tuple(options),
        fact_spans=_spans(rec, "fact_spans", answer, where),
        name_spans=_spans(rec, "name_spans", answer, where),
        author=_need_str(rec, "author", where, optional=True),
    )


def read_records(path: Path) -> list[tuple[str, Any]]:
    """Raw records of a .jsonl or .json file, each with a 'file:line' location for error messages."""
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        if isinstance(data, dict) and "data" in data:
            data = data["data"]
        if not isinstance(data, list):
            raise DataError(f"{path}: a .json data file must hold a list of objects (or {{'data': [...]}})")
        return [(f"{path} item {i}", rec) for i, rec in enumerate(data)]
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg}); each line must be one JSON object") from None
    return out


def parse_file(path: str | Path, parse: Callable[[Any, str], T], empty: str) -> list[T]:
    """Records of a JSONL / JSON file through `parse(record, where)`; no records -> DataError(f"{path}: {empty}")."""
    path = Path(path)
    items = [parse(rec, where) for where, rec in read_records(path)]
    if not items:
        raise DataError(f"{path}: {empty}")
    return items


def load_file(path: str | Path, fields: Fields | None = None) -> list[QARow]:
    """QA rows of one JSONL / JSON file (columns renamed by `fields`); an empty file is an error."""
    return parse_file(path, lambda rec, where: row_from_record(rec, where, fields),
                      "the split is empty; it needs at least one question/answer row")


def rows_from(data: Any, fields: Fields | None = None, what: str = "rows") -> list[QARow]:
    """QA rows of in-memory data: QARows as they are, or records (a `datasets.Dataset`, a list of dicts) validated
    with their columns renamed by `fields`. The Python API's way in for data that is not in files."""
    items = list(data)
    if not items:
        raise DataError(f"{what}: no rows; give at least one question/answer row")
    if all(isinstance(r, QARow) for r in items):
        return items
    return [row_from_record(dict(r) if isinstance(r, Mapping) else r, f"{what} row {i}", fields)
            for i, r in enumerate(items)]


BUILTIN_SOURCES = {"tofu": "TOFU (Maini et al. 2024, MIT licence), every split of locuslab/TOFU"}


def builtin_dir(name: str) -> Path:
    """The folder of a data set shipped inside the package (`obliviate/resources/<name>/`)."""
    return Path(__file__).resolve().parents[1] / "resources" / name


def resolve_source(source: str | Path) -> Path | str:
    """A data source with its short name resolved: `tofu` -> the shipped TOFU folder; anything else unchanged.

    A short name always means the shipped copy (a local folder of that name is `./tofu`), so a config reads
    the same data wherever it is run from.
    """
    return builtin_dir(str(source)) if str(source) in BUILTIN_SOURCES else source


def split_file(directory: Path, split: str) -> Path:
    """The file of `split` in a TOFU-style directory (split.jsonl or split.json)."""
    for ext in (".jsonl", ".json"):
        cand = directory / f"{split}{ext}"
        if cand.is_file():
            return cand
    have = ", ".join(sorted(p.stem for p in directory.glob("*.json*"))) or "none"
    if directory.resolve() in {builtin_dir(n) for n in BUILTIN_SOURCES}:
        raise DataError(f"no split {split!r} in the shipped {directory.name} data; the splits shipped are: {have}")
    raise DataError(f"no split {split!r} in {directory} (looked for {split}.jsonl / {split}.json); "
                    f"splits there: {have}")


def load_hub(repo_id: str, split: str, fields: Fields | None = None) -> list[QARow]:
    """Rows of config `split` of a hub dataset (e.g. locuslab/TOFU, forget10) via datasets.load_dataset."""

    require_hub(f"data source {repo_id!r}")  # seconds, not minutes of retries, when offline
    import datasets  # heavy import, only on this path

    try:
        ds = datasets.load_dataset(repo_id, split, split="train")
    except Exception as exc:  # network, unknown config, ... all become one clear message
        raise DataError(f"could not load {repo_id!r} config {split!r} from the hub: {exc}. "
                        "Offline? Point data.source at a local directory of <split>.jsonl files instead.") from None
    rows = [row_from_record(dict(rec), f"{repo_id}/{split} row {i}", fields) for i, rec in enumerate(ds)]
    if not rows:
        raise DataError(f"{repo_id}/{split}: the split is empty")
    return rows


def load_split(source: str | Path, split: str | None = None, fields: Fields | None = None) -> list[QARow]:
    """Rows of `split` from a shipped data set (`tofu`), a file, a TOFU-style directory, or a hub dataset id; the
    data's columns renamed to obliviate's fields by `fields` (data.fields)."""
    path = Path(resolve_source(source))
    if path.is_file():
        return load_file(path, fields)
    if path.is_dir():
        if not split:
            raise DataError(f"{path} is a directory: name a split in it (e.g. forget10)")
        return load_file(split_file(path, split), fields)
    if str(source).count("/") == 1 and not str(source).startswith((".", "/")) and split:
        return load_hub(str(source), split, fields)
    raise DataError(f"data source {str(source)!r} is neither a file, a directory, a hub dataset id (owner/name "
                    f"with a split) nor a data set shipped with obliviate ({', '.join(BUILTIN_SOURCES)}); "
                    "for TOFU pass data.source=tofu")


def check_disjoint(forget: Sequence[QARow], retain: Sequence[QARow]) -> None:
    """Raise if a forget question also appears in the retain set (that would train on the forget data)."""
    seen = {r.question.strip() for r in retain}
    both = [r.question for r in forget if r.question.strip() in seen]
    if both:
        raise DataError(f"{len(both)} forget question(s) also appear in the retain set, e.g. {both[0]!r}; "
                        "choose a retain split without the forget rows (e.g. retain90 with forget10)")


def write_jsonl(path: Path, rows: Iterable[QARow]) -> None:
    """Write rows in TOFU field names, one JSON object per line."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
