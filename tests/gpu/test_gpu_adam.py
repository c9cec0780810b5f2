"""Parity of adam.cu (global-norm clipping + fused Adam over a flat buffer) with optim.Adam.

Tolerance: ``||out - ref|| / ||ref|| < 1e-5`` for the parameter change (parameters of size ~0.01
so that float32 storage does not dominate the change), both moments and the gradient norm, after
several steps (the reference runs the core's Adam, in float64, on the views
of a NumPy FlatTree). The CUDA-graph test replays one captured step three times.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu.flat import FlatTree
from foxhunt_core.optim import Adam

pytestmark = pytest.mark.gpu
TOL = 1e-5
SHAPES = {"core": {"trunk.w1": (50, 256), "trunk.b1": (256,), "attn.gate": (12,)}, "kan_gate": {"coef": (4, 7)}}
HYPER = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)


def _setup(cp, rng, clip_norm):
    ref_p = FlatTree(SHAPES, dtype=np.float64)
    # Small parameters: the change is compared, and float32 storage of a parameter of size ~0.5
    # alone would cost ~1e-5 relative on a change of ~1e-3 (ulp(0.5) / 2 = 3e-8 per element).
    for _, _, a in ref_p.items():
        a[...] = rng.normal(0, 0.01, a.shape).astype(np.float32)
    opt = Adam(ref_p.tree, HYPER["lr"], (HYPER["b1"], HYPER["b2"]), HYPER["eps"], clip_norm)
    dev = {n: cp.zeros(ref_p.size, cp.float32) for n in ("g", "m", "v")}
    dev.update(p=cp.asarray(ref_p.buffer, cp.float32), step=cp.zeros(1, cp.int32))
    return ref_p, opt, dev


def _flat(ref_p, moment):
    """A moment tree of the core's Adam (separate arrays) laid out like the device buffer."""
    out = ref_p.zeros_like()
    out.load(moment)
    return out.buffer


def _grads(rng, scale):
    g = FlatTree(SHAPES, dtype=np.float64)
    for _, _, a in g.items():
        a[...] = rng.normal(0, scale, a.shape).astype(np.float32)
    return g


@pytest.mark.parametrize("clip_norm", [None, 5.0])
def test_adam_step_matches_optim_adam(cp, rng, clip_norm):
    ref_p, opt, dev = _setup(cp, rng, clip_norm)
    p0 = ref_p.buffer.copy()
    for step, scale in enumerate((1.0, 0.01, 3.0)):  # clipped, not clipped, clipped (when clipping)
        g = _grads(rng, scale)
        dev["g"][...] = cp.asarray(g.buffer, cp.float32)
        scalars = cp.full(4, np.nan, cp.float32)
        K.adam_step(dev["p"], dev["g"], dev["m"], dev["v"], dev["step"], clip_norm=clip_norm,
                    scalars=scalars, **HYPER)
        norm = opt.step(ref_p.tree, g.tree)
        assert_close(f"grad norm, step {step}", scalars[:1], [norm], TOL)
    assert int(dev["step"].get()[0]) == 3
    assert_close("param change", dev["p"] - cp.asarray(p0, cp.float32), ref_p.buffer - p0, TOL)
    assert_close("m", dev["m"], _flat(ref_p, opt.m), TOL)
    assert_close("v", dev["v"], _flat(ref_p, opt.v), TOL)


def test_adam_step_replays_as_a_cuda_graph(cp, rng):
    ref_p, opt, dev = _setup(cp, rng, 5.0)
    p0 = ref_p.buffer.copy()
    scalars = cp.zeros(4, cp.float32)
    ws = K.adam_workspace()
    g = _grads(rng, 1.0)
    dev["g"][...] = cp.asarray(g.buffer, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        # Warm up (compiles the module) outside the capture, then undo its effect.
        K.adam_step(dev["p"], dev["g"], dev["m"], dev["v"], dev["step"], clip_norm=5.0,
                    scalars=scalars, workspace=ws, **HYPER)
        dev["p"][...] = cp.asarray(p0, cp.float32)
        dev["m"].fill(0)
        dev["v"].fill(0)
        dev["step"].fill(0)
        stream.begin_capture()
        K.adam_step(dev["p"], dev["g"], dev["m"], dev["v"], dev["step"], clip_norm=5.0,
                    scalars=scalars, workspace=ws, **HYPER)
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        stream.synchronize()
    for _ in range(3):
        opt.step(ref_p.tree, g.tree)
    assert int(dev["step"].get()[0]) == 3
    assert_close("param change", dev["p"] - cp.asarray(p0, cp.float32), ref_p.buffer - p0, TOL)


def test_adam_step_checks_buffers(cp):
    p = cp.zeros(64, cp.float32)
    with pytest.raises(ValueError, match="adam_step: m has shape"):
        K.adam_step(p, p, cp.zeros(32, cp.float32), p, cp.zeros(1, cp.int32), 1e-3)
    with pytest.raises(TypeError, match="adam_step: step must be int32"):
        K.adam_step(p, p, p, p, cp.zeros(1, cp.int64), 1e-3)
