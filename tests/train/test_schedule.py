"""The schedule's length (train/loop.schedule): steps from epochs, warm-up from a ratio or from epochs (the ASU
authors' forget.py: warmup_steps = one epoch's steps = rows // global batch), and the optimizer's schedule."""
from __future__ import annotations

import pytest
import torch

from obliviate.config import RunConfig, TrainConfig, load_config
from obliviate.errors import ConfigError
from obliviate.train.optim import make_optimizer
from obliviate.train.schedule import Schedule, schedule


@pytest.mark.parametrize("rows, expected, half", [(40, Schedule(7, 1), 0), (200, Schedule(32, 6), 3),
                                                   (400, Schedule(63, 12), 6)])
def test_warmup_epochs_count_one_epochs_steps_of_the_global_batch(rows: int, expected: Schedule, half: int) -> None:
    """TOFU forget01/05/10 at batch 4 x 2 processes x accumulation 4 = 32: ceil(5 N / 32) steps and floor(N / 32)
    warm-up steps (by hand: 200/32 = 6.25 -> 7 and 1; 1000/32 = 31.25 -> 32 and 6; 2000/32 = 62.5 -> 63 and 12;
    half an epoch: 20/32, 100/32, 200/32 -> 0, 3, 6)."""
    cfg = TrainConfig(epochs=5, batch_size=4, grad_accum=4, warmup_epochs=1)
    assert schedule(rows, 8, cfg) == expected
    assert schedule(rows, 8, TrainConfig(epochs=5, batch_size=4, grad_accum=4, warmup_epochs=0.5)).warmup == half
    assert schedule(rows, 8, TrainConfig(epochs=5, batch_size=4, grad_accum=4, warmup_ratio=0.1)).warmup == \
        int(0.1 * expected.steps)


def test_a_warmup_that_outlasts_the_run_is_refused() -> None:
    with pytest.raises(ConfigError, match="train.warmup_epochs=1 gives 6 warm-up steps .* the run has 5 steps"):
        schedule(200, 8, TrainConfig(max_steps=5, batch_size=4, grad_accum=4, warmup_epochs=1))
    with pytest.raises(ConfigError, match="gives 6 warm-up steps .* the run has 6 steps"):  # never leaves warm-up
        schedule(200, 8, TrainConfig(max_steps=6, batch_size=4, grad_accum=4, warmup_epochs=1))
    assert schedule(200, 8, TrainConfig(max_steps=7, batch_size=4, grad_accum=4, warmup_epochs=1)) == Schedule(7, 6)
    assert schedule(200, 8, TrainConfig(max_steps=1, batch_size=4, grad_accum=4, warmup_epochs=0)) == Schedule(1, 0)
    for overrides, match in [(["train.warmup_epochs=5", "train.epochs=5"], "below train.epochs"),
                             (["train.warmup_epochs=1", "train.warmup_ratio=0.1"], "train.warmup_ratio"),
                             (["train.warmup_epochs=-1"], ">= 0 or null")]:
        with pytest.raises(ConfigError, match=match):
            load_config(RunConfig, None, overrides=overrides)


def test_the_optimizer_warms_up_for_the_given_steps_then_decays_linearly() -> None:
    """transformers' linear schedule: lr · k / warmup while warming up, then lr · (steps − k) / (steps − warmup)."""
    model = torch.nn.Linear(2, 1)
    opt, sched = make_optimizer(model, TrainConfig(lr=1.0, scheduler="linear"), 6, 2)
    seen = []
    for _ in range(6):
        seen.append(round(opt.param_groups[0]["lr"], 6))
        opt.step()
        sched.step()
    assert seen == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
