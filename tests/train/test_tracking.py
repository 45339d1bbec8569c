"""Trackers through accelerate (train.report_to): TensorBoard's scalars are the run's history, step by step and key
by key; the config is recorded; a resumed run's logs hold every step once; an unknown name or a missing package is
one clear error before anything is written; the CLI leaves the event files in <output_dir>/logs."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import interrupt_after

from obliviate.cli import main
from obliviate.config import CombineConfig, MethodConfig, TrainConfig
from obliviate.data.synthetic import write_world
from obliviate.errors import ConfigError
from obliviate.train import tracking
from obliviate.train.monitor import Monitor
from obliviate.train.unlearn import unlearn

SAGO = MethodConfig(forget="npo", retain="nll", combine=CombineConfig(rule="sago"))  # losses, lr, grad_norm and the rule's stats


def _cfg(**kw):
    return TrainConfig(**{"progress": False, "max_steps": 3, "batch_size": 4, "lr": 1e-3, "scheduler": "linear", **kw})


def _model(small_tok):
    from obliviate.modeling.tiny import tiny_llama

    return tiny_llama(small_tok, hidden_size=32, num_layers=1, num_heads=4, seed=0)


def _unlearn(world, tok, cfg, **kw):
    return unlearn(_model(tok), tok, world.splits["forget10"], world.splits["retain90"], SAGO, cfg, max_length=48, **kw)


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard holds in `run_dir` (its own event files, not the hparams sub-directories)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _expected(history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The history as TensorBoard stores it: each numeric key (but step) at its entry's step, as float32."""
    out: dict[str, list[tuple[int, float]]] = {}
    for h in history:
        for k, v in h.items():
            if k != "step" and isinstance(v, (int, float)):
                out.setdefault(k, []).append((int(h["step"]), float(np.float32(v))))
    return out


def _hparams(run_dir: Path) -> dict:
    (path,) = run_dir.glob("*/hparams.yml")
    return yaml.safe_load(path.read_text())


def test_tensorboard_scalars_are_the_history_at_every_step(tmp_path, small_world, small_tok):
    cfg = _cfg(report_to="tensorboard", tracking_dir=str(tmp_path / "tb"))
    monitor = Monitor(2, lambda m: {"probe": 0.25})  # evaluation during training at steps 2 and 3 (the last)
    res = _unlearn(small_world, small_tok, cfg, monitor=monitor)
    assert {"forget", "retain", "loss", "lr", "grad_norm", "cos_f_r", "conflict_share", "eval_probe"} <= \
        {k for h in res.history for k in h}
    run_dir = tmp_path / "tb" / "npo+nll+sago" / "obliviate"  # tracking_dir / run name (the method) / project
    logged, expected = _scalars(run_dir), _expected(res.history)
    assert logged == expected  # same keys (none dropped, none added), same steps, same values
    assert [s for s, _ in logged["eval_probe"]] == [2, 3] and [s for s, _ in logged["loss"]] == [1, 2, 3]
    assert _hparams(run_dir) == tracking.flat_config(cfg) and _hparams(run_dir)["report_to"] == "tensorboard"


def test_a_resumed_run_logs_every_step_once(tmp_path, small_world, small_tok):
    cfg = _cfg(report_to="tensorboard", checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=1)
    track = tracking.trackers(cfg, name="resumed", directory=tmp_path / "stage", staged=True)
    with pytest.raises(KeyboardInterrupt):
        interrupt_after(2, lambda: _unlearn(small_world, small_tok, cfg, tracking=track))
    assert [s for s, _ in _scalars(tmp_path / "stage" / "obliviate")["loss"]] == [1, 2]
    res = _unlearn(small_world, small_tok, cfg, tracking=track)  # resumes at step 3
    assert _scalars(tmp_path / "stage" / "obliviate") == _expected(res.history)


def test_config_flattens_to_plain_values():
    from obliviate.config import RunConfig

    flat = tracking.flat_config(RunConfig(method=SAGO, train=_cfg(report_to=["tensorboard"])))
    assert flat["method.combine.rule"] == "sago" and flat["train.lr"] == 1e-3 and flat["train.report_to"] == '["tensorboard"]'
    assert flat["model.lora.target_modules"] is None and flat["method.forget_args"] == "{}"
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in flat.values())


