"""Selection and verdict on different rows: the held-out cut and the parts of an evaluation, by hand."""
from __future__ import annotations

import pytest

from obliviate.errors import ConfigError
from obliviate.eval.heldout import part, report_ids


def test_the_cut_holds_out_a_share_of_each_group_and_depends_only_on_ids_share_and_seed():
    groups = {"forget": [f"f{i}" for i in range(4)], "retain": [f"r{i}" for i in range(5)], "one": ["x"],
              "two": ["a", "b"]}
    held = report_ids(groups, 0.5, seed=0)
    assert len(held & set(groups["forget"])) == 2 and len(held & set(groups["retain"])) == 2  # round(2.5) = 2
    assert "x" not in held and len(held & {"a", "b"}) == 1  # a group of one is never held out; of two, one
    assert report_ids(dict(reversed(list(groups.items()))), 0.5, seed=0) == held  # order does not matter
    assert report_ids(groups, 0.5, seed=1) != held  # another seed, another cut
    tiny = report_ids({"g": [f"g{i}" for i in range(5)]}, 0.01)
    assert len(tiny) == 1  # at least one row of a group of two or more
    assert len(report_ids({"g": [f"g{i}" for i in range(5)]}, 0.99)) == 4  # at most n − 1


@pytest.mark.parametrize("share", [0, 1, 0.0, 1.0, -0.5, True])
def test_a_share_of_zero_or_one_is_refused(share):
    with pytest.raises(ConfigError, match="heldout_share .* must lie strictly between 0 and 1"):
        report_ids({"g": ["a", "b"]}, share)


EVALUATION = {
    "forget_accuracy": 0.5, "forget_mcq_accuracy": 0.75, "forget_score": 0.666, "forget_mcq_n": 4,
    "generations": {"forget": ["..."]},
    "rows": {"forget_accuracy": [1.0, 0.0, 1.0, 0.0], "forget_mcq_accuracy": [1.0, 1.0, 0.0, 1.0]},
    "row_ids": {"forget_accuracy": ["a", "b", "c", "d"], "forget_mcq_accuracy": ["a", "b", "c", "d"]},
}


def test_each_part_recomputes_its_means_and_the_forget_score():
    """Held out {b, c}: selection reads a, d (accuracy 0.5, MCQ 1.0 -> forget_score max(0.5, 1.0) = 1.0); the
    report b, c (accuracy 0.5, MCQ 0.5 -> max(0.5, (0.5 - 0.25) / 0.75) = 0.5)."""
    select, rows = part(EVALUATION, {"b", "c"}, report=False)
    assert (select["forget_accuracy"], select["forget_mcq_accuracy"], select["forget_score"]) == (0.5, 1.0, 1.0)
    assert rows == {"forget_accuracy": [1.0, 0.0], "forget_mcq_accuracy": [1.0, 1.0]}
    report, _ = part(EVALUATION, {"b", "c"}, report=True)
    assert (report["forget_accuracy"], report["forget_mcq_accuracy"], report["forget_score"]) == (0.5, 0.5, 0.5)
    assert select["forget_mcq_n"] == 4 and "generations" not in select  # counts stay, texts go


def test_poisoned_held_out_rows_leave_the_selection_part_unchanged():
    poisoned = {**EVALUATION, "rows": {k: [1 - v if i in ("b", "c") else v for v, i in zip(vals, EVALUATION[
        "row_ids"][k])] for k, vals in EVALUATION["rows"].items()}}
    assert part(poisoned, {"b", "c"}, report=False) == part(EVALUATION, {"b", "c"}, report=False)
    assert part(poisoned, {"b", "c"}, report=True) != part(EVALUATION, {"b", "c"}, report=True)



def test_unseen_positions_drop_the_held_out_rows_a_source_selection_read():
    from obliviate.eval.heldout import unseen_positions

    # two rows: the cut holds one out by position; reversing the rows puts the row the source selected there
    source = ["a", "b"]
    assert unseen_positions(source, source, 0.5, 0, 0.5, 0) == [0]  # the same rows, the same cut: never read
    assert unseen_positions(source[::-1], source, 0.5, 0, 0.5, 0) == []  # the held-out row is the one it read
    assert unseen_positions(["c", "d"], source, 0.5, 0, 0.5, 0) == [0]  # rows it never had
    # four of eight rows (as forget05 is half of forget10): exactly the held-out rows that are not selection rows
    many = [f"q{i}" for i in range(8)]
    got = unseen_positions(many[4:], many, 0.5, 0, 0.5, 0)
    assert got == [p for p, q in enumerate(_held(many[4:])) if q in _held(many)]


def _held(rows):
    from obliviate.eval.heldout import tofu_cut

    return [rows[i] for i in tofu_cut({"forget": rows}, 0.5, 0)[1]["forget"]]


def test_transfer_unseen_script_refuses_a_folder_that_is_not_a_snapshot(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "transfer_unseen.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "is not a sweep snapshot (no sweep.yaml and sweep.db)" in done.stderr
    assert list(tmp_path.iterdir()) == []
