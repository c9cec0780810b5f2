"""The gate on the NumPy path: float64 finite differences of the gate alone (its input and every
parameter), DESIGN.md defects 1 and 3 in the backward, the twin against a dense oracle, the
stage's protocol, its options and its manifest."""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_kan_gate import plugin
from foxhunt_kan_gate.gate import gate_backward, gate_forward
from foxhunt_kan_gate.options import KanGateOptions
from foxhunt_kan_gate.spline import Grid, basis_matrix, basis_slope_matrix
from foxhunt_kan_gate.stage import KanGateStage, initial_fit
from kan_plan_versions import plan_residual_gradient, plan_spline_slope

from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import discover
from foxhunt_core.stages import BuildContext, GateActivation
from foxhunt_core.testing import check_tree_gradients, numeric_gradient

GRIDS = [Grid(), Grid(-2.5, 3.0, 12), Grid(-4.0, 4.0, 4)]


def _setup(grid: Grid, seed: int, rows: int = 40, width: int = 9):
    """Parameters off the sigmoid fit and inputs spread beyond the grid, so that both clamps
    (input outside [lo, hi], raw outside [0, 1]) occur; the inputs kept off the kinks."""
    rng = np.random.default_rng(seed)
    stage = KanGateStage(grid=grid)
    p = stage.init_params((width,), rng)
    p["b0.coeff"] = p["b0.coeff"] + rng.normal(0, 0.4, p["b0.coeff"].shape)
    p["b0.residual"] = rng.normal(0, 0.15, width)
    span = grid.hi - grid.lo
    pre = rng.uniform(grid.lo - 0.4 * span, grid.hi + 0.4 * span, (rows, width))
    for end in (grid.lo, grid.hi):
        near = np.abs(pre - end) < 1e-3
        pre[near] += 2e-3
    w = rng.normal(size=(rows, width))
    return stage, p, pre, w, rng


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gate_gradients_match_finite_differences(grid, seed):
    stage, p, pre, w, rng = _setup(grid, seed)
    gate, cache = stage.forward(np, p, 0, pre)
    assert (~cache.inside_out).mean() > 0.05 and cache.inside_out.mean() > 0.3, "both sides of the output clamp"
    assert (~cache.loc.inside).mean() > 0.1, "inputs clamped to the grid"
    dpre, grads = stage.backward(np, p, 0, cache, w)
    assert set(grads) == {"b0.coeff", "b0.residual"}

    def loss() -> float:
        return float((stage.forward(np, p, 0, pre)[0] * w).sum())

    tree = {"kan_gate": p, "input": {"pre": pre}}
    ana = {"kan_gate": grads, "input": {"pre": dpre}}
    # every parameter entry, and 120 of the inputs
    n = max(v.size for v in p.values())
    assert check_tree_gradients(loss, tree, ana, rng, samples_per_tensor=n) == []
    assert check_tree_gradients(loss, {"input": {"pre": pre}}, {"input": {"pre": dpre}}, rng,
                                samples_per_tensor=120) == []


def _residual_problems(dres: np.ndarray, loss, p: dict) -> list[str]:
    """Units whose residual-weight gradient is not the finite difference of that unit's own weight."""
    out = []
    for j in range(dres.size):
        num = numeric_gradient(loss, p["b0.residual"], (j,))
        if abs(num - dres[j]) > 1e-7 + 1e-6 * abs(num):
            out.append(f"unit {j}: {dres[j]:.6g} != {num:.6g}")
    return out


def test_residual_gradient_lands_on_its_own_element():
    """Defect 1: each unit's residual gradient in d_residual[unit]. The plan added it at
    ``&d_residual_w + neuron`` (beside the pointer), leaving the gradient at its zeros; a version
    that put it on a neighbour's element fails too."""
    stage, p, pre, w, _ = _setup(Grid(), 7, rows=60, width=11)
    gate, cache = stage.forward(np, p, 0, pre)
    _, grads = stage.backward(np, p, 0, cache, w)
    dres = grads["b0.residual"]
    assert np.abs(dres).min() > 1e-3 and len(np.unique(np.round(dres, 6))) == dres.size  # distinct, nonzero

    def loss() -> float:
        return float((stage.forward(np, p, 0, pre)[0] * w).sum())

    assert _residual_problems(dres, loss, p) == []
    np.testing.assert_allclose(dres, (np.where(cache.inside_out, w, 0) * pre).sum(0), rtol=1e-12)
    assert len(_residual_problems(plan_residual_gradient(dres.size), loss, p)) == dres.size
    assert len(_residual_problems(np.roll(dres, 1), loss, p)) == dres.size


