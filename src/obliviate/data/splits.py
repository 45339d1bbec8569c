"""Loading the splits a command names: a run's training rows (QA rows or raw documents) and an audit's forget,
retain and holdout rows."""
from __future__ import annotations

from pathlib import Path

from obliviate.data.rows import Fields, QARow, load_split
from obliviate.errors import ConfigError, DataError


def load_data(source: str, fmt: str, splits: list, fields: Fields | None = None) -> list:
    """QA rows (format qa; columns renamed by `fields`) or raw documents (format text) of the named splits,
    concatenated."""
    if not splits:
        raise ConfigError("data.splits is empty; name at least one split, e.g. data.splits=[full]")
    if fmt == "text":
        from obliviate.data.text import load_texts

        skipped: list[str] = []  # empty documents (MUSE-News raw/forget.json item 821) are left out, counted
        docs = [t for s in splits for t in load_texts(source, str(s), skipped=skipped)]
        if skipped:
            print(f"skipped {len(skipped)} empty document(s): {', '.join(skipped[:5])}"
                  + (" ..." if len(skipped) > 5 else ""))
        return docs
    return [r for s in splits for r in load_split(source, str(s), fields)]


def _split(source: str, name: str) -> list[QARow]:
    """Rows of split `name` of `source`, or of the file `name` when it is one."""
    return load_split(name) if Path(name).is_file() else load_split(source, name)


def load_attack_splits(source: str, fsplit: str, rsplit: str | None, hsplit: str | None
                       ) -> tuple[list[QARow], list[QARow], list[QARow], list[str]]:
    """(forget, retain, holdout, notes) an audit attacks: the forget split (its _perturbed version when present, with
    the paraphrased questions) and its retain and holdout partners (a missing partner is a note, not an error)."""
    notes: list[str] = []
    if Path(source).is_file():
        forget = load_split(source)
    else:
        try:
            forget = load_split(source, f"{fsplit}_perturbed")
        except DataError:
            forget = load_split(source, fsplit)
            notes.append(f"no {fsplit}_perturbed split: paraphrased questions may be missing")
    parts = []
    for what, name in (("retain", rsplit), ("holdout", hsplit)):
        rows: list[QARow] = []
        if name and not Path(source).is_file() or name and Path(name).is_file():
            try:
                rows = _split(source, name)
            except DataError as exc:
                notes.append(f"{what} rows not loaded ({exc})")
        else:
            notes.append(f"no {what} split given (--{what}-split)")
        parts.append(rows)
    return forget, parts[0], parts[1], notes
