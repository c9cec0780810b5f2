"""GEMM ceilings of the update's shapes on this GPU: foxhunt's cuBLAS binding against PyTorch.

    python benchmarks/bench_gemm.py [--rows 65536] [--repeats 30]

For each shape (rows x k x n, and the weight-gradient shape k x rows x n) prints median µs and
TFLOP/s of: foxhunt's ``cublas.matmul`` (TF32), ``torch.mm`` (TF32), ``torch.addmm`` (bias in the
cuBLASLt epilogue), ``torch.mm`` in BF16, and a device copy of the output's size (bandwidth floor).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_update import time_torch  # noqa: E402


def med_us(fn, repeats: int) -> float:
    return statistics.median(time_torch(fn, repeats)) * 1e3


def _row(ta, tb, n: int, repeats: int) -> list[float]:
    """µs of foxhunt TF32, torch TF32, torch addmm, torch BF16 and a copy of the output's size."""
    import cupy as cp
    import torch

    from foxhunt_core.gpu import cublas

    bias = torch.randn(n, device="cuda")
    ca, cb = cp.asarray(ta), cp.asarray(tb)
    a16, b16 = ta.bfloat16(), tb.bfloat16()
    out = torch.empty(ta.shape[0], n, device="cuda")
    src = torch.randn_like(out)
    return [
        med_us(lambda: cublas.matmul(ca, cb), repeats),
        med_us(lambda: torch.mm(ta, tb), repeats),
        med_us(lambda: torch.addmm(bias, ta, tb), repeats),
        med_us(lambda: torch.mm(a16, b16), repeats),
        med_us(lambda: out.copy_(src), repeats),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[4096, 65536, 131072])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    import torch

    from foxhunt_core.gpu import cublas

    cublas.set_tf32(True)
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"{'shape':>24} {'fox tf32':>9} {'torch tf32':>10} {'addmm':>9} {'bf16':>9} {'copy':>9}   (µs; TFLOP/s)")
    for R in args.rows:
        for k, n, wgrad in ((256, 256, False), (256, 512, False), (256, 153, False), (50, 256, False),
                            (256, 256, True), (256, 153, True)):
            if wgrad:  # [k, R] x [R, n]
                ta = torch.randn(R, k, device="cuda").t()
                tb = torch.randn(R, n, device="cuda")
                flops = 2.0 * R * k * n
                shape = f"{k}x{R}x{n} (dW)"
            else:
                ta = torch.randn(R, k, device="cuda")
                tb = torch.randn(k, n, device="cuda")
                flops = 2.0 * R * k * n
                shape = f"{R}x{k}x{n}"
            res = _row(ta, tb, n, args.repeats)
            cells = " ".join(f"{u:6.1f};{flops / u / 1e6:3.0f}" for u in res[:4])
            print(f"{shape:>24} {cells} {res[4]:6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
