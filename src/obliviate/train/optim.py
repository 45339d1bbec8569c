"""The optimizer and learning-rate schedule of every run: AdamW over the trainable parameters and a transformers
schedule (train/loop.py builds them for plain and data-parallel runs, train/fsdp.py again over the shards)."""
from __future__ import annotations

from typing import Any

import torch

from obliviate.config import TrainConfig


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
