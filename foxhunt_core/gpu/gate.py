"""A gate's CUDA fragment in the GLU kernels: what a launch passes (:class:`GateLaunch`), and the
launch wrappers of gate_glu.cu (the elementwise GLU forward and backward for such a gate, the sums
of its parameter gradients).

The fragment (:class:`foxhunt_core.stages.GateFragment`) is compiled into ``glu_gemm``,
``glu_backward_gemm`` and the kernels here through ``gate.cuh``: the launch names its header
(``GATE_HEADER``) and passes, per branch of the launch, the addresses of the gate's parameter
arrays and, for a backward, of their gradients. The built-in sigmoid is the kernels' default:
its launches carry no define, so that stage 0 compiles exactly as it always has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..stages import GateFragment
from .arrays import F32, elementwise_grid, glu_blocks, glu_output, rows_view, view_out
from .defines import value
from .launch import KERNEL_DIR, THREADS, blocks_for, i32
from .launch import get_kernel as _kernel

Array = Any
GATE_MAX_SETS = value("GATE_MAX_SETS")
GG_UNIT_TILE, GG_ROW_THREADS, GG_ROW_BATCH = value("GG_UNIT_TILE"), value("GG_ROW_THREADS"), value("GG_ROW_BATCH")
GT_ROW_THREADS = value("GT_ROW_THREADS")
GATE_ARGS = np.dtype([("p", np.uint64, (GATE_MAX_SETS, 2)), ("g", np.uint64, (GATE_MAX_SETS, 2))])
BUILT_IN = str((KERNEL_DIR / "gate_sigmoid.cuh").resolve())
TARGET_BLOCKS = 1024  # gate_glu_backward's blocks to aim for (several an SM: the kernel waits on memory)


def rows_per_chunk(rows: int, units: int) -> int:
    """gate_glu_backward's rows per block (its partial sums: a row each): enough blocks to keep
    the memory busy, each thread at least one batch of GG_ROW_BATCH rows, chunks of whole batches."""
    step = GG_ROW_THREADS * GG_ROW_BATCH
    tiles = -(-units // GG_UNIT_TILE)
    chunks = max(1, -(-TARGET_BLOCKS // tiles))
    per = -(-rows // chunks)
    return max(step, -(-per // step) * step)


def built_in(fragment: GateFragment | None) -> bool:
    """Whether ``fragment`` is the kernels' default gate (the sigmoid) or none."""
    return fragment is None or str(Path(fragment.header).resolve()) == BUILT_IN


