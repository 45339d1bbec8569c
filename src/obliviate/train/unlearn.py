"""Unlearning and fine-tuning as compositions: encoded data + objective terms + the one loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from obliviate.config import MethodConfig, TrainConfig
from obliviate.data.pairing import batches, paired_batches, shard
from obliviate.data.rows import QARow, check_disjoint
from obliviate.data.tokenize import Encoded, collate, encode_qa, pad_id
from obliviate.modeling.frozen import FrozenModels
from obliviate.modeling.logprobs import TokenStats, forward_stats
from obliviate.objectives import FORGET, RETAIN, ObjectiveSpec
from obliviate.train.loop import TrainResult, make_accelerator, make_optimizer, run_loop, total_steps


@dataclass(frozen=True)
class ResolvedMethod:
    """A method with registry entries and validated hyper-parameters."""

    forget: ObjectiveSpec
    forget_kw: dict[str, Any]
    teacher_kw: dict[str, Any] | None
    retain: ObjectiveSpec | None
    retain_kw: dict[str, Any]
    gamma: float
    alpha: float

    @property
    def needs_frozen(self) -> bool:
        return bool(self.forget.needs) or bool(self.retain and self.retain.needs)


def resolve_method(m: MethodConfig) -> ResolvedMethod:
    """Look up objective and retain term by name and check their hyper-parameters (errors name valid keys)."""
    f = FORGET.get(m.forget)
    fkw, tkw = f.resolve(m.forget_args)
    r = RETAIN.get(m.retain) if m.retain else None
    rkw = r.resolve(m.retain_args)[0] if r else {}
    return ResolvedMethod(f, fkw, tkw if "teacher" in f.needs else None, r, rkw, m.gamma, m.alpha)


def encode_rows(tokenizer: Any, rows: Sequence[QARow], max_length: int) -> list[Encoded]:
    return [encode_qa(tokenizer, r.question, r.answer, max_length) for r in rows]


def _extra(spec: ObjectiveSpec, frozen: FrozenModels | None, batch: dict) -> dict[str, TokenStats]:
    out: dict[str, TokenStats] = {}
    if "teacher" in spec.needs:
        out["teacher"] = frozen.teacher_stats(batch)  # type: ignore[union-attr]
    if "reference" in spec.needs:
        out["reference"] = frozen.reference_stats(batch)  # type: ignore[union-attr]
    return out


def _shard_batch(enc: list[Encoded], idx: list[int], acc: Any, pad: int) -> tuple[dict, float]:
    """This rank's collated share of a global micro-batch and the factor making rank means global."""
    mine = shard(idx, acc.process_index, acc.num_processes)
    batch = {k: v.to(acc.device) for k, v in collate([enc[i] for i in mine], pad).items()}
    return batch, len(mine) * acc.num_processes / len(idx)


def unlearn(model: torch.nn.Module, tokenizer: Any, forget_rows: Sequence[QARow], retain_rows: Sequence[QARow],
            method: MethodConfig, train: TrainConfig, *, max_length: int = 256, accelerator: Any = None) -> TrainResult:
    """Minimise γ·L_F(forget) + α·L_R(retain) from the current weights (θ0) for the configured steps."""
    rm = resolve_method(method)
    if rm.retain is not None:
        check_disjoint(forget_rows, retain_rows)
    acc = accelerator or make_accelerator(train)
    fenc, renc = encode_rows(tokenizer, forget_rows, max_length), encode_rows(tokenizer, retain_rows, max_length)
    frozen = FrozenModels(model, rm.teacher_kw) if rm.needs_frozen else None
    if frozen is not None:
        frozen.model.to(acc.device)
    global_batch = train.batch_size * acc.num_processes
    steps = total_steps(len(fenc), global_batch, train)
    opt, sched = make_optimizer(model, train, steps)
    model, opt = acc.prepare(model, opt)
    pad = pad_id(tokenizer)
    plan = paired_batches(len(fenc), len(renc) if rm.retain else 0, global_batch, seed=train.seed)

    def compute(micro: tuple[list[int], list[int]]) -> dict[str, tuple[float, torch.Tensor]]:
        fb, fs = _shard_batch(fenc, micro[0], acc, pad)
        terms = {"forget": (rm.gamma, rm.forget.fn(forward_stats(model, fb), **_extra(rm.forget, frozen, fb), **rm.forget_kw) * fs)}
        if rm.retain is not None:
            rb, rs = _shard_batch(renc, micro[1], acc, pad)
            terms["retain"] = (rm.alpha, rm.retain.fn(forward_stats(model, rb), **_extra(rm.retain, frozen, rb), **rm.retain_kw) * rs)
        return terms

    return run_loop(model, plan, compute, train, steps, acc, opt, sched, desc=f"unlearn {method.forget}")


def finetune(model: torch.nn.Module, tokenizer: Any, rows: Sequence[QARow], train: TrainConfig, *,
             max_length: int = 256, accelerator: Any = None, desc: str = "finetune") -> TrainResult:
    """Supervised fine-tuning: minimise answer-token NLL (per-example mean) on `rows`."""
    acc = accelerator or make_accelerator(train)
    enc = encode_rows(tokenizer, rows, max_length)
    global_batch = train.batch_size * acc.num_processes
    steps = total_steps(len(enc), global_batch, train)
    opt, sched = make_optimizer(model, train, steps)
    model, opt = acc.prepare(model, opt)
    pad = pad_id(tokenizer)

    def compute(idx: list[int]) -> dict[str, tuple[float, torch.Tensor]]:
        b, s = _shard_batch(enc, idx, acc, pad)
        return {"nll": (1.0, forward_stats(model, b, keep_logits=False).nll.mean() * s)}

    return run_loop(model, batches(len(enc), global_batch, seed=train.seed), compute, train, steps, acc, opt, sched, desc=desc)
