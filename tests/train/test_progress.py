"""Progress without a terminal: plain, flushed log lines (first step, every ~5% or LOG_EVERY_S, last step)
instead of a live bar that shows nothing until the end; a terminal keeps the bar; progress=false prints nothing."""
import itertools
import re

import pytest
import torch

from obliviate.config import TrainConfig
from obliviate.train import loop
from obliviate.train.loop import LossPlan, make_accelerator, make_optimizer, run_loop

LINE = re.compile(r"^unlearn npo\+sago: step (\d+)/(\d+) \((\d+)%\) forget -?[\d.]+ retain [\d.]+ grad_norm [\d.]+ "
                  r"elapsed \d+s$")


@pytest.fixture(autouse=True)
def no_forced_terminal(monkeypatch):
    """capsys's stdout is not a TTY; keep an outer FORCE_COLOR / TTY_COMPATIBLE from saying otherwise."""
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(key, raising=False)


def _run(steps: int, progress: bool = True) -> None:
    """A 4-parameter model, `steps` optimizer steps of a forget and a retain part, through the real loop."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    cfg = TrainConfig(max_steps=steps, batch_size=1, lr=1e-2, progress=progress, weight_decay=0.0, scheduler="constant")
    acc = make_accelerator(cfg)
    opt, sched = make_optimizer(model, cfg, steps)
    model, opt = acc.prepare(model, opt)
    x = torch.ones(2, 3, device=acc.device)

    def compute(micro, part):
        out = model(x).mean()
        return 1.0, (-out if part == "forget" else out ** 2)

    plan = LossPlan(parts=("forget", "retain"), compute=compute)
    res = run_loop(model, itertools.repeat(None), plan, cfg, steps, acc, opt, sched, desc="unlearn npo+sago")
    assert res.steps == steps


def _lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]


@pytest.mark.parametrize("steps", [73, 40, 7, 1])
def test_not_a_terminal_prints_a_line_per_5_percent_with_first_and_last(steps, capsys):
    _run(steps)
    lines = _lines(capsys)
    assert lines and all(LINE.match(ln) for ln in lines), lines
    shown = [int(LINE.match(ln)[1]) for ln in lines]
    assert all(int(LINE.match(ln)[2]) == steps for ln in lines)
    assert shown[0] == 1 and shown[-1] == steps and shown == sorted(set(shown))
    # one line each time the run crosses a 5% mark, plus the first step: at most 21 lines, no gap over ~5%
    expected = sorted({1} | {s for s in range(1, steps + 1) if s * 20 // steps > (s - 1) * 20 // steps})
    assert shown == expected
    assert len(shown) <= 21 and max(b - a for a, b in zip([0] + shown, shown)) <= -(-steps // 20)
    assert [int(LINE.match(ln)[3]) for ln in lines] == [100 * s // steps for s in shown]


def test_73_steps_as_in_the_issue(capsys):
    _run(73)
    shown = [int(LINE.match(ln)[1]) for ln in _lines(capsys)]
    assert shown[:4] == [1, 4, 8, 11] and shown[-1] == 73 and len(shown) == 21
    # the issue's example line: step 12/73 would be 16%
    assert 100 * 12 // 73 == 16


def test_time_rule_logs_every_step_when_the_interval_has_passed(capsys, monkeypatch):
    monkeypatch.setattr(loop, "LOG_EVERY_S", 0.0)
    _run(30)
    assert [int(LINE.match(ln)[1]) for ln in _lines(capsys)] == list(range(1, 31))


def test_progress_false_prints_nothing(capsys):
    _run(12, progress=False)
    assert capsys.readouterr().out == ""


def test_a_terminal_keeps_the_rich_bar(monkeypatch):
    from rich.progress import Progress

    monkeypatch.setenv("TTY_COMPATIBLE", "0")  # even under `pytest -s` in a terminal
    assert isinstance(loop._progress(True, "x", 5), loop._LogLines)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich's switch for "this stdout is a terminal"
    assert isinstance(loop._progress(True, "x", 5), Progress)
    assert isinstance(loop._progress(False, "x", 5), Progress)  # disabled: rich's no-op


def test_clock():
    assert [loop._clock(s) for s in (0, 14.9, 65, 3725)] == ["0s", "14s", "1m05s", "1h02m"]
