"""The fused network launches the same kernels with the same arguments as recorded.

For a grid of (network shape and stages, device capability and SMs, TF32, rows) the execution plan
is built, and the update's three forwards and its backward (and a forward for acting) run on the
CPU with every launch recorded (``launch_trace``); each case's trace must have the digest recorded
in ``plan_decisions.json``, which was captured from the code before the execution plan existed
(its predicates read the device and module switches at each call): the plan chooses exactly what
they chose. ``FOXHUNT_TRACE_DIR=dir`` writes every trace out, to diff two versions.
"""

from __future__ import annotations

import os
import re
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

from foxhunt_core.gpu import kernels as RK
from foxhunt_core.net import fused
from foxhunt_core.net.fused import Device, ExecutionPlan, FusedNetwork, record

CONSTANTS = ("GLU_BACKWARD_GEMM_SETS",)
CASES = cases()


def _config(name: str, kwargs: dict) -> tuple[dict | None, dict]:
    """The compile-time configuration each wrapper launches its kernel with (the config the call
    passes, else the wrapper's default), as the recorded traces name it."""
    kwargs = dict(kwargs)
    cfg = kwargs.pop("config", None)
    straight = kwargs.pop("straight", False)
    if name == "glu_gemm":
        c = cfg or RK.GluGemmConfig()
        out = dict(stages=c.stages, staged_boxes=c.staged_boxes, store_boxes=c.store_boxes, cluster=c.cluster,
                   pv_tma=c.pv_tma)
    elif name in ("linear_gemm", "linear_gemm_relu_backward", "heads_dueling"):
        c = cfg or RK.LinearGemmConfig()
        out = dict(stages=c.stages, cluster=c.cluster)
        if name == "heads_dueling":
            out["staged"] = not straight
    elif name in ("wgrad_gemm", "wgrad_gemm_sets"):
        out = dict(stages=(cfg or RK.WgradGemmConfig()).stages)
    elif name == "glu_backward_gemm":
        out = dict(stages=(cfg or RK.GluBackwardGemmConfig()).stages)
    else:
        out = None
    return out, kwargs


def trace(case: tuple) -> Recorder:
    """The launches of one case: the plan built for its device, TF32 and rows, the network run over
    recording stand-ins of the kernels, GEMMs and side stream."""
    kind, shape, dev, tf32, rows = case
    cc, sms = DEVICES[dev]
    rec = Recorder()
    net = network(shape)
    plan = ExecutionPlan.build(net, Device(cc, sms), tf32, rows)
    kernels = types.SimpleNamespace(**launchers(rec, _config), **{n: getattr(RK, n) for n in CONSTANTS})
    fn = FusedNetwork(net, plan, kernels=kernels, blas=blas(rec), streams=side_streams(rec), xp=numpy_cupy())
    storage = fn.storage_shapes()
    rec.call("layout", (), {"storage": {k: repr(v) for k, v in storage.items()}})
    online, twin, target = stacked_trees(net, storage)
    S = net.settings.state_dim
    obs, nxt = zeros((rows, S)), zeros((rows, S))
    if kind == "act":
        fn.forward_segments([(online.tree, obs, ("q",))], keep_cache=False)
        return rec
    stacked = plan.stacks(rows).on  # (the agent's choice of the online tree for s')
    rec.call("twin", (), {"copy": stacked})
    segs = [(online.tree, obs, fused.ALL_OUTPUTS), (twin.tree if stacked else online.tree, nxt, ("q",)),
            (target.tree, nxt, (fused.HEADS,))]
    out, on_next, tgt = fn.forward_segments(segs, keep_cache=True)
    rec.call("outputs", (), {"q_next": on_next.q, "heads": tgt.heads, "log_probs": out.log_probs})
    fn.backward(online.tree, out, zeros(out.log_probs.shape), grads_into=online.zeros_like().tree)
    return rec


RECORD = os.environ.get("FOXHUNT_RECORD_DECISIONS") == "1"  # (re)write plan_decisions.json instead


@pytest.fixture(scope="module")
def golden():
    digests = {} if RECORD else load_golden()
    yield digests
    if RECORD:
        save_golden(digests)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_launches_as_recorded(case, golden):
    rec = trace(case)
    write_trace(case, rec)
    if RECORD:
        golden[case_id(case)] = rec.digest()
    assert rec.digest() == golden[case_id(case)]


FUSED_KERNELS = ("glu_gemm", "heads_dueling", "linear_gemm", "glu_forward", "dueling_softmax_forward",
                 "glu_backward_gemm", "glu_backward", "wgrad_gemm", "wgrad_gemm_sets", "linear_gemm_relu_backward",
                 "relu_backward")
RECORD_CASES = [c for c in CASES if c[0] == "update" and c[4] in (128, 4096, 16384, 65536)]


@pytest.mark.parametrize("case", RECORD_CASES, ids=[case_id(c) for c in RECORD_CASES])
def test_the_plans_record_names_the_kernels_that_run(case):
    """The plan's record of the update (gpu_plan.json, --explain) names exactly the kernels the
    update launches: each kernel of the trace is in some choice, and each kernel a choice names is
    launched."""
    kind, shape, dev, tf32, rows = case
    cc, sms = DEVICES[dev]
    ran = {c[0] for c in trace(case).calls}
    plan = ExecutionPlan.build(network(shape), Device(cc, sms), tf32, rows)
    text = " ".join(c["kernel"] for c in record.choices(plan))
    named = {k for k in FUSED_KERNELS if re.search(rf"\b{k}\b", text)}
    assert named == ran & set(FUSED_KERNELS), record.explain(plan)


def test_the_record_says_where_the_q_pipeline_runs():
    """The Q pipeline at s on a third stream by default, its forward forking beside the bootstrap;
    after the loss kernel with q_early off; in line with q_stream off; the record says which and why."""
    kind, shape, dev, tf32, rows = RECORD_CASES[0]
    cc, sms = DEVICES[dev]
    net = network(shape)
    kernels = {(): "on a third stream, its forward beside the bootstrap at s', the rest beside the network's "
                    "backward",
               (("q_early", False),): "on a third stream after the loss kernel, beside the network's backward",
               (("q_stream", False),): "after the network's backward, on the main stream"}
    for overrides, kernel in kernels.items():
        plan = ExecutionPlan.build(net, Device(cc, sms), tf32, rows, **dict(overrides))
        on = dict(overrides).get("q_stream", True)
        assert bool(plan.q_stream) is on
        (c,) = [c for c in record.choices(plan) if c["what"] == "the Q pipeline at s and its backward"]
        assert c["kernel"] == kernel
        assert c["why"] == ("a third stream" if on else "q_stream switched off "
                            "(BENCHMARKS.md#the-execution-plans-thresholds (q_stream))")
