"""ASU's teacher settings: one default (τ = 2.0, the low end of the paper's 2.0-2.8), one check, one object."""
from __future__ import annotations

import pytest

from obliviate.config import MethodConfig
from obliviate.errors import ConfigError
from obliviate.modeling.teacher import Teacher, check_teacher_args, tau_problem
from obliviate.objectives import FORGET


def test_the_default_teacher_is_tau_2_on_every_layer_everywhere():
    assert Teacher() == Teacher(2.0, None)
    assert FORGET.get("asu").defaults()["tau"] == 2.0 and FORGET.get("asu").defaults()["layers"] is None
    assert Teacher.from_args({}) == Teacher(2.0, None)
    assert Teacher.from_args({"layers": [0, -1]}) == Teacher(2.0, (0, -1))


def test_from_args_reads_only_tau_and_layers_and_round_trips():
    t = Teacher.from_args({"tau": 3, "layers": [1], "reduction": "token", "factual_shift": 0.4})
    assert t == Teacher(3.0, (1,)) and t.as_args() == {"tau": 3.0, "layers": [1]}


@pytest.mark.parametrize("tau", [0, -1.0, float("nan"), float("inf"), "2", True])
def test_impossible_temperatures_are_refused_with_the_key(tau):
    assert tau_problem(tau) is not None
    with pytest.raises(ConfigError, match=r"method\.forget_args\.tau=.* is impossible"):
        check_teacher_args({"tau": tau})


def test_tau_at_or_below_one_needs_the_opt_in():
    with pytest.raises(ConfigError, match="identical to the model"):
        check_teacher_args({"tau": 1})
    with pytest.raises(ConfigError, match="sharpens"):
        check_teacher_args({"tau": 0.5})
    check_teacher_args({"tau": 0.5}, allow_unusual_tau=True)
    with pytest.raises(ConfigError, match="sharpens"):  # the config runs the same check
        MethodConfig(forget="asu", forget_args={"tau": 0.5})
    assert MethodConfig(forget="asu", forget_args={"tau": 0.5}, allow_unusual_tau=True).forget_args["tau"] == 0.5


def test_one_typed_teacher_from_the_config_to_the_frozen_model(trained_small):
    """resolve_method builds the Teacher once (with the config's opt-in); FrozenModels takes that object, not a
    dict; a teacher check runs for objectives that have a teacher only (another objective's own `tau` is its own)."""
    from obliviate.modeling.frozen import FrozenModels
    from obliviate.train.unlearn import resolve_method

    rm = resolve_method(MethodConfig(forget="asu", forget_args={"tau": 0.5, "layers": [1]}, allow_unusual_tau=True))
    assert rm.teacher == Teacher(0.5, (1,)) and rm.teacher_kw == {"tau": 0.5, "layers": [1]}
    assert resolve_method(MethodConfig(forget="npo")).teacher is None
    assert FrozenModels(trained_small, rm.teacher).teacher is rm.teacher
    with pytest.raises(TypeError, match="Teacher.from_args"):
        FrozenModels(trained_small, {"tau": 3.0})
    npo = MethodConfig(forget="npo", forget_args={"tau": 0.5})  # not ASU: the config runs no teacher check ...
    with pytest.raises(ConfigError, match=r"unknown hyper-parameter\(s\) \['tau'\] for 'npo'"):  # ... npo's own does
        resolve_method(npo)


@pytest.mark.parametrize("layers", [[], [0.5], "0", [True]])
def test_bad_layer_lists_are_refused(layers):
    with pytest.raises(ConfigError, match=r"forget_args\.layers=.*non-empty list of layer"):
        check_teacher_args({"layers": layers})
