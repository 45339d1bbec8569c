"""Weight quantisation attacks in the formats models ship in: Linear weights quantised, then dequantised in place.

The attack of Zhang et al. (2024, "Catastrophic failure of LLM unlearning via quantization", arXiv 2410.16454)
works through the rounding grid alone: what must be exact is which values each weight can take. So every scheme
here is fake quantisation in float32 (quantise -> dequantise), which computes what a weight-only kernel computes
(dequantised weights times float activations) up to float summation order, on any device, with no kernel package.
The paper's released code loads models with bitsandbytes `BitsAndBytesConfig(load_in_4bit=True)`: FP4, blocks of
64, no double quantisation; NF4 is the other bitsandbytes 4-bit type. bitsandbytes is not a dependency: its tables
and decision pivots are written out below, with their source.

Schemes (SCHEMES, by name):
  rtn_int8   obliviate's RTN grid: symmetric per output row, scale = max|w_row| / 127,
             q = clamp(round(w / scale), -128, 127)
  rtn_int4   obliviate's RTN grid: asymmetric, groups of `group_size` input columns per row, scale = (max - min) / 15,
             zero = round(-min / scale), q = clamp(round(w / scale) + zero, 0, 15), w' = (q - zero) * scale
  nf4, fp4   bitsandbytes 4-bit: the weight flattened row-major, blocks of `blocksize` (64) consecutive values (a
             last partial block is its own block), absmax per block in float32, each value * (1 / absmax) mapped
             to a level of the 16-entry table by the CUDA kernel's decision tree, w' = level * absmax. The tree's
             pivots are midpoints between neighbouring levels and a value equal to a pivot takes the level BELOW it
             (`x > pivot` goes up): NF4 on the signed value; FP4 (sign-magnitude) on |x| with the sign put back, so
             an FP4 tie goes toward zero. NF4's pivots are the float32 midpoints; FP4's are the kernel's literals,
             within 4e-7 of the midpoints. bitsandbytes' pure-torch CPU backend uses `bucketize` on signed values
             instead: it agrees except for a negative FP4 value exactly on a pivot. A zero block stays zero.
  gguf_q8_0  llama.cpp GGUF Q8_0 by the `gguf` package: blocks of 32 along each row, d = max|x| / 127,
             q = round-half-away(x * (1 / d)), w' = q * float16(d)
  gguf_q4_0  llama.cpp GGUF Q4_0 by the `gguf` package: blocks of 32 along each row, m = the block's value of
             largest |x| (sign kept), d = m / -8, q = min(15, trunc(x * (1 / d) + 8.5)), w' = (q - 8) * float16(d)
A weight whose rows are not a multiple of 32 cannot be written in a GGUF block type; llama.cpp's converter
(convert_hf_to_gguf.py) then stores it as F16, and so do we (`unfit_layers` lists them). The installed gguf
package (0.19) quantises in Python only F16/BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0 and MXFP4: every
k-quant (Q2_K ... Q6_K) and i-quant raises NotImplementedError, so none is offered here.

Quantised: the nn.Linear weights of the model, except an output head (and any Linear whose weight is tied to the
input embedding); embeddings, norms and biases stay in full precision. (llama.cpp's Q4_0 files also quantise the
head, to Q6_K by default; bitsandbytes leaves it unquantised, and so do we for every scheme.)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

BNB_BLOCKSIZE = 64  # bitsandbytes' default 4-bit blocksize (Linear4bit / quantize_4bit)
GGUF_BLOCK = 32  # values per Q8_0 / Q4_0 block, along a row

# NF4: bitsandbytes `functional.get_4bit_type("nf4")` (= csrc/kernels.cu `nf4_dequantization_lut`), the normal-float
# table of Dettmers et al. 2023 (QLoRA, arXiv 2305.14314); code i (0..15) decodes to NF4_LEVELS[i], ascending.
NF4_LEVELS: tuple[float, ...] = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
# FP4: bitsandbytes' e2m1 code table `get_4bit_type("fp4")` = [0, 0.0625, 8, 12, 4, 6, 2, 3] (and the same negated
# for codes 8..15), divided by its max 12 (csrc/kernels.cu `fp4_dequantization_lut`); in code order 0b000..0b111.
FP4_MAGNITUDES: tuple[float, ...] = tuple(v / 12.0 for v in (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0))
# csrc/kernels.cu `dQuantizeFP4`: the pivots its decision tree compares |x| with (`x > pivot` -> the upper level).
FP4_PIVOTS: tuple[float, ...] = (0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333)


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


def _blocks_absmax(w: Tensor, blocksize: int) -> tuple[Tensor, Tensor]:
    """w flattened row-major into [n_blocks, blocksize] float32 (last block zero-padded), and absmax [n_blocks, 1]."""
    if blocksize < 1:
        raise ValueError(f"blocksize must be >= 1, got {blocksize}")
    x = w.detach().float().reshape(-1)
    x = torch.nn.functional.pad(x, (0, (-x.numel()) % blocksize))  # zeros never raise a block's absmax
    blocks = x.reshape(-1, blocksize)
    return blocks, blocks.abs().amax(dim=1, keepdim=True)


def _bnb_dequantized(w: Tensor, absmax: Tensor, levels: Tensor) -> Tensor:
    """levels [n_blocks, blocksize] times the block absmax, cut back to w's shape and dtype."""
    return (levels * absmax).reshape(-1)[: w.numel()].reshape(w.shape).to(w.dtype)


