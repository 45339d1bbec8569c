"""The one training loop (accelerate): micro-batches, accumulation, clipping, AdamW, schedule, logs.

A caller supplies `compute(micro) -> {name: (weight, loss)}`; the loop backpropagates the weighted
sum of the terms (one fused backward), accumulates over `grad_accum` micro-batches (no DDP sync
until the last), clips, steps and logs every term. Losses are already scaled by the caller so
that the average over ranks equals the loss on the whole global micro-batch.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import Tensor

from obliviate.config import TrainConfig

Terms = Mapping[str, tuple[float, Tensor]]


@dataclass
class TrainResult:
    """Per-step logs of a run: step, lr, grad_norm and every loss term (global means)."""

    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.history)


def make_accelerator(cfg: TrainConfig) -> Any:
    """An Accelerator honouring `cfg.cpu`; seeds every RNG from `cfg.seed`."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    acc = Accelerator(cpu=cfg.cpu)
    set_seed(cfg.seed)
    return acc


def total_steps(n_examples: int, global_batch: int, cfg: TrainConfig) -> int:
    """Optimizer steps: max_steps, or ceil(epochs · n / global batch) where global batch counts accumulation."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    return max(1, math.ceil(cfg.epochs * n_examples / (global_batch * cfg.grad_accum)))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, steps: int) -> tuple[Any, Any]:
    """AdamW over trainable parameters (no decay on biases/norms) and a transformers schedule."""
    from transformers import get_scheduler

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr)
    sched = get_scheduler(cfg.scheduler, opt, num_warmup_steps=int(cfg.warmup_ratio * steps), num_training_steps=steps)
    return opt, sched


def _progress(enabled: bool, desc: str, steps: int) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[terms]}"), disable=not enabled, transient=False)
    return prog


def run_loop(model: torch.nn.Module, micro_batches: Iterator[Any], compute: Callable[[Any], Terms],
             cfg: TrainConfig, steps: int, accelerator: Any, optimizer: Any, scheduler: Any,
             desc: str = "train") -> TrainResult:
    """Train for `steps` optimizer steps; returns the per-step history (see module docstring)."""
    result, start = TrainResult(), time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    with _progress(cfg.progress and accelerator.is_main_process, desc, steps) as prog:
        task = prog.add_task(desc, total=steps, terms="")
        for step in range(1, steps + 1):
            logs: dict[str, Tensor] = {}
            for k in range(cfg.grad_accum):
                sync = k == cfg.grad_accum - 1
                with (nullcontext() if sync else accelerator.no_sync(model)):
                    terms = compute(next(micro_batches))
                    loss = sum(w * t for w, t in terms.values()) / cfg.grad_accum
                    accelerator.backward(loss)
                for name, (_, t) in terms.items():
                    logs[name] = logs.get(name, 0.0) + t.detach() / cfg.grad_accum
                logs["loss"] = logs.get("loss", 0.0) + loss.detach()
            entry = _finish_step(accelerator, optimizer, scheduler, params, cfg, logs, step)
            result.history.append(entry)
            prog.update(task, advance=1, terms=" ".join(f"{k} {v:.3f}" for k, v in entry.items() if k not in ("step", "lr", "loss")))
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def _finish_step(accelerator: Any, optimizer: Any, scheduler: Any, params: list[Tensor], cfg: TrainConfig,
                 logs: dict[str, Tensor], step: int) -> dict[str, float]:
    """Clip, step, schedule, zero grads; return the step's logs averaged over ranks."""
    grad_norm = None
    if cfg.max_grad_norm is not None:
        grad_norm = accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    names = sorted(logs)
    vec = torch.stack([torch.as_tensor(logs[n], dtype=torch.float32, device=accelerator.device) for n in names])
    vec = accelerator.reduce(vec, reduction="mean") if accelerator.num_processes > 1 else vec
    entry = {"step": float(step), "lr": float(lr), **{n: float(v) for n, v in zip(names, vec.tolist())}}
    if grad_norm is not None:
        entry["grad_norm"] = float(grad_norm)
    return entry
