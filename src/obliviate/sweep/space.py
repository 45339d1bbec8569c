"""A sweep's search space: dimensions over a trial's keys, checked before anything runs, sampled by Optuna.

A trial is one method (a method section) trained with one training section and one seed. Its keys:
  seed                        the trial's seed (training order, initialisation of adapters, refusals)
  train.<key>                 any key of the unlearning run's training section (lr, epochs, max_steps, ...)
  method.<key>                any key of the method section (alpha, gamma, retain, combine.rule, ...)
  method.forget_args.<arg>    a hyper-parameter of the method's forget objective (tau, layers, beta, ...)
  method.retain_args.<arg>    a hyper-parameter of its retain term
A dimension is one of
  {float: [low, high], log: false, step: null}   a real range (log: sampled on a log scale)
  {int: [low, high], log: false, step: 1}        an integer range
  {choices: [a, b, ...]}                         a list of values (any YAML value: layer sets are lists)
  {teacher_map: PATH}                            key method.forget_args only: the (τ, layers) points of a
                                                 teacher map (calibration.json of `obliviate calibrate
                                                 replies=true`) where facts drop while replies stay fluent,
                                                 plus the points of an optional `include: [{tau, layers}]`
                                                 (e.g. the method's recipe, for start_at_recipe)
with an optional `methods: [names]` that limits it to those methods (τ only for ASU, β only for NPO). A key may
hold a list of dimensions, each for its own methods (RMU's retain weight lives on another scale than NPO's).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from obliviate.config import CombineConfig, MethodConfig, TrainConfig, build
from obliviate.errors import ConfigError, ObliviateError

KINDS = ("float", "int", "choices", "teacher_map")
_DIM_KEYS = {"float", "int", "choices", "teacher_map", "log", "step", "methods", "include"}
MAP_KEY = "method.forget_args"  # the one key a teacher_map dimension sets: τ and layers together


@dataclass(frozen=True)
class Dim:
    """One dimension of the search space (module docstring)."""

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    methods: tuple[str, ...] = ()

    def applies(self, method: str) -> bool:
        return not self.methods or method in self.methods

    def labels(self) -> list[Any]:
        """Optuna-storable stand-ins of the choices: a value Optuna stores as is, else its JSON text."""
        return [c if c is None or isinstance(c, (bool, int, float, str)) else json.dumps(c) for c in self.choices]

    def value(self, label: Any) -> Any:
        """The choice a stored label stands for."""
        return copy.deepcopy(self.choices[self.labels().index(label)])

    def suggest(self, trial: Any) -> Any:
        """Draw this dimension's value for an Optuna trial."""
        if self.kind == "choices":
            return self.value(trial.suggest_categorical(self.key, self.labels()))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def grid(self) -> list[Any]:
        """The values a grid search visits (labels for choices); a real range needs a step."""
        if self.kind == "choices":
            return self.labels()
        if self.step is None and self.kind == "float":
            raise ConfigError(f"space.{self.key}: a grid search needs a step for a float range (or use choices)")
        step = self.step or 1
        n = int(math.floor((self.high - self.low) / step + 1e-9)) + 1  # type: ignore[operator]
        values = [self.low + i * step for i in range(n)]  # type: ignore[operator]
        return [int(round(v)) for v in values] if self.kind == "int" else values

    def extremes(self) -> list[Any]:
        """The values checked before the sweep runs: both ends of a range, every choice."""
        return list(self.choices) if self.kind == "choices" else [self.low, self.high]


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_dim(key: str, raw: Any, method_names: Sequence[str]) -> Dim:
    """One dimension from its YAML form; an empty or inverted range, an unknown form or method is an error."""
    where = f"space.{key}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping such as {{float: [1e-5, 1e-4], log: true}}, "
                          f"{{int: [5, 20]}} or {{choices: [a, b]}}, got {raw!r}")
    unknown = sorted(set(raw) - _DIM_KEYS)
    kinds = [k for k in KINDS if k in raw]
    if unknown or len(kinds) != 1:
        raise ConfigError(f"{where}: give exactly one of {list(KINDS)} (with optional log, step, methods); got keys "
                          f"{sorted(raw)}")
    methods = raw.get("methods") or []
    if isinstance(methods, str):
        methods = [methods]
    bad = [m for m in methods if m not in method_names]
    if bad:
        raise ConfigError(f"{where}.methods: unknown method(s) {bad}; the sweep's methods: {list(method_names)}")
    kind = kinds[0]
    log, step = raw.get("log", False), raw.get("step")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log: expected true or false, got {log!r}")
    if (kind == "teacher_map") != (key == MAP_KEY):
        raise ConfigError(f"{where}: a teacher map sets {MAP_KEY} (τ and layers together): write "
                          f"{MAP_KEY}: {{teacher_map: calibration.json}}, and other keys as float, int or choices")
    if "include" in raw and kind != "teacher_map":
        raise ConfigError(f"{where}.include: only a teacher_map dimension takes extra points")
    if kind == "teacher_map":
        points = map_points(raw["teacher_map"])
        points += [p for p in _included(raw.get("include"), where) if p not in points]
        return Dim(key, "choices", choices=tuple(points), methods=tuple(methods))
    if kind == "choices":
        choices = raw["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choices: expected a non-empty list of values, got {choices!r}")
        return Dim(key, kind, choices=tuple(choices), methods=tuple(methods))
    bounds = raw[kind]
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_number(b) for b in bounds)):
        raise ConfigError(f"{where}.{kind}: expected [low, high] (two numbers), got {bounds!r}")
    low, high = bounds
    if kind == "int" and not all(isinstance(b, int) for b in bounds):
        raise ConfigError(f"{where}.int: the bounds must be whole numbers, got {bounds!r}")
    if not low < high:
        raise ConfigError(f"{where}.{kind}: the range [{low}, {high}] is "
                          f"{'empty' if low == high else 'inverted'}; give [low, high] with low < high "
                          "(a single value belongs in the base config or in choices)")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0, got {low}")
    if step is not None and not (_number(step) and step > 0):
        raise ConfigError(f"{where}.step: expected a number > 0, got {step!r}")
    if step is not None and log:
        raise ConfigError(f"{where}: step and log cannot be combined (Optuna samples one or the other)")
    return Dim(key, kind, float(low) if kind == "float" else low, float(high) if kind == "float" else high,
               log, step, methods=tuple(methods))


