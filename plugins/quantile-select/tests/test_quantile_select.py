"""quantile_select on the NumPy path: hand-worked quantiles, the blend, options, manifest, kernel build."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from foxhunt_quantile_select import plugin
from foxhunt_quantile_select.kernel import KERNEL_FILE, tile_for
from foxhunt_quantile_select.quantile import (
    quantile_reference,
    quantile_select_xp,
    quantiles_xp,
    select_reference,
)

from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import discover
from foxhunt_core.stages import BuildContext, SelectInputs

Z5 = np.linspace(-2.0, 2.0, 5)  # atoms -2 -1 0 1 2, dz = 1
Z51 = np.linspace(-10.0, 10.0, 51)  # the default support, dz = 0.4


def _select(p: np.ndarray, z: np.ndarray, alpha: float, lower: float = 0.1, upper: float = 0.9) -> float:
    """Q_select of one distribution three ways (reference, NumPy twin, the stage); asserts they agree."""
    ref = select_reference(p, z[0], z[1] - z[0], alpha, lower, upper)
    twin = quantile_select_xp(np, p[None, None, :], z, alpha, lower, upper)[0, 0]
    st = plugin.QuantileSelectStage(lower=lower, upper=upper)
    inputs = SelectInputs(p[None, None, :], z, np.zeros((1, 1)), np.zeros((1, 1)), alpha)
    via_stage = st.select_values(np, inputs)[0, 0]
    assert twin == pytest.approx(ref, abs=1e-12) and via_stage == pytest.approx(ref, abs=1e-12)
    return ref


def _one_hot(n: int, k: int) -> np.ndarray:
    p = np.zeros(n)
    p[k] = 1.0
    return p


# ----------------------------------------------------------------------------- golden values
@pytest.mark.parametrize("alpha, want", [(0.0, 1.4), (1.0, 0.6), (0.5, 1.0), (0.25, 1.2)])
def test_point_mass(alpha, want):
    """All mass on z_3 = 1: its cell is [0.5, 1.5], so Q(tau) = 1 + (tau - 1/2); Q10 = 0.6, Q90 = 1.4."""
    p = _one_hot(5, 3)
    assert quantile_reference(p, -2.0, 1.0, 0.1) == pytest.approx(0.6)
    assert quantile_reference(p, -2.0, 1.0, 0.9) == pytest.approx(1.4)
    assert _select(p, Z5, alpha) == pytest.approx(want, abs=1e-12)


def test_point_mass_on_the_edge_atoms_reads_inside_their_cells():
    assert _select(_one_hot(5, 0), Z5, 1.0) == pytest.approx(-2.4)  # Q10 of mass on z_0 = -2
    assert _select(_one_hot(5, 4), Z5, 0.0) == pytest.approx(2.4)  # Q90 of mass on z_4 = 2


@pytest.mark.parametrize("alpha, want", [(0.0, 2.0 + 0.65 / 0.75 - 0.5), (1.0, -1.1), (0.25, 1.5)])
def test_two_atoms(alpha, want):
    """Mass 1/4 on z_1 = -1 and 3/4 on z_4 = 2. Q10: 0.1 <= F_1 = 0.25, so j = 1 and the fraction is
    0.1 / 0.25 = 0.4: Q10 = -1 + (0.4 - 0.5) = -1.1. Q90: F_1..F_3 = 0.25 < 0.9 <= F_4 = 1, fraction
    (0.9 - 0.25) / 0.75: Q90 = 2 + 0.8667 - 0.5 = 2.3667. At alpha 1/4: 0.75 Q90 + 0.25 Q10 = 1.5."""
    p = np.array([0.0, 0.25, 0.0, 0.0, 0.75])
    assert _select(p, Z5, alpha) == pytest.approx(want, abs=1e-12)


def test_two_equal_adjacent_atoms_have_their_midpoint_as_median():
    """Half on z_1, half on z_2: the median is where the cells meet (-0.5), continuous across it."""
    p = np.array([0.0, 0.5, 0.5, 0.0, 0.0])
    assert quantile_reference(p, -2.0, 1.0, 0.5) == pytest.approx(-0.5)
    below, above = (quantile_reference(p, -2.0, 1.0, t) for t in (0.5 - 1e-9, 0.5 + 1e-9))
    assert below == pytest.approx(-0.5, abs=1e-8) and above == pytest.approx(-0.5, abs=1e-8)
    assert _select(p, Z5, 0.5, lower=0.5, upper=0.5) == pytest.approx(-0.5)


@pytest.mark.parametrize("alpha, want", [(0.0, 8.16), (1.0, -8.16), (0.5, 0.0), (0.75, -4.08)])
def test_uniform(alpha, want):
    """Uniform on the 51 default atoms: the cells tile [-10.2, 10.2] evenly, so
    Q(tau) = -10.2 + 20.4 tau: Q10 = -8.16, Q90 = +8.16."""
    p = np.full(51, 1.0 / 51)
    assert _select(p, Z51, alpha) == pytest.approx(want, abs=1e-9)


def test_alpha_is_iqn_readiness_clipped_to_the_unit_interval():
    p = np.array([0.1, 0.2, 0.3, 0.3, 0.1])
    assert _select(p, Z5, -0.7) == _select(p, Z5, 0.0)
    assert _select(p, Z5, 1.8) == _select(p, Z5, 1.0)
    assert _select(p, Z5, 0.0) > _select(p, Z5, 1.0)


def test_monotone_non_increasing_in_alpha():
    rng = np.random.default_rng()
    logits = rng.normal(size=(64, 12, 51)) * rng.uniform(0.5, 4.0)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    vals = np.stack([quantile_select_xp(np, probs, Z51, a, 0.1, 0.9) for a in np.linspace(0, 1, 21)])
    assert (np.diff(vals, axis=0) <= 1e-12).all()
    assert (vals[0] - vals[-1] > 0).all()  # strictly: Q90 > Q10 for every spread-out distribution


# ----------------------------------------------------------------------------- properties
def test_twin_matches_the_reference_on_random_distributions():
    rng = np.random.default_rng()
    probs = rng.dirichlet(np.full(11, 0.3), size=(40, 12))  # peaked, with near-empty atoms
    probs[0, 0] = _one_hot(11, 7)
    probs[1, 1] = np.full(11, 1.0 / 11)
    z = np.linspace(-3.0, 5.0, 11)
    lower, upper = sorted(rng.uniform(0.01, 0.99, size=2))
    for alpha in (0.0, 0.3, 1.0):
        got = quantile_select_xp(np, probs, z, alpha, lower, upper)
        want = np.array([[select_reference(probs[b, a], z[0], 0.8, alpha, lower, upper) for a in range(12)]
                         for b in range(40)])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    f32 = quantile_select_xp(np, probs.astype(np.float32), z.astype(np.float32), 0.3, lower, upper)
    assert f32.dtype == np.float32 and f32.shape == (40, 12)


def test_quantile_function_integrates_to_the_mean_and_stays_in_the_cells():
    """The cell distribution's mean is E[Q]: the integral of Q(tau) over (0, 1) equals sum p_j z_j
    (midpoint rule on 4000 levels, error well below 1e-3; a reading off by half a cell, dz/2 = 0.2,
    would fail it)."""
    rng = np.random.default_rng()
    probs = rng.dirichlet(np.full(51, 3.0), size=(8, 12))
    taus = (np.arange(4000) + 0.5) / 4000
    q = np.stack([quantiles_xp(np, probs, Z51, t) for t in taus])  # [T, 8, 12]
    np.testing.assert_allclose(q.mean(axis=0), (probs * Z51).sum(-1), atol=1e-3)
    assert (np.diff(q, axis=0) >= -1e-12).all()  # non-decreasing in tau
    assert q.min() >= -10.2 - 1e-12 and q.max() <= 10.2 + 1e-12


def test_unnormalised_mass_is_read_as_its_normalised_distribution():
    p = np.array([0.1, 0.2, 0.3, 0.3, 0.1])
    for tau in (0.05, 0.1, 0.5, 0.9, 0.99):
        assert quantile_reference(p * (1 + 3e-7), -2.0, 1.0, tau) == pytest.approx(
            quantile_reference(p, -2.0, 1.0, tau), abs=1e-9)


# ----------------------------------------------------------------------------- plugin surface
def test_options_defaults_bounds_and_unknown_keys():
    o = plugin.QuantileSelectOptions()
    assert (o.lower_quantile, o.upper_quantile, o.evaluation, o.use_cuda_kernel) == (0.1, 0.9, "coordinated_q", True)
    with pytest.raises(ValueError, match="lower_quantile must not exceed upper_quantile"):
        plugin.QuantileSelectOptions(lower_quantile=0.8, upper_quantile=0.2)
    for bad in ({"lower_quantile": 0.0}, {"upper_quantile": 1.0}, {"evaluation": "raw"}, {"upper_quantil": 0.8}):
        with pytest.raises(ValueError):
            plugin.QuantileSelectOptions.model_validate(bad)
    assert plugin.QuantileSelectOptions(lower_quantile=0.5, upper_quantile=0.5).lower_quantile == 0.5


@pytest.mark.parametrize("source, want", [
    (None, (0.1, 0.9, False, True)),
    ({"evaluation": "q_select", "lower_quantile": 0.25}, (0.25, 0.9, True, True)),
    (plugin.QuantileSelectOptions(upper_quantile=0.75, use_cuda_kernel=False), (0.1, 0.75, False, False)),
])
def test_hook_builds_the_stage_from_the_options(source, want):
    ctx = BuildContext(settings=RunSettings(), xp=np, options={} if source is None else {"quantile_select": source})
    st = plugin.action_select(ctx)
    assert (st.lower, st.upper, st.in_evaluation, st.use_cuda_kernel) == want and st.name == "quantile_select"


def test_manifest_is_discovered_and_validated():
    reg = discover()
    assert "quantile_select" not in reg.problems
    p = reg.plugins["quantile_select"]
    assert p.position == 3 and p.manifest.hooks == ("action_select",)
    assert p.manifest.kernel_names() == ["quantile_select"]
    assert p.manifest.parameter_count() == 0 and p.manifest.parameters == ()
    assert p.distribution.startswith("foxhunt-quantile-select ")


def test_tile_fits_shared_memory_up_to_383_atoms():
    assert [tile_for(n) for n in (2, 51, 95, 96, 191, 192, 383)] == [128, 128, 128, 64, 64, 32, 32]
    assert tile_for(384) is None and tile_for(1000) is None
    for n in range(2, 384):
        assert tile_for(n) * (n | 1) * 4 <= 48 * 1024


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on this machine")
@pytest.mark.parametrize("defines", [[], ["-DNUM_ATOMS=64"], ["-DNUM_ATOMS=11"], ["-DNUM_ATOMS=191", "-DQS_TILE=64"],
                                     ["-DNUM_ATOMS=383", "-DQS_TILE=32"]])
def test_kernel_compiles_to_ptx_for_sm90(tmp_path, defines):
    res = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", *defines, str(KERNEL_FILE), "-o", str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert ".entry quantile_select" in (tmp_path / "k.ptx").read_text()
