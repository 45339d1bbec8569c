"""The search space: every dimension form, its checks before anything runs, sampling and a trial's settings."""
from __future__ import annotations

import json

import optuna
import pytest

from obliviate.config import TrainConfig
from obliviate.errors import ConfigError, ObliviateError
from obliviate.sweep.space import Dim, grid_size, grid_space, parse_dim, parse_space, trial_settings, valid_keys

METHODS = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.0}, "retain": "kl"},
           "NPO": {"forget": "npo", "retain": "nll"}}


@pytest.mark.parametrize("raw, match", [
    ({"float": [1e-4, 1e-4]}, r"range \[0.0001, 0.0001\] is empty"),
    ({"float": [1e-3, 1e-4]}, r"range \[0.001, 0.0001\] is inverted"),
    ({"int": [5, 2]}, "inverted"),
    ({"int": [1.5, 3]}, "whole numbers"),
    ({"float": [0.0, 1.0], "log": True}, "log range needs low > 0"),
    ({"float": [1, 2], "step": 0}, "step: expected a number > 0"),
    ({"float": [1, 2], "step": 0.5, "log": True}, "step and log cannot be combined"),
    ({"float": [1]}, r"expected \[low, high\]"),
    ({"choices": []}, "non-empty list"),
    ({"float": [1, 2], "choices": [1]}, "exactly one of"),
    ({"range": [1, 2]}, "exactly one of"),
    ({"float": [1, 2], "methods": ["GA"]}, r"unknown method\(s\) \['GA'\]; the sweep's methods: \['ASU', 'NPO'\]"),
    ([1, 2], "expected a mapping"),
])
def test_bad_dimensions_are_refused_with_the_reason(raw, match):
    with pytest.raises(ConfigError, match=match):
        parse_dim("train.lr", raw, ["ASU", "NPO"])


def test_an_unknown_key_lists_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        parse_space({"train.learning_rate": {"float": [1e-5, 1e-4]}}, METHODS, TrainConfig())
    text = str(err.value)
    assert "unknown key 'train.learning_rate'; valid keys: [" in text
    for key in ("'seed'", "'train.lr'", "'method.alpha'", "'method.forget_args.tau'", "'method.forget_args.beta'",
                "'method.combine.rule'"):
        assert key in text, key


def test_a_hyper_parameter_of_another_method_must_be_limited_to_its_methods():
    with pytest.raises(ConfigError, match=r"method 'NPO' \(npo\) has no hyper-parameter 'tau'; limit the key"):
        parse_space({"method.forget_args.tau": {"float": [2, 8]}}, METHODS, TrainConfig())
    dims = parse_space({"method.forget_args.tau": {"float": [2, 8], "methods": ["ASU"]}}, METHODS, TrainConfig())
    assert dims[0].applies("ASU") and not dims[0].applies("NPO")


def test_both_ends_of_a_range_are_checked_by_the_method_itself():
    with pytest.raises(ConfigError, match=r"space.method.forget_args.tau=0.5 \(ASU\).*sharpens"):
        parse_space({"method.forget_args.tau": {"float": [0.5, 4], "methods": ["ASU"]}}, METHODS, TrainConfig())
    with pytest.raises(ObliviateError, match=r"space.method.combine.rule='nope' \(ASU\): unknown gradient rule"):
        parse_space({"method.combine.rule": {"choices": ["sago", "nope"]}}, METHODS, TrainConfig())
    with pytest.raises(ConfigError, match=r"space.train.batch_size='big' \(ASU\): train.batch_size: expected int"):
        parse_space({"train.batch_size": {"choices": [4, "big"]}}, METHODS, TrainConfig())


def test_sampling_stays_in_range_and_layer_sets_round_trip_through_optuna():
    dims = parse_space({"train.lr": {"float": [1e-5, 1e-3], "log": True}, "train.epochs": {"int": [2, 6], "step": 2},
                        "method.forget_args.layers": {"choices": [[0], [0, 1], None], "methods": ["ASU"]}},
                       METHODS, TrainConfig())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        t = study.ask()
        v = {d.key: d.suggest(t) for d in dims}
        assert 1e-5 <= v["train.lr"] <= 1e-3 and v["train.epochs"] in (2, 4, 6)
        assert v["method.forget_args.layers"] in ([0], [0, 1], None)
        seen.add(str(v["method.forget_args.layers"]))
        study.tell(t, 0.0)
    assert seen == {"[0]", "[0, 1]", "None"}


