"""Which positions of a batch a loss counts (docs/METHODS.md §8): the answer tokens by default, or every real token,
every padded position of the batch, or every position up to max_length, as ME's, UNDIAL's and KL's reference code
count them. A batch in, the same batch relabelled out; the log-probs are then taken by modeling/logprobs.py."""
from __future__ import annotations

from typing import Any, Mapping

import torch.nn.functional as F
from torch import Tensor

from obliviate.errors import ConfigError
from obliviate.modeling.logprobs import IGNORE_INDEX


def every_token_labels(batch: Mapping[str, Any]) -> Tensor:
    """[B, T] labels counting every real token (prompt included, padding not): a sequence-level loss."""
    return batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)


POSITIONS = ("answer", "sequence", "batch", "max_length")


def pad_to(batch: Mapping[str, Any], width: int, pad: int) -> dict[str, Any]:
    """A right-padded [B, T] batch widened to [B, width] (pad ids, attention 0, labels -100); width >= T."""
    extra = width - batch["input_ids"].shape[1]
    if extra < 0:
        raise ValueError(f"cannot pad a batch of width {batch['input_ids'].shape[1]} to {width}")
    fill = {"input_ids": pad, "attention_mask": 0, "labels": IGNORE_INDEX}
    return {k: F.pad(v, (0, extra), value=fill[k]) if k in fill else v for k, v in batch.items()}


def position_labels(batch: Mapping[str, Any], positions: str, *, pad: int, vocab_size: int, max_length: int,
                    last: bool = False) -> dict[str, Any]:
    """The batch relabelled so that every position `positions` names counts (docs/METHODS.md §8); [B, T] -> [B, T'].

    "sequence": every real token (prompt included, padding not). "batch": every position of the batch as padded
    to its longest row, prompt and padding included; "max_length": the same with every row padded to
    `max_length` (closer-look pads so). Where the labels said -100 the target becomes vocab_size − 100 (the id a
    −100 label indexes in the reference code's one-hot); `last` also counts the last position of each row
    (a KL over every logit, as open-unlearning's kl_div on the flattened logits), by padding one column more.
    """
    if positions == "answer":
        return dict(batch)
    if positions == "sequence":
        return {**batch, "labels": every_token_labels(batch)}
    if positions not in POSITIONS:
        raise ConfigError(f"positions must be one of {list(POSITIONS)}, got {positions!r}")
    width = max(max_length, batch["input_ids"].shape[1]) if positions == "max_length" else batch["input_ids"].shape[1]
    out = pad_to(batch, width + (1 if last else 0), pad)
    labels = out["labels"]
    out["labels"] = labels.masked_fill(labels == IGNORE_INDEX, IGNORE_INDEX % vocab_size)
    return out
