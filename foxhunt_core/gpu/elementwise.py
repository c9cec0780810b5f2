"""Launch wrappers of elementwise.cu: the GLU, trunk and VSN activations forward and backward, the
network's augmented input and flat-buffer copies (a thread per element, four where rows allow)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import check_array
from .arrays import (
    F32,
    MAX_ELEMENTWISE,
    aligned16,
    augmented,
    elementwise_grid,
    glu_blocks,
    glu_output,
    matrix,
    rows_view,
    view_out,
)
from .launch import THREADS, i32, i64, output
from .launch import get_kernel as _kernel

Array = Any


def glu_forward(pv: Array, *, width: int | None = None, blocks: int = 1, h: Array | None = None) -> Array:
    """GLU over the joint layout: ``pv`` [B, 2H] is ``[u W_gate | u W_val]`` (one GEMM with the
    two weights side by side, biases included). Returns ``h = sigmoid(gate pre-activation) * value``
    [B, H], or with ``width`` > H the augmented ``[h, 0, ..., 0, 1]`` [B, width] (the input of a
    GEMM whose weight block keeps the bias in its last row). ``blocks`` branches side by side:
    ``pv`` [B, blocks 2H] gives ``h`` [B, blocks width]. ``pv`` and ``h`` may be views with any
    row pitch (column blocks of wider arrays)."""
    k = "glu_forward"
    B, H, ld_pv, W, h, ld_h = glu_output(k, pv, blocks, width, h)
    vec4 = H % 4 == 0 and W % 4 == 0 and ld_pv % 4 == 0 and ld_h % 4 == 0 and aligned16(pv, h)
    total = B * blocks * W
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (elementwise_grid(total // 4 if vec4 else total),), (THREADS,),
        (pv, i32(ld_pv), h, i32(ld_h), i64(total), i32(H), i32(W), i32(blocks)))
    return h


def glu_backward(dh: Array, pv: Array, *, blocks: int = 1, dpv: Array | None = None) -> Array:
    """Backward of :func:`glu_forward` from its input (the gate and value are recomputed, the
    forward keeps nothing else): ``dpv`` [B, blocks 2H] = ``[d gate pre-activation | d value]``
    per branch, with ``dpre = dh * val * gate * (1 - gate)``, ``dval = dh * gate``, from ``dh``
    [B, blocks H]. ``dpv=pv`` runs in place; every array may be a view with any row pitch."""
    k = "glu_backward"
    B, H, ld_pv = glu_blocks(k, pv, blocks)
    ld_dh = rows_view(k, "dh", dh, (B, blocks * H))
    dpv, ld_dpv = view_out(k, "dpv", dpv, (B, blocks * 2 * H))
    vec4 = H % 4 == 0 and ld_pv % 4 == 0 and ld_dh % 4 == 0 and ld_dpv % 4 == 0 and aligned16(dh, pv, dpv)
    total = B * blocks * H
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (elementwise_grid(total // 4 if vec4 else total),), (THREADS,),
        (dh, i32(ld_dh), pv, i32(ld_pv), dpv, i32(ld_dpv), i64(total), i32(H), i32(blocks)))
    return dpv


def bias_relu_forward(x: Array, bias: Array, *, out: Array | None = None) -> Array:
    """``relu(x + bias)`` for ``x`` [B, H] (the GEMM output), ``bias`` [H]; ``out=x`` runs in place."""
    k = "bias_relu_forward"
    B, H = matrix(k, "x", x)
    check_array(k, "bias", bias, F32, (H,))
    out = output(k, "out", out, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((elementwise_grid(total),), (THREADS,), (x, bias, out, i64(total), i32(H)))
    return out


def relu_backward(dy: Array, y: Array, *, addend: Array | None = None, out: Array | None = None) -> Array:
    """``(dy + addend) * (y > 0)`` from the ReLU's output ``y``; ``addend`` is optional."""
    k = "relu_backward"
    B, H = matrix(k, "dy", dy)
    check_array(k, "y", y, F32, (B, H))
    if addend is not None:
        check_array(k, "addend", addend, F32, (B, H))
    out = output(k, "out", out, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((elementwise_grid(total),), (THREADS,), (dy, y, addend, out, i64(total)))
    return out


def vsn_forward(
    h2: Array, mpre: Array, *, width: int | None = None, keep_rows: int | None = None,
    m: Array | None = None, z: Array | None = None, tf32: bool = False,
) -> tuple[Array | None, Array]:
    """Variable-selection mask: ``m = sigmoid(mpre)``, ``z = h2 * m``; returns ``(m, z)``.

    ``width`` > H gives the augmented ``z`` = ``[h2 * m, 0, ..., 0, 1]`` [B, width]. ``m`` is
    written for the first ``keep_rows`` rows (default all; the rows a backward will read) and
    is None for ``keep_rows=0``. With ``tf32`` z is written rounded to TF32, to nearest
    (:func:`.reference.tf32_nearest`): where only TF32 GEMMs read it, which round it so anyway,
    :func:`glu_gemm` then need not (its ``rounded``)."""
    k = "vsn_forward"
    B, H = matrix(k, "h2", h2)
    check_array(k, "mpre", mpre, F32, (B, H))
    keep = B if keep_rows is None else int(keep_rows)
    if not 0 <= keep <= B:
        raise ValueError(f"{k}: keep_rows {keep} outside 0..{B}")
    m = output(k, "m", m, (keep, H)) if keep else None
    z = augmented(k, "z", z, B, H, width)
    W = z.shape[1]
    vec4 = H % 4 == 0 and W % 4 == 0 and aligned16(h2, mpre, m, z)
    total = B * W
    _kernel("elementwise.cu", k + "_vec4" if vec4 else k)(
        (elementwise_grid(total // 4 if vec4 else total),), (THREADS,),
        (h2, mpre, m, z, i64(total), i32(H), i32(W), i32(keep), i32(bool(tf32))))
    return m, z


def vsn_backward(
    dz: Array, h2: Array, m: Array, *, dh2: Array | None = None, dmpre: Array | None = None, tf32: bool = False
) -> tuple[Array, Array]:
    """``(dh2, dmpre) = (dz * m, dz * h2 * m * (1 - m))`` — the mask's share of ``dh2`` and its
    pre-activation. ``dz`` may be a column block of a wider array (any row pitch). With ``tf32``
    dmpre is written rounded to TF32, to nearest (:func:`.reference.tf32_nearest`), for TF32 GEMMs
    to read as it is (:func:`linear_gemm_relu_backward`'s ``rounded``)."""
    k = "vsn_backward"
    B, H = matrix(k, "h2", h2)
    ld = rows_view(k, "dz", dz, (B, H))
    check_array(k, "m", m, F32, (B, H))
    dh2 = output(k, "dh2", dh2, (B, H))
    dmpre = output(k, "dmpre", dmpre, (B, H))
    total = B * H
    _kernel("elementwise.cu", k)((elementwise_grid(total),), (THREADS,),
                                 (dz, h2, m, dh2, dmpre, i64(total), i32(H), i32(ld), i32(bool(tf32))))
    return dh2, dmpre


def copy(dst: Array, src: Array) -> Array:
    """``dst[...] = src`` for 1-D float32 buffers of one size (flat parameter buffers): a float4
    kernel where both are 16-byte aligned and the size is a multiple of 4, else CuPy's copy."""
    k = "copy"
    check_array(k, "src", src, F32, (None,))
    check_array(k, "dst", dst, F32, src.shape)
    n = src.shape[0]
    if n % 4 or not aligned16(src, dst) or n >= 4 * MAX_ELEMENTWISE:
        dst[...] = src
        return dst
    _kernel("elementwise.cu", "copy_vec4")((elementwise_grid(n // 4),), (THREADS,), (src, dst, i64(n // 4)))
    return dst


def pack_rows(sources: Sequence[Array], width: int, *, out: Array | None = None) -> Array:
    """The rows of up to three [rows_i, S] sources one after another, each row augmented:
    ``[x, 0, ..., 0, 1]`` [sum rows_i, width] (``width`` > S; ``width`` = S copies them)."""
    k = "pack_rows"
    if not 1 <= len(sources) <= 3:
        raise ValueError(f"{k}: takes one to three sources, got {len(sources)}")
    S = None
    for i, x in enumerate(sources):
        check_array(k, f"sources[{i}]", x, F32, (None, S))
        S = x.shape[1]
    rows = [x.shape[0] for x in sources]
    R = sum(rows)
    out = augmented(k, "out", out, R, S, width)
    W = out.shape[1]
    xs = list(sources) + [sources[-1]] * (3 - len(sources))
    r1, r2 = rows[0], rows[0] + (rows[1] if len(rows) > 1 else R)
    total = R * W
    _kernel("elementwise.cu", k)((elementwise_grid(total),), (THREADS,),
                                 (xs[0], xs[1], xs[2], i32(r1), i32(min(r2, R)), out, i64(total), i32(S), i32(W)))
    return out

