"""Refusal answers for IDK-style objectives: the shipped TOFU list or the user's file, drawn per access or per
example with a seeded generator."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from obliviate.errors import DataError


def load_refusals(path: str | Path | None = None) -> list[str]:
    """Refusal sentences, one per line (plain text or a JSON string); the shipped list when `path` is None."""
    if path is None:
        text = resources.files("obliviate.resources").joinpath("idontknow.jsonl").read_text(encoding="utf-8")
        where = "the shipped refusal list"
    else:
        p = Path(path)
        if not p.is_file():
            raise DataError(f"refusal file not found: {p} (one refusal per line, e.g. \"I don't know.\")")
        text, where = p.read_text(encoding="utf-8"), str(p)
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if line.startswith('"'):
            try:
                line = json.loads(line)
            except json.JSONDecodeError:
                raise DataError(f"{where}:{lineno}: a line starting with a quote must be a JSON string") from None
        if not isinstance(line, str) or not line.strip():
            raise DataError(f"{where}:{lineno}: each line must be one non-empty refusal sentence")
        out.append(line)
    if not out:
        raise DataError(f"{where} holds no refusal sentences")
    return out


DRAWS = ("per_access", "per_example")


def draw_refusals(n: int, n_refusals: int, seed: int, step: int) -> list[int]:
    """Refusal index of each of `n` examples at optimizer step `step`: one seeded draw per (seed, step), the same
    on every rank and for any split of the step into processes or micro-batches (a resume redraws it exactly)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n_refusals, (n,), generator=g).tolist()


class RefusalTwins:
    """Each question answered with a refusal, encoded on first use: `per_example` keeps one refusal per question
    for the run; `per_access` draws a fresh one at every optimizer step (`draw_refusals`). `at(step)` is a list-like
    view: view[i] is question i's twin at that step."""

    def __init__(self, encode: Any, questions: list[str], refusals: list[str], seed: int, draw: str) -> None:
        if draw not in DRAWS:
            raise ValueError(f"refusal draw must be one of {list(DRAWS)}, got {draw!r}")
        self.encode, self.questions, self.refusals, self.seed, self.draw = encode, questions, refusals, seed, draw
        self._fixed = None
        if draw == "per_example":  # the draw of earlier builds: per_example runs are theirs
            g = torch.Generator().manual_seed(seed)
            self._fixed = torch.randint(len(refusals), (len(questions),), generator=g).tolist()
        self._enc: dict[tuple[int, int], Any] = {}

    def __len__(self) -> int:
        return len(self.questions)

    def choice(self, step: int) -> list[int]:
        """The refusal index of every question at `step`."""
        return self._fixed if self._fixed is not None else draw_refusals(len(self.questions), len(self.refusals),
                                                                          self.seed, step)

    def twin(self, i: int, k: int) -> Any:
        """Question i encoded with refusal k (cached)."""
        if (i, k) not in self._enc:
            self._enc[(i, k)] = self.encode(self.questions[i], self.refusals[k])
        return self._enc[(i, k)]

    def at(self, step: int) -> "_View":
        return _View(self, self.choice(step))

    def fingerprint_rows(self) -> list[Any]:
        """What decides the twins: per_example the run's encodings; per_access every refusal on question 0."""
        if self._fixed is not None:
            return [self.twin(i, k) for i, k in enumerate(self._fixed)]
        return [self.twin(0, k) for k in range(len(self.refusals))] if self.questions else []


class _View:
    def __init__(self, twins: RefusalTwins, choice: list[int]) -> None:
        self.twins, self.choice = twins, choice

    def __len__(self) -> int:
        return len(self.choice)

    def __getitem__(self, i: int) -> Any:
        return self.twins.twin(i, self.choice[i])
