"""The fields of a QA row and a data set's own column names for them (`data.fields`).

Room: floor 1; imports only the standard library, so both config (to check a mapping) and data (to apply it) use it.
"""
from __future__ import annotations

from typing import Any, Mapping

FIELDS = ("question", "answer", "paraphrased_answer", "perturbed_answer", "paraphrased_question", "option1", "option2",
          "option3", "option4", "fact_spans", "name_spans", "author")
Fields = Mapping[str, str]


def check_fields(fields: Any, key: str = "data.fields") -> dict[str, str]:
    """A validated column mapping {obliviate field: the data's column}; ValueError naming the bad entry."""
    if not isinstance(fields, Mapping):
        raise ValueError(f"{key} must be a mapping of field to column, e.g. {{question: prompt, answer: response}}")
    for ours, theirs in fields.items():
        if ours not in FIELDS:
            raise ValueError(f"{key}: unknown field {ours!r}; fields: {', '.join(FIELDS)}")
        if not isinstance(theirs, str) or not theirs:
            raise ValueError(f"{key}.{ours} must name a column (a non-empty string), got {theirs!r}")
    return dict(fields)