def test_grid_values_and_size():
    d = parse_dim("train.lr", {"float": [0.1, 0.3], "step": 0.1}, [])
    assert d.grid() == pytest.approx([0.1, 0.2, 0.3])
    assert parse_dim("train.epochs", {"int": [1, 7], "step": 3}, []).grid() == [1, 4, 7]
    assert Dim("k", "choices", choices=([0], None)).grid() == ["[0]", None]
    with pytest.raises(ConfigError, match="grid search needs a step"):
        parse_dim("train.lr", {"float": [0.1, 0.3]}, []).grid()
    dims = [parse_dim("train.epochs", {"int": [1, 7], "step": 3}, []),
            parse_dim("method.forget_args.tau", {"choices": [2.0, 4.0], "methods": ["ASU"]}, ["ASU", "NPO"])]
    assert grid_size(dims, "ASU") == 6 and grid_size(dims, "NPO") == 3
    assert set(grid_space(dims, "NPO")) == {"train.epochs"}


def test_a_trials_settings_are_the_base_with_its_values():
    method, train = trial_settings(METHODS["ASU"], TrainConfig(lr=1e-5, seed=3),
                                   {"train.lr": 2e-4, "seed": 7, "method.forget_args.tau": 4.0, "method.alpha": 0.5,
                                    "method.combine.rule": "sago"})
    assert (train.lr, train.seed, train.epochs) == (2e-4, 7, TrainConfig().epochs)
    assert method.forget_args == {"tau": 4.0} and method.alpha == 0.5 and method.combine.rule == "sago"
    assert METHODS["ASU"]["forget_args"] == {"tau": 2.0}  # the base is not edited


def test_valid_keys_follow_the_methods_objectives():
    keys = valid_keys({"only": {"forget": "simnpo", "retain": "kl"}})
    assert "method.forget_args.delta" in keys and "method.forget_args.tau" not in keys


def test_a_key_may_hold_one_range_per_group_of_methods():
    dims = parse_space({"method.alpha": [{"float": [0.5, 4.0], "methods": ["ASU"]},
                                         {"float": [100.0, 1000.0], "methods": ["NPO"]}]}, METHODS, TrainConfig())
    assert [(d.low, d.methods) for d in dims] == [(0.5, ("ASU",)), (100.0, ("NPO",))]
    for bad in ([{"float": [0.5, 4.0]}, {"float": [1.0, 2.0], "methods": ["NPO"]}],
                [{"float": [0.5, 4.0], "methods": ["NPO"]}, {"float": [1.0, 2.0], "methods": ["NPO"]}]):
        with pytest.raises(ConfigError, match="each method in one of them only"):
            parse_space({"method.alpha": bad}, METHODS, TrainConfig())
    with pytest.raises(ConfigError, match="an empty list"):
        parse_space({"method.alpha": []}, METHODS, TrainConfig())


def _map(tmp_path, points, replies=True, name="calibration.json"):
    """A calibration.json: grid points (tau, layers, fluent) and θ0's replies when `replies`."""
    grid = [{"tau": t, "layers": layers, "fluent_forgetting": fluent} for t, layers, fluent in points]
    data = {"grid": grid, **({"base": {"forget": {"recall": 1.0}}} if replies else {})}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_teacher_map_gives_asu_its_fluent_forgetting_points(tmp_path):
    """Only the points where facts drop while replies stay fluent become choices; a trial sets τ and layers
    together and keeps the base's other forget arguments."""
    from obliviate.config import TrainConfig
    from obliviate.sweep.space import parse_space, trial_settings

    path = _map(tmp_path, [(4.0, [1], True), (8.0, [0], False), (2.3, None, True)])
    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.0, "layers": [0], "reduction": "example"},
                       "retain": "kl"}, "GD": {"forget": "ga", "retain": "nll"}}
    dims = parse_space({"method.forget_args": {"teacher_map": str(path), "methods": ["ASU"]}}, methods, TrainConfig())
    (dim,) = dims
    assert dim.choices == ({"tau": 4.0, "layers": [1]}, {"tau": 2.3, "layers": None}) and dim.methods == ("ASU",)
    m, _ = trial_settings(methods["ASU"], TrainConfig(), {"method.forget_args": dim.value(dim.labels()[0])})
    assert m.forget_args == {"tau": 4.0, "layers": [1], "reduction": "example"}