def valid_keys(methods: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every key a dimension may name, given the sweep's methods (their objectives' hyper-parameters)."""
    from obliviate.gradients import RULES
    from obliviate.objectives import FORGET, RETAIN

    keys = ["seed"] + [f"train.{f.name}" for f in dataclasses.fields(TrainConfig)]
    for f in dataclasses.fields(MethodConfig):
        if f.name == "combine":
            keys += [f"method.combine.{c.name}" for c in dataclasses.fields(CombineConfig) if c.name != "args"]
            keys += [f"method.combine.args.{k}" for r in RULES.names() for k in RULES.get(r).defaults()]
        elif f.name not in ("forget_args", "retain_args"):
            keys.append(f"method.{f.name}")
    keys.append(MAP_KEY)
    for raw in methods.values():
        forget, retain = raw.get("forget", MethodConfig.forget), raw.get("retain", MethodConfig.retain)
        if forget in FORGET.names():
            keys += [f"method.forget_args.{k}" for k in FORGET.get(forget).defaults()]
        if retain in RETAIN.names():
            keys += [f"method.retain_args.{k}" for k in RETAIN.get(retain).defaults()]
    return list(dict.fromkeys(keys))


def _set(tree: dict, dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if node is None or not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {part!r} is not a section")
    node[parts[-1]] = value


def trial_settings(method: Mapping[str, Any], train: TrainConfig, params: Mapping[str, Any],
                   where: str = "trial") -> tuple[MethodConfig, TrainConfig]:
    """The method and training sections of a trial: the base's with the trial's values set (validated)."""
    m: dict[str, Any] = {"method": copy.deepcopy(dict(method))}
    t: dict[str, Any] = {"train": dataclasses.asdict(train)}
    for key, value in params.items():
        if key == "seed":
            _set(t, "train.seed", value)
        elif key.startswith("train."):
            _set(t, key, value)
        elif key == MAP_KEY:  # a teacher map's point: τ and layers set, the other forget_args kept
            m["method"]["forget_args"] = {**(m["method"].get("forget_args") or {}), **value}
        else:
            _set(m, key, value)
    try:
        return build(MethodConfig, m["method"], "method."), build(TrainConfig, t["train"], "train.")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_space(raw: Mapping[str, Any], methods: Mapping[str, Mapping[str, Any]], train: TrainConfig) -> list[Dim]:
    """Every dimension, checked: known keys (the error lists them), sound ranges, and values the method and
    training sections accept at both ends of each range and for every choice (so no trial fails on them)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"space: expected a mapping of key -> dimension, got {raw!r}")
    valid = valid_keys(methods)
    dims = []
    for key, spec in raw.items():
        key = str(key)
        if key not in valid:
            raise ConfigError(f"space: unknown key {key!r}; valid keys: {valid}")
        specs = spec if isinstance(spec, list) else [spec]  # a list: one range per group of methods
        if not specs:
            raise ConfigError(f"space.{key}: an empty list; give a dimension, or a list of them for different methods")
        mine = [parse_dim(key, s, list(methods)) for s in specs]
        if len(mine) > 1:
            owners = [m for d in mine for m in (d.methods or ["<all>"])]
            if "<all>" in owners or len(owners) != len(set(owners)):
                raise ConfigError(f"space.{key}: a list of dimensions needs `methods` on each, each method in one "
                                  f"of them only (got {owners})")
        for dim in mine:
            _check_dim(dim, key, methods, train)
        dims += mine
    return dims