def test_an_unknown_tracker_is_one_error_naming_the_known_ones():
    for bad in ("tensorbaord", ["tensorboard", "comet_ml"], ["none", "wandb"]):
        with pytest.raises(ConfigError, match="none or one or a list of tensorboard, wandb, mlflow, trackio"):
            TrainConfig(report_to=bad)
    assert TrainConfig().trackers == () and TrainConfig(report_to=[]).trackers == ()
    assert TrainConfig(report_to=["mlflow", "tensorboard", "mlflow"]).trackers == ("mlflow", "tensorboard")


def test_a_missing_package_fails_before_training_and_writes_nothing(tmp_path, monkeypatch, small_world, small_tok):
    monkeypatch.setattr(tracking, "installed", lambda name: name != "wandb")
    monkeypatch.chdir(tmp_path)  # the library's default tracking_dir is ./logs
    for cfg in (_cfg(report_to=["tensorboard", "wandb"], tracking_dir=str(tmp_path / "tb")), _cfg(report_to="wandb")):
        with pytest.raises(ConfigError, match="names wandb, whose package is not installed: pip install wandb"):
            _unlearn(small_world, small_tok, cfg)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def world_dir(small_world, tmp_path_factory):
    return write_world(small_world, tmp_path_factory.mktemp("w") / "world")


def _cli(world_dir, model_dir, out, *extra):
    return ["unlearn", f"model.path={model_dir}", f"data.source={world_dir}", "data.forget_split=forget10",
            "data.retain_split=retain90", "data.max_length=48", "method.forget=ga", "method.retain=nll",
            "train.max_steps=2", "train.batch_size=4", "train.progress=false", "eval.enabled=false",
            f"output_dir={out}", *extra]


def test_the_cli_leaves_the_event_files_in_the_output(world_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = _cli(world_dir, model_dir, out, "train.report_to=tensorboard")
    assert main(["validate", *args[1:]]) == 0
    assert f"tracking: tensorboard in {out / 'logs'} (in {tmp_path / '.run.logs'} while training)" in capsys.readouterr().out
    assert main(args) == 0
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert _scalars(out / "logs" / "obliviate") == _expected(history)
    hp = _hparams(out / "logs" / "obliviate")
    assert hp["output_dir"] == str(out) and hp["train.report_to"] == "tensorboard" and hp["method.forget"] == "ga"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the staging directory moved in


@pytest.mark.parametrize("bad, message", [
    ("train.report_to=tensorbaord", "none or one or a list of tensorboard, wandb, mlflow, trackio"),
    ("train.report_to=[tensorboard, wandb]", "pip install wandb"),
    ("train.tracking_dir={out}/tb", "lies inside output_dir"),  # replacing output_dir at the end would delete it
])
def test_the_cli_refuses_bad_trackers_before_anything_is_written(bad, message, world_dir, model_dir, tmp_path,
                                                                 monkeypatch, capsys):
    monkeypatch.setattr(tracking, "installed", lambda name: name != "wandb")
    out = tmp_path / "never"
    for command in ("validate", "unlearn"):
        assert main([command, *_cli(world_dir, model_dir, out, "train.report_to=tensorboard",
                                    bad.format(out=out))[1:]]) == 2
        assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["wandb", "mlflow", "trackio"])
def test_each_optional_tracker_records_the_run_offline(name, tmp_path, monkeypatch, small_world, small_tok):
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"optional extra not installed: {name}")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    res = _unlearn(small_world, small_tok, _cfg(report_to=name, tracking_dir=str(tmp_path / "logs"), run_name="r1"))
    if name == "wandb":
        assert list((tmp_path / "logs" / "r1" / "wandb").glob("offline-run-*"))
    if name == "mlflow":
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name("obliviate").experiment_id])
        assert run.info.run_name == "r1" and run.data.params["report_to"] == "mlflow"
        for key in ("loss", "grad_norm", "conflict_share"):
            assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == \
                [(int(h["step"]), h[key]) for h in res.history]
