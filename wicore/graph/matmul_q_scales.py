"""MatMulQ's block scales and offsets in the fewest bytes that still give every float32 value exactly.

A GGUF keeps its block scales in float16 (Q8_0, Q5_0, Q4_0, Q4_1: `d`, `m`) or as a float16 a super-block
of 256 columns times a small integer a block (K-quants: Q4_K / Q5_K `d * sc` and `dmin * m` with 6-bit sc
and m, Q6_K `d * sc` with an int8 sc). BlockQuant (wicore/model/quant.py) holds them as float32 values,
some of them sums: Q4_1's offset is 8 d + m, Q4_K's 8 d sc - dmin m, each rounded once to float32. Rather
than carry each GGUF type's fields through the transcoding, this module finds, for a whole tensor, an
encoding the kernel (kernels.h, MatMulQPacked) turns back into the same float32 bits, and checks every
value:

    encoding       the kernel computes, in float32               bytes a block (bs 32)    found for
    half           v = half                                      2                        d of Q8_0, Q5_0, Q4_0, Q4_1
    super x int8   v = half[super] * int8                        1 + 2 / blocks_per_super  d sc (Q4_K, Q5_K, Q6_K)
    (offsets)      o = c * scale + the above (c 8), or the       as above                 Q4_1: 8 d + m; Q4_K: 8 d sc - dmin m;
                   above alone (c 0)                                                      Q5_K: -dmin m

Every product is exact (an 11-bit significand times an 8-bit integer; c * scale with c a power of two),
so the only rounding is the offsets' one sum, which is the one the float32 offsets already had; a value
the search cannot match exactly leaves the whole array in float32 (`None`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUPER_COLUMNS = 256  # a K-quant super-block
OFFSET_SCALES = (0.0, 8.0)  # c of o = c * scale + m: the GGUF's own min, or Q4_1 / Q4_K's 8-code shift folded in


@dataclass(frozen=True)
class Narrow:
    """Values [rows, blocks] as half [rows, blocks] (ints None) or half [rows, supers] x ints [rows, blocks]."""

    half: np.ndarray  # float16
    ints: np.ndarray | None  # int8
    blocks_per_super: int

    def values(self, base: np.ndarray | None = None) -> np.ndarray:
        """What the kernel computes: half (x ints), each product exact, plus float32 `base` where given (one
        rounding; the kernel adds none where the offsets' c is 0, so a -0.0 stays -0.0)."""
        half = self.half.astype(np.float32)
        term = half if self.ints is None else np.repeat(half, self.blocks_per_super, axis=1) * self.ints.astype(np.float32)
        return term if base is None else np.asarray(base, np.float32) + term


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit-equal float32 (a zero's sign included)."""
    return np.asarray(a, np.float32).view(np.uint32) == np.asarray(b, np.float32).view(np.uint32)


def _halves(target: np.ndarray, base: np.ndarray | None) -> np.ndarray | None:
    """fp16 h [rows, blocks] with float32 (base +) h == target exactly, trying the nearest fp16 to target -
    base and its two neighbours; None where some block has none."""
    guess = (target if base is None else target - base).astype(np.float16)
    best = np.zeros_like(guess)
    found = np.zeros(guess.shape, bool)
    with np.errstate(over="ignore", invalid="ignore"):
        for h in (guess, np.nextafter(guess, np.float16(np.inf)), np.nextafter(guess, np.float16(-np.inf))):
            value = h.astype(np.float32) if base is None else base + h.astype(np.float32)
            ok = ~found & np.isfinite(h) & _same(value, target)
            best[ok] = h[ok]
            found |= ok
    return best if found.all() else None


def _supers(target: np.ndarray, base: np.ndarray | None, per: int) -> tuple[np.ndarray, np.ndarray] | None:
    """fp16 D [rows, supers] and int8 t [rows, blocks] with float32 (base +) D t == target exactly, or None.

    Per super-block, D comes from its block of largest |target - base| (the anchor) divided by each t in
    ±128 .. ±1 (rounded to fp16), the other blocks' t by division; the first D that matches all is kept."""
    rows, blocks = target.shape
    shape = (rows * blocks // per, per)
    want = target.reshape(shape)
    b = None if base is None else base.reshape(shape)
    left = (want if b is None else want - b).astype(np.float64)
    anchor = left[np.arange(shape[0]), np.abs(left).argmax(1)]
    d_out = np.zeros(shape[0], np.float16)
    t_out = np.zeros(shape, np.int8)
    zero = np.zeros_like(want) if b is None else b + np.float32(0)
    todo = np.flatnonzero(~_same(zero, want).all(1))  # all-zero terms: D = 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for t in [*range(128, 0, -1), *range(-1, -129, -1)]:
            if todo.size == 0:
                break
            d = (anchor[todo] / t).astype(np.float16)
            d32 = d.astype(np.float32)[:, None]
            ints = np.rint(left[todo] / d32)
            ok = np.isfinite(d32[:, 0]) & (d32[:, 0] != 0) & (np.abs(ints) <= 128).all(1) & (ints <= 127).all(1)
            ints = np.where(np.isfinite(ints), ints, 0).astype(np.int8)
            term = d32 * ints.astype(np.float32)
            ok &= _same(term if b is None else b[todo] + term, want[todo]).all(1)
            d_out[todo[ok]] = d[ok]
            t_out[todo[ok]] = ints[ok]
            todo = todo[~ok]
    if todo.size:
        return None
    return d_out.reshape(rows, blocks // per), t_out.reshape(rows, blocks)


def narrow(values: np.ndarray, block_size: int, base: np.ndarray | None = None) -> Narrow | None:
    """The smallest exact encoding of float32 values [rows, blocks] (over `base`, float32, for offsets)."""
    target = np.asarray(values, np.float32)
    b = None if base is None else np.asarray(base, np.float32)
    blocks = target.shape[1]
    per = SUPER_COLUMNS // block_size
    if blocks % per == 0:
        found = _supers(target, b, per)
        if found is not None:
            return Narrow(found[0], found[1], per)
    half = _halves(target, b)
    return None if half is None else Narrow(half, None, 0)


def narrow_offsets(offsets: np.ndarray, scales: np.ndarray, block_size: int) -> tuple[float, Narrow] | None:
    """(c, m) with offsets == c * scales + m exactly (m narrow), c from OFFSET_SCALES, or None."""
    for c in OFFSET_SCALES:
        base = np.float32(c) * np.asarray(scales, np.float32) if c else None
        found = narrow(offsets, block_size, base)
        if found is not None:
            return c, found
    return None