def _included(raw: Any, where: str) -> list[dict[str, Any]]:
    """A teacher_map dimension's extra points: a list of {tau: number, layers: null or [indices]}."""
    if raw is None:
        return []
    ok = isinstance(raw, list) and all(
        isinstance(p, Mapping) and set(p) == {"tau", "layers"} and _number(p["tau"])
        and (p["layers"] is None or isinstance(p["layers"], list) and all(isinstance(i, int) for i in p["layers"]))
        for p in raw)
    if not ok:
        raise ConfigError(f"{where}.include: expected a list of {{tau: number, layers: null or [layer indices]}}, "
                          f"got {raw!r}")
    return [{"tau": p["tau"], "layers": p["layers"]} for p in raw]


def map_points(path: Any) -> list[dict[str, Any]]:
    """The points of a teacher map where facts drop while the replies stay fluent, as forget_args updates
    [{tau, layers}] (eval/analysis.fluent_forgetting); a missing file, a calibration without replies or a map
    without such a point is a ConfigError saying what to run."""
    from pathlib import Path

    p = Path(str(path))
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"space.{MAP_KEY}.teacher_map: cannot read {path} ({exc}); write a map with obliviate "
                          "calibrate replies=true output_dir=DIR (DIR/calibration.json)") from None
    if not isinstance(data, dict) or "base" not in data or not isinstance(data.get("grid"), list):
        raise ConfigError(f"space.{MAP_KEY}.teacher_map: {path} is not a teacher map (a calibration without "
                          "replies); run obliviate calibrate replies=true")
    points = [{"tau": g["tau"], "layers": g["layers"]} for g in data["grid"] if g.get("fluent_forgetting")]
    if not points:
        raise ConfigError(f"space.{MAP_KEY}.teacher_map: no point of {path} forgets while its replies stay fluent; "
                          "map more of τ and the layers (taus, window_widths) or relax recall_ratio / degenerate_max")
    return points


def _check_dim(dim: Dim, key: str, methods: Mapping[str, Mapping[str, Any]], train: TrainConfig) -> None:
    """A dimension's key exists for every method it applies to, and the method accepts its values."""
    from obliviate.objectives import FORGET, RETAIN
    from obliviate.train.unlearn import resolve_method

    for name in methods:
        if not dim.applies(name):
            continue
        section = key.split(".")[1] if key.startswith("method.") and key.count(".") >= 2 else None
        if section in ("forget_args", "retain_args"):
            arg = key.split(".", 2)[2]
            owner = methods[name].get("forget" if section == "forget_args" else "retain")
            reg = FORGET if section == "forget_args" else RETAIN
            if owner not in reg.names() or arg not in reg.get(owner).defaults():
                raise ConfigError(f"space.{key}: method {name!r} ({owner}) has no hyper-parameter {arg!r}; "
                                  f"limit the key with methods: [...] to the methods that have it")
        for value in dim.extremes():
            method_cfg, _ = trial_settings(methods[name], train, {key: value}, f"space.{key}={value!r} ({name})")
            try:
                resolve_method(method_cfg)
            except ObliviateError as exc:
                raise ConfigError(f"space.{key}={value!r} ({name}): {exc}") from None


