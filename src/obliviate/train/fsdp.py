"""Fully sharded data parallel (torch FSDP2, `train.fsdp=true`): the student and the frozen θ0 copy are sharded
per decoder layer, then at the root, over every launched process; AdamW's state follows the shards.

Gradients are DTensor shards (dim 0 split across ranks, already averaged by FSDP's reduce-scatter). The gradient
rules run on the local shards (`local`); their scalar dot products and norms are partial sums that
`all_reduce_sums` completes, one all-reduce of a float64 vector per rule (gradients.py's `reduce`). When training
ends, `unshard` gathers every parameter in full back to the device the model came from and removes FSDP from the
modules, so the caller saves and evaluates a plain model on every rank, as after data-parallel training.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from obliviate.config import TrainConfig
from obliviate.modeling.logprobs import decoder_layers
from obliviate.train import optim
from obliviate.train.switches import apply_switches

_HOME = "_obliviate_fsdp_home"  # attribute on a sharded root: the device its parameters came from


def is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: Tensor | None) -> Tensor | None:
    """This rank's shard of a DTensor (the tensor itself otherwise)."""
    return t.to_local() if t is not None and is_dtensor(t) else t


def as_param_grad(p: Tensor, g: Tensor | None) -> Tensor | None:
    """A local gradient shard wrapped as a DTensor laid out like parameter `p` (plain tensors pass through)."""
    if g is None or not is_dtensor(p):
        return g
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(g, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())


def all_reduce_sums(sums: Tensor, device: torch.device | str = "cpu") -> Tensor:
    """Σ over ranks of a float64 vector of partial sums (one all-reduce on `device`, the process group's),
    returned on the CPU; the reducer of sharded gradient rules (gradients.py's `reduce`)."""
    import torch.distributed as dist

    out = sums.to(device, torch.float64, copy=True)
    dist.all_reduce(out)
    return out.cpu()


def collective_device() -> torch.device:
    """The device collectives of the default process group take tensors on (CUDA for NCCL, else the CPU)."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reducer(device: torch.device) -> Callable[[Tensor], Tensor]:
    """`all_reduce_sums` on the training device (NCCL needs CUDA tensors, gloo takes CPU ones)."""
    return partial(all_reduce_sums, device=device)


def _mesh(device: torch.device) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """fully_shard each decoder layer, then the root (in place; parameters become DTensor shards on `device`)."""
    from torch.distributed.fsdp import fully_shard

    home = next(model.parameters()).device
    mesh = _mesh(device)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    # the root (embeddings, final norm, LM head) stays gathered from its forward to its backward: vocabulary
    # chunks (train.vocab_chunk) apply the head to the captured hidden rows after the forward and again in the
    # backward's recompute, and its gradient is reduce-scattered once, when the backward ends
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    setattr(model, _HOME, home)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return hasattr(model, _HOME)


def unshard(model: torch.nn.Module) -> None:
    """Gather every parameter in full (collective: every rank calls it) onto the device the model came from
    (where it was loaded: the CPU for a model too large for one accelerator) and make the modules plain again
    (FSDP's hooks, state, registry and class removed), so it can be saved, evaluated or sharded again."""
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
    from torch.distributed._composable_state import _module_state_mapping
    from torch.distributed.fsdp import FSDPModule

    home = getattr(model, _HOME)
    gathered: dict[int, torch.nn.Parameter] = {}  # by the sharded parameter: tied weights stay one tensor
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and is_dtensor(p):
                if id(p) not in gathered:  # one tensor at a time: the device holds one in full
                    gathered[id(p)] = torch.nn.Parameter(p.detach().full_tensor().to(home), requires_grad=p.requires_grad)
                module._parameters[name] = gathered[id(p)]
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = _module_state_mapping.get(module)
        state = state() if state is not None else None
        if state is not None:
            for handle in {id(h): h for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)}.values():
                handle.remove()
            _module_state_mapping.pop(module, None)
        for key in (STATE_KEY, REGISTRY_KEY):
            module.__dict__.pop(key, None)
        for attr in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            module.__dict__.pop(attr, None)
        module.__class__ = next(c for c in type(module).__mro__[1:] if not issubclass(c, FSDPModule))
    for module in model.modules():  # managed submodules carry the dynamo flags too
        for attr in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            module.__dict__.pop(attr, None)
    model.to(home)  # the buffers FSDP moved to the device (the parameters are there already)
    delattr(model, _HOME)


def active(acc: Any, cfg: TrainConfig) -> bool:
    """train.fsdp with several processes (one process has nothing to shard over: it trains as without)."""
    return cfg.fsdp and acc.num_processes > 1


def prepare(acc: Any, model: torch.nn.Module, optimizer: Any, scheduler: Any, cfg: TrainConfig,
            sch: Any) -> tuple[torch.nn.Module, Any, Any]:
    """accelerate's data-parallel prepare, or with cfg.fsdp the student sharded and a fresh AdamW + schedule
    built over its shards (the optimizer given was built over the full parameters that sharding replaced).
    Gradient checkpointing and per-layer compilation (train/switches.py) are applied first."""

    apply_switches(model, cfg)
    if not active(acc, cfg):
        model, optimizer = acc.prepare(model, optimizer)
        return model, optimizer, scheduler

    optimizer.param_groups.clear()  # it holds the full parameters: let sharding free them (AdamW has no state yet)
    shard(model, acc.device)
    optimizer, scheduler = optim.make_optimizer(model, cfg, sch.steps, sch.warmup)  # sch: train.schedule.Schedule
    return model, optimizer, scheduler


def place_frozen(frozen: Any, acc: Any, cfg: TrainConfig, method: Any = None) -> None:
    """The frozen θ0 copy on the device, sharded like the student under cfg.fsdp (a LoRA student's θ0 is itself).

    A sharded θ0 forward is a collective (every rank gathers each layer), so ranks must run it in lockstep: with
    a θ0 cache the ranks agree before each frozen forward whether any of them misses (train/unlearn.py)."""
    if not active(acc, cfg):
        frozen.model.to(acc.device)
        return
    if not frozen.shared:
        shard(frozen.model, acc.device)
