"""train/unlearn.py: RMU's default trainable window (WMDP's rmu/unlearn.py trains mlp.down_proj of layers 5, 6, 7
for layer_id 7: the RMU layer and the two below it)."""
from __future__ import annotations

from obliviate.modeling.tiny import tiny_llama
from obliviate.train.unlearn import select_trainable


def test_rmu_default_window_is_the_layer_and_two_below(small_tok):
    model = tiny_llama(small_tok, hidden_size=16, num_layers=6, num_heads=2, seed=0)  # deep enough: no clipping
    names = select_trainable(model, "wmdp", None, 4)
    assert names == [f"model.layers.{i}.mlp.down_proj.weight" for i in (2, 3, 4)]
    assert sorted(n for n, p in model.named_parameters() if p.requires_grad) == names
    # "layers": every parameter of the same three layers, nothing outside them
    whole = select_trainable(model, "layers", None, 4)
    assert {n.split(".")[2] for n in whole} == {"2", "3", "4"} and set(names) < set(whole)
    assert sorted(n for n, p in model.named_parameters() if p.requires_grad) == whole
    # near the bottom the window is clipped at layer 0
    assert select_trainable(model, "wmdp", None, 1) == [f"model.layers.{i}.mlp.down_proj.weight" for i in (0, 1)]
