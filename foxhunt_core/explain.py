"""``foxhunt train --explain``: the GPU execution plan a run would build, without training.

The plan depends on the network's shapes and plugin stages (from the flag file), the batch size
and TF32 (its run settings) and the device: the current GPU, or, on any machine, the one given as
``CAPABILITY:SMS`` (``--gpu 90:132``: an H200), so that the plan can be read on a laptop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .agent import Q_HOOKS, build_stages
from .config import RunSettings
from .net import BranchingC51
from .net.fused import Device, ExecutionPlan
from .plugins import PluginSet


class ExplainError(ValueError):
    """The plan cannot be built; the message says why and what to give instead."""


def device_for(gpu: str | None, settings: RunSettings) -> Device:
    """The device to plan for: ``gpu`` (``CAPABILITY:SMS``) when given, else the current GPU."""
    if gpu is not None:
        try:
            return Device.parse(gpu)
        except ValueError as exc:
            raise ExplainError(f"--gpu: {exc}") from None
    if settings.device == "cpu":
        raise ExplainError("the run trains on the CPU (device: cpu), which has no GPU execution plan; give --gpu "
                           "CAPABILITY:SMS (e.g. 90:132 for an H200) to see the plan for a GPU")
    from .backend import cuda_available

    if not cuda_available():
        raise ExplainError("no CUDA GPU here (or no CuPy): give --gpu CAPABILITY:SMS (e.g. 90:132 for an H200) to "
                           "see the plan foxhunt would build for that device")
    return Device.current()


def plan_for(settings: RunSettings, plugins: PluginSet, options: dict[str, Any] | None,
             gpu: str | None) -> ExecutionPlan:
    """The execution plan of the update a run of ``settings`` with ``plugins`` would build (the
    stages are built on NumPy: the plan reads only their kinds and shapes)."""
    device = device_for(gpu, settings)
    st = build_stages(plugins, settings, np, options)
    net = BranchingC51(settings.net, gate=st.gate, branch_inputs=st.branch_inputs)
    q_stages = [(h, n) for h in Q_HOOKS for n in st.owners.get(h, [])]
    return ExecutionPlan.build(net, device, settings.train.tf32, settings.train.batch_size, q_stages=q_stages,
                               act_rows=settings.env.num_envs)
