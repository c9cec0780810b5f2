"""CUDA parity of diffusion_refine.cu: fresh random inputs, outputs poisoned with NaN, float64 twin.

Tolerance: ``||out - ref|| / ||ref|| < 2e-6`` for the refined Q and dQ (float32 sums of a few dozen
terms per value) and ``< 1e-5`` for the parameter gradients (float32 per tile, then double).
Also: the stage picks the kernels on CuPy float32 (and the array path where no kernel fits),
gradients written into given slots, bitwise reproducible gradients, the wrappers' argument checks,
and the whole update with graph_message and the plugin on the GPU against the NumPy update (and
its CUDA-graph replay against eager launches).
"""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_diffusion_refine import refine

pytestmark = pytest.mark.gpu
TOL_Q = 2e-6
TOL_GRAD = 2e-5  # float32 sums over the batch against the float64 twin (DESIGN.md: fp32 ~1e-5)


def _rel(a, b) -> float:
    a = a.get() if hasattr(a, "get") else a
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _fresh(A, K, H, batch):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    q = (rng.normal(size=(batch, A)) * rng.uniform(0.5, 3.0)).astype(np.float32)
    var = (rng.random((batch, A)) * 4.0).astype(np.float32)
    var[0, 0] = -1e-5  # a variance rounded below zero: sigma 0
    dy = rng.normal(size=(batch, A)).astype(np.float32)
    p = refine.init_params(K, H, A, rng, zero_output=False)
    p = {k: (v + rng.normal(size=v.shape) * 0.3).astype(np.float32) for k, v in p.items()}
    return q, var, dy, p, seed


@pytest.mark.parametrize(("A", "K", "H"), [(12, 3, 24), (12, 3, 48), (7, 2, 8)])
@pytest.mark.parametrize("batch", [1, 129, 4096, 65_539])
def test_kernels_match_the_float64_twin(A, K, H, batch):
    import cupy as cp
    from foxhunt_diffusion_refine.cuda import backward_cuda, forward_cuda

    q, var, dy, p, seed = _fresh(A, K, H, batch)
    dev = {k: cp.asarray(v) for k, v in p.items()}
    dq_, dv, ddy = cp.asarray(q), cp.asarray(var), cp.asarray(dy)
    out = cp.full_like(dq_, cp.nan)
    dq = cp.full_like(dq_, cp.nan)
    grads = {k: cp.full_like(v, cp.nan) for k, v in dev.items()}
    assert forward_cuda(dq_, dv, dev, 0.1, out=out) is out
    res_dq, res_g = backward_cuda(dq_, dv, ddy, dev, 0.1, dq=dq, grads=grads)
    assert res_dq is dq and all(res_g[k] is grads[k] for k in grads)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    ref, cache = refine.forward(np, p64, q.astype(np.float64), var.astype(np.float64), 0.1)
    dref, gref = refine.backward(np, p64, cache, dy.astype(np.float64))
    assert np.isfinite(out.get()).all() and np.isfinite(dq.get()).all(), f"unwritten (seed {seed})"
    assert _rel(out, ref) < TOL_Q, f"forward (seed {seed}, batch {batch})"
    assert _rel(dq, dref) < TOL_Q, f"dq (seed {seed}, batch {batch})"
    for k in grads:
        assert np.isfinite(grads[k].get()).all(), f"{k} unwritten (seed {seed})"
        assert _rel(grads[k], gref[k]) < TOL_GRAD, f"{k} (seed {seed}, batch {batch})"
    assert np.array_equal(dq_.get(), q) and np.array_equal(dv.get(), var) and np.array_equal(ddy.get(), dy)


