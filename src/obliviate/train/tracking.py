"""Experiment trackers (TensorBoard, Weights & Biases, MLflow, Trackio) fed through accelerate's tracking API.

`train.report_to` names them. The accelerator is made with them (`accelerator_kwargs`: `log_with` and a
`ProjectConfiguration` whose logging dir is the tracking directory); the loop (train/loop.py) opens them with
`tracked` before its first step (`init_trackers` with the run's resolved config as a flat dict of plain values),
gives them every optimizer step's history entry (each numeric value under its metrics.json key, at the entry's
own step: losses, lr, grad_norm, the rule's statistics, eval_* during training) and closes them when it ends,
also on an error, so their files are complete. A resumed run gives them its restored steps first, so they always
hold the whole history. Only the main process writes (accelerate's trackers do nothing on the others).

They are closed tracker by tracker, which is what `accelerator.end_training()` does before it destroys the process
group: here that group outlives the loop (the saved model is gathered after it, a continual run trains again, and
`obliviate.train.loop.end_process` takes it down).
"""
from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from obliviate.errors import ConfigError
from obliviate.files import check_writable_location, remove_path

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}  # pip name


@dataclass(frozen=True)
class Tracking:
    """Where and under which names a run reports: `trackers` (accelerate's names), the `directory` they write to,
    accelerate's project name, the run's name, its config (flat, plain values); `staged`: the directory is a
    staging place that the run command moves into `<output_dir>/logs` with the run (obliviate.cli.runs)."""

    trackers: tuple[str, ...]
    directory: str
    project: str
    run_name: str
    config: dict[str, Any] = field(default_factory=dict)
    staged: bool = False

    def request(self, i: int) -> Tracking:
        """The trackers of request `i` of a continual run: a run of its own, in a sub-directory."""
        return dataclasses.replace(self, directory=str(Path(self.directory) / f"request_{i:02d}"),
                                   run_name=f"{self.run_name} request {i}", config={**self.config, "request": i})


def installed(tracker: str) -> bool:
    """Whether accelerate finds the tracker's package (it silently drops a tracker whose package is missing)."""
    import accelerate.utils as au

    return bool(getattr(au, f"is_{tracker}_available")())


def check_installed(trackers: tuple[str, ...]) -> None:
    """A ConfigError naming what to `pip install` for each tracker whose package is missing."""
    missing = [t for t in trackers if not installed(t)]
    if missing:
        packages = " ".join(PACKAGES[t] for t in missing)
        raise ConfigError(f"train.report_to names {', '.join(missing)}, whose package{'s are' if len(missing) > 1 else ' is'} "
                          f"not installed: pip install {packages} (or drop {', '.join(missing)} from train.report_to)")


def staging_dir(output_dir: str | Path) -> Path:
    """Where a run command's trackers write while it trains (train.tracking_dir null): beside output_dir, which only
    appears when the run is saved; the directory then moves into it as logs/ (obliviate.cli.runs.keep_logs)."""
    out = Path(output_dir).expanduser()
    return out.parent / f".{out.name}.logs"


def check(train: Any, output_dir: str = "") -> list[str]:
    """The pre-flight of train.report_to: each tracker's package installed, a train.tracking_dir that can be written
    and that replacing output_dir would not delete; a line for `validate` (none without trackers)."""
    if not train.trackers:
        return []
    check_installed(train.trackers)
    if train.tracking_dir:
        where = Path(train.tracking_dir).expanduser().resolve()
        if output_dir and where.is_relative_to(Path(output_dir).expanduser().resolve()):
            raise ConfigError(f"train.tracking_dir {train.tracking_dir} lies inside output_dir {output_dir}, which the "
                              "run replaces as a whole when it is saved; leave train.tracking_dir null (the logs then "
                              "go to <output_dir>/logs) or choose a directory outside output_dir")
        check_writable_location(train.tracking_dir, "train.tracking_dir")
        name = train.run_name or Path(output_dir).name or "<run_name>"
        return [f"tracking: {', '.join(train.trackers)} in {Path(train.tracking_dir) / name}"]
    if not output_dir:
        return [f"tracking: {', '.join(train.trackers)} in <output_dir>/logs"]
    return [f"tracking: {', '.join(train.trackers)} in {Path(output_dir) / 'logs'} (in {staging_dir(output_dir)} "
            "while training)"]


