"""kan_gate's fragment (``kernels/kan_fragment.cuh``) element by element on the CPU, through
foxhunt_core.testing.cuda_emu, against the spline's dense NumPy oracle: the gate, d loss / d pre
and every parameter-gradient term (the per-element terms that glu_backward_gemm sums), on inputs
in every knot interval, on the knots, at the grid's ends and outside it. Both the forward
(gate_value) and the backward (gate_backward) read the units' knot-power floats (the stage's
derive, KnotPower, in float64 rounded once, as the ``kan_power`` kernel writes them); the oracle is
the B-spline form of the coefficients. The backward's terms are in the knot-power basis: they are
checked as they are (against ``md`` times spline.knot_terms) and through the fragment's map to the
coefficients' gradients (gate_terms_to_grads, which the kernels apply to their sums), against
``md`` times the B-spline bases.

Grids of 4 to 12 bases. The GPU runs the same source inside the GEMM epilogues
(test_kan_gate_gpu.py and tests/gpu/test_gpu_gate_fragments.py compare those with the twin).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from foxhunt_kan_gate.cuda import defines
from foxhunt_kan_gate.spline import Grid, basis_matrix, basis_slope_matrix, knot_terms
from foxhunt_kan_gate.stage import KnotPower

from foxhunt_core.testing import cuda_emu

KERNELS = Path(__file__).resolve().parents[1] / "foxhunt_kan_gate" / "kernels"
CORE_KERNELS = Path(cuda_emu.__file__).resolve().parents[1] / "kernels"
pytestmark = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no host C++ compiler")


def _probe(tmp: Path) -> Path:
    cu = tmp / "kan_fragment_probe.cu"
    cu.write_text(f"""#define __grid_constant__