@pytest.mark.parametrize("batch", [129, 65_539])
def test_the_bits_do_not_depend_on_the_lanes_or_the_rows_and_all_match_the_twin(batch):
    """The wrappers choose 8 or 4 lanes a sample, and 1 or 2 samples a forward thread, by batch
    size: every choice gives the same bits (a sample's sums are added in one tree whichever lanes
    add them, and a thread's samples do not share arithmetic), and all match the twin."""
    import cupy as cp
    from foxhunt_diffusion_refine.cuda import FEW_LANES, LANES, backward_cuda, forward_cuda

    q, var, dy, p, seed = _fresh(12, 3, 24, batch)
    dev = {k: cp.asarray(v) for k, v in p.items()}
    dq_, dv, ddy = cp.asarray(q), cp.asarray(var), cp.asarray(dy)
    outs = {}
    for lanes in (LANES, FEW_LANES):
        for rows in (1, 2):
            outs[lanes, rows] = forward_cuda(dq_, dv, dev, 0.1, out=cp.full_like(dq_, cp.nan), lanes=lanes,
                                             rows=rows).get()
    back = {}
    for lanes in (LANES, FEW_LANES):
        dq, g = backward_cuda(dq_, dv, ddy, dev, 0.1, dq=cp.full_like(dq_, cp.nan),
                              grads={k: cp.full_like(v, cp.nan) for k, v in dev.items()}, lanes=lanes)
        back[lanes] = (dq.get(), {k: v.get() for k, v in g.items()})
    first = outs[LANES, 1]
    for key, out in outs.items():
        np.testing.assert_array_equal(out, first, err_msg=f"forward {key} (seed {seed})")
    a, b = back[LANES], back[FEW_LANES]
    np.testing.assert_array_equal(a[0], b[0], err_msg=f"dq (seed {seed})")
    for k in a[1]:
        np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=f"{k} (seed {seed})")
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    ref, cache = refine.forward(np, p64, q.astype(np.float64), var.astype(np.float64), 0.1)
    dref, gref = refine.backward(np, p64, cache, dy.astype(np.float64))
    assert np.isfinite(first).all() and _rel(first, ref) < TOL_Q, f"forward (seed {seed})"
    assert np.isfinite(b[0]).all() and _rel(b[0], dref) < TOL_Q, f"dq (seed {seed})"
    for k in gref:
        assert np.isfinite(b[1][k]).all() and _rel(b[1][k], gref[k]) < TOL_GRAD, f"{k} (seed {seed})"


def test_gradients_are_bitwise_reproducible_and_the_stage_uses_the_kernels():
    import cupy as cp
    from foxhunt_diffusion_refine.cuda import backward_cuda
    from foxhunt_diffusion_refine.stage import DiffusionRefineStage

    from foxhunt_core.stages import PostInputs

    q, var, dy, p, seed = _fresh(12, 3, 24, 50_000)
    dev = {k: cp.asarray(v) for k, v in p.items()}
    dq_, dv, ddy = cp.asarray(q), cp.asarray(var), cp.asarray(dy)
    a = backward_cuda(dq_, dv, ddy, dev, 0.1)
    b = backward_cuda(dq_, dv, ddy, dev, 0.1)
    assert cp.array_equal(a[0], b[0]) and all(cp.array_equal(a[1][k], b[1][k]) for k in dev), f"seed {seed}"
    st = DiffusionRefineStage(12)
    out, cache = st.forward(cp, dev, PostInputs(dq_, dv))
    assert cache.get("kernel") is True
    slots = {k: cp.zeros_like(v) for k, v in dev.items()}
    dq_in, g = st.backward(cp, dev, cache, ddy, grads_into=slots)
    assert all(g[k] is slots[k] for k in slots), "gradients not written into the given slots"
    assert cp.array_equal(dq_in, a[0])
    plain = DiffusionRefineStage(12, use_cuda_kernel=False)
    out2, cache2 = plain.forward(cp, dev, PostInputs(dq_, dv))
    # the array-op path runs its products on cuBLAS, in TF32 where the process enabled it
    # (backend.select does for a training run): DESIGN.md's TF32 tolerance
    assert not cache2.get("kernel") and _rel(out2, out.get()) < 1e-3
    wide = DiffusionRefineStage(12, hidden=70)  # no kernel fits: the array path, said once
    p64 = {k: cp.asarray(v, dtype=cp.float32) for k, v in wide.init_params(np.random.default_rng(0)).items()}
    with pytest.warns(RuntimeWarning, match="no CUDA kernel"):
        _, c3 = wide.forward(cp, p64, PostInputs(dq_, dv))
    assert not c3.get("kernel")


