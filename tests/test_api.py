"""The Python API (obliviate/__init__.py): every name resolves, `import obliviate` stays light, and the docstring's
recipe unlearns a model in memory."""
from __future__ import annotations

import subprocess
import sys

import pytest

import obliviate


def test_every_api_name_resolves_and_an_unknown_one_lists_them():
    for name in obliviate.__all__:
        assert getattr(obliviate, name) is not None, name
    with pytest.raises(AttributeError, match="the API: EvalRunConfig, MethodConfig"):
        obliviate.nope  # noqa: B018


def test_importing_the_package_loads_no_torch():
    code = "import sys, obliviate; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_docstrings_recipe_unlearns_a_model_in_memory(trained_small, small_tok):
    import copy

    import torch

    from obliviate import MethodConfig, TrainConfig, rows_from, unlearn

    model = copy.deepcopy(trained_small)
    before = [p.detach().clone() for p in model.parameters()]
    forget = rows_from([{"question": "Where was Mia born?", "answer": "Mia was born in Ash."}])
    retain = rows_from([{"question": "What is the capital of Ash?", "answer": "Its capital is Lund."}])
    res = unlearn(model, small_tok, forget, retain, MethodConfig(forget="asu", forget_args={"tau": 4.0}),
                  TrainConfig(max_steps=2, batch_size=1, lr=1e-3, progress=False))
    assert len(res.history) == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model in memory changed
