"""TOFU cut down to its last N authors, in TOFU's own layout, for a model small enough to learn them (issue 33).

TOFU (Maini et al. 2024) fine-tunes a target on 200 fictitious authors (20 question/answer rows each) and forgets
the last 1%, 5% or 10% of them; its retain model is trained on the others. A 135M-parameter model on a CPU cannot
learn 4,000 rows well, so this writes the same protocol on the last N authors (N ≤ 20, TOFU's forget10 authors,
the only ones whose paraphrased and perturbed answers TOFU ships beside their rows):

- full: the N authors' rows (TOFU's full.jsonl, last 20·N rows, in TOFU's order);
- forget<p>, forget<p>_perturbed: the last p% of the N authors, for each p of TOFU's 1, 5, 10 that is a whole
  number of authors (N = 20: forget05 = 1 author, forget10 = 2); TOFU's own perturbed rows;
- retain<100-p>: the other authors' rows (what the retain model trains on);
- retain_perturbed: the rows of the authors that no forget split holds (model utility's retain part), with
  TOFU's perturbed answers (TOFU's retain_perturbed covers other authors, that this target never learns);
- holdout<p>: as many never-trained authors as forget<p> has, the first of TOFU's holdout10 (whose first two
  are its holdout01), for MIA and PrivLeak;
- real_authors, world_facts and their _perturbed splits: copied as they are (general knowledge).

Every split is a list of TOFU records (its field names), so `data.source` pointed at the folder works with every
command and preset that reads TOFU.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from obliviate.data.rows import builtin_dir
from obliviate.errors import DataError

ROWS_PER_AUTHOR = 20
TOFU_AUTHORS = 200
MAX_AUTHORS = 20  # TOFU's forget10: the authors whose perturbed answers it ships
PERCENTS = (1, 5, 10)  # TOFU's forget shares
COPIED = ("real_authors", "real_authors_perturbed", "world_facts", "world_facts_perturbed")


def _read(directory: Path, split: str) -> list[dict[str, Any]]:
    path = directory / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{directory}: no {split}.jsonl; point --source at a folder of TOFU's splits (the shipped "
                        "copy is the default)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def forget_percents(authors: int) -> list[int]:
    """The forget percentages that are a whole number of authors, at least one, and leave one to retain."""
    return [p for p in PERCENTS if (p * authors) % 100 == 0 and 1 <= p * authors // 100 < authors]


def subset_splits(authors: int, source: str | Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """Split name -> TOFU records of the last `authors` authors (module docstring); `source`: a TOFU folder
    (default: the shipped copy). Everything is read and checked before the caller writes anything."""
    if isinstance(authors, bool) or not isinstance(authors, int) or not 2 <= authors <= MAX_AUTHORS:
        raise DataError(f"--authors must be a whole number from 2 to {MAX_AUTHORS} (TOFU ships perturbed answers "
                        f"for its last {MAX_AUTHORS} authors only), got {authors!r}")
    percents = forget_percents(authors)
    if not percents:
        raise DataError(f"--authors {authors}: no forget share of {list(PERCENTS)}% is a whole number of authors; "
                        "use 10 or 20")
    directory = Path(source) if source is not None else builtin_dir("tofu")
    full, perturbed, holdout = _read(directory, "full"), _read(directory, "forget10_perturbed"), \
        _read(directory, "holdout10")
    if len(full) != TOFU_AUTHORS * ROWS_PER_AUTHOR or len(perturbed) != MAX_AUTHORS * ROWS_PER_AUTHOR:
        raise DataError(f"{directory}: expected TOFU's {TOFU_AUTHORS * ROWS_PER_AUTHOR} full rows and "
                        f"{MAX_AUTHORS * ROWS_PER_AUTHOR} forget10_perturbed rows, found {len(full)} and "
                        f"{len(perturbed)}")
    mine = full[-authors * ROWS_PER_AUTHOR:]
    tail = perturbed[-authors * ROWS_PER_AUTHOR:]
    if [r["question"] for r in mine] != [r["question"] for r in tail]:
        raise DataError(f"{directory}: forget10_perturbed's questions are not full's last {MAX_AUTHORS} authors' "
                        "in order; is it TOFU?")
    out: dict[str, list[dict[str, Any]]] = {"full": mine}
    for p in percents:
        n = p * authors // 100 * ROWS_PER_AUTHOR
        out[f"forget{p:02d}"] = mine[-n:]
        out[f"forget{p:02d}_perturbed"] = tail[-n:]
        out[f"retain{100 - p}"] = mine[:-n]
        if n > len(holdout):
            raise DataError(f"{directory}: holdout10 has {len(holdout)} rows, forget{p:02d} needs {n}")
        out[f"holdout{p:02d}"] = holdout[:n]
    largest = max(percents) * authors // 100 * ROWS_PER_AUTHOR
    out["retain_perturbed"] = tail[:-largest]
    for name in COPIED:
        out[name] = _read(directory, name)
    return out


def describe(authors: int, splits: dict[str, list[dict[str, Any]]]) -> str:
    """A README for the written folder: where each split comes from (TOFU's last `authors` authors)."""
    first = TOFU_AUTHORS - authors + 1
    lines = [f"# TOFU's authors {first}-{TOFU_AUTHORS} ({authors} of {TOFU_AUTHORS})", "",
             "Written by `obliviate prepare tofu` from TOFU (Maini et al. 2024, arXiv 2401.06121; MIT licence, "
             "copyright (c) 2024 CMU Locus Lab), records unchanged. Rows per split:", ""]
    lines += [f"- {name}: {len(rows)}" for name, rows in splits.items()]
    return "\n".join(lines) + "\n"
