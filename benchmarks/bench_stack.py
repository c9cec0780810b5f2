"""How to run the GEMMs of the update's three forwards (online on s, online on s', target on s').

    python benchmarks/bench_stack.py [--batches 4096 16384 65536] [--repeats 20]

For each layer shape of the stage-0 network (a GLU alone, three GLUs side by side, an advantage
layer, the value head) and batch size B, the median µs of one layer over the 3 B rows, each
variant replayed from a captured CUDA graph (so small sizes are timed without launch overhead):

- ``stacked K+1``: one strided-batched GEMM over three parameter trees in one allocation, the
  bias in the weight block's last row met by the input's ones column (K = 256 -> 260);
- ``stacked bias``: the same with K = 256 and the bias in cuBLASLt's epilogue (batch stride);
- ``2 plain K+1`` / ``2 plain bias``: the online rows (2 B) in one GEMM, the target's (B) in
  another, as before the stacking;
- ``one tree``: the 3 B rows through one set of weights (no such shortcut exists for the update:
  a floor for comparison).

Each with cuBLASLt's heuristic choice, then with autotuning (``cublaslt.set_autotune``).

Then the backward's advantage-layer weight gradients of three branches ([260, B] x [B, 156] each):
three GEMMs (cuBLAS may split their long K = B reduction) against one strided-batched GEMM
(which it never splits).
"""

from __future__ import annotations

import argparse
import statistics


def graph_us(fn, repeats: int, inner: int = 10) -> float:
    """Median µs of ``fn`` over ``repeats`` replays of a graph that runs it ``inner`` times."""
    import cupy as cp

    fn()  # plans made (and tuned, when autotuning) outside the capture
    cp.cuda.get_current_stream().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(inner):
            fn()
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(repeats):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / inner)
    return statistics.median(times)


def variants(B: int, K: int, N: int):
    """``{name: fn}`` of the ways to run a [3B, K] x [K, N] layer over three parameter trees."""
    import cupy as cp

    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu.flat import FlatTree

    trees = FlatTree.stacked(3, {"core": {"w": (K + 4, N), "b": (N,)}}, xp=cp)
    for t in trees:
        t.buffer[...] = cp.random.standard_normal(t.size, dtype=cp.float32) * 0.05
    stride = trees[0].size
    w, b = trees[0].tree["core"]["w"], trees[0].tree["core"]["b"]
    wt, bt = trees[2].tree["core"]["w"], trees[2].tree["core"]["b"]
    x = cp.random.standard_normal((3 * B, K + 4), dtype=cp.float32)
    out = cp.empty((3 * B, N), dtype=cp.float32)
    return {
        "stacked K+1": lambda: cublas.matmul(x, w, out=out, stack=(3, stride)),
        "stacked bias": lambda: cublas.matmul(x[:, :K], w[:K], out=out, bias=b, stack=(3, stride)),
        "2 plain K+1": lambda: (cublas.matmul(x[: 2 * B], w, out=out[: 2 * B]),
                                cublas.matmul(x[2 * B:], wt, out=out[2 * B:])),
        "2 plain bias": lambda: (cublas.matmul(x[: 2 * B, :K], w[:K], out=out[: 2 * B], bias=b),
                                 cublas.matmul(x[2 * B:, :K], wt[:K], out=out[2 * B:], bias=bt)),
        "one tree": lambda: cublas.matmul(x[:, :K], w[:K], out=out, bias=b),
    }


def wgrad_variants(B: int):
    """Three advantage-layer weight gradients as three GEMMs, and as one strided-batched GEMM."""
    import cupy as cp

    from foxhunt_core.gpu import cublas

    h = cp.random.standard_normal((B, 3 * 260), dtype=cp.float32)
    dadv = cp.random.standard_normal((B, 3 * 156), dtype=cp.float32)
    g = cp.empty((260, 3 * 156), dtype=cp.float32)

    def three():
        for i in range(3):
            cublas.matmul(h[:, 260 * i : 260 * (i + 1)].T, dadv[:, 156 * i : 156 * (i + 1)],
                          out=g[:, 156 * i : 156 * (i + 1)])

    def batched():
        cublas.matmul(h[:, :260].T, dadv[:, :156], out=g[:, :156], batch=(3, 260, 156, 156))

    return three, batched


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import cupy as cp

    from foxhunt_core.gpu import cublas, cublaslt

    cublas.set_tf32(True)
    shapes = [("GLU", 256, 512), ("3 GLUs", 256, 1536), ("advantages", 256, 156), ("value", 256, 52)]
    names = list(variants(64, 8, 8))
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; µs per layer over 3 B rows, "
          f"median of {args.repeats} graph replays")
    print(f"| B | layer | tuned | {' | '.join(names)} |")
    print("|---" * (len(names) + 3) + "|")
    for B in args.batches:
        for label, K, N in shapes:
            for tuned in (False, True):
                cublaslt.set_autotune(tuned)
                fns = variants(B, K, N)
                us = [graph_us(fns[n], args.repeats) for n in names]
                print(f"| {B} | {label} [{K}, {N}] | {'yes' if tuned else 'no'} | "
                      + " | ".join(f"{u:.1f}" for u in us) + " |")
    cublaslt.set_autotune(False)
    print("\n| B | advantage weight gradients, 3 branches | 3 GEMMs | 1 batched |")
    print("|---|---|---|---|")
    for B in args.batches:
        three, batched = wgrad_variants(B)
        print(f"| {B} | [260, {B}] x [{B}, 156] | {graph_us(three, args.repeats):.1f} | "
              f"{graph_us(batched, args.repeats):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