def _scaled(blocks: Tensor, absmax: Tensor) -> Tensor:
    """Each value times 1 / absmax (as the kernel does: one reciprocal per block); a zero block scales to 0."""
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    return blocks * inv


def nf4(w: Tensor, blocksize: int = BNB_BLOCKSIZE) -> Tensor:
    """bitsandbytes NF4, absmax blocks of `blocksize` over the row-major flattened weight, dequantised: any shape."""
    blocks, absmax = _blocks_absmax(w, blocksize)
    table = torch.tensor(NF4_LEVELS, dtype=torch.float32, device=blocks.device)
    pivots = (table[:-1] + table[1:]) / 2  # = the kernel's dQuantizeNF4 pivots in float32
    idx = torch.searchsorted(pivots, _scaled(blocks, absmax).contiguous())  # pivots < x: equal to a pivot goes down
    return _bnb_dequantized(w, absmax, table[idx])


def fp4(w: Tensor, blocksize: int = BNB_BLOCKSIZE) -> Tensor:
    """bitsandbytes FP4 (e2m1, sign-magnitude) with absmax blocks of `blocksize`, dequantised: any shape."""
    blocks, absmax = _blocks_absmax(w, blocksize)
    s = _scaled(blocks, absmax)
    magnitudes = torch.tensor(sorted(FP4_MAGNITUDES), dtype=torch.float32, device=blocks.device)
    pivots = torch.tensor(FP4_PIVOTS, dtype=torch.float32, device=blocks.device)
    idx = torch.searchsorted(pivots, s.abs().contiguous())
    levels = torch.where(s < 0, -magnitudes[idx], magnitudes[idx])
    return _bnb_dequantized(w, absmax, levels)


