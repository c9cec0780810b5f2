"""CUDA parity of graph_message.cu: fresh random inputs, outputs poisoned with NaN, float64 twin.

Tolerance: ``||out - ref|| / ||ref|| < 2e-6`` for Q' and dQ (a few float32 terms per output) and
``< 2e-5`` for the parameter gradients (float32 terms per sample, summed over the batch in double),
or four times the float32 twin's own error where the inputs make float32 itself worse.
Also: the stage picks the kernels on CuPy float32, gradients written into given slots, bitwise
reproducible gradients, the wrappers' argument checks, and the whole update with the plugin on the
GPU against the NumPy update (and its CUDA-graph replay against eager launches).
"""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_graph_message import graph

pytestmark = pytest.mark.gpu
TOL_Q = 2e-6
TOL_GRAD = 2e-5  # float32 sums over the batch against the float64 twin (DESIGN.md: fp32 ~1e-5)
LAYOUTS = [(3, 3, 3, 3), (3, 2, 4, 2)]


def _offsets(sizes):
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)]))


def _rel(a, b) -> float:
    a = a.get() if hasattr(a, "get") else a
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _fresh(sizes, batch):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    A = sum(sizes)
    q = (rng.normal(size=(batch, A)) * rng.uniform(0.5, 3.0)).astype(np.float32)
    dy = rng.normal(size=(batch, A)).astype(np.float32)
    params = {k: (rng.normal(size=s) * 0.6).astype(np.float32) for k, s in graph.param_shapes(sizes).items()}
    return q, dy, params, seed


@pytest.mark.parametrize("sizes", LAYOUTS, ids=str)
@pytest.mark.parametrize("batch", [1, 129, 4096, 65_539])
def test_kernels_match_the_float64_twin(sizes, batch):
    import cupy as cp
    from foxhunt_graph_message.cuda import backward_cuda, forward_cuda

    offs = _offsets(sizes)
    q, dy, params, seed = _fresh(sizes, batch)
    dev = {k: cp.asarray(v) for k, v in params.items()}
    dq_, ddy = cp.asarray(q), cp.asarray(dy)
    out = cp.full_like(dq_, cp.nan)
    dq = cp.full_like(dq_, cp.nan)
    grads = {k: cp.full_like(v, cp.nan) for k, v in dev.items()}
    assert forward_cuda(dq_, dev, offs, out=out) is out
    res_dq, res_g = backward_cuda(dq_, ddy, dev, offs, dq=dq, grads=grads)
    assert res_dq is dq and all(res_g[k] is grads[k] for k in grads)
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    ref, cache = graph.forward(np, p64, q.astype(np.float64), offs)
    dref, gref = graph.backward(np, p64, cache, dy.astype(np.float64), offs)
    # The twin in float32: how far float32 arithmetic itself lands from float64 on these inputs. A
    # gate's gradient is a cancelling sum (dot of the message and dy); on a single sample it can sit
    # well past TOL_GRAD in any float32 implementation (seed 4263484918 at batch 1: 3.2e-5 for the
    # twin and the kernel alike), so the kernel is held to the larger of the two.
    _, c32 = graph.forward(np, params, q, offs)
    _, g32 = graph.backward(np, params, c32, dy, offs)
    assert np.isfinite(out.get()).all() and np.isfinite(dq.get()).all(), f"unwritten (seed {seed})"
    assert _rel(out, ref) < TOL_Q, f"forward (seed {seed}, batch {batch})"
    assert _rel(dq, dref) < TOL_Q, f"dq (seed {seed}, batch {batch})"
    for k in grads:
        assert np.isfinite(grads[k].get()).all(), f"{k} unwritten (seed {seed})"
        tol = max(TOL_GRAD, 4.0 * _rel(g32[k], gref[k]))
        assert _rel(grads[k], gref[k]) < tol, f"{k} (seed {seed}, batch {batch})"
    assert np.array_equal(dq_.get(), q) and np.array_equal(ddy.get(), dy), "inputs modified"


