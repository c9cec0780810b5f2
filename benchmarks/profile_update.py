"""Where the time of one foxhunt update goes on the GPU: each phase timed with CUDA events.

    python benchmarks/profile_update.py [--batch 65536] [--repeats 20]

Phases run eagerly, one after the other, each timed alone (median of ``repeats``), so their sum
exceeds the graph replay by the launch overhead the graph removes.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("CUPY_TF32", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_update import random_batch, time_cuda  # noqa: E402


def timed(fn, repeats: int) -> float:
    """Median ms of ``fn`` (one warm-up call first)."""
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    return statistics.median(time_cuda(fn, repeats, cp.cuda.Device().synchronize))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import cupy as cp

    from foxhunt_core.agent import Agent
    from foxhunt_core.config import RunSettings
    from foxhunt_core.gpu import kernels as K
    from foxhunt_core.net.layers import matmul as mm
    from foxhunt_core.plugins import PluginSet

    B = args.batch
    agent = Agent(RunSettings(), PluginSet(), cp, np.random.default_rng(0))
    step, fnet, on = agent.step, agent.fused_network, agent.online
    rng = np.random.default_rng(1)
    batch = random_batch(B)
    out, on_next, tgt = step.forwards(batch)
    dl = cp.asarray(rng.normal(size=out.log_probs.shape) * 1e-4, dtype=cp.float32)
    q = step.q_pipeline(on, out, keep_cache=True)
    dq = cp.asarray(rng.normal(size=q.q_coord.shape), dtype=cp.float32)
    grads, _, _, _ = agent.loss_and_grads(batch, 0.001)
    a_star, disc = step.bootstrap(batch, on_next)
    taken = batch["action"] + step.branch_base
    x = cp.asarray(rng.normal(size=(B, 256)), dtype=cp.float32)
    w = cp.asarray(rng.normal(size=(256, 256)), dtype=cp.float32)

    def backward():  # (the backward consumes its forward's cache: a forward first, timed with it)
        o = fnet.forward(on, batch["obs"], keep_cache=True)
        fnet.backward(on, o, dl, grads_into=agent.opt.grad_slots())

    rows = {
        "forward (keep cache)": lambda: fnet.forward(on, batch["obs"], keep_cache=True),
        "forward (E[Q] only)": lambda: fnet.forward(on, batch["obs"], outputs=("q",)),
        "the update's three forwards": lambda: step.forwards(batch),
        "bootstrap (qpipe on s', argmax)": lambda: step.bootstrap(batch, on_next),
        "c51 target+loss kernel": lambda: K.c51_target_loss(
            None, batch["reward"], disc, out.log_probs, agent.z, 0.001, next_heads=tgt.heads, next_action=a_star,
            action=taken, offsets=agent.offsets, dlogits_full=True, write_m=False),
        "forward (keep cache) + network backward": backward,
        "qpipe forward (cache)": lambda: step.q_pipeline(on, out, keep_cache=True),
        "qpipe backward": lambda: agent.qpipe.backward(on, q, dq, grads_into=agent.opt.grad_slots()),
        "adam step": lambda: agent.opt.step(on, grads),
        "whole loss_and_grads": lambda: agent.loss_and_grads(batch, 0.001),
        "one GEMM [B,256]x[256,256]": lambda: mm(x, w),
        "one GEMM dW [256,B]x[B,256]": lambda: mm(x.T, x),
        "column sum via cupy sum(axis=0)": lambda: x.sum(axis=0),
        "zeros_like [B,A,N]": lambda: cp.zeros_like(out.log_probs),
    }
    print(f"B = {B}; ms, median of {args.repeats}")
    for name, fn in rows.items():
        try:
            print(f"{name:42s} {timed(fn, args.repeats):9.3f}")
        except Exception as exc:  # noqa: BLE001 - a failing row is reported, the rest still run
            print(f"{name:42s}   failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
