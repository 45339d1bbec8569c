"""The one training loop (accelerate): micro-batches, accumulation, gradient rules, clipping,
AdamW, schedule, logs. What is optimised comes in a LossPlan (see its docstring)."""
from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import torch
from torch import Tensor

from obliviate.config import TrainConfig
from obliviate.errors import LaunchError
from obliviate.gradients import combine_into
from obliviate.progress import progress
from obliviate.train import fsdp
from obliviate.train.checkpoint import Checkpointer
from obliviate.train.fsdp import is_sharded, unshard
from obliviate.train.guard import DivergenceGuard, describe_checkpoint, stalled
from obliviate.train.switches import autocast
from obliviate.train.tracking import Tracking, accelerator_kwargs, tracked


@dataclass
class TrainResult:
    """Per-step logs of a run: step, lr, grad_norm and every loss term (global means)."""

    history: list[dict[str, float]] = field(default_factory=list)
    module_stats: list[dict[str, dict[str, float]]] = field(default_factory=list)
    seconds: float = 0.0
    stall: str | None = None  # the forget loss barely moved (train/guard.py `stalled`)

    @property
    def steps(self) -> int:
        return len(self.history)


WORLD_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")  # torchrun, MPI launchers


def launched_processes() -> int:
    """How many processes the launcher started (1 without torchrun / mpirun)."""
    for key in WORLD_ENV:
        if os.environ.get(key, "").strip().isdigit():
            return int(os.environ[key])
    return 1


def _device_backend() -> bool:
    """Whether accelerate would find a multi-process device backend (CUDA, XPU, NPU, ...), not just the CPU."""
    if torch.cuda.is_available():
        return True
    import accelerate.utils as au

    for name in ("is_npu_available", "is_mlu_available", "is_musa_available", "is_sdaa_available", "is_xpu_available"):
        check = getattr(au, name, None)
        try:
            if check is not None and check():
                return True
        except Exception:  # a probe that cannot run means no such device
            continue
    return False