@dataclass(frozen=True)
class GateLaunch:
    """A gate fragment with the parameters one launch reads: ``params[s]`` the arrays
    (``fragment.arrays``) of the launch's branch ``s``; for a backward, ``grads[s]`` where their
    gradients go (arrays of the same shapes, written, not accumulated). ``stage``, ``tree``,
    ``grad_tree`` and ``branches`` say the same as the gate stage, its parameter tree, the tree of
    its gradients and the network's branches of the launch: what the kernels' NumPy twins
    (:mod:`.reference`) compute with (:func:`branch_launch` fills both)."""

    fragment: GateFragment
    params: tuple[tuple[Array, ...], ...] = ()
    grads: tuple[tuple[Array, ...], ...] | None = None
    stage: Any = None
    tree: dict | None = None
    grad_tree: dict | None = None
    branches: tuple[int, ...] = ()

    @property
    def terms(self) -> int:
        return self.fragment.terms

    def check_forward(self, k: str) -> None:
        """Refuse a backward's launch (the parameters) in a forward kernel of a fragment whose
        forward reads other arrays."""
        if self.grads is not None and self.fragment.forward_arrays is not None:
            raise ValueError(f"{k}: the gate's forward reads {self.fragment.forward_arrays}, not its parameters: "
                             "pass a forward's launch (branch_launch without grads)")

    def compile_options(self) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The defines and include directories of a kernel built with this gate."""
        f = self.fragment
        if built_in(f):
            return {}, ()
        header = Path(f.header).resolve()
        units = (*f.unit_floats, 0, 0)[:2]
        defs = {"GATE_HEADER": f'"{header.name}"', "GATE_EXPECT_UNIT0": units[0], "GATE_EXPECT_UNIT1": units[1],
                **dict(f.defines)}
        return defs, (str(header.parent), *f.include)

    def args(self, k: str, sets: int, units: int) -> np.ndarray:
        """The kernel argument (gate.cuh's GateArgs) for ``sets`` branches of ``units`` units each,
        the arrays checked."""
        out = np.zeros(1, dtype=GATE_ARGS)
        f = self.fragment
        if not f.arrays:
            return out
        if sets > GATE_MAX_SETS:
            raise ValueError(f"{k}: a gate with parameters takes up to {GATE_MAX_SETS} branches a launch, got {sets}")
        for what, per_set in (("params", self.params), ("grads", self.grads)):
            if per_set is None:
                continue
            if len(per_set) != sets:
                raise ValueError(f"{k}: the gate's {what} for {len(per_set)} branches, the launch has {sets}")
            for s, arrays in enumerate(per_set):
                if len(arrays) != len(f.arrays):
                    raise ValueError(f"{k}: branch {s}'s gate {what}: {len(arrays)} arrays, the fragment reads "
                                     f"{len(f.arrays)}")
                names = f.arrays if what == "grads" else f.forward_names if self.grads is None else f.backward_names
                for a, (name, u) in enumerate(zip(names, f.unit_floats)):
                    x = arrays[a]
                    d = self.branches[s] if len(self.branches) == sets else s  # (the network's branch)
                    _unit_array(k, f"gate {what} {name.format(d=d)}", x, units, u)
                    out["p" if what == "params" else "g"][0, s, a] = x.data.ptr
        return out


def _unit_array(k: str, name: str, x: Array, units: int, floats: int) -> None:
    import cupy

    shape = (units,) if floats == 1 and getattr(x, "ndim", 0) == 1 else (units, floats)
    if not isinstance(x, cupy.ndarray) or x.dtype != F32 or tuple(x.shape) != shape or not x.flags.c_contiguous:
        raise ValueError(f"{k}: {name} must be a C-contiguous float32 array of shape {list(shape)} "
                         f"(or [{units}] for one float a unit), got {getattr(x, 'dtype', type(x).__name__)} "
                         f"{list(getattr(x, 'shape', ()))}")


def gate_glu_forward(pv: Array, gate: GateLaunch, *, width: int | None = None, blocks: int = 1,
                     h: Array | None = None) -> Array:
    """:func:`~foxhunt_core.gpu.elementwise.glu_forward` with the gate of ``gate`` (its fragment,
    branch ``b`` of ``blocks`` reading ``gate.params[b]``): ``h = gate(pre) * value``, augmented
    to ``width`` columns per branch."""
    k = "gate_glu_forward"
    gate.check_forward(k)
    B, H, ld_pv, W, h, ld_h = glu_output(k, pv, blocks, width, h)
    defs, inc = gate.compile_options()
    if B:
        _kernel("gate_glu.cu", k, defs, inc)((elementwise_grid(B * blocks * W),), (THREADS,),
                                             (pv, i32(ld_pv), h, i32(ld_h), i32(B), i32(H), i32(W), i32(blocks),
                                              gate.args(k, blocks, H)))
    return h


def gate_glu_backward(dh: Array, pv: Array, gate: GateLaunch, *, blocks: int = 1, dpv: Array | None = None) -> Array:
    """:func:`~foxhunt_core.gpu.elementwise.glu_backward` with the gate of ``gate``: ``dpv``
    ``[dpre | dval]`` per branch (``dpv=pv`` in place), and the gate's parameter gradients into
    ``gate.grads`` (sums over the rows in a fixed order: the same bits on every run)."""
    import cupy

    k = "gate_glu_backward"
    B, H, ld_pv = glu_blocks(k, pv, blocks)
    ld_dh = rows_view(k, "dh", dh, (B, blocks * H))
    dpv, ld_dpv = view_out(k, "dpv", dpv, (B, blocks * 2 * H))
    T = gate.terms
    if T and gate.grads is None:
        raise ValueError(f"{k}: a gate with parameters needs gate.grads, where their gradients go")
    defs, inc = gate.compile_options()
    args = gate.args(k, blocks, H)
    units = blocks * H
    per = rows_per_chunk(B, units)
    chunks = max(1, -(-B // per))
    partial = cupy.empty((chunks, units, max(T, 1)), dtype=F32) if T else None
    if B:
        _kernel("gate_glu.cu", k, defs, inc)((-(-units // GG_UNIT_TILE), chunks), (GG_UNIT_TILE, GG_ROW_THREADS),
                                             (dh, i32(ld_dh), pv, i32(ld_pv), dpv, i32(ld_dpv), i32(B), i32(H),
                                              i32(blocks), args, partial, i32(per)))
    if T:
        if not B:
            partial.fill(0.0)
        _kernel("gate_glu.cu", "gate_glu_reduce", defs, inc)(
            (blocks_for(units * T, THREADS),), (THREADS,), (partial, i32(chunks), i32(H), i32(blocks), args))
    return dpv


def gate_terms_reduce(partial: Array, gate: GateLaunch, *, ctas: int, warps: int, tile_cols: int, H: int,
                      blocks: int) -> None:
    """The gate's parameter gradients (into ``gate.grads``) from ``glu_backward_gemm``'s partial
    sums ``[ctas, warps, terms, tile_cols]``, CTA ``c`` holding column tile ``c % col_tiles``."""
    k = "gate_terms_reduce"
    defs, inc = gate.compile_options()
    T = gate.terms
    if warps < 1 or GT_ROW_THREADS % warps:
        raise ValueError(f"{k}: the partial's warps per CTA ({warps}) must divide its {GT_ROW_THREADS} rows of threads")
    if tile_cols % GG_UNIT_TILE or H % tile_cols:
        raise ValueError(f"{k}: column tiles of {tile_cols} must hold whole blocks of {GG_UNIT_TILE} units "
                         f"and divide H = {H}")
    _kernel("gate_glu.cu", k, defs, inc)((-(-blocks * H // GG_UNIT_TILE), T), (GG_UNIT_TILE, GT_ROW_THREADS),
                                         (partial, i32(ctas), i32(warps), i32(tile_cols), i32(H), i32(blocks),
                                          gate.args(k, blocks, H)))


def branch_launch(stage: Any, params: dict, branches: Sequence[int], grads: dict | None = None,
                  reads: dict | None = None) -> GateLaunch:
    """The launch of the gate ``stage`` (its ``fragment``) over the network's ``branches`` (in
    order) with the gate's parameter tree ``params``. A forward's launch (no ``grads``) reads the
    fragment's forward arrays: ``reads`` (``fragment.forward_reads(xp, params)``, which a step
    derives once per forward and passes to every launch), derived here when not given. A
    backward's reads the fragment's backward arrays (the parameters, or from ``reads`` where it
    reads derived arrays: the fused backward passes its forward's) and writes the parameters'
    gradients into ``grads``, keyed like ``params``."""
    f = stage.fragment
    if grads is None:
        if reads is None:
            reads = f.forward_reads(_array_module(params), params)
        ps = tuple(f.branch_forward_arrays(reads, d) for d in branches)
        gs = None
    else:
        if f.backward_derives and reads is None:
            reads = f.forward_reads(_array_module(params), params)
        ps = tuple(f.branch_backward_arrays(reads if f.backward_derives else params, d) for d in branches)
        gs = tuple(f.branch_arrays(grads, d) for d in branches)
    return GateLaunch(f, ps, gs, stage, params, grads, tuple(branches))


def _array_module(tree: dict) -> Any:
    """CuPy for a tree of CuPy arrays, NumPy otherwise (the kernels' twins' launches)."""
    if any(type(a).__module__.startswith("cupy") for a in tree.values()):
        import cupy

        return cupy
    return np
