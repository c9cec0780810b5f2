"""What a gate's fragment costs inside the fused GLU kernels, each kernel timed alone.

    python benchmarks/bench_gate_epilogue.py [--batches 4096 16384 65536] [--repeats 30]

For each batch size B, at the update's shapes (3 joint branches of 256 GLU units, the augmented z
of 260 columns, heads of 156 columns), the median µs per call replayed from a captured CUDA graph
(``bench_stack.graph_us``) of ``glu_gemm`` over the 2 B rows of the online forwards (h, and pv of
the first B rows) and of ``glu_backward_gemm`` over B rows (its gate parameters' gradients summed
by ``gate_terms_reduce`` included), for each gate:

- ``sigmoid``: the built-in gate (stage 0's kernels);
- ``tanh``: the tests' tanh gate (one parameter a unit);
- ``kan``: kan_gate's fragment (8 spline coefficients and a residual weight a unit).

Each row's ratio is against the sigmoid's time in the same run. The inputs are random and fixed;
the gates' parameters are their stages' initial values.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_stack import graph_us  # noqa: E402

H, WZ, WH, NH = 256, 260, 260, 156  # GLU units, z's width, h's width per branch, a head's width


def gates() -> dict[str, Any]:
    """name -> (the gate stage, its fragment) for every gate of the table."""
    from foxhunt_kan_gate.stage import KanGateStage

    from hook_plugins import TanhGateStage

    kan = KanGateStage()
    return {"sigmoid": (None, None), "tanh": (TanhGateStage(), TanhGateStage.fragment), "kan": (kan, kan.fragment)}


def launch(stage: Any, fragment: Any, backward: bool) -> Any:
    """The GateLaunch of ``fragment`` over the three joint branches with ``stage``'s initial
    parameters (what it reads derived from them, as a step does before its forwards) and, for a
    backward, arrays for their gradients; None for the sigmoid."""
    import cupy as cp
    import numpy as np

    from foxhunt_core.gpu.gate import branch_launch

    if fragment is None:
        return None
    params = {k: cp.asarray(v, dtype=cp.float32)
              for k, v in stage.init_params((H,) * 4, np.random.default_rng(0)).items()}
    grads = {k: cp.empty_like(v) for k, v in params.items()} if backward else None
    return branch_launch(stage, params, (1, 2, 3), grads)


def cases(B: int) -> dict[str, tuple[Any, Any]]:
    """kernel -> gate name -> the call, at batch size B."""
    import cupy as cp

    from foxhunt_core.gpu import kernels as K

    rng = cp.random.default_rng(0)
    R = 2 * B
    u = rng.standard_normal((R, WZ), dtype=cp.float32)
    w = rng.standard_normal((WZ, 6 * H), dtype=cp.float32) * 0.05
    wt = K.transpose(w)
    pv_f = cp.empty((B, 6 * H), cp.float32)
    h = cp.empty((R, 3 * WH), cp.float32)
    dadv = rng.standard_normal((B, 3 * NH), dtype=cp.float32)
    wo = K.round_tf32(rng.standard_normal((H, 3 * NH), dtype=cp.float32) * 0.05)
    pv_b0 = rng.standard_normal((B, 6 * H), dtype=cp.float32)
    pv_b = cp.empty_like(pv_b0)
    out: dict[str, dict[str, Any]] = {"glu_gemm (2B rows)": {}, "glu_backward_gemm (B rows)": {}}
    for name, (stage, fragment) in gates().items():
        fwd, bwd = launch(stage, fragment, False), launch(stage, fragment, True)
        out["glu_gemm (2B rows)"][name] = lambda g=fwd: K.glu_gemm(u, w, width=WH, blocks=3, h=h, pv=pv_f, wt=wt,
                                                                     gate=g)
        # pv is overwritten by its gradients: each call starts from the same pre-activations
        out["glu_backward_gemm (B rows)"][name] = lambda g=bwd: (
            pv_b.__setitem__(slice(None), pv_b0),
            K.glu_backward_gemm([dadv[:, NH * i:NH * (i + 1)] for i in range(3)],
                                [wo[:, NH * i:NH * (i + 1)] for i in range(3)], pv_b, gate=g))
    copy = {"pv copy (subtracted from the backward)": {"-": lambda: pv_b.__setitem__(slice(None), pv_b0)}}
    return {**out, **copy}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    os.environ.setdefault("CUPY_TF32", "1")
    for B in args.batches:
        table = cases(B)
        copy_us = graph_us(table.pop("pv copy (subtracted from the backward)")["-"], args.repeats)
        print(f"B = {B} (the backward's pv copy, {copy_us:.1f} µs, subtracted)")
        for kernel, by_gate in table.items():
            times = {g: graph_us(fn, args.repeats) - (copy_us if "backward" in kernel else 0.0)
                     for g, fn in by_gate.items()}
            base = times["sigmoid"]
            cells = ", ".join(f"{g} {t:.1f} ({t / base:.2f}x)" for g, t in times.items())
            print(f"  {kernel}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
