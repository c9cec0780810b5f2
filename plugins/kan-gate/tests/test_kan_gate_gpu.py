"""CUDA parity of kan_gate against its float64 twin, and the whole update with the gate on the GPU.

Kernels: fresh random inputs (the seed is printed), every output poisoned with NaN before the
launch, the reference the NumPy twin in float64 on the same float32 inputs; tolerance
``||out - ref|| / ||ref|| < 1e-5`` for the gate, dpre and the batch-reduced parameter gradients
(float32 arithmetic; the gradients summed in float32 per block over at most a few hundred rows,
then in double over the blocks). Elements whose float64 raw gate lies within 1e-4 of the output
clamp's kinks (0 and 1) get a zero upstream gradient, and inputs within 1e-4 of the grid's ends are
moved off them: there the derivative jumps, and float32 may fall on the other side of the kink.

The update: the CPU float32 update against the GPU's (TF32 off), as the core's
``tests/gpu/test_update_gpu.py`` does for its test gate; graph replay against eager updates.
"""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_kan_gate.cuda import backward_cuda, backward_shape, forward_cuda
from foxhunt_kan_gate.gate import gate_backward, gate_forward
from foxhunt_kan_gate.spline import Grid
from foxhunt_kan_gate.stage import CudaCache, KanGateStage, initial_fit

from foxhunt_core.testing.gpu import fresh_rng, host_relative_error

pytestmark = pytest.mark.gpu
TOL = 1e-5
KINK = 1e-4
GRIDS = [Grid(), Grid(-2.5, 3.0, 12), Grid(-4.0, 4.0, 4)]
SHAPES = [(1, 256), (37, 100), (1000, 33), (4096, 256), (65_536, 256)]


@pytest.fixture
def rng(request):
    return fresh_rng(request)


@pytest.fixture
def cp():
    return pytest.importorskip("cupy")


def _inputs(rng, grid: Grid, rows: int, width: int):
    span = grid.hi - grid.lo
    pre = rng.normal((grid.lo + grid.hi) / 2, 0.45 * span, (rows, width)).astype(np.float32)
    for end in (grid.lo, grid.hi):
        pre[np.abs(pre - end) < KINK] += np.float32(3 * KINK)
    coeff = (initial_fit(grid).coefficients + rng.normal(0, 0.3, (width, grid.num_bases))).astype(np.float32)
    residual = rng.normal(0, 0.1, width).astype(np.float32)
    return pre, coeff, residual


def _twin(grid: Grid, pre, coeff, residual):
    """Float64 twin on the float32 inputs: gate, its cache and the unclamped raw gate."""
    p64, c64, r64 = (np.asarray(a, np.float64) for a in (pre, coeff, residual))
    gate, cache = gate_forward(np, grid, c64, r64, p64)
    raw = r64 * p64
    for j, b in enumerate(cache.basis):
        raw = raw + c64.reshape(-1)[cache.first + j] * b
    return gate, cache, raw, (c64, r64)


_rel = host_relative_error



def test_forward_kernel_clamps_and_lets_nan_through(cp):
    """The device's clamp (NaN-propagating min and max): a NaN input gives a NaN gate, raw gates
    past 0 and 1 give exactly 0 and 1, as the twin's."""
    grid = Grid()
    pre = np.array([[np.nan, 0.0, 3.0, -3.0]], np.float32)
    coeff = np.tile(initial_fit(grid).coefficients, (4, 1)).astype(np.float32)
    residual = np.array([0.0, 0.0, 1.0, 1.0], np.float32)  # raw past 1 at 3, below 0 at -3
    out = cp.full(pre.shape, 0.25, dtype=cp.float32)
    host = forward_cuda(grid, cp.asarray(coeff), cp.asarray(residual), cp.asarray(pre), out=out).get()
    ref, *_ = _twin(grid, pre, coeff, residual)
    assert np.isnan(host[0, 0]) and np.isnan(ref[0, 0])
    assert host[0, 2] == 1.0 and host[0, 3] == 0.0 and ref[0, 2] == 1.0 and ref[0, 3] == 0.0
    assert host[0, 1] == pytest.approx(ref[0, 1], abs=1e-6)

