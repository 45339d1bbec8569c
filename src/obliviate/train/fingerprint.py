"""A run's fingerprint: the resolved settings, starting weights and data that decide its trajectory.

Checkpoints record it; resuming under another fingerprint is a CheckpointMismatchError that lists every key
that differs (old -> new), so a leftover train.checkpoint_dir of another run is never resumed silently.
Left out, because they never change the numbers a run computes: progress, cpu (the device), fsdp (sharding
equals one process, tested), group_by_length, gradient_checkpointing, compile, compile_backend and share_prefix (same
math up to float reassociation, tested), checkpoint_dir, checkpoint_every, resume, the trackers (report_to, tracking_dir,
tracking_project, run_name), method.combine.module_stats (logging only) and method.refusals (its path: the
encoded refusals are hashed instead). epochs, max_steps and batch_size enter as what they resolve to: the
number of optimizer steps (the schedule's length) and the global batch (per-device batch x processes), so a
resumed run may use another process count with the same global batch.
"""
from __future__ import annotations

import dataclasses
import hashlib
from array import array
from typing import Any, Mapping, Sequence

import torch

IRRELEVANT_TRAIN = frozenset({"progress", "cpu", "fsdp", "checkpoint_dir", "checkpoint_every", "resume",
                              "epochs", "max_steps", "batch_size", "group_by_length", "gradient_checkpointing",
                              "compile", "compile_backend", "share_prefix", "report_to", "tracking_dir", "tracking_project",
                              "run_name"})
SAMPLE = 4096  # values hashed per weight tensor
ABSENT = "(absent)"


def encodings_sha256(encodings: Sequence[Any]) -> str:
    """SHA-256 of tokenised examples: each one's input ids and labels, length-prefixed."""
    h = hashlib.sha256()
    for e in encodings:
        h.update(array("q", [len(e.input_ids), len(e.labels)]).tobytes())
        h.update(array("q", e.input_ids).tobytes())
        h.update(array("q", e.labels).tobytes())
    return h.hexdigest()


def weights_sha256(model: torch.nn.Module) -> tuple[int, str]:
    """(number of values, SHA-256) of a model's weights: every tensor's name, shape and dtype and up to
    SAMPLE evenly spaced values of it (a few MB read even for a 7B model; two fine-tunes of one base differ
    in all of them). LoRA adapter tensors are left out: they start at random, not at θ0."""
    h, n = hashlib.sha256(), 0
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if "lora_" in name:
                continue
            n += t.numel()
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
            if t.device.type == "meta" or t.numel() == 0:
                continue
            flat = t.detach().reshape(-1)
            if flat.numel() > SAMPLE:
                flat = flat[:: flat.numel() // SAMPLE][:SAMPLE]
            h.update(flat.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return n, h.hexdigest()


def _plain(value: Any) -> Any:
    """A value checkpoints can store and compare: numbers, strings, None, lists of them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def flatten(prefix: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"prefix.a.b": 1}: one key per leaf, so differences name the leaf."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(flatten(f"{prefix}.{key}", value))
        else:
            out[f"{prefix}.{key}"] = _plain(value)
    return out


def fingerprint(task: str, train: Any, *, steps: int, global_batch: int, max_length: int, model: torch.nn.Module,
                tokenizer: Any, data: Mapping[str, Sequence[Any]], method: Mapping[str, Any] | None = None
                ) -> dict[str, Any]:
    """The flat dict a checkpoint records (see the module docstring for what is in it and what is not)."""
    fp: dict[str, Any] = {"task": task}
    if method is not None:
        fp.update(flatten("method", method))
    fp.update({f"train.{f.name}": _plain(getattr(train, f.name)) for f in dataclasses.fields(train)
               if f.name not in IRRELEVANT_TRAIN})
    fp.update({"train.steps": steps, "train.global_batch": global_batch, "data.max_length": max_length,
               "tokenizer.vocab_size": len(tokenizer)})
    n, digest = weights_sha256(model)
    fp.update({"model.values": n, "model.weights_sha256": digest})
    fp.update({f"data.{name}_sha256": encodings_sha256(enc) for name, enc in data.items()})
    return fp


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    return value if value is ABSENT else repr(value)


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """'key: old -> new' for every key whose value differs (or exists on one side only)."""
    keys = list(new) + [k for k in old if k not in new]
    return [f"{k}: {_show(old.get(k, ABSENT))} → {_show(new.get(k, ABSENT))}" for k in keys
            if old.get(k, ABSENT) != new.get(k, ABSENT)]
