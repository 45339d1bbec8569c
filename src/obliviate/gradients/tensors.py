"""Lists of per-parameter gradients, paired and reduced: the arithmetic every gradient rule and statistic shares
(working precision, float64 inner products, one host sync per device, one `reduce` call per group of sums)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

Grads = list[Optional[Tensor]]
Pair = Optional[tuple[Tensor, Tensor]]  # (g_f, g_r), or None when both are absent
Reducer = Callable[[Tensor], Tensor]  # partial sums [K] float64 (CPU) of this shard -> sums over all shards
PairFn = Callable[[int, Tensor, Tensor], Tensor]  # (index, g_f, g_r) in float64 -> g in float64


def align_pairs(forget_grads: Grads, retain_grads: Grads) -> list[Pair]:
    """Validate the lists and pair them; a missing side becomes zeros of the other's shape."""
    if len(forget_grads) != len(retain_grads):
        raise ValueError(
            f"forget and retain gradient lists differ in length: {len(forget_grads)} vs {len(retain_grads)}"
        )
    pairs: list[Pair] = []
    for i, (f, r) in enumerate(zip(forget_grads, retain_grads)):
        if f is not None and r is not None and f.shape != r.shape:
            raise ValueError(
                f"gradient {i}: forget shape {tuple(f.shape)} != retain shape {tuple(r.shape)}"
            )
        if f is None and r is None:
            pairs.append(None)
        else:
            pairs.append((f if f is not None else torch.zeros_like(r),
                          r if r is not None else torch.zeros_like(f)))
    return pairs


def work_precision(t: Tensor) -> Tensor:
    """The tensor in a working precision: float32/float64 as they are, half types upcast to float32."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def map_pairs(pairs: list[Pair], fn: PairFn) -> Grads:
    """Apply fn per tensor in working precision (one tensor at a time); cast to g_f's dtype."""
    return [None if p is None else fn(i, work_precision(p[0]), work_precision(p[1])).to(p[0].dtype)
            for i, p in enumerate(pairs)]


def tensor_dot(x: Tensor, y: Tensor) -> Tensor:
    """⟨x, y⟩ of two same-shape tensors as a float64 scalar (BLAS dot in working precision)."""
    x, y = work_precision(x).reshape(-1), work_precision(y).reshape(-1)
    if x.dtype != y.dtype:
        x, y = x.double(), y.double()
    return torch.dot(x, y).double()


def device_total(values: list[Tensor]) -> float:
    """Sum float64 scalars living on any devices with one host sync per device."""
    per_device: dict[torch.device, Tensor] = {}
    for v in values:
        per_device[v.device] = per_device.get(v.device, 0) + v
    return float(sum(float(v) for v in per_device.values()))


def list_dot(xs: list[Optional[Tensor]], ys: list[Optional[Tensor]]) -> float:
    """Σ_i ⟨x_i, y_i⟩ over entries present in both lists, accumulated in float64."""
    return device_total([tensor_dot(x, y) for x, y in zip(xs, ys) if x is not None and y is not None])


def list_dots(products: list[tuple[list[Optional[Tensor]], list[Optional[Tensor]]]],
          reduce: Optional[Reducer] = None) -> list[float]:
    """Several `list_dot`s, completed over shards with ONE call of `reduce` (when given)."""
    vals = [list_dot(xs, ys) for xs, ys in products]
    if reduce is None:
        return vals
    return reduce(torch.tensor(vals, dtype=torch.float64)).tolist()


def side_of(pairs: list[Pair], i: int) -> list[Optional[Tensor]]:
    return [None if p is None else p[i] for p in pairs]


def conflict_mask(f: Tensor, r: Tensor) -> Tensor:
    """Elementwise conflict mask c = (g_f ⊙ g_r < 0); [*shape] bool; zeros never conflict.

    Signs, not the product: a product of two tiny gradients would underflow to 0 and hide a conflict.
    """
    return ((f > 0) & (r < 0)) | ((f < 0) & (r > 0))


def conflict_masks_of(pairs: list[Pair]) -> list[Optional[Tensor]]:
    """Conflict masks of every pair (None where both gradients are absent)."""
    return [None if p is None else conflict_mask(*p) for p in pairs]
