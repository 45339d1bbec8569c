"""Selection and verdict on different rows: a study's evaluation rows cut once into a selection part and a held-out
report part, and an evaluation's metrics recomputed on either part.

`report_ids`: within each group (forget, neighbours, retain, held out), the facts sorted by a seeded hash of their
id; the first round(share · n) of them, at least one and at most n − 1 when n ≥ 2, are held out for the report.
The cut depends on the ids, the share and the seed only, so every trial and every worker of a study uses the same
one. `part`: the metrics whose per-row values an evaluation kept (`rows`, with the fact id of each row in
`row_ids`) are recomputed as the mean over the part's rows; `forget_score` is rebuilt from its two accuracies;
the other numbers (counts, timings) stay as they are. The knowledge evaluation keeps per-row values of every
metric it averages over facts or replies (eval/knowledge.py), so no number of a part reads the other part's rows.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import numpy as np

from obliviate.errors import ConfigError
from obliviate.eval.score import with_forget_score


def check_share(share: float) -> float:
    """A held-out share strictly inside (0, 1), else a ConfigError naming it."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ConfigError(f"heldout_share {share!r} must lie strictly between 0 and 1 (e.g. 0.5: half of each "
                          "group's rows select the best trials, the other half give the verdict)")
    return float(share)


def _key(seed: int, fact_id: str) -> str:
    return hashlib.sha256(f"{seed}:{fact_id}".encode()).hexdigest()


def report_ids(groups: Mapping[str, Sequence[str]], share: float, seed: int = 0) -> set[str]:
    """The fact ids held out for the report (module docstring); groups: name -> fact ids."""
    share = check_share(share)
    out: set[str] = set()
    for ids in groups.values():
        ranked = sorted(dict.fromkeys(ids), key=lambda i: _key(seed, i))
        n = len(ranked)
        k = min(max(round(share * n), 1), n - 1) if n >= 2 else 0
        out.update(ranked[:k])
    return out


def part(evaluation: Mapping[str, Any], held_out: set[str], report: bool) -> tuple[dict[str, Any], dict[str, list]]:
    """(metrics, rows) of an evaluation on its report part (report=True) or its selection part: every metric with
    per-row values recomputed on that part's rows (None when the part has none), the other numbers as they are;
    texts and tables (generations, the rows themselves) are left out."""

    rows, ids = evaluation.get("rows") or {}, evaluation.get("row_ids") or {}
    metrics: dict[str, Any] = {k: v for k, v in evaluation.items()
                               if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}
    out_rows: dict[str, list] = {}
    for name, values in rows.items():
        keep = [v for v, i in zip(values, ids[name]) if (i in held_out) == report]
        out_rows[name] = keep
        metrics[name] = float(np.mean(keep)) if keep else None
    if "forget_score" in evaluation:
        metrics = with_forget_score(metrics)
    return metrics, out_rows


def tofu_cut(splits: Mapping[str, Sequence[Any]], share: float, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """({split: selection row indices}, {split: held-out row indices}), each sorted: eval/heldout.report_ids on ids
    "<split>:<index>", so the cut depends on the splits' sizes, the share and the seed only."""
    held = report_ids({k: [f"{k}:{i}" for i in range(len(rows))] for k, rows in splits.items()}, share, seed)
    select = {k: np.array([i for i in range(len(r)) if f"{k}:{i}" not in held], dtype=int) for k, r in splits.items()}
    report = {k: np.array([i for i in range(len(r)) if f"{k}:{i}" in held], dtype=int) for k, r in splits.items()}
    return select, report


def unseen_positions(rows: Sequence[Any], source_rows: Sequence[Any], share: float, seed: int,
                     source_share: float, source_seed: int) -> list[int]:
    """Positions, within a TOFU split's held-out part (tofu_cut's order), of the rows that another study's selection
    never read: those not in the selection part of `source_rows` (that study's split, cut with its own share and seed),
    rows matched by equality (e.g. question text). A transfer study (export.write_transfer_config) whose rows overlap
    its source's reports on these to keep selection and verdict apart."""
    seen = {source_rows[i] for i in tofu_cut({"forget": source_rows}, source_share, source_seed)[0]["forget"]}
    held = tofu_cut({"forget": rows}, share, seed)[1]["forget"]
    return [p for p, i in enumerate(held) if rows[i] not in seen]
