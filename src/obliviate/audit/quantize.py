"""Round-to-nearest (RTN) weight-only quantisation, applied as quantise -> dequantise of Linear weights.

Why our own RTN and not a library: the attack of Zhang et al. (2024, "Catastrophic failure of LLM unlearning
via quantization") works through the rounding grid alone, so what must be exact is which values the weights
can take. Measured on this project's CPU set-up (torch 2.13 CPU, 2026-12-01): torchao 0.18's int8 weight-only
config runs on a CPU, but its int4 weight-only config needs an extra kernel package (`mslk`) and fails on a
CPU; optimum-quanto installs but adds a compiled extension for what is here ~20 lines of torch. Fake
quantisation in float32 computes exactly what a weight-only int8/int4 kernel computes (dequantised weights
times float activations) up to float summation order, runs anywhere the model runs, and adds no dependency.

Grids (the paper's RTN baseline):
  int8  symmetric, per output channel (row): scale = max|w_row| / 127, q = clamp(round(w / scale), -128, 127)
  int4  asymmetric, groups of `group_size` input columns per row: scale = (max - min) / 15,
        zero = round(-min / scale), q = clamp(round(w / scale) + zero, 0, 15), w' = (q - zero) * scale
Every |w - w'| <= scale / 2. Quantised: the nn.Linear weights of the model, except an output head (and any
Linear whose weight is tied to the input embedding); embeddings, norms and biases stay in full precision.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor


def rtn_int8(w: Tensor) -> Tensor:
    """Symmetric per-row int8 RTN, dequantised: [out, in] -> [out, in] in w's dtype."""
    x = w.detach().float()
    scale = x.abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(x / scale), -128, 127)
    return (q * scale).to(w.dtype)


def rtn_int4(w: Tensor, group_size: int = 128) -> Tensor:
    """Asymmetric group-wise int4 RTN (groups of `group_size` input columns), dequantised: [out, in] -> [out, in]."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    x = w.detach().float()
    rows, cols = x.shape
    pad = (-cols) % group_size
    xp = torch.nn.functional.pad(x, (0, pad))
    g = xp.reshape(rows, -1, group_size)
    if pad:  # padded zeros must not widen the last group's range: use its real values' range only
        mask = torch.zeros(xp.shape[1], dtype=torch.bool)
        mask[cols:] = True
        mask = mask.reshape(-1, group_size)
        lo = g.masked_fill(mask, float("inf")).amin(-1, keepdim=True)
        hi = g.masked_fill(mask, float("-inf")).amax(-1, keepdim=True)
    else:
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / 15.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-lo / scale)
    q = torch.clamp(torch.round(g / scale) + zero, 0, 15)
    out = ((q - zero) * scale).reshape(rows, -1)[:, :cols]
    return out.to(w.dtype)


def quantizable_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """(name, module) of every nn.Linear but the output head and any Linear sharing the input embedding's weight."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = emb.weight.data_ptr() if emb is not None else None
    out_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not out_head and m.weight.data_ptr() != tied]


@torch.no_grad()
def quantize_weights(model: torch.nn.Module, bits: int, group_size: int = 128) -> int:
    """Replace, in place, each quantisable Linear weight by its RTN-dequantised version; returns how many."""
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    layers = quantizable_linears(model)
    for _, m in layers:
        m.weight.copy_(rtn_int8(m.weight) if bits == 8 else rtn_int4(m.weight, group_size))
    return len(layers)


def quantized_copy(model: Any, bits: int, group_size: int = 128) -> Any:
    """A frozen deep copy of `model` with RTN int8 / int4 Linear weights (the model itself is untouched)."""
    q = copy.deepcopy(model).eval()
    for p in q.parameters():
        p.requires_grad_(False)
    n = quantize_weights(q, bits, group_size)
    if n == 0:
        raise ValueError("the model has no quantisable nn.Linear layer (all are heads or tied to embeddings)")
    return q
