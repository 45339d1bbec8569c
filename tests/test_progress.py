"""Progress without a terminal: plain, flushed log lines (first step, every ~5% or LOG_EVERY_S, last step)
instead of a live bar that shows nothing until the end; a terminal keeps the bar; progress=false prints nothing.
Phases (probe, calibration, evaluation, audit) print the same lines once they have run QUIET_FOR_S seconds."""
import itertools
import re

import pytest
import torch

from obliviate import progress as P
from obliviate.config import TrainConfig
from obliviate.train.loop import LossPlan, make_accelerator, run_loop
from obliviate.train.optim import make_optimizer

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
    opt, sched = make_optimizer(model, cfg, steps, 0)
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
    monkeypatch.setattr(P, "LOG_EVERY_S", 0.0)
    _run(30)
    assert [int(LINE.match(ln)[1]) for ln in _lines(capsys)] == list(range(1, 31))


def test_progress_false_prints_nothing(capsys):
    _run(12, progress=False)
    assert capsys.readouterr().out == ""


def test_a_terminal_keeps_the_rich_bar(monkeypatch):
    from rich.progress import Progress

    monkeypatch.setenv("TTY_COMPATIBLE", "0")  # even under `pytest -s` in a terminal
    assert isinstance(P.progress(True, "x", 5), P.LogLines)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich's switch for "this stdout is a terminal"
    assert isinstance(P.progress(True, "x", 5), Progress)
    assert isinstance(P.progress(False, "x", 5), Progress)  # disabled: rich's no-op


def test_clock():
    assert [P.clock(s) for s in (0, 14.9, 65, 3725)] == ["0s", "14s", "1m05s", "1h02m"]


def _clock_at(monkeypatch, times):
    """time.perf_counter in the progress module returns the given times, one per call."""
    it = iter(times)
    monkeypatch.setattr(P.time, "perf_counter", lambda: next(it))


def test_a_short_phase_prints_nothing_in_a_log(capsys, monkeypatch):
    _clock_at(monkeypatch, [0.0, 0.0] + [9.9] * 5)  # start (twice: init, add_task), then 5 updates within 10 s
    assert list(P.track(range(5), "probe")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().out == ""


def test_a_long_phase_prints_lines_after_the_quiet_time(capsys, monkeypatch):
    # 40 units: updates at 1 s ... 40 s; quiet for 10 s, then the first line, every 5% mark, and the last
    _clock_at(monkeypatch, [0.0, 0.0] + [float(t) for t in range(1, 41)])
    with P.phase("probe", 40) as advance:
        for _ in range(40):
            advance(1)
    lines = capsys.readouterr().out.splitlines()
    done = [int(re.match(r"^probe: (\d+)/40 \(\d+%\) elapsed \d+s$", ln)[1]) for ln in lines]
    assert done == [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40]
    assert lines[0] == "probe: 10/40 (25%) elapsed 10s" and lines[-1] == "probe: 40/40 (100%) elapsed 40s"


def test_a_phase_on_a_terminal_is_a_transient_bar(monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert P.on_terminal()
    assert list(P.track(["a", "b"], "calibrate")) == ["a", "b"]


def test_phases_nest_on_a_terminal(monkeypatch):
    """The audit's attacks (a phase) run generation phases and a relearning loop with its own bar inside."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    seen = []
    for outer in P.track([1, 2], "audit"):
        for inner in P.track([1, 2, 3], "generating"):
            seen.append((outer, inner))
        with P.progress(True, "relearn", 2) as prog:
            task = prog.add_task("relearn", total=2, terms="")
            prog.update(task, advance=2, terms="")
    assert len(seen) == 6