static inline int min(int a, int b) {{ return a < b ? a : b; }}  // (CUDA's)
static inline int max(int a, int b) {{ return a > b ? a : b; }}
#define GATE_HEADER "{KERNELS / 'kan_fragment.cuh'}"
#include "{CORE_KERNELS / 'gate.cuh'}"
// Element i of unit i % units: its gate (forward and backward), d loss / d pre and terms.
// (mapped: the element's terms through gate_terms_grads, as the kernels map their sums)
extern "C" __global__ void probe(const float* x, const float* dh, const float* v, const float* power,
                                 const float* residual, int n, int units, float* gate_f,
                                 float* gate_b, float* dpre, float* terms, float* mapped) {{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    GateUnit u;  // the forward and the backward read the same arrays
    u.p0 = power + (long long)(i % units) * GATE_UNIT0;
    u.p1 = residual + i % units;
    gate_f[i] = gate_value(x[i], u);
    float g, t[GATE_TERMS];
    dpre[i] = gate_backward(x[i], u, dh[i], v[i], &g, t);
    gate_b[i] = g;
    for (int k = 0; k < GATE_TERMS; ++k) terms[(long long)i * GATE_TERMS + k] = t[k];
    gate_terms_grads(t);
    for (int k = 0; k < GATE_TERMS; ++k) mapped[(long long)i * GATE_TERMS + k] = t[k];
}}
""")
    return cu


def _inputs(grid: Grid, rng: np.random.Generator) -> np.ndarray:
    """Every knot, the ends, points just inside and outside them, and random points in and past the grid."""
    knots = grid.lo + grid.step * np.arange(grid.intervals + 1)
    eps = 1e-3 * grid.step
    special = np.concatenate([knots, knots + eps, knots - eps, [grid.lo - 1.0, grid.hi + 1.0, grid.lo - 50.0]])
    spread = rng.uniform(grid.lo - 2.0, grid.hi + 2.0, size=400)
    return np.concatenate([special, spread]).astype(np.float32)


@pytest.mark.parametrize("grid", [Grid(), Grid(-2.5, 3.0, 12), Grid(-3.3, 0.5, 7), Grid(-4.0, 4.0, 4)],
                         ids=lambda g: f"{g.num_bases}bases")
def test_fragment_matches_the_oracle_per_element(tmp_path, grid):
    rng = np.random.default_rng()
    x = _inputs(grid, rng)
    n, units, nb = x.size, 7, grid.num_bases
    # random units, and three that put raw below 0, above 1 and inside (0, 1) for every input: both
    # sides of the clamp and its interior are exercised whatever the draw
    coeff = rng.uniform(-0.3, 1.3, size=(units, nb)).astype(np.float32)
    residual = rng.uniform(-0.2, 0.2, size=units).astype(np.float32)
    coeff[:3] = np.array([-0.5, 1.5, 0.5], np.float32)[:, None]
    residual[:3] = 0.0
    dh = rng.normal(size=n).astype(np.float32)
    v = rng.normal(size=n).astype(np.float32)
    T = nb + 1
    power = KnotPower(grid)(np, {"b0.coeff": coeff})["b0.power"]
    assert power.dtype == np.float32 and power.shape == coeff.shape
    bufs = {"x": x, "dh": dh, "v": v, "power": power, "residual": residual,
            **{k: np.full(n, np.nan, np.float32) for k in ("gate_f", "gate_b", "dpre")},
            **{k: np.full(n * T, np.nan, np.float32) for k in ("terms", "mapped")}}
    defs = {k: v for k, v in defines(grid).items() if k.startswith("KG_")}
    L = cuda_emu.Launch
    res = cuda_emu.run(_probe(tmp_path), bufs, [
        L("probe", -(-n // 64), 64, ["x", "dh", "v", "power", "residual", np.int32(n), np.int32(units),
                                     "gate_f", "gate_b", "dpre", "terms", "mapped"])], defines=defs)

    x64 = x.astype(np.float64)
    c = coeff.astype(np.float64)[np.arange(n) % units]
    r = residual.astype(np.float64)[np.arange(n) % units]
    B, S = basis_matrix(np, x64, grid), basis_slope_matrix(np, x64, grid)
    raw = (B * c).sum(axis=1) + r * x64
    gate = np.clip(raw, 0.0, 1.0)
    md = np.where((raw > 0.0) & (raw < 1.0), dh.astype(np.float64) * v, 0.0)
    dpre = md * ((S * c).sum(axis=1) + r)
    grads = np.concatenate([md[:, None] * B, (md * x64)[:, None]], axis=1)

    # The knot-power form in float32 loses what its terms' magnitudes allow (their sum cancels to
    # the spline's value; the more intervals, the larger the outer terms): per element, a bound of
    # 32 roundings of the sum of the terms' magnitudes, on top of the B-spline form's tolerance.
    eps = 2.0**-24
    u = (np.clip(x64, grid.lo, grid.hi) - grid.lo) / grid.step
    p = power.astype(np.float64)[np.arange(n) % units]
    phi = np.stack(knot_terms(np, u, grid), axis=1)
    size = np.abs(p * phi).sum(axis=1) + np.abs(r * x64)
    _close(res["gate_f"], gate, 1e-5, 1e-6 + 32 * eps * size)
    # the backward's gate is the forward's, bit for bit (the same arithmetic)
    np.testing.assert_array_equal(res["gate_b"], res["gate_f"])
    # its slope: the knot-power form's, so within what that form's terms allow, as the value
    slope_size = (np.abs(p[:, 1]) + 2 * np.abs(p[:, 2] * phi[:, 1]) + 3 * np.abs(p[:, 3] * phi[:, 2])
                  + 3 * (np.abs(p[:, 4:]) * np.abs(phi[:, 4:]) ** (2 / 3)).sum(axis=1) + np.abs(r) * grid.step)
    _close(res["dpre"], dpre, 1e-4, 1e-5 + 32 * eps * np.abs(md) * slope_size / grid.step)
    # the terms: md times the knot-power basis and md x; mapped, md times the B-spline bases
    want = np.concatenate([md[:, None] * phi, (md * x64)[:, None]], axis=1)
    np.testing.assert_allclose(res["terms"].reshape(n, T), want, rtol=1e-5, atol=1e-6)
    _close(res["mapped"].reshape(n, T), grads, 1e-4, 1e-6 + 32 * eps * (np.abs(md) * np.abs(phi).sum(axis=1))[:, None])
    # where the element's clamp bites, its terms are exactly 0 (no gradient flows)
    assert np.all(res["mapped"].reshape(n, T)[md == 0.0] == 0.0)
    # the clamp's both sides and the interior were all exercised
    assert (raw <= 0.0).any() and (raw >= 1.0).any() and ((raw > 0.0) & (raw < 1.0)).sum() > 50


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: np.ndarray | float) -> None:
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= atol + rtol * np.abs(want))
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off: worst error {err[bad].max():.3g} "
                           f"where the bound is {np.broadcast_to(atol, err.shape)[bad][err[bad].argmax()]:.3g}")