def flat_config(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclass or mapping) as one flat dict of plain values: nested keys joined by dots, lists and
    empty mappings as JSON text, so that every tracker can store it (TensorBoard's hparams, MLflow's params)."""
    raw = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) else dict(cfg)
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flat_config(v, key + "."))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = json.dumps(v, default=str)
    return out


def trackers(train: Any, *, name: str, directory: str | Path | None = None, config: Any = None,
             staged: bool = False) -> Tracking | None:
    """The trackers of a run with TrainConfig `train` (None when train.report_to is none), named train.run_name,
    else `name`. They write to train.tracking_dir/<run name>, else to `directory` (the run's own, e.g. a run
    command's staging directory), else to ./logs/<run name>: a directory several runs share gets one sub-directory
    per run. `config` (default: `train`) is recorded flat. A tracker whose package is missing is a ConfigError here,
    before anything is written."""
    trackers = train.trackers
    if not trackers:
        return None
    check_installed(trackers)
    name = train.run_name or name
    shared = train.tracking_dir or (None if directory else "logs")
    where = Path(shared) / name if shared else Path(str(directory))
    return Tracking(trackers, str(where), train.tracking_project, name, flat_config(train if config is None else config),
                    staged=staged and not shared)


def accelerator_kwargs(tracking: Tracking | None) -> dict[str, Any]:
    """Accelerator(...) arguments that set up the trackers (none without tracking)."""
    if tracking is None:
        return {}
    from accelerate.utils import ProjectConfiguration

    return {"log_with": list(tracking.trackers),
            "project_config": ProjectConfiguration(project_dir=tracking.directory, logging_dir=tracking.directory)}


def init_kwargs(tracking: Tracking) -> dict[str, dict[str, Any]]:
    """Each tracker's own start arguments: the run's name (TensorBoard names its sub-directory by the project),
    wandb's local files in the tracking directory."""
    kw = {"wandb": {"name": tracking.run_name, "dir": tracking.directory}, "mlflow": {"run_name": tracking.run_name},
          "trackio": {"name": tracking.run_name}}
    return {t: kw[t] for t in tracking.trackers if t in kw}


def numeric(entry: Mapping[str, Any]) -> dict[str, float]:
    """The values of a history entry a tracker plots: every number but the step itself."""
    return {k: v for k, v in entry.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def log(accelerator: Any, entry: Mapping[str, Any]) -> None:
    """One history entry to every tracker, at its own step."""
    accelerator.log(numeric(entry), step=int(entry["step"]))


@contextmanager
def tracked(accelerator: Any, tracking: Tracking | None,
            history: list[dict[str, Any]]) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """Open the trackers (a resumed run's `history` logged first), yield the per-step `log`, close them at the end,
    also after an error. Without tracking, a `log` that does nothing."""
    if tracking is None:
        yield lambda entry: None
        return
    have = {str(t) for t in getattr(accelerator, "log_with", [])}
    if not set(tracking.trackers) <= have:
        raise ConfigError(f"train.report_to={list(tracking.trackers)}, but the accelerator was made without "
                          f"{sorted(set(tracking.trackers) - have)}: make it with "
                          "obliviate.train.loop.make_accelerator(train, tracking) (or pass none)")
    if accelerator.is_main_process:
        if tracking.staged:  # a failed or interrupted run's logs: this run logs anew
            remove_path(Path(tracking.directory))
        Path(tracking.directory).mkdir(parents=True, exist_ok=True)  # wandb's `dir` must exist
    accelerator.project_configuration.logging_dir = tracking.directory  # an accelerator reused run after run
    accelerator.print(f"{', '.join(tracking.trackers)}: logging run {tracking.run_name!r} to {tracking.directory}")
    accelerator.init_trackers(tracking.project, config=tracking.config, init_kwargs=init_kwargs(tracking))
    try:
        for entry in history:
            log(accelerator, entry)
        yield lambda entry: log(accelerator, entry)
    finally:
        for tracker in accelerator.trackers:
            tracker.finish()
        accelerator.trackers = []
