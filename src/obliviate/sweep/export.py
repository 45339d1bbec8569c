"""Each method's best trial of a sweep as a config file that runs alone (`obliviate unlearn` / `obliviate demo`), so
the best can be trained again with its weights kept, audited (relearning, quantisation, paraphrases) and published.

The best is `obliviate compare`'s: the trial the report names under the sweep's bar (a method with none gets no
file). Its config is the sweep's base with the sweep's `set`, the method's own section and training settings, and
the trial's values (train.seed included): what `run_trial` trained, except that a run evaluates every row where the
sweep's selection read only its part.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

from obliviate.config import build, to_dict
from obliviate.errors import ObliviateError
from obliviate.sweep.audits import slug
from obliviate.sweep.compare import best_per_method, collect, scales
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.run import CONFIG_FILE, plan_sweep
from obliviate.sweep.space import trial_settings

Log = Callable[[str], None]
COMMAND = {"unlearn": "obliviate unlearn --config", "knowledge": "obliviate demo --config", "demo": "obliviate demo --config"}


def best_config(plan: Any, method: str, params: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """The run config (a plain mapping, validated) of `method` with a trial's `params` on the sweep's base."""
    method_cfg, train_cfg = trial_settings(plan.methods[method], plan.trains[method], params, f"{method}'s best")
    track = plan.track
    raw = to_dict(track.cfg)
    if track.kind == "unlearn":
        raw["method"], raw["train"] = to_dict(method_cfg), to_dict(train_cfg)
    else:  # the demo and knowledge configs: a methods table and one `unlearn` section for all of them
        raw["methods"], raw["unlearn"] = {method: to_dict(method_cfg)}, to_dict(train_cfg)
    raw["output_dir"] = output_dir
    build(type(track.cfg), raw)  # what the command will build: an invalid file is never written
    return raw


def write_best_configs(sweep_dir: Path, out: Path, log: Log = print) -> list[Path]:
    """Write <out>/<method>.yaml for each method with a best trial in the sweep at `sweep_dir`; the paths written."""
    if not (sweep_dir / CONFIG_FILE).is_file():
        raise ObliviateError(f"--best-configs: {sweep_dir} is not a sweep directory (no {CONFIG_FILE}); pass the "
                             "output_dir of an `obliviate sweep`")
    recorded = yaml.safe_load((sweep_dir / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    plan = plan_sweep(build(SweepConfig, recorded))
    coll = collect([str(sweep_dir)])
    bar, _ = scales(coll)
    written, raws = [], {}
    for best in best_per_method(coll, bar):
        if best.point is None:
            log(f"{best.method}: no trial passes the bar ({bar.describe()}), so no config")
            continue
        if best.method not in plan.methods:
            raise ObliviateError(f"{sweep_dir}: the storage holds method {best.method!r}, which its {CONFIG_FILE} "
                                 f"does not name; valid: {', '.join(plan.methods)}")
        raws[best.method] = (best.point, best_config(plan, best.method, dict(best.point.params),
                                                     f"runs/{sweep_dir.name}-{slug(best.method)}"))
    out.mkdir(parents=True, exist_ok=True)
    for method, (point, raw) in raws.items():  # every file checked before the first is written
        path = out / f"{slug(method)}.yaml"
        head = (f"# {point.name} of the sweep in {sweep_dir}: its best under the bar ({bar.describe()}).\n"
                f"# Run: {COMMAND[plan.track.kind]} {path}\n")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(head + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        tmp.replace(path)
        written.append(path)
        log(f"{method}: {point.name} -> {path}")
    return written
