"""Each method's best trial of a sweep as a config file that runs alone (`obliviate unlearn` / `obliviate demo`), so
the best can be trained again with its weights kept, audited (relearning, quantisation, paraphrases) and published;
and all of them as one sweep file that runs each again on other rows (`write_transfer_config`: does a best carry over
to another family of facts or another forget split?).

The best is `obliviate compare`'s: the trial the report names under the sweep's bar (a method with none gets no
file). Its config is the sweep's base with the sweep's `set`, the method's own section and training settings, and
the trial's values (train.seed included): what `run_trial` trained, except that a run evaluates every row where the
sweep's selection read only its part.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from obliviate.config import build, to_dict
from obliviate.errors import ObliviateError
from obliviate.eval.score import nearest_to_bar
from obliviate.sweep.audits import best_header, slug
from obliviate.sweep.compare import best_per_method, collect, scales, with_bar
from obliviate.sweep.config import SweepConfig
from obliviate.sweep.run import CONFIG_FILE, plan_sweep
from obliviate.sweep.space import MAP_KEY, trial_settings

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


def write_best_configs(sweep_dir: Path, out: Path, log: Log = print, bar: Mapping[str, Any] | None = None
                       ) -> list[Path]:
    """Write <out>/<method>.yaml for each method with a best trial in the sweep at `sweep_dir` (under `bar` when
    given: compare's with_bar); the paths written."""
    if not (sweep_dir / CONFIG_FILE).is_file():
        raise ObliviateError(f"--best-configs: {sweep_dir} is not a sweep directory (no {CONFIG_FILE}); pass the "
                             "output_dir of an `obliviate sweep`")
    recorded = yaml.safe_load((sweep_dir / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    plan = plan_sweep(build(SweepConfig, recorded))
    coll = with_bar(collect([str(sweep_dir)]), bar)
    judge, _ = scales(coll)
    written, raws = [], {}
    for best in best_per_method(coll, judge):
        if best.point is None:
            log(f"{best.method}: no trial passes the bar ({judge.describe()}), so no config")
            continue
        if best.method not in plan.methods:
            raise ObliviateError(f"{sweep_dir}: the storage holds method {best.method!r}, which its {CONFIG_FILE} "
                                 f"does not name; valid: {', '.join(plan.methods)}")
        raws[best.method] = (best.point, best_config(plan, best.method, dict(best.point.params),
                                                     f"runs/{sweep_dir.name}-{slug(best.method)}"))
    out.mkdir(parents=True, exist_ok=True)
    for method, (point, raw) in raws.items():  # every file checked before the first is written
        path = out / f"{slug(method)}.yaml"
        head = best_header(point.name, sweep_dir, judge.describe()) + f"# Run: {COMMAND[plan.track.kind]} {path}\n"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(head + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        tmp.replace(path)
        written.append(path)
        log(f"{method}: {point.name} -> {path}")
    return written


def _with_params(section: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A sweep's method section with a trial's values written into it (`train.*` into its `train` table, a teacher
    map's point into `forget_args`); the trial's own seed is left out, as the new sweep's repeats choose theirs."""
    out = yaml.safe_load(yaml.safe_dump(dict(section)))
    for key, value in params.items():
        if key == "seed":
            continue
        if key == MAP_KEY:
            out["forget_args"] = {**(out.get("forget_args") or {}), **value}
            continue
        node = out.setdefault("train", {}) if key.startswith("train.") else out
        parts = key.split(".")[1:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def check_transfer_file(out: Path) -> None:
    """Refuse a transfer file name that is not a .yaml file (before anything is written)."""
    if out.suffix not in (".yaml", ".yml"):
        raise ObliviateError(f"--transfer: {out} should be a .yaml file (the sweep file to write)")


def write_transfer_config(sweep_dir: Path, out: Path, log: Log = print, bar: Mapping[str, Any] | None = None
                          ) -> Path:
    """Write `out`: a sweep file running each method of the sweep at `sweep_dir` at the point it selected (its best
    under the bar, else its nearest miss) as that method's only trial (`start_at_recipe`, an empty space), with the
    same bar (`bar` when given, which also selects), objectives, repeats and held-out share; change its `set`
    (another family of facts, another forget split) to see whether the selection carries over. Returns `out`."""
    if not (sweep_dir / CONFIG_FILE).is_file():
        raise ObliviateError(f"--transfer: {sweep_dir} is not a sweep directory (no {CONFIG_FILE}); pass the "
                             "output_dir of an `obliviate sweep`")
    check_transfer_file(out)
    recorded = yaml.safe_load((sweep_dir / CONFIG_FILE).read_text(encoding="utf-8")) or {}
    plan = plan_sweep(build(SweepConfig, recorded))
    coll = with_bar(collect([str(sweep_dir)]), bar)
    judge, _ = scales(coll)
    if bar is not None:
        recorded = {**recorded, "bar": dict(bar)}
    methods, chosen = {}, []
    for best in best_per_method(coll, judge):
        point, why = best.point, "its best"
        if point is None:
            pts = [p for p in coll.points if p.method == best.method and p.state == "complete" and p.repeat_of is None]
            i = nearest_to_bar([p.metrics for p in pts], judge, coll.original)
            if i is None:
                log(f"{best.method}: no finished trial, left out")
                continue
            point, why = pts[i], "its nearest miss"
        if best.method not in plan.methods:
            raise ObliviateError(f"{sweep_dir}: the storage holds method {best.method!r}, which its {CONFIG_FILE} "
                                 f"does not name; valid: {', '.join(plan.methods)}")
        methods[best.method] = _with_params(recorded["methods"][best.method], dict(point.params))
        chosen.append(f"{best.method}: {point.name} ({why})")
    if not methods:
        raise ObliviateError(f"--transfer: {sweep_dir} has no finished trial: run the sweep first")
    skip = {"space", "trials", "start_at_recipe", "methods", "output_dir", "storage", "study", "overwrite",
            "warm_start", "queue"}
    raw = {k: v for k, v in recorded.items() if k not in skip}
    name = recorded.get("output_dir") or "obliviate-sweep"
    raw.update(methods=methods, space={}, trials=1, start_at_recipe=True, output_dir=f"{name}-transfer")
    plan_sweep(build(SweepConfig, raw))  # what the sweep will build: an invalid file is never written
    head = (f"# Each method of the sweep in {sweep_dir} at the point it selected, once, then with the sweep's repeats:\n"
            + "".join(f"#   {c}\n" for c in chosen)
            + "# Change `set` (e.g. knowledge.forget_families, data.forget_split) to run them on rows the selection "
              "never saw.\n# Run: obliviate sweep --config " + str(out) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(head + yaml.safe_dump(raw, sort_keys=False, width=120), encoding="utf-8")
    tmp.replace(out)
    for c in chosen:
        log(c)
    return out