@pytest.mark.parametrize("case, message", [
    ("missing", "cannot read"), ("no_replies", "is not a teacher map"), ("none_fluent", "no point of"),
    ("other_key", "a teacher map sets method.forget_args"), ("all_methods", "GD"),
])
def test_teacher_map_dimensions_refuse_what_cannot_work(case, message, tmp_path):
    from obliviate.config import TrainConfig
    from obliviate.errors import ConfigError
    from obliviate.sweep.space import parse_space

    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.0}, "retain": "kl"},
               "GD": {"forget": "ga", "retain": "nll"}}
    path = {"missing": tmp_path / "nope.json",
            "no_replies": _map(tmp_path, [(4.0, [0], True)], replies=False, name="plain.json"),
            "none_fluent": _map(tmp_path, [(4.0, [0], False)], name="none.json")}.get(case) \
        or _map(tmp_path, [(4.0, [0], True)])
    key = "method.forget_args.tau" if case == "other_key" else "method.forget_args"
    spec = {"teacher_map": str(path)} if case == "all_methods" else {"teacher_map": str(path), "methods": ["ASU"]}
    with pytest.raises(ConfigError, match=message):
        parse_space({key: spec}, methods, TrainConfig())


def test_a_methods_recipe_is_a_point_of_the_space():
    """start_at_recipe: each space key takes the value the method's own section (or the base's training settings,
    or the objective's default) gives it; choices go to Optuna as their labels."""
    from obliviate.sweep.space import recipe_point

    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.3, "layers": None}, "retain": "kl", "alpha": 0.5},
               "NPO": {"forget": "npo", "retain": "nll", "combine": {"rule": "gru"}}}
    space = {"train.lr": {"float": [1e-5, 1e-3], "log": True}, "train.epochs": {"choices": [2, 5]},
             "method.alpha": {"float": [0.3, 3.0]},
             "method.forget_args.tau": {"float": [2.0, 8.0], "methods": ["ASU"]},
             "method.forget_args.layers": {"choices": [None, [6, 7]], "methods": ["ASU"]},
             "method.forget_args.beta": {"float": [0.05, 0.5], "methods": ["NPO"]},
             "method.combine.args.gru_gamma": {"float": [0.5, 0.99], "methods": ["NPO"]}}
    train = TrainConfig(lr=2e-4, epochs=5)
    dims = parse_space(space, methods, train)
    assert recipe_point(dims, methods["ASU"], train, "ASU") == {
        "train.lr": 2e-4, "train.epochs": 5, "method.alpha": 0.5, "method.forget_args.tau": 2.3,
        "method.forget_args.layers": None}
    npo = recipe_point(dims, methods["NPO"], train, "NPO")  # beta and gru_gamma: the objective's and rule's defaults
    assert npo == {"train.lr": 2e-4, "train.epochs": 5, "method.alpha": 1.0, "method.forget_args.beta": 0.1,
                   "method.combine.args.gru_gamma": 0.8}
    layered = {**methods, "ASU": {**methods["ASU"], "forget_args": {"tau": 2.3, "layers": [6, 7]}}}
    assert recipe_point(dims, layered["ASU"], train, "ASU")["method.forget_args.layers"] == "[6, 7]"  # its label
    for where, bad in (("train", TrainConfig(lr=1e-2, epochs=5)), ("method", TrainConfig(lr=2e-4, epochs=3))):
        key = "train.lr" if where == "train" else "train.epochs"
        with pytest.raises(ConfigError, match=f"space.{key}: the recipe of NPO sets .* outside .*widen the space"):
            recipe_point(dims, methods["NPO"], bad, "NPO")
    with pytest.raises(ConfigError, match=r"space.method.alpha: the recipe of ASU sets 0.2, outside \[0.3, 3.0\]"):
        recipe_point(dims, {**methods["ASU"], "alpha": 0.2}, train, "ASU")


def test_a_recipe_on_a_teacher_map_is_one_of_its_points(tmp_path):
    from obliviate.sweep.space import recipe_point

    path = _map(tmp_path, [(4.0, [1], True), (2.3, None, True)])
    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.3, "layers": None}, "retain": "kl"}}
    dims = parse_space({"method.forget_args": {"teacher_map": str(path)}}, methods, TrainConfig())
    assert recipe_point(dims, methods["ASU"], TrainConfig(), "ASU") == {
        "method.forget_args": json.dumps({"tau": 2.3, "layers": None})}
    with pytest.raises(ConfigError, match="outside the choices"):
        recipe_point(dims, {"forget": "asu", "forget_args": {"tau": 3.0, "layers": None}, "retain": "kl"},
                     TrainConfig(), "ASU")