def test_spline_slope_is_zero_where_the_input_is_clamped():
    """Defect 3: outside [lo, hi] the spline is constant, so d gate / d pre is the residual
    weight's alone (where the output is not clamped); the plan used the slope at the clamped input."""
    grid = Grid()
    stage = KanGateStage(grid=grid)
    p = stage.init_params((3,), np.random.default_rng(0))
    p["b0.residual"][:] = [0.0, 0.001, -0.0015]
    pre = np.tile(np.array([-9.0, -4.5, -4.0 - 1e-6, 4.0 + 1e-6, 4.3, 7.0])[:, None], (1, 3))
    gate, cache = stage.forward(np, p, 0, pre)
    assert cache.inside_out.all()
    dpre, _ = stage.backward(np, p, 0, cache, np.ones_like(pre))
    np.testing.assert_array_equal(dpre, np.broadcast_to(p["b0.residual"], pre.shape))
    # the finite difference agrees (unit 0: no residual, so the gate is flat there)
    h = 1e-7  # (the points 1e-6 beyond the ends stay beyond them)
    num = (stage.forward(np, p, 0, pre + h)[0] - stage.forward(np, p, 0, pre - h)[0]) / (2 * h)
    np.testing.assert_allclose(dpre, num, rtol=0, atol=1e-8)
    # the plan's slope at the clamped input is not 0 there: it would fail the same comparison
    plan = plan_spline_slope(pre[:, 0], p["b0.coeff"][0])
    assert np.abs(plan - num[:, 0]).max() > 1e-3


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_twin_matches_the_dense_oracle(grid):
    """The gather/bincount twin against the dense basis matrix, forward and backward."""
    stage, p, pre, w, _ = _setup(grid, 3, rows=33, width=7)
    c, r = p["b0.coeff"], p["b0.residual"]
    gate, cache = gate_forward(np, grid, c, r, pre)
    dpre, dc, dr = gate_backward(np, grid, c, r, cache, w)
    b = basis_matrix(np, pre, grid)  # [B, W, K]
    raw = np.einsum("bwk,wk->bw", b, c) + r * pre
    m = (raw > 0) & (raw < 1)
    np.testing.assert_allclose(gate, np.clip(raw, 0, 1), rtol=0, atol=1e-14)
    md = np.where(m, w, 0)
    np.testing.assert_allclose(dc, np.einsum("bw,bwk->wk", md, b), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dr, (md * pre).sum(0), rtol=1e-12, atol=1e-13)
    slope = np.einsum("bwk,wk->bw", basis_slope_matrix(np, pre, grid), c)
    np.testing.assert_allclose(dpre, md * (slope + r), rtol=1e-12, atol=1e-13)