def make_accelerator(cfg: TrainConfig, tracking: Tracking | None = None) -> Any:
    """An Accelerator honouring `cfg.cpu`, data-parallel whenever a launcher started several processes, with the
    run's trackers when `tracking` names some (train/tracking.py).

    accelerate only forms a CPU process group (gloo) when asked for cpu=True: under torchrun on a machine
    without a GPU, Accelerator(cpu=False) makes every process a lone rank 0 that duplicates the work and
    writes the output. So several launched processes and no device backend mean cpu=True. A launch that
    still does not form one group of all processes, or more processes per node than GPUs, is a LaunchError.
    Seeds every RNG from `cfg.seed`.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes"):
        raise LaunchError("this run was launched with DeepSpeed (accelerate launch --use_deepspeed), which obliviate "
                          "does not drive: DeepSpeed's engine owns the backward and the gradient buffers that the "
                          "forget/retain gradient rules need. Launch with torchrun and set train.fsdp=true to shard a "
                          "model that does not fit one device (or plain torchrun for data parallelism)")
    world = launched_processes()
    cpu = cfg.cpu or (world > 1 and not _device_backend())
    per_node = os.environ.get("LOCAL_WORLD_SIZE", "")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world > 1 and not cpu and gpus and per_node.isdigit() and int(per_node) > gpus:
        raise LaunchError(f"{per_node} processes per node were launched, but this machine has {gpus} GPU(s): launch "
                          f"at most {gpus} (torchrun --nproc_per_node {gpus}), or set train.cpu=true to train on CPUs")
    acc = Accelerator(cpu=cpu, **accelerator_kwargs(tracking))
    if world > 1 and acc.num_processes != world:  # e.g. a device backend accelerate cannot group
        raise LaunchError(f"{world} processes were launched, but accelerate formed a data-parallel group of "
                          f"{acc.num_processes} (distributed type {acc.distributed_type}): they would duplicate "
                          "the work and each write the output. Set train.cpu=true to train on CPUs, or launch one "
                          "process per GPU with torchrun")
    set_seed(cfg.seed)
    if cfg.deterministic:
        make_deterministic()
    return acc


def make_deterministic() -> None:
    """train.deterministic: torch's deterministic algorithms for every later op (a warning, not an error, where one
    has none) and cuBLAS's fixed workspace (read when its first handle is made); cudnn's autotuner off."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def end_process(rc: int) -> NoReturn:
    """Leave a multi-process run and exit with status `rc`: on success the ranks meet once more (gloo: a barrier
    that gives up after 60 s) and the process group is destroyed; then stdout and stderr are flushed and the
    process exits without the interpreter's finalisation (os._exit).

    Why not a plain exit: torch keeps the process group alive through references (the device mesh, FSDP's state),
    so gloo's worker threads and the work they hold can outlive `destroy_process_group` and be torn down while the
    interpreter finalises, which aborts the process now and then (SIGABRT, "terminate called without an active
    exception"), also after an interrupted run whose checkpoint is complete. Skipping finalisation skips that.
    After an error (rc != 0) the other ranks may be anywhere, so nothing waits for them. The `obliviate` command
    calls this itself under torchrun; a script that drives the library under torchrun may end with it."""
    import torch.distributed as dist

    if rc == 0 and dist.is_available() and dist.is_initialized():
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=60))
            dist.destroy_process_group()
        except Exception as exc:  # a rank that left early: say so, exit anyway
            print(f"obliviate: leaving the process group: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


@dataclass
class LossPlan:
    """What the loop optimises: named parts, each computed per micro-batch as (weight, loss).

    `compute(micro, part)` returns the part's weight and its loss, already scaled so that the mean
    over ranks is the loss on the whole global micro-batch. With rule "sum" and separate=False the
    weighted parts share one fused backward. Otherwise (the SAGO family, docs/METHODS.md §2) the parts
    "forget" and "retain" get their own backward, are accumulated in separate buffers (.grad and
    ONE extra copy), averaged across ranks, and combined once by `obliviate.gradients.combine_into`,
    which writes each combined tensor into .grad as it is produced (per-tensor rules: peak memory
    is .grad + one gradient copy + one tensor; global rules hold one more copy while combining).
    """

    parts: tuple[str, ...]
    compute: Callable[[Any, str], tuple[float, Tensor]]
    rule: Any = "sum"  # the rule's RuleSpec (or a registered name)
    separate: bool = False
    alpha: float = 1.0
    gamma: float = 1.0
    module_stats: bool = False
    rule_state: Any = None
    rule_params: dict[str, Any] = field(default_factory=dict)  # the rule's own settings, e.g. {"gru_gamma": 0.8}


def run_loop(model: torch.nn.Module, micro_batches: Iterator[Any], plan: LossPlan,
             cfg: TrainConfig, steps: int, accelerator: Any, optimizer: Any, scheduler: Any,
             desc: str = "train", fingerprint: Callable[[], dict[str, Any]] | None = None,
             monitor: Any = None, tracking: Tracking | None = None) -> TrainResult:
    """Train for `steps` optimizer steps; returns the per-step history (see module docstring).

    With cfg.checkpoint_dir, `fingerprint()` (what decides the trajectory, train/fingerprint.py; called
    before the first step, while the model is still θ0) is recorded in each checkpoint and checked on resume.
    A diverging step raises DivergenceError (train/guard.py) before the optimizer or a checkpoint sees it.
    With a `monitor` (train/monitor.py), its due steps evaluate the model; the values join that step's history
    entry as `eval_<metric>` (main process; a monitor under FSDP is refused before training). With `tracking`
    (train/tracking.py), every history entry also goes to the run's trackers at its step.
    """
    result, start = TrainResult(), time.perf_counter()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    ckpt = None
    if cfg.checkpoint_dir:
        ckpt = Checkpointer(Path(cfg.checkpoint_dir), cfg.checkpoint_every, cfg.resume,
                            fingerprint() if fingerprint is not None else None)
    guard = DivergenceGuard(cfg.lr, cfg.max_grad_norm)
    done = 0
    if ckpt is not None:
        done, result.history = ckpt.load(model, optimizer, scheduler, plan.rule_state, accelerator)
        for _ in range(done * cfg.grad_accum):  # the plan is seeded: skip what the saved steps used
            next(micro_batches)
    guard.start(result.history, params)
    plan = _autocast_plan(plan, cfg, accelerator)
    model.train()
    with tracked(accelerator, tracking, result.history) as track, \
            progress(cfg.progress and accelerator.is_main_process, desc, steps) as prog:
        task = prog.add_task(desc, total=steps, terms="", completed=done)
        for step in range(done + 1, steps + 1):
            t_step = time.perf_counter()
            if plan.separate:
                logs, extra = _separate_step(model, micro_batches, plan, cfg, accelerator, named)
            else:
                logs, extra = _fused_step(model, micro_batches, plan, cfg, accelerator), {}
            if ckpt is not None:
                guard.checkpoint = describe_checkpoint(ckpt.directory, ckpt.step)
            entry = _finish_step(accelerator, optimizer, scheduler, params, cfg, logs, step, guard)
            entry.update(extra.get("stats", {}))
            entry["step_seconds"] = time.perf_counter() - t_step
            if "modules" in extra:
                result.module_stats.append(extra["modules"])
            if monitor is not None and accelerator.is_main_process:
                seen = monitor.after_step(step, steps, accelerator.unwrap_model(model))
                entry.update({f"eval_{k}": v for k, v in (seen or {}).items() if k != "step"})
            result.history.append(entry)
            track(entry)
            shown = {k: v for k, v in entry.items() if k in plan.parts or k in ("grad_norm", "cos_f_r")}
            prog.update(task, advance=1, terms=" ".join(f"{k} {v:.3f}" for k, v in shown.items()))
            if ckpt is not None and ckpt.due(step, steps):
                ckpt.save(step, model, optimizer, scheduler, plan.rule_state, result.history, accelerator)
    result.seconds = time.perf_counter() - start
    result.stall = stalled(result.history, cfg.lr)
    if result.stall and accelerator.is_main_process:
        print(f"note: {result.stall}", flush=True)

    if is_sharded(model):  # the caller saves and evaluates a plain, full model (every rank gathers)
        unshard(model)
    model.eval()
    return result


def _autocast_plan(plan: LossPlan, cfg: TrainConfig, accelerator: Any) -> LossPlan:
    """The plan with its forward passes and losses under train.precision's autocast (backward outside it)."""
    import dataclasses

    if getattr(cfg, "precision", "fp32") == "fp32":
        return plan
    inner = plan.compute

    def compute(micro: Any, part: str) -> tuple[float, Tensor]:
        with autocast(cfg.precision, accelerator.device):
            return inner(micro, part)

    return dataclasses.replace(plan, compute=compute)


def _fused_step(model: torch.nn.Module, micro_batches: Iterator[Any], plan: LossPlan, cfg: TrainConfig,
                accelerator: Any) -> dict[str, Tensor]:
    """Accumulate one fused backward of Σ weight·loss per micro-batch (DDP syncs on the last; FSDP
    reduce-scatters every backward into the sharded .grad)."""

    logs: dict[str, Tensor] = {}
    for k in range(cfg.grad_accum):
        sync = k == cfg.grad_accum - 1 or is_sharded(model)
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
    """Forget and retain backward separately, accumulate, all-reduce, combine into .grad (SAGO family).

    Under FSDP each backward reduce-scatters (averages) into the sharded .grad of whichever buffer is swapped
    in, and the rule combines the local shards, summing its scalars over ranks (fsdp.all_reduce_sums)."""

    sharded = fsdp.is_sharded(model)
    params = [p for _, p in named]
    forget_buf: list[Tensor | None] = [None] * len(params)
    logs: dict[str, Tensor] = {}
    for _ in range(cfg.grad_accum):
        micro = next(micro_batches)
        # DDP: ranks are averaged once below, for both buffers; FSDP must reduce-scatter each backward
        with (nullcontext() if sharded else accelerator.no_sync(model)):
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
    if sharded:  # already averaged by the reduce-scatter; the rule works on this rank's shards
        g_f, g_r = [fsdp.local(g) for g in g_f], [fsdp.local(g) for g in g_r]
    elif accelerator.num_processes > 1:
        _all_reduce_mean(g_f + g_r, accelerator.num_processes)
    names = [n for n, _ in named] if plan.module_stats else None
    for p in params:  # g_r now lives only in the list, so each .grad can be replaced as it is combined
        p.grad = None

    def write(i: int, g: Tensor | None) -> None:
        params[i].grad = fsdp.as_param_grad(params[i], g) if sharded else g

    stats = combine_into(plan.rule, g_f, g_r, write, alpha=plan.alpha, gamma=plan.gamma, state=plan.rule_state,
                         per_module_names=names, reduce=fsdp.reducer(accelerator.device) if sharded else None,
                         params=plan.rule_params)
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
                 logs: dict[str, Tensor], step: int, guard: DivergenceGuard) -> dict[str, float]:
    """Average the logs over ranks, clip (or measure) the gradient norm, check both, step, check the weights,
    schedule, zero grads; return the step's logs."""
    from torch.nn.utils import get_total_norm

    if cfg.max_grad_norm is not None:
        grad_norm = accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
    else:  # ranks hold the same averaged gradients (or DTensor shards), so every rank measures the same norm
        grad_norm = get_total_norm([p.grad for p in params if p.grad is not None])
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP: the norm over all shards
        grad_norm = grad_norm.full_tensor()
    lr = scheduler.get_last_lr()[0]
    names = sorted(logs)
    wide = torch.float32 if accelerator.device.type == "mps" else torch.float64  # MPS has no float64
    vec = torch.stack([torch.as_tensor(logs[n], dtype=wide, device=accelerator.device) for n in names])
    vec = accelerator.reduce(vec, reduction="mean") if accelerator.num_processes > 1 else vec
    entry = {"step": float(step), "lr": float(lr), **{n: float(v) for n, v in zip(names, vec.tolist())}}
    entry["grad_norm"] = float(grad_norm)
    guard.check_step(step, entry)  # raises before the optimizer sees a non-finite gradient
    optimizer.step()
    guard.check_weights(step, params)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return entry
