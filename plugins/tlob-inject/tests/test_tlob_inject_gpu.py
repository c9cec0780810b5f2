"""tlob_inject on the GPU: the CuPy column gather against NumPy, and the whole update against the
CPU's.

The gather is a copy: fresh random observations (the seed is printed), the output poisoned with NaN
before the call, exact equality required. The update: the CPU float32 update against the GPU's
(TF32 off), with the widened rows moved off zero so that the columns take part; gradients within
``2e-3`` relative (float32 on both sides, different summation order), as the core's GPU update
tests allow. Graph replay against eager updates.
"""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_tlob_inject.options import ORDER_FEATURES, URGENCY_FEATURES
from foxhunt_tlob_inject.stage import FeatureColumns, gather_columns

from foxhunt_core.testing.gpu import fresh_rng, host_relative_error

pytestmark = pytest.mark.gpu
LISTS = [ORDER_FEATURES, URGENCY_FEATURES, ("microprice_dev", "ret_1", "ret_2", "ofi", "position")]
WIDENED = [f"branch{d}.{w}_in" for d in (2, 3) for w in ("w_gate", "w_val")]  # the rows reading the columns


@pytest.fixture
def rng(request):
    return fresh_rng(request)


@pytest.fixture
def cp():
    return pytest.importorskip("cupy")


_rel = host_relative_error


@pytest.mark.parametrize("names", LISTS, ids=lambda n: n[0])
@pytest.mark.parametrize("rows", [1, 37, 4096, 65_536])
def test_gather_on_cupy_equals_numpy(cp, rng, names, rows):
    st = FeatureColumns(2, names)
    obs = rng.normal(size=(rows, 50)).astype(np.float32)
    ref, _ = st.forward(np, {}, obs)
    out = cp.full((rows, st.width), np.nan, dtype=cp.float32)
    got = gather_columns(cp, cp.asarray(obs), st.runs, st.width, out=out)
    assert got is out and not cp.isnan(out).any()
    assert np.array_equal(out.get(), ref)
    cols, _ = st.forward(cp, {}, cp.asarray(obs))
    assert cols.dtype == cp.float32 and np.array_equal(cols.get(), ref)


def _agents(cp, seed: int, names=("tlob_inject",)):
    from foxhunt_core.agent import Agent
    from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
    from foxhunt_core.gpu import cublas
    from foxhunt_core.plugins import discover

    cublas.set_tf32(False)
    settings = RunSettings(net=NetSettings(shared_h1=64, shared_h2=64, adv_h=48),
                           train=TrainSettings(lr=1e-3, tf32=False))
    plugins = discover().plugin_set(list(names))
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


def _off_zero(cpu, rng) -> None:
    for k in WIDENED:
        w = cpu.online["core"][k]
        w[...] = rng.normal(0, 0.3, w.shape).astype(w.dtype)


def test_gpu_update_with_tlob_inject_matches_cpu_update(cp, rng):
    cpu, gpu = _agents(cp, int(rng.integers(1 << 30)))
    assert gpu.stage_owners["branch_inputs"] == ["tlob_inject"]
    _off_zero(cpu, rng)
    for o, s in cpu.online.items():
        for k, v in s.items():
            cpu.target[o][k][...] = v + rng.normal(0.0, 0.05, v.shape).astype(v.dtype)
            gpu.online[o][k][...] = cp.asarray(v)
            gpu.target[o][k][...] = cp.asarray(cpu.target[o][k])
    obs = _batch(rng, 300)["obs"]
    q_cpu = cpu.act_values(obs, 1.0, evaluation=True)
    q_gpu = gpu.act_values(cp.asarray(obs), 1.0, evaluation=True)
    assert _rel(q_gpu, q_cpu) < 1e-4
    batch = _batch(rng, 256)
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    g_gpu, s_gpu, _, _ = gpu.loss_and_grads({k: cp.asarray(v) for k, v in batch.items()}, 0.01)
    assert abs(float(s_cpu["loss"]) - float(s_gpu["loss"])) < 1e-4 * abs(float(s_cpu["loss"]))
    assert set(g_gpu) == set(g_cpu) == {"core"}
    for o, s in g_cpu.items():
        for k, v in s.items():
            assert _rel(g_gpu[o][k], v) < 2e-3, f"{o}/{k}"


def test_step_0_q_on_the_gpu_equals_the_network_without_the_plugin(cp, rng):
    seed = int(rng.integers(1 << 30))
    _, plain = _agents(cp, seed, names=())
    _, wide = _agents(cp, seed)
    obs = cp.asarray(_batch(rng, 512)["obs"])
    q0, q1 = plain.act_values(obs, 1.0, evaluation=True), wide.act_values(obs, 1.0, evaluation=True)
    assert _rel(q1, q0.get()) < 1e-5  # (the two take different kernel arrangements)


def test_graph_replay_with_tlob_inject_equals_eager_updates(cp, rng):
    from foxhunt_core.graphs import GraphedUpdate

    seed = int(rng.integers(1 << 30))
    _, eager = _agents(cp, seed)
    _, graphed = _agents(cp, seed)
    start = {k: graphed.online["core"][k].copy() for k in WIDENED}
    g = GraphedUpdate(graphed, 128)
    for k, v in start.items():
        assert cp.array_equal(graphed.online["core"][k], v), f"capture changed {k}"
    for step in range(5):
        batch = {k: cp.asarray(v) for k, v in _batch(rng, 128).items()}
        coeff = 0.01 * (step + 1)
        s_e, _, _ = eager.update(batch, cp.asarray(coeff, dtype=cp.float32))
        g.load_batch(batch)
        s_g, _, _ = g.replay(coeff)
        cp.cuda.get_current_stream().synchronize()
        assert abs(float(s_e["loss"]) - float(s_g["loss"])) <= 1e-5 * abs(float(s_e["loss"]))
    for k in WIDENED:
        v = eager.online["core"][k]
        assert _rel(graphed.online["core"][k], v.get()) < 1e-5, k
        assert not start[k].any() and bool((v != 0).any()), f"{k}: the widened rows were not trained"
