"""The optimizer and learning-rate schedule of every run: AdamW over the trainable parameters and a transformers
schedule (train/loop.py builds them for plain and data-parallel runs, train/fsdp.py again over the shards)."""
from __future__ import annotations

from typing import Any

import torch

from obliviate.config import TrainConfig
from obliviate.errors import ConfigError
from obliviate.modeling.load import require_bitsandbytes

BNB_OPTIMIZERS = {"adamw_8bit": "AdamW8bit", "paged_adamw": "PagedAdamW", "paged_adamw_8bit": "PagedAdamW8bit"}


def optimizer_class(name: str) -> Any:
    """train.optimizer -> its class: torch's AdamW, or bitsandbytes' (checked: installed, CUDA present)."""
    if name == "adamw":
        return torch.optim.AdamW
    if name not in BNB_OPTIMIZERS:
        raise ConfigError(f"train.optimizer={name!r} is unknown; valid: adamw, {', '.join(BNB_OPTIMIZERS)}")

    require_bitsandbytes(f"train.optimizer={name}", "use train.optimizer=adamw")
    import bitsandbytes

    return getattr(bitsandbytes.optim, BNB_OPTIMIZERS[name])


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, steps: int, warmup: int) -> tuple[Any, Any]:
    """AdamW (train.optimizer: torch's or bitsandbytes' 8-bit / paged one) over trainable parameters (no decay on
    biases/norms) and a transformers schedule of `steps` steps, the first `warmup` of them warming up
    (train/schedule.py)."""
    from transformers import get_scheduler

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = optimizer_class(cfg.optimizer)(groups, lr=cfg.lr)
    sched = get_scheduler(cfg.scheduler, opt, num_warmup_steps=warmup, num_training_steps=steps)
    return opt, sched
