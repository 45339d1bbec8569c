"""A run whose forget loss barely moves says so (train/guard.py `stalled`): the rule on logged values, worked by
hand, and RMU at a learning rate too small to move its layer, which is what hid RMU's no-op on the TOFU-20 target."""
import copy

from obliviate.config import MethodConfig, TrainConfig
from obliviate.train.guard import loss_change, quarter_means, stalled
from obliviate.train.unlearn import unlearn


def _history(values):
    return [{"step": float(i + 1), "forget": v, "retain": 0.0} for i, v in enumerate(values)]


def test_the_first_and_last_quarters_means_are_compared():
    # 8 steps: quarters of 2; first mean 200, last mean 198.5: 0.75% < 1% -> noted, with both means and the fix
    note = stalled(_history([201, 199, 200, 200, 200, 200, 199, 198]), lr=2e-4)
    assert note is not None and "200 over its first quarter" in note and "198.5 over its last, 0.75%" in note
    assert "train.lr (now 0.0002)" in note
    # last mean 197.5: 1.25% -> moved enough, no note; the middle steps do not count
    assert stalled(_history([201, 199, 0, 0, 0, 0, 198, 197]), lr=2e-4) is None
    assert stalled(_history([201, 199, 0, 0, 0, 0, 199, 198]), lr=2e-4) is not None


def test_loss_change_is_the_relative_move_between_the_quarters_means():
    # 12 steps: quarters of 3; first mean (4 + 5 + 6) / 3 = 5, last mean (3 + 3 + 3) / 3 = 3: |3 - 5| / 5 = 0.4
    history = _history([4, 5, 6, 9, 9, 9, 9, 9, 9, 3, 3, 3])
    assert quarter_means(history) == (5.0, 3.0) and loss_change(history) == 0.4
    assert loss_change(_history([1.0] * 7)) is None and quarter_means(_history([1.0] * 7)) is None


def test_short_runs_missing_terms_and_a_loss_that_falls_are_not_noted():
    assert stalled(_history([5.0] * 7), lr=1e-3) is None  # fewer than 8 steps
    assert stalled(_history([5.0] * 8), lr=1e-3) is not None
    assert stalled(_history([5.0] * 8), lr=1e-3, term="nll") is None  # no such term
    assert stalled(_history([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0]), lr=1e-3) is None  # GA's falls
    # a negative term that stays put is noted too (relative to |first|)
    assert stalled(_history([-10.0] * 4 + [-10.05] * 4), lr=1e-3) is not None


def test_rmu_at_a_rate_that_cannot_move_its_layer_is_noted_and_one_that_can_is_not(small_world, small_tok, trained_small,
                                                                                     capsys):
    def run(lr):
        model = copy.deepcopy(trained_small)
        res = unlearn(model, small_tok, small_world.splits["forget10"], small_world.splits["retain90"],
                      MethodConfig(forget="rmu", forget_args={"layer": 1, "steering_coef": 20.0}, retain="hidden_mse",
                                   retain_args={"layer": 1}, alpha=1.0),
                      TrainConfig(max_steps=8, batch_size=4, lr=lr, progress=False, scheduler="constant"),
                      max_length=64)
        return res.stall, capsys.readouterr().out

    stall, out = run(1e-9)
    assert stall is not None and f"note: {stall}" in out and "train.lr (now 1e-09)" in stall
    stall, out = run(3e-2)
    assert stall is None and "barely moved" not in out