def grid_space(dims: Sequence[Dim], method: str) -> dict[str, list[Any]]:
    """Optuna's GridSampler search space of one method's dimensions."""
    return {d.key: d.grid() for d in dims if d.applies(method)}


def grid_size(dims: Sequence[Dim], method: str) -> int:
    return math.prod(len(v) for v in grid_space(dims, method).values())


def _lookup(tree: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key in a nested mapping."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def recipe_value(dim: Dim, method: Mapping[str, Any], train: TrainConfig, name: str) -> Any:
    """The value a method's own settings (its recipe: the base config with its method section) give a dimension's
    key, its objective's or rule's default where the section is silent."""
    from obliviate.train.method import resolve_method

    method_cfg, train_cfg = trial_settings(method, train, {}, f"the recipe of {name}")
    resolved = resolve_method(method_cfg).settings()
    rule_args = {k: v for k, v in resolved["combine"].items() if k not in ("rule", "separate_backward")}
    trees = ({"method": dataclasses.asdict(method_cfg), "train": dataclasses.asdict(train_cfg)},
             {"method": {**resolved, "combine": {**resolved["combine"], "args": rule_args}}})
    if dim.key == MAP_KEY:
        args = resolved["forget_args"]
        layers = args.get("layers")
        return {"tau": args.get("tau"), "layers": list(layers) if isinstance(layers, tuple) else layers}
    for tree in trees:
        found, value = _lookup(tree, dim.key)
        if found:
            return value
    raise ConfigError(f"space.{dim.key}: the recipe of {name} has no value for it")


def _label(dim: Dim, value: Any, where: str, fix: str) -> Any:
    """The Optuna param (a choice's label, a number as is) a value takes on a dimension; a value outside the
    dimension is an error naming `where` it comes from and the `fix`."""
    if dim.kind in ("choices", "teacher_map"):
        inside = value in list(dim.choices)
        label = dim.labels()[list(dim.choices).index(value)] if inside else None
        space = f"the choices {list(dim.choices)}"
    else:
        inside = _number(value) and dim.low <= value <= dim.high  # type: ignore[operator]
        label, space = value, f"[{dim.low}, {dim.high}]"
    if not inside:
        raise ConfigError(f"space.{dim.key}: {where} sets {value!r}, outside {space}; {fix}")
    return label


def recipe_point(dims: Sequence[Dim], method: Mapping[str, Any], train: TrainConfig, name: str) -> dict[str, Any]:
    """The point of the search space where a method's recipe sits, as Optuna params (choices by their labels): the
    first trial of its study when `start_at_recipe` is on. A recipe value outside the space is an error naming it."""
    return {dim.key: _label(dim, recipe_value(dim, method, train, name), f"the recipe of {name}",
                            "widen the space to hold it, or set start_at_recipe: false")
            for dim in dims if dim.applies(name)}


def queued_point(dims: Sequence[Dim], point: Any, name: str, i: int) -> dict[str, Any]:
    """A point of the sweep's `queue` for method `name` (its i-th: {space key: value}) as Optuna params; keys it
    leaves out are the sampler's. A key that is no dimension of this method's, or a value outside it, is an error."""
    where = f"queue.{name}[{i}]"
    if not isinstance(point, Mapping) or not point:
        raise ConfigError(f"{where}: expected a mapping of space keys to values (e.g. {{train.lr: 1.0e-4}}), got "
                          f"{point!r}")
    own = {d.key: d for d in dims if d.applies(name)}
    unknown = sorted(k for k in point if k not in own)
    if unknown:
        raise ConfigError(f"{where}: {unknown} {'is' if len(unknown) == 1 else 'are'} not in {name}'s search space; "
                          f"its keys: {sorted(own) or 'none'}")
    return {k: _label(own[k], v, where, "queue a point inside the space, or widen it") for k, v in point.items()}
