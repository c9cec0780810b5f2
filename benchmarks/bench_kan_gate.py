"""Time kan_gate's standalone CUDA kernels against its CuPy array-operation twin, per branch.

    python benchmarks/bench_kan_gate.py [--batches 4096 16384 65536] [--width 256] [--repeats 100]

For each batch size B, on gate pre-activations [B, width] (one branch's GLU), the median over
``repeats`` (CUDA events, after warm-up) of: the forward (gate values), the backward (dpre and the
batch-reduced parameter gradients), each through the kernels (``foxhunt_kan_gate.cuda``) and
through the twin on CuPy (``KanGateStage(use_cuda_kernels=False)``), and, for scale, the sigmoid
of the same array. The update runs the gate four times forward per forward pass (one per branch)
and four times backward.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np


def _time(cp, fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` runs (CUDA events; three warm-up runs)."""
    for _ in range(3):
        fn()
    cp.cuda.get_current_stream().synchronize()
    out = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=100)
    args = ap.parse_args()

    import cupy as cp
    from foxhunt_kan_gate.stage import KanGateStage

    from foxhunt_core.net import layers as L

    rng = np.random.default_rng(0)
    fast, twin = KanGateStage(), KanGateStage(use_cuda_kernels=False)
    params = {k: cp.asarray(v + rng.normal(0, 0.05, v.shape), dtype=cp.float32)
              for k, v in fast.init_params((args.width,), rng).items()}
    print(f"| B | kernels fwd ms | kernels bwd ms | twin fwd ms | twin bwd ms | sigmoid ms |  (width {args.width})")
    print("|---|---|---|---|---|---|")
    for B in args.batches:
        pre = cp.asarray(rng.normal(0, 2, (B, args.width)), dtype=cp.float32)
        dgate = cp.asarray(rng.normal(size=(B, args.width)), dtype=cp.float32)
        cells = []
        for stage in (fast, twin):
            _, cache = stage.forward(cp, params, 0, pre)
            cells.append(_time(cp, lambda s=stage, x=pre: s.forward(cp, params, 0, x), args.repeats))
            cells.append(_time(cp, lambda s=stage, c=cache, g=dgate: s.backward(cp, params, 0, c, g), args.repeats))
        cells.append(_time(cp, lambda x=pre: L.sigmoid(x), args.repeats))
        print(f"| {B} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
