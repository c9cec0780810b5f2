"""The GPU execution plan as a run would build it, read on the CPU (``foxhunt train --explain``)."""

from __future__ import annotations

import json

import pytest

from foxhunt_core.config import RunSettings, TrainSettings
from foxhunt_core.explain import ExplainError, plan_for
from foxhunt_core.net.fused import record
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from hook_plugins import CenterPlugin, OfiColumnPlugin, PlainTanhGatePlugin, TanhGatePlugin


def _plugins(*classes):
    return PluginSet([LoadedPlugin(c.__name__, c.POSITION, c()) for c in classes])


def test_the_stage_0_plan_for_an_h200_takes_every_fused_kernel_at_65536():
    settings = RunSettings(train=TrainSettings(batch_size=65536))
    plan = plan_for(settings, PluginSet(), {}, "90:132")
    assert (plan.device.capability, plan.device.sm_count, plan.batch, plan.tf32) == ("90", 132, 65536, True)
    assert plan.pairs and plan.glu_gemm and plan.glu_backward_gemm and plan.wgrad_gemm and plan.joint_dz
    assert not plan.stacks(65536) and plan.relu_gemm_at(65536) and plan.wgrad_heads_at(65536)
    kernels = " ".join(c["kernel"] for c in record.choices(plan))
    for k in ("glu_gemm", "heads_dueling", "linear_gemm", "glu_backward_gemm", "wgrad_gemm", "wgrad_gemm_sets",
              "linear_gemm_relu_backward"):
        assert k in kernels, k
    text = record.explain(plan)
    assert text.startswith("GPU execution plan: compute capability 9.0, 132 SMs, TF32 on, batch 65536")
    assert "stack_max_rows = 1024" in text and "BENCHMARKS.md#the-execution-plans-thresholds" in text
    doc = json.loads(json.dumps(record.to_dict(plan)))  # what gpu_plan.json holds
    assert doc["batch"] == 65536 and doc["thresholds"]["stack_max_rows"]["value"] == 1024
    assert doc["choices"] and all(set(c) == {"part", "what", "kernel", "why"} and c["why"] for c in doc["choices"])


def test_small_batches_stack_and_other_devices_take_no_tensor_core_kernel():
    settings = RunSettings(train=TrainSettings(batch_size=128))
    plan = plan_for(settings, PluginSet(), {}, "90:132")
    assert plan.stacks(128) and "128 rows <= stack_max_rows 1024" in plan.stacks(128).why
    assert not plan.glu_gemm_for(stacked=True)
    a100 = plan_for(settings, PluginSet(), {}, "8.0:108")
    assert not a100.glu_gemm and "compute capability 80" in a100.glu_gemm.why
    assert "glu_gemm" not in " ".join(c["kernel"] for c in record.choices(a100))
    fp32 = plan_for(RunSettings(train=TrainSettings(tf32=False)), PluginSet(), {}, "90:132")
    assert not fp32.wgrad_gemm and "TF32 off" in fp32.wgrad_gemm.why


def test_plugin_stages_without_a_fast_form_are_on_the_slow_path_with_the_reason():
    """A gate of its own and branch-input columns turn the fused path off, as recorded decisions:
    each stage's path and reason, and the choices they switch off with the stage as the reason."""
    plan = plan_for(RunSettings(), _plugins(CenterPlugin, PlainTanhGatePlugin, OfiColumnPlugin), {}, "90:132")
    paths = {(s.hook, s.name): s for s in plan.stages}
    gate = paths[("gate_activation", "tanh_gate")]
    assert gate.path == "slow" and "no CUDA fragment" in gate.why and "glu_gemm" in gate.why
    columns = paths[("branch_inputs", "ofi_column")]
    assert columns.path == "slow" and "not appended to the augmented z" in columns.why and "[2, 3]" in columns.why
    assert paths[("pre_attention", "CenterPlugin")].path == "own"
    assert not plan.gate_fast and not plan.pairs and "no CUDA fragment" in plan.pairs.why
    assert not plan.glu_gemm and "tanh_gate" in plan.glu_gemm.why
    assert not plan.glu_backward_gemm and not plan.joint_dz
    assert plan.wgrad_gemm  # the weight gradients over z keep their kernel
    text = record.explain(plan)
    assert "each forward of 128 rows on its own" in text and "the plugin gate's forward, per branch" in text


def test_a_gate_with_a_cuda_fragment_is_on_the_fast_path():
    """The tests' tanh gate ships a fragment: glu_gemm, heads_dueling, glu_backward_gemm and the
    side stream stay on; only the stacked forwards of small batches go (one tree a launch)."""
    for B in (128, 65536):
        plan = plan_for(RunSettings(train=TrainSettings(batch_size=B)), _plugins(TanhGatePlugin), {}, "90:132")
        gate = {(s.hook, s.name): s for s in plan.stages}[("gate_activation", "tanh_gate")]
        assert gate.path == "fast" and "fragment" in gate.why
        assert plan.gate_fast and plan.pairs and plan.glu_gemm and plan.glu_backward_gemm and plan.joint_dz
        assert not plan.stacks(B) and "parameters of its own" in plan.stacks(B).why
        kernels = " ".join(c["kernel"] for c in record.choices(plan))
        assert "the plugin gate" not in kernels and "glu_gemm" in kernels
        if B == 65536:
            assert "glu_backward_gemm" in kernels and "each forward of" not in record.explain(plan)


def test_no_plan_without_a_device_to_plan_for():
    cpu = RunSettings(device="cpu")
    with pytest.raises(ExplainError, match="device: cpu.*--gpu CAPABILITY:SMS"):
        plan_for(cpu, PluginSet(), {}, None)
    with pytest.raises(ExplainError, match="--gpu: device 'h200': expected CAPABILITY:SMS"):
        plan_for(cpu, PluginSet(), {}, "h200")
    assert plan_for(cpu, PluginSet(), {}, "sm_90:114").device.sm_count == 114
