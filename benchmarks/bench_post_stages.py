"""The post-attention plugins' kernels at the update's shapes, against the 3 % budget.

    python benchmarks/bench_post_stages.py [--batches 4096 16384 65536] [--repeats 30]

For each batch size B (12 actions in 4 branches of 3) and each plugin (graph_message,
diffusion_refine at its defaults), the median µs, replayed from a captured CUDA graph
(benchmarks/bench_stack.py's ``graph_us``), of:

- ``forward``: one forward kernel over B rows;
- ``backward``: the backward kernel and its gradient reduction over B rows, the gradients written
  into preallocated slots (as the update writes them into the optimizer's flat gradient buffer);
- ``update share``: what the plugin adds to one captured update: the forwards at s and at s' and
  the backward at s;

and the update share as a percentage of the stage-0 update at that batch size (``--stage0-ms``;
the defaults are the H200 figures of issue 22: 0.507, 1.243, 4.058 ms). A second table times
diffusion_refine's forward and backward at each choice of lanes per sample and of samples per
forward thread (the same bits either way; ``foxhunt_diffusion_refine.cuda`` picks by batch size from
these figures). The whole update with a
flag set's stages is what ``benchmarks/bench_update.py --flags FILE`` times; this script isolates
the plugins' own kernels. The inputs are random and fixed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_stack import graph_us  # noqa: E402

SIZES = (3, 3, 3, 3)
STAGE0_MS = {4096: 0.507, 16384: 1.243, 65536: 4.058}


def _stage(name: str, use_kernel: bool):
    from foxhunt_diffusion_refine.stage import DiffusionRefineStage
    from foxhunt_graph_message.stage import GraphMessageStage

    if name == "graph_message":
        return GraphMessageStage(SIZES, use_cuda_kernel=use_kernel)
    return DiffusionRefineStage(sum(SIZES), use_cuda_kernel=use_kernel)


def cases(name: str, B: int, lanes: int | None = None, rows: int | None = None) -> dict:
    import cupy as cp


    rng = np.random.default_rng(0)
    A = sum(SIZES)
    st = _stage(name, True)
    params = {k: cp.asarray(v + rng.normal(size=v.shape) * 0.1, dtype=cp.float32)
              for k, v in st.init_params(rng).items()}
    q_s, q_n = (cp.asarray(rng.normal(size=(B, A)), dtype=cp.float32) for _ in range(2))
    var = cp.asarray(rng.random((B, A)), dtype=cp.float32)
    dy = cp.asarray(rng.normal(size=(B, A)), dtype=cp.float32)
    slots = {k: cp.empty_like(v) for k, v in params.items()}
    out, dq = cp.empty_like(q_s), cp.empty_like(q_s)
    if name == "graph_message":
        from foxhunt_graph_message import cuda as C

        ws = C.new_workspace(st.offsets)

        def fwd(q):
            return C.forward_cuda(q, params, st.offsets, out=out)

        def bwd():
            return C.backward_cuda(q_s, dy, params, st.offsets, dq=dq, grads=slots, workspace=ws)
    else:
        from foxhunt_diffusion_refine import cuda as C

        ws = C.new_workspace(A, st.steps, st.hidden)

        def fwd(q):
            return C.forward_cuda(q, var, params, st.step_scale, out=out, lanes=lanes, rows=rows)

        def bwd():
            return C.backward_cuda(q_s, var, dy, params, st.step_scale, dq=dq, grads=slots, workspace=ws,
                                   lanes=lanes)

    return {"forward": lambda: fwd(q_s), "backward": bwd,
            "update share": lambda: (fwd(q_s), fwd(q_n), bwd())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[4096, 16384, 65536])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--stage0-ms", nargs="+", type=float, default=None,
                    help="The stage-0 update's ms at each batch size (default: issue 22's H200 figures).")
    args = ap.parse_args()
    stage0 = dict(zip(args.batches, args.stage0_ms)) if args.stage0_ms else STAGE0_MS
    print("| plugin | B | forward µs | backward µs | update share µs | % of stage 0 |")
    print("|---|---|---|---|---|---|")
    for name in ("graph_message", "diffusion_refine"):
        for B in args.batches:
            t = {k: graph_us(fn, args.repeats) for k, fn in cases(name, B).items()}
            pct = f"{100 * t['update share'] / (1000 * stage0[B]):.2f}" if B in stage0 else "-"
            print(f"| {name} | {B} | {t['forward']:.1f} | {t['backward']:.1f} | {t['update share']:.1f} | {pct} |",
                  flush=True)
    from foxhunt_diffusion_refine import cuda as C

    print()
    print("| diffusion_refine | B | lanes | forward rows a thread | forward µs | backward µs "
          "| chosen (forward lanes, rows; backward lanes) |")
    print("|---|---|---|---|---|---|---|")
    for B in args.batches:
        chosen = f"{C.forward_lanes(B)}, {C.forward_rows(B)}; {C.backward_lanes(B)}"
        for lanes in (C.LANES, C.FEW_LANES):
            for rows in (1, 2):
                c = cases("diffusion_refine", B, lanes, rows)
                f = graph_us(c["forward"], args.repeats)
                b = graph_us(c["backward"], args.repeats) if rows == 1 else float("nan")
                print(f"| | {B} | {lanes} | {rows} | {f:.1f} | {b:.1f} | {chosen} |", flush=True)


if __name__ == "__main__":
    main()
