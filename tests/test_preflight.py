"""The pre-flight (obliviate.preflight): RMU's forget objective and its retain term read one decoder layer, as
WMDP's rmu/unlearn.py (one `layer_id` for the forget and the retain activations)."""
from __future__ import annotations

import pytest

from obliviate.config import RunConfig, load_config
from obliviate.errors import ConfigError
from obliviate.preflight import preflight_unlearn


@pytest.fixture(scope="module")
def paths(small_world, small_tok, tmp_path_factory):
    """A tiny 3-layer model (never trained: the pre-flight loads no weights) and the small world on disk."""
    from obliviate.data.synthetic import write_world
    from obliviate.modeling.tiny import tiny_llama

    root = tmp_path_factory.mktemp("preflight")
    tiny_llama(small_tok, hidden_size=32, num_layers=3, num_heads=4, seed=0).save_pretrained(root / "model")
    small_tok.save_pretrained(root / "model")
    return {"model": root / "model", "world": write_world(small_world, root / "world")}


def _preflight(paths, *method: str):
    cfg = load_config(RunConfig, None, [f"model.path={paths['model']}", f"data.source={paths['world']}",
                                        "eval.enabled=false", *method])
    return preflight_unlearn(cfg, need_output=False)


def test_rmu_forget_and_retain_layers_must_agree(paths):
    with pytest.raises(ConfigError) as err:
        _preflight(paths, "method.forget=rmu", "method.forget_args={layer: 2}", "method.retain=hidden_mse",
                   "method.retain_args={layer: 1}")
    assert str(err.value).startswith("method.forget_args.layer=2 and method.retain_args.layer=1 differ")
    assert "set method.retain_args.layer=2 (or method.forget_args.layer=1)" in str(err.value)
    # the retain term's default layer (7) counts too, once it exists in the model (else the range check speaks)
    with pytest.raises(ConfigError, match="method.retain_args.layer=7 must be a decoder layer index 0..2"):
        _preflight(paths, "method.forget=rmu", "method.forget_args={layer: 2}", "method.retain=hidden_mse")
    # one layer for both passes; so does RMU with a retain term that reads no hidden state
    plan = _preflight(paths, "method.forget=rmu", "method.forget_args={layer: 2}", "method.retain=hidden_mse",
                      "method.retain_args={layer: 2}")
    assert plan.n_layers == 3 and plan.method.forget_kw["layer"] == plan.method.retain_kw["layer"] == 2
    assert _preflight(paths, "method.forget=rmu", "method.forget_args={layer: 1}", "method.retain=nll").n_layers == 3
