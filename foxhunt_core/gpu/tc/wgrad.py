"""Launch wrappers of wgrad_gemm.cu: weight gradients over the batch on the TF32 tensor cores, the
batch split over the SMs and the slices summed in order (wgrad_gemm; wgrad_gemm_sets for up to
four at once, the batch-major input transposed in shared memory)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import tma
from ..arrays import F32, elementwise_grid, rows_view, view_out
from ..defines import value
from ..launch import THREADS, i32, sm_count
from ..launch import get_kernel as _kernel
from .common import GLU_GEMM_BOX_K, GLU_GEMM_ROWS, SMEM_LIMIT, TILE_A, glu_gemm_supported, opt_in_smem, tc_operands

Array = Any
WGRAD_GEMM_ROWS = value("WG_ROWS")  # wgrad_gemm.cu's N per tile: one wgmma of 256 columns and one of 8
WGRAD_GEMM_BOX_ROWS = value("WG_BOX_ROWS")  # xt's rows per TMA box
WGRAD_GEMM_STAGES = value("WG_STAGES")
WGRAD_GEMM_THREADS = value("WG_THREADS")  # two consumer warpgroups and the producer's
WGRAD_GEMM_MIN_CHUNKS = 4  # each slice of the batch at least this many 32-row chunks


@dataclass(frozen=True)
class WgradRows:
    """The rows of xt that one wgrad_gemm tile takes (its wgmmas' N: 256 and a tail), as the
    kernel is compiled for them (``defines``; none for the table's)."""

    rows: int
    box_rows: int  # xt's rows per TMA box: a multiple of 8 (each box starts 1024-aligned)
    defines: tuple[tuple[str, int], ...] = ()


NARROW = WgradRows(WGRAD_GEMM_ROWS, WGRAD_GEMM_BOX_ROWS)  # the tail of 8: inputs of up to 264 columns
# The tail of 16: inputs of 265 to 272 columns (z with branch-input columns of the observation).
WIDE = WgradRows(value("WG_N") + 16, 136, (("WG_NT", 16), ("WG_ROWS", value("WG_N") + 16), ("WG_BOX_ROWS", 136)))
WGRAD_GEMM_MAX_ROWS = WIDE.rows


def wgrad_rows(n: int) -> WgradRows:
    """The variant of wgrad_gemm for a layer input of ``n`` columns (257 to 272)."""
    return NARROW if n <= NARROW.rows else WIDE


@dataclass(frozen=True)
class WgradGemmConfig:
    """How :func:`wgrad_gemm`'s kernels (and :func:`wgrad_gemm_sets`', built from the same file) are
    built: wgrad_gemm's shared-memory stages (the table's four)."""

    stages: int = WGRAD_GEMM_STAGES

    def __post_init__(self) -> None:
        if self.stages < 3 or self.smem > SMEM_LIMIT:
            raise ValueError(f"wgrad_gemm: {self.stages} stages (at least 3) do not fit 227 KiB")

    @property
    def smem(self) -> int:
        """Bytes of shared memory of wgrad_gemm: its stages (16 KiB of y and 33 KiB of xt each), two
        mbarriers per stage, the 1024-byte alignment of the swizzled tiles."""
        return self.smem_for(NARROW)

    def smem_for(self, variant: WgradRows) -> int:
        """:attr:`smem` of the kernel built for ``variant``'s rows (34 KiB of xt a stage for WIDE)."""
        return self.stages * (TILE_A + variant.rows * GLU_GEMM_BOX_K * 4) + 16 * self.stages + 1024


def wgrad_gemm_supported(n: int | None = None) -> bool:
    """Whether :func:`wgrad_gemm` runs on the current device (as :func:`glu_gemm_supported`) and,
    given ``n``, for a layer input that wide: more than 256 and at most 272 columns (one tile: the
    network's augmented z is 260, 268 with tlob_inject's columns). :func:`wgrad_gemm_sets` takes up
    to 264."""
    return glu_gemm_supported() and (n is None or 256 < n <= WGRAD_GEMM_MAX_ROWS)


def wgrad_splits(K: int, M: int, sets: int = 1) -> tuple[int, int]:
    """``(splits, k_split)``: the slices of the batch ``K`` (``k_split`` rows each, a multiple of
    32; the last may be shorter) for ``M`` output columns of each of ``sets`` products, so that the
    CTAs (128 columns of one set by one slice each) fill the device's SMs about once."""
    tiles, chunks = sets * -(-M // GLU_GEMM_ROWS), -(-K // GLU_GEMM_BOX_K)
    splits = max(1, min(max(1, chunks // WGRAD_GEMM_MIN_CHUNKS), round(sm_count() / tiles)))
    k_split = -(-chunks // splits) * GLU_GEMM_BOX_K
    return -(-K // k_split), k_split


def wgrad_gemm(xt: Array, y: Array, *, out: Array | None = None, zero_rows: tuple[int, int] = (0, 0),
               keep_cols: tuple[int, int] = (0, 0), config: WgradGemmConfig | None = None) -> Array:
    """A weight gradient over the batch: ``out`` [N, M] = ``xt @ y`` = ``x.T @ y`` on the TF32
    tensor cores (wgmma; see :func:`wgrad_gemm_supported`; both operands rounded to TF32 to
    nearest, as cuBLAS does, the products accumulated in float32), rows ``zero_rows`` then zero
    outside columns ``keep_cols``.

    ``xt`` [N, K]: the layer's input ``x`` [K, N] transposed and rounded to TF32
    (:func:`transpose`); ``y`` [K, M] the gradient of the layer's output; K the batch, split over
    the CTAs (:func:`wgrad_splits`) and the slices' partial sums added in a fixed order, so that the
    result does not depend on timing. ``xt`` and ``y`` (moved by TMA) may be views with row
    pitches of a multiple of 4 floats, 16-byte aligned; ``out`` (new when not given) any view.
    ``config``: how the kernel is built (:class:`WgradGemmConfig`)."""
    import cupy

    k = "wgrad_gemm"
    cfg = config if config is not None else WgradGemmConfig()
    tc_operands(k, "xt and y", (xt, y))
    N, K = xt.shape
    M = y.shape[1]
    if y.shape[0] != K:
        raise ValueError(f"{k}: xt has {K} columns but y has {y.shape[0]} rows")
    if not 256 < N <= WGRAD_GEMM_MAX_ROWS:
        raise ValueError(f"{k}: xt needs more than 256 and at most {WGRAD_GEMM_MAX_ROWS} rows, got {N}")
    if K % 4 or M % 4:
        raise ValueError(f"{k}: needs K and M multiples of 4; got K {K}, M {M}")
    if not (0 <= zero_rows[0] <= zero_rows[1] <= N and 0 <= keep_cols[0] <= keep_cols[1] <= M):
        raise ValueError(f"{k}: zero_rows {zero_rows} or keep_cols {keep_cols} outside [{N}, {M}]")
    rows_view(k, "xt", xt, (N, K))
    rows_view(k, "y", y, (K, M))
    out, ld_out = view_out(k, "out", out, (N, M))
    if M == 0:
        return out
    if K == 0:
        out[...] = 0.0
        return out
    variant = wgrad_rows(N)
    smem = cfg.smem_for(variant)
    if smem > SMEM_LIMIT:
        raise ValueError(f"{k}: {cfg.stages} stages of {variant.rows} rows do not fit 227 KiB")
    splits, k_split = wgrad_splits(K, M)
    tiles = -(-M // GLU_GEMM_ROWS)
    part = cupy.empty((splits, variant.rows, tiles * GLU_GEMM_ROWS), dtype=F32)
    map_y = tma.matrix_map(k, "y", y, GLU_GEMM_BOX_K, GLU_GEMM_BOX_K)
    map_xt = tma.matrix_map(k, "xt", xt, GLU_GEMM_BOX_K, variant.box_rows)
    defs = {"WG_STAGES": cfg.stages, **dict(variant.defines)}
    fn = _kernel("wgrad_gemm.cu", k, defs)
    opt_in_smem(fn, smem)
    fn((tiles * splits,), (WGRAD_GEMM_THREADS,), (map_y, map_xt, part, i32(K), i32(M), i32(k_split), i32(tiles)),
       shared_mem=smem)
    _wgrad_reduce(part, [out], ld_out, splits, tiles, N, M, cfg, zero_rows, keep_cols, defs)
    return out


# wgrad_gemm.cu's OutSets: wgrad_reduce's output pointers; WgradSets: wgrad_gemm_tx's tensor maps.
WGRAD_SETS = value("WT_SETS")
OUT_SETS = np.dtype([("out", np.uint64, (WGRAD_SETS,))])
WGRAD_SETS_ARGS = np.dtype([("maps", np.uint64, (2 * WGRAD_SETS, 16))])
WGRAD_GEMM_TX_STAGES = value("WT_STAGES")


def _wgrad_reduce(part: Array, outs: Sequence[Array], ld_out: int, splits: int, tiles: int, N: int, M: int,
                  cfg: WgradGemmConfig, zero_rows: tuple[int, int] = (0, 0),
                  keep_cols: tuple[int, int] = (0, 0), defines: dict | None = None) -> None:
    """wgrad_reduce: each set's slices of the batch summed in order into its output (``part``'s
    rows per split as the kernel of ``defines`` wrote them)."""
    ptrs = np.zeros(1, dtype=OUT_SETS)
    for i, o in enumerate(outs):
        ptrs["out"][0, i] = o.data.ptr
    _kernel("wgrad_gemm.cu", "wgrad_reduce", defines or {"WG_STAGES": cfg.stages})(
        (elementwise_grid(len(outs) * N * M),), (THREADS,),
        (part, i32(len(outs)), i32(splits), i32(tiles * GLU_GEMM_ROWS), ptrs, i32(ld_out), i32(N), i32(M),
         i32(zero_rows[0]), i32(zero_rows[1]), i32(keep_cols[0]), i32(keep_cols[1])))


def wgrad_gemm_tx_smem() -> int:
    """Bytes of shared memory of wgrad_gemm_tx: its stages (16 KiB of y, 36 KiB of x as loaded: nine
    boxes of 32 columns), the two transposed buffers (33 KiB each), the mbarriers, the alignment
    (222 KiB in all)."""
    raw = -(-WGRAD_GEMM_ROWS // 32) * GLU_GEMM_BOX_K * 128
    return (WGRAD_GEMM_TX_STAGES * (TILE_A + raw) + 2 * WGRAD_GEMM_ROWS * GLU_GEMM_BOX_K * 4
            + 16 * WGRAD_GEMM_TX_STAGES + 1024)


def wgrad_gemm_sets(x: Sequence[Array], y: Sequence[Array], out: Sequence[Array], *,
                    config: WgradGemmConfig | None = None) -> list[Array]:
    """Up to :data:`WGRAD_SETS` weight gradients over the batch in one launch, ``out[b]`` [N, M] =
    ``x[b].T @ y[b]``, with ``x[b]`` [K, N] as the layer's input is (batch-major: the advantage
    heads' h, which no pass transposes) and ``y[b]`` [K, M]: as :func:`wgrad_gemm`, x transposed in
    shared memory by the kernel (``wgrad_gemm_tx``). Every matrix may be a view (x and y with row
    pitches of a multiple of 4 floats, 16-byte aligned; the outputs with one row pitch for all);
    256 < N <= 264, M a multiple of 4; ``config`` as for :func:`wgrad_gemm` (the kernels' file)."""
    import cupy

    k = "wgrad_gemm_tx"
    cfg = config if config is not None else WgradGemmConfig()
    sets = len(x)
    if not 1 <= sets <= WGRAD_SETS or len(y) != sets or len(out) != sets:
        raise ValueError(f"{k}: 1 to {WGRAD_SETS} sets of x, y and out, got {sets} x, {len(y)} y, {len(out)} out")
    tc_operands(k, "x, y and out", (*x, *y, *out))
    K, N = x[0].shape
    M = y[0].shape[1]
    if not 256 < N <= WGRAD_GEMM_ROWS:
        raise ValueError(f"{k}: x needs more than 256 and at most {WGRAD_GEMM_ROWS} columns, got {N}")
    if M % 4:
        raise ValueError(f"{k}: needs M a multiple of 4, got {M}")
    lds = set()
    for i in range(sets):
        rows_view(k, f"x[{i}]", x[i], (K, N))
        rows_view(k, f"y[{i}]", y[i], (K, M))
        lds.add(rows_view(k, f"out[{i}]", out[i], (N, M)))
    if len(lds) != 1:
        raise ValueError(f"{k}: the outputs need one row pitch, got {sorted(lds)}")
    if M == 0:
        return list(out)
    if K == 0:
        for o in out:
            o[...] = 0.0
        return list(out)
    splits, k_split = wgrad_splits(K, M, sets)
    tiles = -(-M // GLU_GEMM_ROWS)
    part = cupy.empty((sets, splits, WGRAD_GEMM_ROWS, tiles * GLU_GEMM_ROWS), dtype=F32)
    args = np.zeros(1, dtype=WGRAD_SETS_ARGS)
    for i in range(sets):
        args["maps"][0, i] = tma.matrix_map(k, f"y[{i}]", y[i], GLU_GEMM_BOX_K, GLU_GEMM_BOX_K)["opaque"][0]
        args["maps"][0, WGRAD_SETS + i] = tma.matrix_map(k, f"x[{i}]", x[i], GLU_GEMM_BOX_K,
                                                         GLU_GEMM_BOX_K)["opaque"][0]
    fn = _kernel("wgrad_gemm.cu", k, {"WG_STAGES": cfg.stages})
    smem = wgrad_gemm_tx_smem()
    opt_in_smem(fn, smem)
    fn((sets * tiles * splits,), (WGRAD_GEMM_THREADS,),
       (args, part, i32(K), i32(M), i32(k_split), i32(tiles), i32(splits)), shared_mem=smem)
    _wgrad_reduce(part, out, lds.pop(), splits, tiles, N, M, cfg)
    return list(out)

