"""The retain model's outputs recorded in a TOFU sweep's storage (sweep/retained.py): a worker without the retain
model's files runs a trial to the same numbers as one with them; without a record, a clear error and nothing written."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest
import yaml

from obliviate.config import build
from obliviate.errors import ConfigError
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.retained import RECORD_KEY, recorded
from obliviate.sweep.run import run_sweep

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _base(unlearn_base, tmp_path: Path, model_dir: Path) -> tuple[Path, Path]:
    """The unlearn base with a retain model of its own (a copy of the tiny model, so it can be taken away) and a
    holdout split, so that PrivLeak and the reference attack read the retain model in every trial."""
    base = unlearn_base(max_steps=2, max_examples=6, max_new_tokens=3)
    raw = yaml.safe_load(base.read_text())
    retain = tmp_path / "retain"
    shutil.copytree(model_dir, retain)
    raw["eval"].update(retain_model=str(retain), holdout_split="holdout10")
    base.write_text(yaml.safe_dump(raw))
    return base, retain


def _sweep(base: Path, out: Path, log) -> dict:
    cfg = build(SweepConfig, {"base": str(base), "space": {"train.lr": {"float": [1e-6, 1e-2], "log": True}},
                              "trials": 1, "start_at_recipe": True, "heldout_share": 0.5, "output_dir": str(out)})
    return run_sweep(cfg, log=log)


def _trial(out: Path):
    study = optuna.load_study(study_name="sweep/npo+nll", storage=f"sqlite:///{out.resolve() / 'sweep.db'}")
    return study, [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]


def test_a_worker_without_the_retain_model_runs_on_its_record_to_the_same_numbers(unlearn_base, tmp_path, model_dir):
    base, retain = _base(unlearn_base, tmp_path, model_dir)
    first = tmp_path / "with"
    assert _sweep(base, first, lambda s: None)["outcomes"] == {"complete": 1}
    study, (trial,) = _trial(first)
    rec = study.user_attrs[RECORD_KEY]
    assert len(rec["forget_tr"]) == 6 and len(rec["scores"]) == 2  # one scored row set per part of the cut
    for scores in rec["scores"].values():
        assert 0.0 <= scores["auc_retrain"] <= 1.0 and len(scores["avg_loss"]) > 3  # forget part + holdout rows
    m = trial.user_attrs["metrics"]
    assert m["privleak_auc_retrain"] is not None and m["mia_reference_auc"] is not None
    # the same study on a machine without the retain model: its recipe trial run again from the record
    second = tmp_path / "without"
    second.mkdir()
    for name in ("sweep.db", "sweep.yaml"):
        shutil.copy(first / name, second / name)
    with sqlite3.connect(second / "sweep.db") as db:  # the recipe trial as if its worker had stopped
        db.execute("UPDATE trials SET state = 'FAIL'")
    shutil.rmtree(retain)
    lines: list[str] = []
    assert _sweep(base, second, lines.append)["outcomes"] == {"complete": 1}
    assert any("not on this machine; its outputs recorded in the storage stand in for it (6 forget truth ratios, "
               "2 scored row sets)" in line for line in lines)
    _, (again,) = _trial(second)
    assert again.params == trial.params
    for key in ("forget_quality", "privleak", "privleak_auc_retrain", "mia_reference_auc", "mia_min_k_auc",
                "forget_rougeL_recall", "model_utility"):
        assert again.user_attrs["metrics"][key] == m[key], key
        assert again.user_attrs["report"]["metrics"][key] == trial.user_attrs["report"]["metrics"][key], key
    # a record that lacks the retain model's scores (its worker stopped before a trial) cannot stand in for it
    third = _copy_without_recipe(first, tmp_path / "no-scores", scores={})
    with pytest.raises(ConfigError, match="holds no scores on forget \\+ holdout rows yet"):
        _sweep(base, third, lambda s: None)
    # nor scores of other rows: the trial fails with the reason, rather than reporting PrivLeak without its reference
    fourth = _copy_without_recipe(first, tmp_path / "other-rows", scores={"other": {"auc_retrain": 0.5,
                                                                                     "avg_loss": [1.0]}})
    assert _sweep(base, fourth, lambda s: None)["outcomes"] == {"failed": 1}
    failed = [t for t in _trial(fourth)[0].get_trials(deepcopy=False) if t.state.name == "FAIL"][-1]
    assert "recorded scores do not cover these forget + holdout rows" in failed.user_attrs["error"]


def _copy_without_recipe(src: Path, dst: Path, scores: dict) -> Path:
    """The study in `src` copied to `dst`, its recipe trial as if cut, its retain record's scores replaced."""
    dst.mkdir()
    for name in ("sweep.db", "sweep.yaml"):
        shutil.copy(src / name, dst / name)
    with sqlite3.connect(dst / "sweep.db") as db:
        db.execute("UPDATE trials SET state = 'FAIL'")
        for sid, value in db.execute("SELECT study_id, value_json FROM study_user_attributes WHERE key = ?",
                                     (RECORD_KEY,)).fetchall():
            rec = {**json.loads(value), "scores": scores}
            db.execute("UPDATE study_user_attributes SET value_json = ? WHERE key = ? AND study_id = ?",
                       (json.dumps(rec), RECORD_KEY, sid))
    return dst


