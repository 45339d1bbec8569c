"""Intervals and ties: a percentile bootstrap of a score over rows and seeds, and the tie rule of the verdicts.

A run's score (e.g. the bar's forget score, an expression over metrics) is a function of per-row means:
`forget_accuracy` is the mean of 0/1 per forget fact, and so on. Given each seed's per-row values of those
metrics, one bootstrap draw resamples the seeds with replacement and, within each seed, the rows of each
metric group with replacement (one index draw per group of equal length, so metrics over the same rows stay
paired; `group` may instead name the rows that share a draw, e.g. each split of a TOFU evaluation on its own),
recomputes the means, evaluates the score per drawn seed and averages over the drawn seeds. Scores that are not
functions of row means (a KS test's p-value) read the resampled rows themselves (`whole`). The
interval is the draws' (1 − level)/2 and (1 + level)/2 quantiles (Efron & Tibshirani 1993, ch. 13). Metrics
given without per-row values enter each drawn seed as they are, so with one seed and no rows the interval
is the point itself: nothing to resample, said so by `resampled`.

Ties (`tied_groups`): sorted by estimate, best first; the best method and every remaining method whose
interval overlaps the best's form one group of ties; the rest are grouped the same way. Methods in one
group are reported as tied, never ranked among themselves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from obliviate.errors import ConfigError

Score = Callable[[Mapping[str, Any]], float]
Group = Callable[[str, int], Hashable]
REFERENCE = "θ0:"  # the prefix of a reference model's numbers in a paired table (`paired`)


def by_length(key: str, n: int) -> int:
    """The default draw groups: every metric with n rows shares one index draw."""
    return n


@dataclass(frozen=True)
class Interval:
    """A score's estimate (the mean over seeds of the score on all rows), its bootstrap interval, the level, how
    many seeds and rows per seed it rests on, and whether anything was resampled."""

    estimate: float
    low: float
    high: float
    level: float
    seeds: int
    rows: int
    resampled: bool

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self, digits: int = 3) -> str:
        if not self.resampled:
            return f"{self.estimate:.{digits}f} (no interval: one seed, no per-row values)"
        return (f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] "
                f"({self.seeds} seed{'s' if self.seeds != 1 else ''} x {self.rows} rows)")


def check_level(level: float) -> float:
    """A confidence level strictly inside (0, 1), else a ConfigError naming it."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ConfigError(f"interval level {level!r} must lie strictly between 0 and 1, e.g. 0.95")
    return float(level)


Layout = list[tuple[Hashable, list[str], np.ndarray]]  # per draw group, in drawing order: its metrics, [k, n] rows


def _layout(rows: Mapping[str, np.ndarray], group: Group) -> Layout:
    """A seed's rows by draw group (one [k, n] matrix each, k metrics of n rows), in drawing order; a group whose
    metrics have different row counts is refused."""
    keys: dict[Hashable, list[str]] = {}
    for k, v in rows.items():
        keys.setdefault(group(k, len(v)), []).append(k)
    out = []
    for g in sorted(keys, key=lambda g: (str(type(g)), g)):
        sizes = {len(rows[k]) for k in keys[g]}
        if len(sizes) > 1:
            raise ValueError(f"bootstrap: draw group {g!r} holds metrics of {' and of '.join(map(str, sorted(sizes)))} "
                             f"rows ({', '.join(keys[g])})")
        out.append((g, keys[g], np.stack([rows[k] for k in keys[g]])))
    return out