@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize(("rows", "width"), SHAPES)
def test_forward_matches_twin(cp, rng, grid, rows, width):
    pre, coeff, residual = _inputs(rng, grid, rows, width)
    ref, *_ = _twin(grid, pre, coeff, residual)
    dp, dc, dr = cp.asarray(pre), cp.asarray(coeff), cp.asarray(residual)
    out = cp.full((rows, width), np.nan, dtype=cp.float32)
    got = forward_cuda(grid, dc, dr, dp, out=out)
    assert got is out
    host = out.get()
    assert np.isfinite(host).all(), "unwritten gate elements"
    assert _rel(host, ref) < TOL
    assert np.array_equal(dp.get(), pre), "input modified"


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize(("rows", "width"), SHAPES)
def test_backward_matches_twin(cp, rng, grid, rows, width):
    pre, coeff, residual = _inputs(rng, grid, rows, width)
    _, cache, raw, (c64, r64) = _twin(grid, pre, coeff, residual)
    dgate = rng.normal(size=(rows, width)).astype(np.float32)
    dgate[(np.abs(raw) < KINK) | (np.abs(raw - 1) < KINK)] = 0
    assert (~cache.inside_out).mean() > 0.02 or rows < 100, "the output clamp is exercised"
    ref_dpre, ref_dc, ref_dr = gate_backward(np, grid, c64, r64, cache, dgate.astype(np.float64))
    dp, dc, dr, dd = (cp.asarray(a) for a in (pre, coeff, residual, dgate))
    outs = dict(dpre=cp.full((rows, width), np.nan, dtype=cp.float32),
                dcoeff=cp.full((width, grid.num_bases), np.nan, dtype=cp.float32),
                dresidual=cp.full(width, np.nan, dtype=cp.float32))
    got = backward_cuda(grid, dc, dr, dp, dd, **outs)
    for name, g, ref in zip(("dpre", "dcoeff", "dresidual"), got, (ref_dpre, ref_dc, ref_dr)):
        assert g is outs[name]
        host = g.get()
        assert np.isfinite(host).all(), f"{name}: unwritten elements"  # defect 1: each unit's own element
        err = _rel(host, ref)
        assert err < TOL, f"{name}: relative error {err:.3g} (rows {rows}, chunks {backward_shape(rows, width)[1]})"


def test_backward_is_deterministic(cp, rng):
    grid = Grid()
    pre, coeff, residual = _inputs(rng, grid, 65_536, 256)
    args = [cp.asarray(a) for a in (coeff, residual, pre)] + [cp.asarray(rng.normal(size=pre.shape), cp.float32)]
    a, b = backward_cuda(grid, *args), backward_cuda(grid, *args)
    assert all(cp.array_equal(x, y) for x, y in zip(a, b)), "not bitwise reproducible"