def test_gate_propagates_nan():
    stage = KanGateStage()
    p = stage.init_params((2,), np.random.default_rng(0))
    gate, _ = stage.forward(np, p, 0, np.array([[np.nan, 0.0]]))
    assert np.isnan(gate[0, 0]) and gate[0, 1] == pytest.approx(0.5, abs=2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stage_is_a_gate_activation_and_keeps_the_dtype(dtype):
    stage = KanGateStage()
    assert isinstance(stage, GateActivation) and stage.name == "kan_gate"
    rng = np.random.default_rng(1)
    p = {k: v.astype(dtype) for k, v in stage.init_params((16, 16, 16, 16), rng).items()}
    pre = rng.normal(0, 2, (5, 16)).astype(dtype)
    for d in range(4):
        gate, cache = stage.forward(np, p, d, pre)
        dpre, g = stage.backward(np, p, d, cache, np.ones_like(pre))
        assert gate.dtype == dpre.dtype == dtype
        assert {k: v.dtype for k, v in g.items()} == {f"b{d}.coeff": dtype, f"b{d}.residual": dtype}
    with pytest.raises(TypeError, match="kan_gate: backward got a tuple cache"):
        stage.backward(np, p, 0, (pre,), pre)


def test_initial_parameters_and_count():
    """4 branches x adv_h x 9 parameters (9 216 at adv_h 256), every unit starting at the fit."""
    stage = KanGateStage()
    p = stage.init_params((256,) * 4, np.random.default_rng(0))
    assert sum(v.size for v in p.values()) == 9216
    assert plugin.MANIFEST.parameter_count(RunSettings()) == 9216
    fit = initial_fit(Grid())
    for d in range(4):
        assert p[f"b{d}.coeff"].shape == (256, 8) and (p[f"b{d}.coeff"] == fit.coefficients).all()
        assert p[f"b{d}.residual"].shape == (256,) and not p[f"b{d}.residual"].any()
    # at its initial parameters the gate is the sigmoid to within the fit error on the grid
    x = np.linspace(-4, 4, 801)[:, None].repeat(256, 1)
    gate, _ = stage.forward(np, p, 0, x)
    assert np.abs(gate - 1 / (1 + np.exp(-x))).max() <= fit.max_error * 1.01


def test_residual_init_option():
    stage = KanGateStage(residual_init=0.05)
    p = stage.init_params((3,), np.random.default_rng(0))
    assert (p["b0.residual"] == 0.05).all()


@pytest.mark.parametrize("source", [None, {}, {"num_bases": 12, "grid_min": -3.0, "grid_max": 5.0},
                                    {"use_cuda_kernels": False, "residual_init": 0.1}])
def test_hook_reads_options(source):
    ctx = BuildContext(settings=RunSettings(), xp=np, options={} if source is None else {"kan_gate": source})
    stage = plugin.gate_activation(ctx)
    want = KanGateOptions.model_validate(source or {})
    assert stage.grid == Grid(want.grid_min, want.grid_max, want.num_bases)
    assert stage.use_cuda_kernels is want.use_cuda_kernels and stage.residual_init == want.residual_init


@pytest.mark.parametrize(("bad", "msg"), [({"num_base": 8}, "extra"), ({"num_bases": 3}, "greater than or equal"),
                                          ({"num_bases": 33}, "less than or equal"),
                                          ({"grid_min": 1.0, "grid_max": 1.0}, "must be above"),
                                          ({"grid_max": float("inf")}, "finite"),
                                          ({"residual_init": 2.0}, "less than or equal")])
def test_options_reject_bad_values(bad, msg):
    with pytest.raises(ValueError, match=msg):
        KanGateOptions.model_validate(bad)


def test_manifest_is_discovered_and_validated():
    reg = discover()
    assert "kan_gate" not in reg.problems
    p = reg.plugins["kan_gate"]
    assert p.position == 5 and p.manifest.hooks == ("gate_activation",)
    assert p.manifest.kernel_names() == ["kan_gate_forward", "kan_gate_backward_partial", "kan_gate_param_reduce",
                                         "kan_power"]
    assert p.distribution.startswith("foxhunt-kan-gate ")


@pytest.mark.parametrize("grid", [Grid(), Grid(-2.5, 3.0, 12)], ids=str)
def test_fragment_reads_the_knot_power_form_in_the_forward(grid):
    """The fused forward kernels read b{d}.power (derived from b{d}.coeff before each forward) and
    b{d}.residual; the backward's read b{d}.coeff and b{d}.residual and form their gradients. The
    derive (NumPy here) is the float64 product rounded once to the coefficients' dtype, and the
    form it gives is the twin's spline."""
    from foxhunt_kan_gate.spline import knot_power_map, knot_power_value

    stage = KanGateStage(grid=grid)
    f = stage.fragment
    assert f.arrays == ("b{d}.coeff", "b{d}.residual") and f.forward_names == ("b{d}.power", "b{d}.residual")
    assert f.unit_floats == (grid.num_bases, 1) and f.terms == grid.num_bases + 1
    rng = np.random.default_rng(3)
    params = {k: (v + rng.normal(0, 0.2, v.shape)).astype(np.float32)
              for k, v in stage.init_params((16, 16, 16), rng).items()}
    reads = f.forward_reads(np, params)
    assert {k for k in reads if k.endswith(".power")} == {"b0.power", "b1.power", "b2.power"}
    for d in range(3):
        c = params[f"b{d}.coeff"]
        power = reads[f"b{d}.power"]
        assert power.dtype == np.float32 and power.shape == c.shape
        np.testing.assert_array_equal(power, (c.astype(np.float64) @ knot_power_map(grid)).astype(np.float32))
        x = rng.uniform(grid.lo - 1, grid.hi + 1, (50, 16))
        spline = knot_power_value(np, x, power.astype(np.float64)[None], grid)
        want = (basis_matrix(np, x, grid) * c.astype(np.float64)[None]).sum(-1)
        np.testing.assert_allclose(spline, want, rtol=0, atol=1e-5)
    assert f.branch_forward_arrays(reads, 1)[0] is reads["b1.power"]
    assert f.branch_arrays(params, 1)[0] is params["b1.coeff"]