def test_a_teacher_map_dimension_may_include_the_recipe(tmp_path):
    """`include` adds points to the map's fluent ones (the authors' τ on every layer, which the map may call broken),
    so that start_at_recipe can begin there; a malformed point or an include on another kind is refused."""
    from obliviate.sweep.space import recipe_point

    path = _map(tmp_path, [(4.0, [1], True), (2.3, None, False)])
    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.3, "layers": None}, "retain": "kl"}}
    raw = {"teacher_map": str(path), "include": [{"tau": 2.3, "layers": None}, {"tau": 4.0, "layers": [1]}]}
    (dim,) = parse_space({"method.forget_args": raw}, methods, TrainConfig())
    assert dim.choices == ({"tau": 4.0, "layers": [1]}, {"tau": 2.3, "layers": None})  # no point twice
    assert recipe_point([dim], methods["ASU"], TrainConfig(), "ASU") == {
        "method.forget_args": json.dumps({"tau": 2.3, "layers": None})}
    for bad in ([{"tau": 2.3}], [{"tau": "x", "layers": None}], [{"tau": 2.0, "layers": [0.5]}], {"tau": 2.0}):
        with pytest.raises(ConfigError, match="include: expected a list of"):
            parse_space({"method.forget_args": {"teacher_map": str(path), "include": bad}}, methods, TrainConfig())
    with pytest.raises(ConfigError, match="only a teacher_map dimension takes extra points"):
        parse_space({"train.lr": {"float": [1e-5, 1e-4], "include": [{"tau": 2.0, "layers": None}]}}, methods,
                    TrainConfig())


def test_a_queued_point_becomes_optuna_params_and_a_bad_one_is_refused_with_its_place():
    """`queue`: each point's keys must be dimensions of that method's space, its values inside them; choices go to
    Optuna as their labels, numbers as they are; keys left out are not in the params (the sampler's)."""
    from obliviate.sweep.space import queued_point

    methods = {"ASU": {"forget": "asu", "forget_args": {"tau": 2.3, "layers": None}, "retain": "kl"},
               "NPO": {"forget": "npo", "retain": "nll"}}
    space = {"train.lr": {"float": [1e-5, 1e-3], "log": True}, "train.epochs": {"choices": [2, 5]},
             "method.forget_args.layers": {"choices": [None, [6, 7]], "methods": ["ASU"]},
             "method.forget_args.beta": {"float": [0.05, 0.5], "methods": ["NPO"]}}
    dims = parse_space(space, methods, TrainConfig())
    assert queued_point(dims, {"method.forget_args.layers": [6, 7], "train.lr": 1e-4}, "ASU", 0) == {
        "method.forget_args.layers": "[6, 7]", "train.lr": 1e-4}
    assert queued_point(dims, {"train.epochs": 5}, "NPO", 3) == {"train.epochs": 5}
    with pytest.raises(ConfigError, match=r"queue.NPO\[1\]: \['method.forget_args.layers'\] is not in NPO's search "
                                          r"space; its keys: \['method.forget_args.beta', 'train.epochs', 'train.lr'\]"):
        queued_point(dims, {"method.forget_args.layers": [6, 7]}, "NPO", 1)
    with pytest.raises(ConfigError, match=r"space.train.lr: queue.ASU\[0\] sets 0.1, outside \[1e-05, 0.001\]; "
                                          "queue a point inside the space"):
        queued_point(dims, {"train.lr": 0.1}, "ASU", 0)
    with pytest.raises(ConfigError, match=r"space.method.forget_args.layers: queue.ASU\[0\] sets \[5\], outside the "
                                          r"choices \[None, \[6, 7\]\]"):
        queued_point(dims, {"method.forget_args.layers": [5]}, "ASU", 0)
    for bad in ({}, [1e-4], "lr=1e-4"):
        with pytest.raises(ConfigError, match=r"queue.ASU\[2\]: expected a mapping of space keys to values"):
            queued_point(dims, bad, "ASU", 2)
