"""The ``gate_activation`` stage: the KAN spline gate of every GLU unit of every branch.

Parameters, per branch ``d`` (``W = adv_h`` units, ``K`` bases): ``b{d}.coeff`` [W, K], initialised
to the least-squares fit of the sigmoid (:func:`.spline.fit_sigmoid`), and ``b{d}.residual`` [W],
initialised to ``residual_init``. On CuPy float32 inputs the stage runs the CUDA kernels
(:mod:`.cuda`); otherwise the array-operation twin (:mod:`.gate`) on NumPy or CuPy. Its CUDA
fragment (:attr:`KanGateStage.fragment`, ``kernels/kan_fragment.cuh``) is what the core compiles
into its fused GLU kernels on the GPU; there the stage's own kernels run only on the slow path.
The fragment reads each branch's spline in the knot-power form (``b{d}.power``, derived from the
coefficients before each forward: :class:`KnotPower`; the fused backward takes its forward's) and
forms the coefficients' gradients (its terms in the knot-power basis, mapped back per unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core.stages import GateFragment

from .cuda import defines
from .gate import TwinCache, gate_backward, gate_forward
from .spline import Grid, SigmoidFit, fit_sigmoid, knot_power_map

Array = Any
Params = dict[str, Array]
FRAGMENT = Path(__file__).parent / "kernels" / "kan_fragment.cuh"


@lru_cache(maxsize=16)
def initial_fit(grid: Grid) -> SigmoidFit:
    """The sigmoid fit of ``grid`` (computed once per grid)."""
    return fit_sigmoid(grid)


def coeff_key(branch: int) -> str:
    return f"b{branch}.coeff"


@dataclass(frozen=True)
class KnotPower:
    """The fragment's ``derive``: every branch's coefficients in the knot-power form its kernels
    evaluate (``b{d}.power``, :func:`.spline.knot_power_map`). On CuPy float32 arrays one
    ``kan_power`` launch per width (the branches of one width together); otherwise the product
    in float64, in the coefficients' dtype."""

    grid: Grid

    def __call__(self, xp: Any, params: Params) -> Params:
        keys = sorted(k for k in params if k.endswith(".coeff"))
        coeffs = [params[k] for k in keys]
        out: Params = {}
        on_gpu = getattr(xp, "__name__", "") == "cupy" and all(
            c.dtype == np.float32 and c.ndim == 2 and c.flags.c_contiguous for c in coeffs)
        if on_gpu:
            from .cuda import power_cuda

            for width in sorted({int(c.shape[0]) for c in coeffs}):
                ks = [k for k, c in zip(keys, coeffs) if int(c.shape[0]) == width]
                out.update(zip(ks, power_cuda(self.grid, [params[k] for k in ks])))
        else:
            m = xp.asarray(knot_power_map(self.grid))
            out = {k: (c.astype(np.float64) @ m).astype(c.dtype) for k, c in zip(keys, coeffs)}
        return {k[: -len(".coeff")] + ".power": v for k, v in out.items()}


def residual_key(branch: int) -> str:
    return f"b{branch}.residual"


@dataclass(frozen=True)
class CudaCache:
    """The forward's cache on the kernel path: the kernels recompute everything else from ``pre``."""

    pre: Array


@dataclass(frozen=True)
class KanGateStage:
    """``gate = clamp(spline(pre) + r * pre, 0, 1)`` per unit (plan Task 4, defects 1-3 fixed)."""

    grid: Grid = field(default_factory=Grid)
    residual_init: float = 0.0
    use_cuda_kernels: bool = True
    name: str = "kan_gate"

    @property
    def fragment(self) -> GateFragment | None:
        """The gate as the core's GLU kernels compile it in (None with ``use_cuda_kernels`` off:
        the array-operation twin, per branch, on the slow path)."""
        if not self.use_cuda_kernels:
            return None
        defs = defines(self.grid)
        return GateFragment(str(FRAGMENT), arrays=("b{d}.coeff", "b{d}.residual"),
                            unit_floats=(self.grid.num_bases, 1),
                            defines=tuple((k, defs[k]) for k in ("KG_NUM_BASES", "KG_GRID_LO", "KG_GRID_HI",
                                                                 "KG_POWER_MAP")),
                            forward_arrays=("b{d}.power", "b{d}.residual"),
                            backward_arrays=("b{d}.power", "b{d}.residual"), derive=KnotPower(self.grid))

    def init_params(self, widths: tuple[int, ...], rng: np.random.Generator) -> Params:
        c = initial_fit(self.grid).coefficients
        out: Params = {}
        for d, w in enumerate(widths):
            out[coeff_key(d)] = np.tile(c, (w, 1))
            out[residual_key(d)] = np.full(w, float(self.residual_init))
        return out

    def on_kernels(self, xp: Any, pre: Array, coeff: Array, residual: Array) -> bool:
        """Whether these arrays take the CUDA kernels (CuPy float32, kernels not switched off)."""
        return (self.use_cuda_kernels and getattr(xp, "__name__", "") == "cupy" and pre.ndim == 2
                and all(a.dtype == np.float32 for a in (pre, coeff, residual)))

    def forward(self, xp: Any, params: Params, branch: int, pre: Array) -> tuple[Array, Any]:
        coeff, res = params[coeff_key(branch)], params[residual_key(branch)]
        if self.on_kernels(xp, pre, coeff, res):
            from .cuda import forward_cuda

            pre = xp.ascontiguousarray(pre)
            return forward_cuda(self.grid, xp.ascontiguousarray(coeff), xp.ascontiguousarray(res), pre), CudaCache(pre)
        return gate_forward(xp, self.grid, coeff, res, pre)

    def backward(self, xp: Any, params: Params, branch: int, cache: Any, dgate: Array) -> tuple[Array, Params]:
        coeff, res = params[coeff_key(branch)], params[residual_key(branch)]
        if isinstance(cache, CudaCache):
            from .cuda import backward_cuda

            dpre, dc, dr = backward_cuda(self.grid, xp.ascontiguousarray(coeff), xp.ascontiguousarray(res),
                                         cache.pre, xp.ascontiguousarray(dgate, dtype=np.float32))
        elif isinstance(cache, TwinCache):
            dpre, dc, dr = gate_backward(xp, self.grid, coeff, res, cache, dgate)
        else:
            raise TypeError(f"kan_gate: backward got a {type(cache).__name__} cache, not one of its forward's")
        return dpre, {coeff_key(branch): dc, residual_key(branch): dr}
