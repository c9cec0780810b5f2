"""The fused network launches the same kernels with the same arguments as recorded.

For a grid of (network shape and stages, device capability and SMs, TF32, rows) the update's three
forwards and its backward (and a forward for acting) run on the CPU with every launch recorded
(``launch_trace``); each case's trace must have the digest recorded in ``plan_decisions.json``
(captured from the code before the execution plan: the plan chooses exactly what the old
predicates chose). ``FOXHUNT_TRACE_DIR=dir`` writes every trace out, to diff two versions.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
from launch_trace import (
    DEVICES,
    Recorder,
    blas,
    case_id,
    cases,
    launchers,
    load_golden,
    network,
    numpy_cupy,
    save_golden,
    side_streams,
    stacked_trees,
    write_trace,
    zeros,
)

from foxhunt_core import backend
from foxhunt_core.gpu import kernels as RK
from foxhunt_core.net import fused

PREDICATES = ("glu_gemm_supported", "heads_dueling_supported", "heads_dueling_fills", "glu_backward_gemm_fills",
              "wgrad_gemm_supported", "linear_gemm_relu_backward_fills")
CONSTANTS = ("GLU_BACKWARD_GEMM_DQ_H", "GLU_BACKWARD_GEMM_DQ_COLS", "GLU_BACKWARD_GEMM_SETS", "LINEAR_GEMM_COLS")
CASES = cases()


def _config(name: str, kwargs: dict) -> tuple[dict | None, dict]:
    """The compile-time configuration each wrapper launches its kernel with."""
    if name == "glu_gemm":
        cfg = dict(stages=RK.GLU_GEMM_STAGES, staged_boxes=RK.GLU_GEMM_STAGED_BOXES,
                   store_boxes=RK.GLU_GEMM_STORE_BOXES, cluster=RK.GLU_GEMM_CLUSTER, pv_tma=RK.GLU_GEMM_PV_TMA)
    elif name in ("linear_gemm", "linear_gemm_relu_backward"):
        cfg = dict(stages=RK.LINEAR_GEMM_STAGES, cluster=RK.LINEAR_GEMM_CLUSTER)
    elif name == "heads_dueling":
        cfg = dict(stages=RK.LINEAR_GEMM_STAGES, cluster=RK.LINEAR_GEMM_CLUSTER, staged=RK.HEADS_DUELING_STAGED)
    elif name in ("wgrad_gemm", "wgrad_gemm_sets"):
        cfg = dict(stages=RK.WGRAD_GEMM_STAGES)
    elif name == "glu_backward_gemm":
        cfg = dict(stages=RK.GLU_BACKWARD_GEMM_STAGES)
    else:
        cfg = None
    return cfg, kwargs


def trace(case: tuple, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    kind, shape, dev, tf32, rows = case
    cc, sms = DEVICES[dev]
    rec = Recorder()
    monkeypatch.setitem(sys.modules, "cupy", numpy_cupy())
    monkeypatch.setattr(RK, "sm_count", lambda: sms)
    monkeypatch.setattr(backend, "compute_capability", lambda: cc)
    shim = types.SimpleNamespace(**launchers(rec, _config), **{n: getattr(RK, n) for n in PREDICATES + CONSTANTS})
    monkeypatch.setattr(fused, "K", shim)
    monkeypatch.setattr(fused, "cublas", blas(rec, tf32))
    monkeypatch.setattr(fused, "streams", side_streams(rec))
    net = network(shape)
    storage = fused.storage_shapes(net)
    rec.call("layout", (), {"storage": {k: repr(v) for k, v in storage.items()}})
    online, twin, target = stacked_trees(net, storage)
    S = net.settings.state_dim
    obs, nxt = (zeros((rows, S)) for _ in range(2))
    if kind == "act":
        fused.forward_segments(net, [(online.tree, obs, ("q",))], keep_cache=False)
        return rec
    stacked = fused.stacks(net, rows)  # (the agent's choice of the online tree for s')
    rec.call("twin", (), {"copy": stacked})
    segs = [(online.tree, obs, fused.ALL_OUTPUTS), (twin.tree if stacked else online.tree, nxt, ("q",)),
            (target.tree, nxt, (fused.HEADS,))]
    out, on_next, tgt = fused.forward_segments(net, segs, keep_cache=True)
    rec.call("outputs", (), {"q_next": on_next.q, "heads": tgt.heads, "log_probs": out.log_probs})
    dlogits = zeros(out.log_probs.shape)
    slots = online.zeros_like()
    fused.backward(net, online.tree, out, dlogits, grads_into=slots.tree)
    return rec


RECORD = os.environ.get("FOXHUNT_RECORD_DECISIONS") == "1"  # (re)write plan_decisions.json instead


@pytest.fixture(scope="module")
def golden():
    digests = {} if RECORD else load_golden()
    yield digests
    if RECORD:
        save_golden(digests)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_launches_as_recorded(case, golden, monkeypatch):
    rec = trace(case, monkeypatch)
    write_trace(case, rec)
    if RECORD:
        golden[case_id(case)] = rec.digest()
    assert rec.digest() == golden[case_id(case)]
