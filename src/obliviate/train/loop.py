"""The one training loop (accelerate): micro-batches, accumulation, gradient rules, clipping,
AdamW, schedule, logs. What is optimised comes in a LossPlan (see its docstring)."""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from obliviate.config import TrainConfig
from obliviate.train.checkpoint import Checkpointer

@dataclass
class TrainResult:
    """Per-step logs of a run: step, lr, grad_norm and every loss term (global means)."""

    history: list[dict[str, float]] = field(default_factory=list)
    module_stats: list[dict[str, dict[str, float]]] = field(default_factory=list)
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


@dataclass
class LossPlan:
    """What the loop optimises: named parts, each computed per micro-batch as (weight, loss).

    `compute(micro, part)` returns the part's weight and its loss, already scaled so that the mean
    over ranks is the loss on the whole global micro-batch. With rule "sum" and separate=False the
    weighted parts share one fused backward. Otherwise (the SAGO family, METHODS.md §2) the parts
    "forget" and "retain" get their own backward, are accumulated in separate buffers (.grad and
    ONE extra copy), averaged across ranks, and combined once by `obliviate.synthesis.combine_into`,
    which writes each combined tensor into .grad as it is produced (per-tensor rules: peak memory
    is .grad + one gradient copy + one tensor; global rules hold one more copy while combining).
    """

    parts: tuple[str, ...]
    compute: Callable[[Any, str], tuple[float, Tensor]]
    rule: str = "sum"
    separate: bool = False
    alpha: float = 1.0
    gamma: float = 1.0
    module_stats: bool = False
    rule_state: Any = None


def run_loop(model: torch.nn.Module, micro_batches: Iterator[Any], plan: LossPlan,
             cfg: TrainConfig, steps: int, accelerator: Any, optimizer: Any, scheduler: Any,
             desc: str = "train") -> TrainResult:
    """Train for `steps` optimizer steps; returns the per-step history (see module docstring)."""
    result, start = TrainResult(), time.perf_counter()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    ckpt = Checkpointer(Path(cfg.checkpoint_dir), cfg.checkpoint_every) if cfg.checkpoint_dir else None
    done = 0
    if ckpt is not None:
        done, result.history = ckpt.load(model, optimizer, scheduler, plan.rule_state, accelerator)
        for _ in range(done * cfg.grad_accum):  # the plan is seeded: skip what the saved steps used
            next(micro_batches)
    model.train()
    with _progress(cfg.progress and accelerator.is_main_process, desc, steps) as prog:
        task = prog.add_task(desc, total=steps, terms="", completed=done)
        for step in range(done + 1, steps + 1):
            t_step = time.perf_counter()
            if plan.separate:
                logs, extra = _separate_step(model, micro_batches, plan, cfg, accelerator, named)
            else:
                logs, extra = _fused_step(model, micro_batches, plan, cfg, accelerator), {}
            entry = _finish_step(accelerator, optimizer, scheduler, params, cfg, logs, step)
            entry.update(extra.get("stats", {}))
            entry["step_seconds"] = time.perf_counter() - t_step
            if "modules" in extra:
                result.module_stats.append(extra["modules"])
            result.history.append(entry)
            shown = {k: v for k, v in entry.items() if k in plan.parts or k in ("grad_norm", "cos_f_r")}
            prog.update(task, advance=1, terms=" ".join(f"{k} {v:.3f}" for k, v in shown.items()))
            if ckpt is not None and ckpt.due(step, steps):
                ckpt.save(step, model, optimizer, scheduler, plan.rule_state, result.history, accelerator)
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def _fused_step(model: torch.nn.Module, micro_batches: Iterator[Any], plan: LossPlan, cfg: TrainConfig,
                accelerator: Any) -> dict[str, Tensor]:
    """Accumulate one fused backward of Σ weight·loss per micro-batch (DDP syncs on the last)."""
    logs: dict[str, Tensor] = {}
    for k in range(cfg.grad_accum):
        sync = k == cfg.grad_accum - 1
        with (nullcontext() if sync else accelerator.no_sync(model)):
            micro = next(micro_batches)
            terms = {part: plan.compute(micro, part) for part in plan.parts}
            loss = sum(w * t for w, t in terms.values()) / cfg.grad_accum
            accelerator.backward(loss)
        for name, (_, t) in terms.items():
            logs[name] = logs.get(name, 0.0) + t.detach() / cfg.grad_accum
        logs["loss"] = logs.get("loss", 0.0) + loss.detach()
    return logs


def _swap(params: list[Tensor], buffer: list[Tensor | None]) -> None:
    """Exchange each parameter's .grad with its slot in `buffer` (pointer swap, no copy)."""
    for i, p in enumerate(params):
        p.grad, buffer[i] = buffer[i], p.grad


def _separate_step(model: torch.nn.Module, micro_batches: Iterator[Any], plan: LossPlan, cfg: TrainConfig,
                   accelerator: Any, named: list[tuple[str, Tensor]]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Forget and retain backward separately, accumulate, all-reduce, combine into .grad (SAGO family)."""
    from obliviate.synthesis import combine_into

    params = [p for _, p in named]
    forget_buf: list[Tensor | None] = [None] * len(params)
    logs: dict[str, Tensor] = {}
    for _ in range(cfg.grad_accum):
        micro = next(micro_batches)
        with accelerator.no_sync(model):  # ranks are averaged once below, for both buffers
            _swap(params, forget_buf)
            _, lf = plan.compute(micro, "forget")
            accelerator.backward(lf / cfg.grad_accum)
            _swap(params, forget_buf)
            _, lr_ = plan.compute(micro, "retain")
            accelerator.backward(lr_ / cfg.grad_accum)
        logs["forget"] = logs.get("forget", 0.0) + lf.detach() / cfg.grad_accum
        logs["retain"] = logs.get("retain", 0.0) + lr_.detach() / cfg.grad_accum
    logs["loss"] = plan.gamma * logs["forget"] + plan.alpha * logs["retain"]
    g_f, g_r = forget_buf, [p.grad for p in params]
    if accelerator.num_processes > 1:
        _all_reduce_mean(g_f + g_r, accelerator.num_processes)
    names = [n for n, _ in named] if plan.module_stats else None
    for p in params:  # g_r now lives only in the list, so each .grad can be replaced as it is combined
        p.grad = None

    def write(i: int, g: Tensor | None) -> None:
        params[i].grad = g

    stats = combine_into(plan.rule, g_f, g_r, write, alpha=plan.alpha, gamma=plan.gamma,
                         state=plan.rule_state, per_module_names=names)
    extra = {"stats": {k: float(v) for k, v in stats.items() if k != "modules"}}
    if "modules" in stats:
        extra["modules"] = stats["modules"]
    return logs, extra


def _all_reduce_mean(grads: list[Tensor | None], world: int) -> None:
    """Average gradients over data-parallel ranks in one flat all-reduce (None entries stay None)."""
    import torch.distributed as dist

    present = [g for g in grads if g is not None]
    flat = torch.cat([g.reshape(-1) for g in present])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in present:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


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
    wide = torch.float32 if accelerator.device.type == "mps" else torch.float64  # MPS has no float64
    vec = torch.stack([torch.as_tensor(logs[n], dtype=wide, device=accelerator.device) for n in names])
    vec = accelerator.reduce(vec, reduction="mean") if accelerator.num_processes > 1 else vec
    entry = {"step": float(step), "lr": float(lr), **{n: float(v) for n, v in zip(names, vec.tolist())}}
    if grad_norm is not None:
        entry["grad_norm"] = float(grad_norm)
    return entry