def test_wrappers_check_their_arguments():
    import cupy as cp
    from foxhunt_diffusion_refine.cuda import backward_cuda, forward_cuda

    q, var, dy, p, _ = _fresh(12, 3, 24, 8)
    dev = {k: cp.asarray(v) for k, v in p.items()}
    dq_, dv = cp.asarray(q), cp.asarray(var)
    with pytest.raises(TypeError, match="diffusion_refine_forward: var must be float32"):
        forward_cuda(dq_, dv.astype(cp.float64), dev, 0.1)
    with pytest.raises(ValueError, match="alias"):
        forward_cuda(dq_, dv, dev, 0.1, out=dv)
    with pytest.raises(ValueError, match="b2 has shape"):
        forward_cuda(dq_, dv, {**dev, "b2": cp.zeros((3, 11), cp.float32)}, 0.1)
    with pytest.raises(ValueError, match="alias"):
        d = cp.asarray(dy)
        backward_cuda(dq_, dv, d, dev, 0.1, dq=d)


def _agents(cp, both_gpu: bool = False):
    from foxhunt_core.agent import Agent
    from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
    from foxhunt_core.gpu import cublas
    from foxhunt_core.plugins import discover

    cublas.set_tf32(False)
    settings = RunSettings(net=NetSettings(shared_h1=64, shared_h2=64, adv_h=48), train=TrainSettings(lr=1e-3))
    names = ["graph_message", "diffusion_refine"]
    opts = {"diffusion_refine": {"zero_init_output": False}}  # every weight with a gradient at once
    reg = discover()
    seed = int(np.random.SeedSequence().entropy % 2**30)
    a = Agent(settings, reg.plugin_set(names), cp if both_gpu else np, np.random.default_rng(seed), options=opts)
    b = Agent(settings, reg.plugin_set(names), cp, np.random.default_rng(seed), options=opts)
    rng = np.random.default_rng(seed + 1)
    for o, s in a.online.items():
        for k, v in s.items():
            host = v.get() if hasattr(v, "get") else v
            new = host + rng.normal(0.0, 0.05, host.shape).astype(host.dtype)
            a.online[o][k][...] = new if a.xp is np else cp.asarray(new)
            b.online[o][k][...] = cp.asarray(new)
    a.sync_target()
    b.sync_target()
    return rng, a, b


def _batch(rng, B):
    return {"obs": rng.normal(size=(B, 50)).astype(np.float32), "next_obs": rng.normal(size=(B, 50)).astype(np.float32),
            "action": rng.integers(0, 3, size=(B, 4)), "reward": rng.normal(size=B).astype(np.float32),
            "terminal": (rng.random(B) < 0.1).astype(np.float32)}


def test_gpu_update_with_the_plugins_matches_the_cpu_update():
    import cupy as cp

    rng, cpu, gpu = _agents(cp)
    batch = _batch(rng, 256)
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    g_gpu, s_gpu, _, _ = gpu.loss_and_grads({k: cp.asarray(v) for k, v in batch.items()}, 0.01)
    assert abs(float(s_cpu["aux_loss"]) - float(s_gpu["aux_loss"])) < 1e-4 * abs(float(s_cpu["aux_loss"]))
    for owner in ("graph_message", "diffusion_refine"):
        for k, v in g_cpu[owner].items():
            assert _rel(g_gpu[owner][k], v) < 2e-3, f"{owner}/{k}"
        slots = gpu.opt.grad_slots()[owner]
        assert all(g_gpu[owner][k].data.ptr == slots[k].data.ptr for k in slots), f"{owner}: not in place"


def test_graph_replay_with_the_plugins_equals_eager_updates():
    import cupy as cp

    from foxhunt_core.graphs import GraphedUpdate

    rng, eager, graphed = _agents(cp, both_gpu=True)
    g = GraphedUpdate(graphed, 128)
    for step in range(4):
        batch = {k: cp.asarray(v) for k, v in _batch(rng, 128).items()}
        s_e, _, _ = eager.update(batch, cp.asarray(0.01, dtype=cp.float32))
        g.load_batch(batch)
        s_g, _, _ = g.replay(0.01)
        cp.cuda.get_current_stream().synchronize()
        assert abs(float(s_e["aux_loss"]) - float(s_g["aux_loss"])) <= 1e-5 * abs(float(s_e["aux_loss"])), step
    for k, v in eager.online["diffusion_refine"].items():
        assert _rel(graphed.online["diffusion_refine"][k], v.get()) < 1e-5, k
