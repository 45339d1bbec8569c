"""Evaluation during training: due steps, the curve, the best weights kept, NaN never best, a stop rule."""
from __future__ import annotations

import math

import pytest
import torch

from obliviate.errors import ObliviateError
from obliviate.train.monitor import Monitor, StopRun


def _net(value: float) -> torch.nn.Linear:
    net = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        net.weight.fill_(value)
    return net


def test_due_steps_are_every_n_and_the_last():
    m = Monitor(3, lambda model: {})
    assert [s for s in range(1, 11) if m.due(s, 10)] == [3, 6, 9, 10]


def test_the_best_weights_by_score_are_restored_and_nan_is_never_best():
    scores = {2: 0.5, 4: 0.9, 6: math.nan, 8: 0.7}  # step -> score read off the weight (= the step here)
    m = Monitor(2, lambda model: {"acc": scores[int(model.weight.item())]}, score=lambda x: x["acc"], keep_best=True)
    net = _net(0.0)
    for step in range(1, 9):
        with torch.no_grad():
            net.weight.fill_(float(step))  # "training" sets the weight to the step number
        m.after_step(step, 8, net)
    assert [c["step"] for c in m.curve] == [2, 4, 6, 8] and m.curve[1]["score"] == 0.9
    assert m.best_step == 4 and m.restore_best(net) == 4 and net.weight.item() == 4.0
    low = Monitor(2, lambda model: {"acc": scores[int(model.weight.item())]}, score=lambda x: x["acc"],
                  maximize=False, keep_best=True)
    for step in range(1, 9):
        with torch.no_grad():
            net.weight.fill_(float(step))
        low.after_step(step, 8, net)
    assert low.best_step == 2 and low.restore_best(net) == 2 and net.weight.item() == 2.0


def test_evaluation_runs_in_eval_mode_without_gradients_and_restores_training_mode():
    seen = []
    net = _net(1.0).train()
    m = Monitor(1, lambda model: seen.append((model.training, torch.is_grad_enabled())) or {"x": 1.0})
    m.after_step(1, 1, net)
    assert seen == [(False, False)] and net.training


def test_a_stop_rule_ends_the_run_with_its_curve():
    def stop(step, entry, curve):
        if entry["acc"] < 0.5:
            raise StopRun(f"pruned at step {step}", curve)

    m = Monitor(1, lambda model: {"acc": 1.0 - 0.3 * model.weight.item()}, stop=stop)
    net = _net(0.0)
    m.after_step(1, 5, net)
    with torch.no_grad():
        net.weight.fill_(2.0)
    with pytest.raises(StopRun, match="pruned at step 2") as err:
        m.after_step(2, 5, net)
    assert [c["step"] for c in err.value.curve] == [1, 2]


def test_a_monitor_without_a_score_cannot_keep_the_best():
    with pytest.raises(ObliviateError, match="needs a score"):
        Monitor(2, lambda model: {}, keep_best=True)
    with pytest.raises(ObliviateError, match="every_steps must be an int >= 1"):
        Monitor(0, lambda model: {})