def gguf_roundtrip(w: Tensor, qtype: str) -> Tensor:
    """GGUF `qtype` (a gguf.GGMLQuantizationType name) quantised and dequantised by the gguf package along the last
    dim: [..., in] -> same shape and dtype; in must be a multiple of the type's block size (else gguf.QuantError)."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    a = w.detach().float().cpu().contiguous().numpy()
    back = gguf.quants.dequantize(gguf.quants.quantize(a, kind), kind)
    return torch.from_numpy(back.reshape(a.shape).copy()).to(device=w.device, dtype=w.dtype)


@dataclass(frozen=True)
class Scheme:
    """One quantisation format: its name, a one-line description, and w -> dequantised w (same shape and dtype)."""

    name: str
    describe: str
    apply: Callable[[Tensor, int, int], Tensor]  # (w, group_size, blocksize) -> w'
    row_block: int = 0  # > 0: rows must be a multiple of it, else the weight is stored as float16 instead

    def fits(self, w: Tensor) -> bool:
        """Whether `w`'s rows can be written in this format (always, unless row_block is set)."""
        return not self.row_block or w.shape[-1] % self.row_block == 0


SCHEMES: dict[str, Scheme] = {
    "rtn_int8": Scheme("rtn_int8", "obliviate's RTN grid: int8 symmetric per output row",
                       lambda w, g, b: rtn_int8(w)),
    "rtn_int4": Scheme("rtn_int4", "obliviate's RTN grid: int4 asymmetric, groups of group_size input columns",
                       lambda w, g, b: rtn_int4(w, g)),
    "nf4": Scheme("nf4", "bitsandbytes NF4: normal-float levels, absmax blocks of 64 (QLoRA)",
                  lambda w, g, b: nf4(w, b)),
    "fp4": Scheme("fp4", "bitsandbytes FP4: e2m1 levels, absmax blocks of 64 (load_in_4bit's default)",
                  lambda w, g, b: fp4(w, b)),
    "gguf_q8_0": Scheme("gguf_q8_0", "llama.cpp GGUF Q8_0: int8, float16 scale per block of 32",
                        lambda w, g, b: gguf_roundtrip(w, "Q8_0"), GGUF_BLOCK),
    "gguf_q4_0": Scheme("gguf_q4_0", "llama.cpp GGUF Q4_0: 4-bit, float16 scale per block of 32",
                        lambda w, g, b: gguf_roundtrip(w, "Q4_0"), GGUF_BLOCK),
}


def get_scheme(name: str) -> Scheme:
    """The scheme called `name`; an unknown name is a ValueError listing the valid ones."""
    if name not in SCHEMES:
        raise ValueError(f"unknown quantisation scheme {name!r}; valid: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def quantizable_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """(name, module) of every nn.Linear but the output head and any Linear sharing the input embedding's weight."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = emb.weight.data_ptr() if emb is not None else None
    out_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not out_head and m.weight.data_ptr() != tied]


def unfit_layers(model: torch.nn.Module, scheme: str) -> list[str]:
    """Names of the quantisable Linears whose rows `scheme` cannot hold (kept as float16 by quantize_weights)."""
    s = get_scheme(scheme)
    return [n for n, m in quantizable_linears(model) if not s.fits(m.weight)]


@torch.no_grad()
def quantize_weights(model: torch.nn.Module, scheme: str, group_size: int = 128,
                     blocksize: int = BNB_BLOCKSIZE) -> int:
    """Replace, in place, each quantisable Linear weight by its `scheme`-dequantised version (float16 where the
    scheme cannot hold its rows); returns how many weights were replaced."""
    s = get_scheme(scheme)
    layers = quantizable_linears(model)
    for _, m in layers:
        w = m.weight
        m.weight.copy_(s.apply(w, group_size, blocksize) if s.fits(w) else w.half().to(w.dtype))
    return len(layers)


def quantized_copy(model: Any, scheme: str, group_size: int = 128, blocksize: int = BNB_BLOCKSIZE) -> Any:
    """A frozen deep copy of `model` with `scheme`-quantised Linear weights (the model itself is untouched)."""
    get_scheme(scheme)
    q = copy.deepcopy(model).eval()
    for p in q.parameters():
        p.requires_grad_(False)
    n = quantize_weights(q, scheme, group_size, blocksize)
    if n == 0:
        raise ValueError("the model has no quantisable nn.Linear layer (all are heads or tied to embeddings)")
    return q