def _means(layout: Layout, picks: Mapping[Hashable, np.ndarray] | None,
           whole: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Each metric's mean over its rows (resampled by its group's index draw when `picks`); a metric in `whole` as
    its (resampled) rows themselves."""
    out: dict[str, Any] = {}
    for g, keys, mat in layout:
        x = mat if picks is None else mat[:, picks[g]]
        means = x.mean(axis=1)
        for i, k in enumerate(keys):
            out[k] = x[i] if k in whole else float(means[i])
    return out


def bootstrap(score: Score, seeds: Sequence[tuple[Mapping[str, Any], Mapping[str, Sequence[float]]]], *,
              level: float = 0.95, draws: int = 2000, seed: int = 0,
              derive: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              reads: Iterable[str] | None = None, group: Group = by_length,
              whole: Iterable[str] = ()) -> Interval:
    """Interval of `score` over seeds × rows (module docstring). seeds: one (metrics, per-row values) per seed;
    per-row values: metric -> [N] numbers whose mean is that metric (they replace it in the score's input).
    derive: recomputes metrics made from others (e.g. forget_score from its two accuracies) before scoring.
    reads: the metrics the score rests on; the interval's row count is the largest of theirs (default: of all).
    group(metric, n rows): metrics of one group share each index draw (default: those of equal length).
    whole: metrics the score reads as their resampled rows ([n] arrays), not as their means."""
    level = check_level(level)
    if derive is not None:
        inner = score
        score = lambda m: inner(derive(dict(m)))  # noqa: E731
    if not seeds:
        raise ValueError("bootstrap needs at least one seed")
    tables = [({**m}, {k: np.asarray(v, dtype=np.float64) for k, v in r.items() if len(v)}) for m, r in seeds]
    whole = frozenset(whole)
    layouts = [_layout(r, group) for _, r in tables]
    full = [score({**m, **_means(lay, None, whole)}) for (m, _), lay in zip(tables, layouts)]
    estimate = float(np.mean(full))
    resampled = len(tables) > 1 or bool(tables[0][1])
    wanted = None if reads is None else set(reads)
    n_rows = max((len(v) for _, r in tables for k, v in r.items() if wanted is None or k in wanted), default=0)
    if not resampled or np.isnan(estimate):
        return Interval(estimate, estimate, estimate, level, len(tables), n_rows, False)
    rng = np.random.default_rng(seed)
    out = np.empty(draws)
    for d in range(draws):
        chosen = rng.integers(0, len(tables), size=len(tables))
        vals = []
        for s in chosen:
            m, r = tables[s]
            picks = {g: rng.integers(0, mat.shape[1], size=mat.shape[1]) for g, _, mat in layouts[s]}
            vals.append(score({**m, **_means(layouts[s], picks, whole)}))
        out[d] = np.mean(vals)
    low, high = np.nanquantile(out, [(1 - level) / 2, (1 + level) / 2])
    return Interval(estimate, float(low), float(high), level, len(tables), n_rows, True)


def paired(own: tuple[Mapping[str, Any], Mapping[str, Any]], reference: tuple[Mapping[str, Any], Mapping[str, Any]]
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One seed's (metrics, rows) with a reference model's on the same rows beside them (REFERENCE-prefixed), so that
    a bootstrap draws the same rows of both, a paired comparison (the default groups pair rows of equal length; a
    `group` must put a REFERENCE-prefixed metric with its own)."""
    return ({**own[0], **{REFERENCE + k: v for k, v in reference[0].items()}},
            {**own[1], **{REFERENCE + k: v for k, v in reference[1].items()}})


def ratio_to_reference(metric: str, derive: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Score:
    """A score of a `paired` table: `metric` over the reference's, each side through `derive` first (which recomputes
    it from its drawn parts); NaN when either is missing or the reference's is 0."""
    def score(m: Mapping[str, Any]) -> float:
        own = {k: v for k, v in m.items() if not k.startswith(REFERENCE)}
        ref = {k[len(REFERENCE):]: v for k, v in m.items() if k.startswith(REFERENCE)}
        if derive is not None:
            own, ref = derive(own), derive(ref)
        a, b = own.get(metric), ref.get(metric)
        return math.nan if a is None or not b else float(a) / float(b)

    return score


def tied_groups(intervals: Mapping[str, Interval], lower_is_better: bool = True) -> list[list[str]]:
    """Groups of tied methods, best group first (module docstring); NaN estimates go last, alone."""
    sign = 1 if lower_is_better else -1
    left = sorted((k for k in intervals if not np.isnan(intervals[k].estimate)),
                  key=lambda k: sign * intervals[k].estimate)
    groups = []
    while left:
        lead = intervals[left[0]]
        group = [k for k in left if k == left[0] or intervals[k].overlaps(lead)]
        groups.append(group)
        left = [k for k in left if k not in group]
    return groups + [[k] for k in intervals if np.isnan(intervals[k].estimate)]