def test_empty_batch_and_argument_checks(cp):
    grid = Grid()
    coeff, residual = cp.zeros((8, 8), cp.float32), cp.zeros(8, cp.float32)
    pre = cp.zeros((0, 8), cp.float32)
    dpre, dc, dr = backward_cuda(grid, coeff, residual, pre, pre.copy())
    assert dpre.shape == (0, 8) and not dc.any() and not dr.any()
    with pytest.raises(TypeError, match="kan_gate_forward: pre must be float32"):
        forward_cuda(grid, coeff, residual, cp.zeros((4, 8), cp.float64))
    with pytest.raises(ValueError, match="coeff has shape"):
        forward_cuda(grid, cp.zeros((8, 7), cp.float32), residual, cp.zeros((4, 8), cp.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        forward_cuda(grid, coeff, residual, cp.zeros((8, 4), cp.float32).T)
    x = cp.zeros((4, 8), cp.float32)
    with pytest.raises(ValueError, match="alias"):
        forward_cuda(grid, coeff, residual, x, out=x)
    with pytest.raises(ValueError, match="alias"):
        backward_cuda(grid, coeff, residual, x, cp.zeros_like(x), dpre=x)


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize(("branches", "width"), [(1, 1), (4, 256), (11, 100)])
def test_knot_power_kernel_matches_the_float64_product(cp, rng, grid, branches, width):
    """kan_power (the fragment's derive on the GPU): every branch's knot-power floats, up to eight
    branches a launch (eleven take two), against the float64 product rounded once; outputs
    poisoned with NaN first. The GPU's double products and sums may round the last bit apart from
    NumPy's, so one float32 ulp is allowed."""
    from foxhunt_kan_gate.cuda import power_cuda
    from foxhunt_kan_gate.spline import knot_power_map

    coeffs = [(initial_fit(grid).coefficients + rng.normal(0, 0.5, (width, grid.num_bases))).astype(np.float32)
              for _ in range(branches)]
    outs = [cp.full((width, grid.num_bases), np.nan, cp.float32) for _ in coeffs]
    got = power_cuda(grid, [cp.asarray(c) for c in coeffs], outs)
    m = knot_power_map(grid)
    for c, g, o in zip(coeffs, got, outs):
        assert g is o
        want = (c.astype(np.float64) @ m).astype(np.float32)
        host = g.get()
        assert np.isfinite(host).all(), "unwritten knot-power floats"
        ulp = np.spacing(np.abs(want))
        assert np.all(np.abs(host - want) <= ulp), np.abs(host - want).max()
    with pytest.raises(ValueError, match="kan_power: coeff"):
        power_cuda(grid, [cp.zeros((width, grid.num_bases + 1), cp.float32)])


def test_stage_uses_the_kernels_on_cupy_float32(cp, rng):
    stage, plain = KanGateStage(), KanGateStage(use_cuda_kernels=False)
    widths = (64, 64, 64, 64)
    params = {k: cp.asarray(v + rng.normal(0, 0.1, v.shape), dtype=cp.float32)
              for k, v in stage.init_params(widths, rng).items()}
    pre = cp.asarray(rng.normal(0, 3, (500, 64)), dtype=cp.float32)
    dgate = cp.asarray(rng.normal(size=(500, 64)), dtype=cp.float32)
    for d in range(4):
        g1, c1 = stage.forward(cp, params, d, pre)
        g2, c2 = plain.forward(cp, params, d, pre)
        assert isinstance(c1, CudaCache) and not isinstance(c2, CudaCache)
        assert _rel(g1, g2.get()) < TOL
        dp1, gr1 = stage.backward(cp, params, d, c1, dgate)
        dp2, gr2 = plain.backward(cp, params, d, c2, dgate)
        assert _rel(dp1, dp2.get()) < 1e-4  # (clamp kinks are not avoided here)
        for k in gr1:
            assert gr1[k].dtype == cp.float32 and _rel(gr1[k], gr2[k].get()) < 1e-4, k
    p64 = {k: v.astype(cp.float64) for k, v in params.items()}
    _, c = stage.forward(cp, p64, 0, pre.astype(cp.float64))
    assert not isinstance(c, CudaCache), "float64 takes the array-operation twin"


# ----------------------------------------------------------------------------- the whole update
def _agents(cp, seed: int, tf32: bool = False):
    from foxhunt_core.agent import Agent
    from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
    from foxhunt_core.gpu import cublas
    from foxhunt_core.plugins import discover

    cublas.set_tf32(tf32)
    settings = RunSettings(net=NetSettings(shared_h1=64, shared_h2=64, adv_h=48),
                           train=TrainSettings(lr=1e-3, tf32=tf32))
    plugins = discover().plugin_set(["kan_gate"])
    return (Agent(settings, plugins, np, np.random.default_rng(seed)),
            Agent(settings, plugins, cp, np.random.default_rng(seed)))


def _batch(rng, rows: int) -> dict:
    return {
        "obs": rng.normal(size=(rows, 50)).astype(np.float32),
        "next_obs": rng.normal(size=(rows, 50)).astype(np.float32),
        "action": rng.integers(0, 3, size=(rows, 4)),
        "reward": rng.normal(size=rows).astype(np.float32),
        "terminal": (rng.random(rows) < 0.1).astype(np.float32),
    }


def test_gpu_update_with_kan_gate_matches_cpu_update(cp, rng):
    cpu, gpu = _agents(cp, int(rng.integers(1 << 30)))
    assert gpu.stage_owners["gate_activation"] == ["kan_gate"]
    for o, s in cpu.online.items():
        for k, v in s.items():
            if o == "kan_gate":  # off the sigmoid fit, so that the gate's clamps take part
                v[...] = v + rng.normal(0, 0.05, v.shape).astype(v.dtype)
            cpu.target[o][k][...] = v + rng.normal(0.0, 0.05, v.shape).astype(v.dtype)
            gpu.online[o][k][...] = cp.asarray(v)
            gpu.target[o][k][...] = cp.asarray(cpu.target[o][k])
    batch = _batch(rng, 256)
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    g_gpu, s_gpu, _, _ = gpu.loss_and_grads({k: cp.asarray(v) for k, v in batch.items()}, 0.01)
    assert abs(float(s_cpu["loss"]) - float(s_gpu["loss"])) < 1e-4 * abs(float(s_cpu["loss"]))
    for o, s in g_cpu.items():
        for k, v in s.items():
            assert _rel(g_gpu[o][k], v) < 2e-3, f"{o}/{k}"  # float32 on both, different summation order
    assert set(g_gpu["kan_gate"]) == set(cpu.online["kan_gate"])


def test_graph_replay_with_kan_gate_equals_eager_updates(cp, rng):
    from foxhunt_core.graphs import GraphedUpdate

    seed = int(rng.integers(1 << 30))
    _, eager = _agents(cp, seed)
    _, graphed = _agents(cp, seed)
    start = {k: v.copy() for k, v in graphed.online["kan_gate"].items()}
    g = GraphedUpdate(graphed, 128)
    for k, v in start.items():
        assert cp.array_equal(graphed.online["kan_gate"][k], v), f"capture changed {k}"
    for step in range(5):
        batch = {k: cp.asarray(v) for k, v in _batch(rng, 128).items()}
        coeff = 0.01 * (step + 1)
        s_e, _, _ = eager.update(batch, cp.asarray(coeff, dtype=cp.float32))
        g.load_batch(batch)
        s_g, _, _ = g.replay(coeff)
        cp.cuda.get_current_stream().synchronize()
        assert abs(float(s_e["loss"]) - float(s_g["loss"])) <= 1e-5 * abs(float(s_e["loss"]))
    for k, v in eager.online["kan_gate"].items():
        assert _rel(graphed.online["kan_gate"][k], v.get()) < 1e-5, k
        assert not cp.array_equal(v, start[k]), f"{k} was not trained"
