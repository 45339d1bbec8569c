"""Refusal answers for IDK-style objectives: the shipped TOFU list or the user's file, seeded per example."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

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


def assign_refusals(n: int, refusals: list[str], seed: int) -> list[str]:
    """A refusal for each of `n` examples, drawn with a seeded generator (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return [refusals[i] for i in torch.randint(len(refusals), (n,), generator=g).tolist()]
