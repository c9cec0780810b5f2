"""Every GEMM of one foxhunt update as cuBLASLt's autotuning saw it: shape, candidates, choice, time.

    python benchmarks/gemm_plans.py [--batch 65536] [--candidates 8]

Runs the update's warm-up with the default settings' autotuning (``train.gemm_autotune``), then
lists each tuned plan, slowest first: the row-major product ``[rows, k] @ [k, cols]`` (``T`` marks
an operand read transposed: ``[k, rows]^T`` is a weight gradient's activations), the strided
batch, the candidates timed, the chosen algorithm's median time against the heuristic's first,
and the chosen algorithm's configuration (cuBLASLt's algorithm id, tile enum, K split, stages).
``--candidates`` asks the heuristic for that many algorithms per plan. Times are each GEMM alone
on an idle GPU (the tuning's own measurement); a plan serves every call of its shape and layout,
so a GEMM run several times per update is listed once.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("CUPY_TF32", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_update import random_batch  # noqa: E402


def describe(e: dict) -> str:
    """The row-major product of a plan (cuBLASLt's column-major ``m, n, k``: ``[n, k] @ [k, m]``)."""
    left = "T" if e["ops"][1] == "T" else ""  # cuBLASLt's B is our left operand (op T: a transpose view)
    right = "T" if e["ops"][0] == "T" else ""
    return f"[{e['n']}, {e['k']}]{left} @ [{e['k']}, {e['m']}]{right}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--candidates", type=int, default=None,
                    help="heuristic results asked for per plan (default: cublaslt.CANDIDATES)")
    args = ap.parse_args()
    import cupy as cp

    from foxhunt_core.agent import Agent
    from foxhunt_core.config import RunSettings
    from foxhunt_core.gpu import cublas, cublaslt
    from foxhunt_core.plugins import PluginSet

    if args.candidates:
        cublaslt.CANDIDATES = args.candidates
    cublas.set_tf32(True)
    cublaslt.set_autotune(True)
    agent = Agent(RunSettings(), PluginSet(), cp, np.random.default_rng(0))
    batch = random_batch(args.batch)
    coeff = cp.asarray(0.001, dtype=cp.float32)
    for _ in range(2):
        agent.update(batch, coeff)
    cp.cuda.Device().synchronize()
    report = [e for e in cublaslt.tuning_report() if e["best_ms"] is not None]
    report.sort(key=lambda e: -e["best_ms"])
    print(f"B = {args.batch}, {cublaslt.CANDIDATES} heuristic candidates per plan: "
          f"{len(report)} timed plans, chosen {sum(e['best_ms'] for e in report) * 1e3:.1f} us, "
          f"heuristic's first {sum(e['first_ms'] or 0.0 for e in report) * 1e3:.1f} us")
    print(f"{'chosen us':>10} {'first us':>9} {'cands':>5}  {'product':<34} {'batch':>5}  config")
    for e in report:
        c = e["config"]
        first = f"{e['first_ms'] * 1e3:9.1f}" if e["first_ms"] is not None else f"{'-':>9}"
        print(f"{e['best_ms'] * 1e3:10.1f} {first} {e['candidates']:5d}  {describe(e):<34} {e['batch']:5d}  "
              f"id {c['id']} tile {c['tile']} split {c['split_k']} stages {c['stages']} #{e['chosen']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
