"""How cuBLAS and glu_gemm round their float32 operands to TF32, and what it does to the GLU.

    python benchmarks/check_tf32_rounding.py

1. 256 products of x = 1 + 0.75 TF32 ulp with ones (exactly 256.1875): 256.25 if the operands are
   rounded to nearest, 256 if truncated (the tensor cores alone drop the low 13 mantissa bits),
   from cuBLAS's TF32 GEMM and from glu_gemm's pre-activations.
2. The three joint branches' GLU over 65536 rows (K = 260, a one-signed bias row) through cuBLAS's
   GEMM + glu_forward and through glu_gemm: the relative error of pv and h against float64, and
   the mean error along the sign of the exact value (a rounding bias shows as a negative mean).
"""

from __future__ import annotations

import numpy as np


def main() -> None:
    import cupy as cp

    from foxhunt_core.gpu import cublas
    from foxhunt_core.gpu import kernels as K
    from foxhunt_core.gpu import reference as R

    cublas.set_tf32(True)
    x = np.float32(1 + 3 * 2.0**-12)
    a = cp.full((256, 256), x, cp.float32)
    print(f"256 x (1 + 0.75 ulp), exactly 256.1875 (nearest 256.25, truncated 256): "
          f"cuBLAS {float(cublas.matmul(a, cp.ones((256, 256), cp.float32))[0, 0])}", end="")
    pv = cp.empty((128, 256), cp.float32)
    K.glu_gemm(cp.ones((128, 256), cp.float32), a, width=128, pv=pv)
    print(f", glu_gemm {float(pv[0, 0])}")

    rng = np.random.default_rng(0)
    B, k, blocks = 65536, 260, 3
    u = rng.normal(0, 1, (B, k)).astype(np.float32)
    u[:, -1] = 1.0  # the ones column
    w = rng.normal(0, 0.06, (k, 2 * 256 * blocks)).astype(np.float32)
    w[-1] += 0.5  # its bias row, of one sign
    rpv, rh = R.glu_gemm(u.astype(np.float64), w.astype(np.float64), None, 260, blocks)
    ud, wd = cp.asarray(u), cp.asarray(w)
    pv_lt = cublas.matmul(ud, wd)
    h_lt = K.glu_forward(pv_lt, width=260, blocks=blocks)
    pv_gg = cp.empty_like(pv_lt)
    h_gg = K.glu_gemm(ud, wd, width=260, blocks=blocks, pv=pv_gg)

    def err(o, r):
        return float(np.linalg.norm(o.get() - r) / np.linalg.norm(r))

    def bias(o, r):
        return float(((o.get() - r) * np.sign(r)).mean())

    print(f"B = {B}, K = {k}, {blocks} branches:")
    for name, p, h in (("cuBLAS + glu_forward", pv_lt, h_lt), ("glu_gemm", pv_gg, h_gg)):
        print(f"  {name}: pv {err(p, rpv):.3e}, h {err(h, rh):.3e}, mean signed pv error {bias(p, rpv):.3e}")


if __name__ == "__main__":
    main()