def test_gradients_are_bitwise_reproducible_and_the_stage_uses_the_kernels():
    import cupy as cp
    from foxhunt_graph_message.cuda import backward_cuda
    from foxhunt_graph_message.stage import GraphMessageStage

    from foxhunt_core.stages import PostInputs

    sizes = (3, 3, 3, 3)
    q, dy, params, seed = _fresh(sizes, 50_000)
    dev = {k: cp.asarray(v) for k, v in params.items()}
    dq_, ddy = cp.asarray(q), cp.asarray(dy)
    a = backward_cuda(dq_, ddy, dev, _offsets(sizes))
    b = backward_cuda(dq_, ddy, dev, _offsets(sizes))
    assert cp.array_equal(a[0], b[0]) and all(cp.array_equal(a[1][k], b[1][k]) for k in dev), f"seed {seed}"
    st = GraphMessageStage(sizes)
    out, cache = st.forward(cp, dev, PostInputs(dq_, cp.abs(dq_)))
    assert cache.get("kernel") is True
    slots = {k: cp.zeros_like(v) for k, v in dev.items()}
    dq_in, g = st.backward(cp, dev, cache, ddy, grads_into=slots)
    assert all(g[k] is slots[k] for k in slots), "gradients not written into the given slots"
    assert cp.array_equal(dq_in, a[0])
    plain = GraphMessageStage(sizes, use_cuda_kernel=False)
    out2, cache2 = plain.forward(cp, dev, PostInputs(dq_, cp.abs(dq_)))
    # the array-op path runs its products on cuBLAS, in TF32 where the process enabled it
    # (backend.select does for a training run): DESIGN.md's TF32 tolerance
    assert not cache2.get("kernel") and _rel(out2, out.get()) < 1e-3


def test_wrappers_check_their_arguments():
    import cupy as cp
    from foxhunt_graph_message.cuda import backward_cuda, forward_cuda

    sizes = (3, 3, 3, 3)
    offs = _offsets(sizes)
    q, dy, params, _ = _fresh(sizes, 8)
    dev = {k: cp.asarray(v) for k, v in params.items()}
    dq_ = cp.asarray(q)
    with pytest.raises(TypeError, match="graph_message_forward: q must be float32"):
        forward_cuda(dq_.astype(cp.float64), dev, offs)
    with pytest.raises(ValueError, match="alias"):
        forward_cuda(dq_, dev, offs, out=dq_)
    with pytest.raises(ValueError, match="dir_mag.msg has shape"):
        forward_cuda(dq_, {**dev, "dir_mag.msg": cp.zeros((3, 2), cp.float32)}, offs)
    with pytest.raises(KeyError, match="ord_urg.gate_dst"):
        forward_cuda(dq_, {k: v for k, v in dev.items() if k != "ord_urg.gate_dst"}, offs)
    with pytest.raises(ValueError, match="alias"):
        d = cp.asarray(dy)
        backward_cuda(dq_, d, dev, offs, dq=d)


def _agents(cp, both_gpu: bool = False):
    from foxhunt_core.agent import Agent
    from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
    from foxhunt_core.gpu import cublas
    from foxhunt_core.plugins import discover

    cublas.set_tf32(False)
    settings = RunSettings(net=NetSettings(shared_h1=64, shared_h2=64, adv_h=48), train=TrainSettings(lr=1e-3))
    reg = discover()
    seed = int(np.random.SeedSequence().entropy % 2**30)
    a = Agent(settings, reg.plugin_set(["graph_message"]), cp if both_gpu else np,
              np.random.default_rng(seed))
    b = Agent(settings, reg.plugin_set(["graph_message"]), cp, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    for o, s in a.online.items():
        for k, v in s.items():
            host = v.get() if hasattr(v, "get") else v
            new = host + rng.normal(0.0, 0.05, host.shape).astype(host.dtype)  # gates away from 0
            a.online[o][k][...] = new if a.xp is np else cp.asarray(new)
            b.online[o][k][...] = cp.asarray(new)
    a.sync_target()
    b.sync_target()
    return rng, a, b


def _batch(rng, B):
    return {"obs": rng.normal(size=(B, 50)).astype(np.float32), "next_obs": rng.normal(size=(B, 50)).astype(np.float32),
            "action": rng.integers(0, 3, size=(B, 4)), "reward": rng.normal(size=B).astype(np.float32),
            "terminal": (rng.random(B) < 0.1).astype(np.float32)}


def test_gpu_update_with_the_plugin_matches_the_cpu_update():
    import cupy as cp

    rng, cpu, gpu = _agents(cp)
    batch = _batch(rng, 256)
    g_cpu, s_cpu, _, _ = cpu.loss_and_grads(batch, 0.01)
    g_gpu, s_gpu, _, _ = gpu.loss_and_grads({k: cp.asarray(v) for k, v in batch.items()}, 0.01)
    assert abs(float(s_cpu["aux_loss"]) - float(s_gpu["aux_loss"])) < 1e-4 * abs(float(s_cpu["aux_loss"]))
    for k, v in g_cpu["graph_message"].items():
        assert _rel(g_gpu["graph_message"][k], v) < 2e-3, k
    slots = gpu.opt.grad_slots()["graph_message"]
    assert all(g_gpu["graph_message"][k].data.ptr == slots[k].data.ptr for k in slots), "not written in place"


def test_graph_replay_with_the_plugin_equals_eager_updates():
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
    for k, v in eager.online["graph_message"].items():
        assert _rel(graphed.online["graph_message"][k], v.get()) < 1e-5, k