def test_without_the_retain_model_or_its_record_the_error_says_so_and_nothing_is_written(unlearn_base, tmp_path,
                                                                                           model_dir):
    base, retain = _base(unlearn_base, tmp_path, model_dir)
    shutil.rmtree(retain)
    out = tmp_path / "new"
    with pytest.raises(ConfigError, match=r"eval.retain_model .*retain': not found, and this sweep is new.*make the "
                                          r"retain model first"):
        _sweep(base, out, lambda s: None)
    assert not out.exists()


def test_a_retain_model_is_absent_when_neither_here_nor_on_the_hub(tmp_path, model_dir):
    from obliviate.sweep.retained import absent

    assert not absent(str(model_dir)) and not absent(None) and not absent("")
    assert absent(str(tmp_path / "gone"))  # a path to nothing: what the pre-flight refuses
    assert absent("runs/a-model-made-elsewhere")  # looks like a hub id, but neither here nor in the hub cache


def test_the_fullest_record_is_read_and_none_without_one():
    class Study:
        def __init__(self, attrs):
            self.user_attrs = attrs

    small = {"forget_tr": [0.5], "scores": {"a": {}}}
    full = {"forget_tr": [0.5], "scores": {"a": {}, "b": {}}}
    assert recorded([Study({RECORD_KEY: small}), Study({RECORD_KEY: full}), Study({})]) == full
    assert recorded([Study({}), Study({RECORD_KEY: {"scores": {}}})]) is None  # no truth ratios: not a record


def test_the_retain_models_scores_are_kept_under_their_rows_and_scoring_settings():
    from obliviate.data.rows import QARow
    from obliviate.eval.runner import scores_key

    rows = [QARow("Who?", "Ann"), QARow("Where?", "Rome")]
    kw = {"batch_size": 8, "max_length": 64, "token_rule": "open_unlearning"}
    assert scores_key(rows, kw) == scores_key([("Who?", "Ann"), ("Where?", "Rome")], dict(reversed(kw.items())))
    assert scores_key(rows, {**kw, "max_length": 32}) != scores_key(rows, kw)  # other settings: other scores
    assert scores_key(rows[:1], kw) != scores_key(rows, kw) != scores_key(rows[::-1], kw)  # other rows, order


def test_a_record_is_adopted_only_by_studies_of_the_same_models_rows_and_settings(tmp_path):
    from obliviate.sweep.retained import adopt

    models = {"original": "aa", "retain": "bb", "rows": "cc"}
    config = {"base": "b.yaml", "set": {"eval.max_examples": 100}, "heldout_share": 0.5, "seed": 0, "space": {}}
    rec = {"forget_tr": [0.5, 0.25], "scores": {"k": {"auc_retrain": 0.5, "avg_loss": [1.0, 2.0]}}}

    def storage(name: str, studies: dict) -> str:
        url = f"sqlite:///{tmp_path / name}"
        for study_name, attrs in studies.items():
            study = optuna.create_study(study_name=study_name, storage=url)
            for k, v in attrs.items():
                study.set_user_attr(k, v)
        return url

    src = storage("src.db", {"sweep/A": {"models": models, "config": config, RECORD_KEY: rec}})
    dst = storage("dst.db", {
        "sweep/same": {"models": models, "config": {**config, "space": {"x": 1}}},  # another space: same outputs
        "sweep/other-retain": {"models": {**models, "retain": "zz"}, "config": config},
        "sweep/other-set": {"models": models, "config": {**config, "set": {"eval.max_examples": 50}}},
        "sweep/other-cut": {"models": models, "config": {**config, "heldout_share": 0.3}},
        "sweep/unmeasured": {"config": config}})  # no models recorded yet: nothing to match
    assert adopt(src, dst) == 1
    got = {s.study_name: optuna.load_study(study_name=s.study_name, storage=dst).user_attrs.get(RECORD_KEY)
           for s in optuna.get_all_study_summaries(dst)}
    assert got == {"sweep/same": rec, "sweep/other-retain": None, "sweep/other-set": None, "sweep/other-cut": None,
                   "sweep/unmeasured": None}
    assert adopt(src, dst) == 0  # already there
    empty = storage("empty.db", {"sweep/A": {"models": models, "config": config,
                                             RECORD_KEY: {**rec, "scores": {}}}})
    assert adopt(empty, storage("dst2.db", {"sweep/same": {"models": models, "config": config}})) == 0


def test_the_study_script_skips_the_retain_fine_tune_only_on_a_record_with_scores(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "tofu20_study.sh"

    def skips(db: Path) -> bool:
        cmd = f'source <(sed -n "/^recorded()/,/^}}/p" {script}); recorded {db}'
        return subprocess.run(["bash", "-c", cmd], capture_output=True).returncode == 0

    def storage(name: str, record: dict | None) -> Path:
        study = optuna.create_study(study_name="sweep/A", storage=f"sqlite:///{tmp_path / name}")
        if record is not None:
            study.set_user_attr(RECORD_KEY, record)
        return tmp_path / name

    assert skips(storage("full.db", {"forget_tr": [0.5], "scores": {"k": {"auc_retrain": 0.5, "avg_loss": [1.0]}}}))
    assert not skips(storage("empty.db", {"forget_tr": [0.5], "scores": {}}))  # its worker stopped before a trial
    assert not skips(storage("none.db", None)) and not skips(tmp_path / "missing.db")
