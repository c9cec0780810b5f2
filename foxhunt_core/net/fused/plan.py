"""The GPU execution plan: which kernels the fused network's forward and backward run, and why.

An :class:`ExecutionPlan` is built once per (network shapes, plugin stages, device, batch size,
TF32) by :meth:`ExecutionPlan.build`. It holds every choice that does not depend on the rows a call
sees as a :class:`Decision` (on or off, and the reason), and the rules for the ones that do (a
forward's rows decide whether it stacks, whether a kernel's tiles fill the GPU) as methods that
return a :class:`Decision` too; the fused network (:mod:`.network`) asks it and nothing else. The
thresholds and the arrangements it may switch off come from :mod:`.table`; a test or a benchmark
passes other values to ``build`` (``stack_max_rows=0``, ``heads_dueling=False``, ``fill_sms=1``).
:mod:`.record` writes the choices of the update at the plan's batch size out
(``gpu_plan.json``, ``foxhunt train --explain``).

Plugin stages have a place here: a gate activation runs fused where it ships a CUDA fragment
(:class:`~foxhunt_core.stages.GateFragment`; the built-in sigmoid is one), compiled into the GLU
kernels' epilogues; a gate without one takes the slow path, with the reason. Branch-input columns
are not yet appended to the augmented z (the slow path); the Q-pipeline stages run their own
forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...gpu.defines import value
from ...gpu.kernels import (
    WGRAD_GEMM_MAX_ROWS,
    GluBackwardGemmConfig,
    GluGemmConfig,
    LinearGemmConfig,
    WgradGemmConfig,
    heads_dueling_supported,
)
from ...gpu.launch import HEAD_ALIGN, head_columns
from ...stages import GateFragment
from . import layout
from .table import ARRANGEMENTS, FILL_RULE, THRESHOLDS


@dataclass(frozen=True)
class Limits:
    """What the tensor-core kernels take (their tiles, from the table of :mod:`foxhunt_core.gpu.
    defines`): the sizes at which the plan can choose them at all. The arrangement's CPU test
    builds plans with the limits of its NumPy twins of the kernels, which take any size."""

    tile_rows: int = value("TC_BM")  # rows of a tile of every tensor-core kernel
    glu_cols: int = value("GW_BH")  # glu_gemm's and glu_backward_gemm's GLU columns per tile: adv_h a multiple
    relu_cols: int = 128  # linear_gemm_relu_backward's tile columns
    head_cols: int = value("LG_BN")  # heads_dueling's tile: a branch's advantage block at most this wide
    dueling_lanes: int = value("DG_LANES")  # lanes per row of its dueling warps, which hold
    dueling_budget: int = value("DG_BUDGET")  # at most this many of a branch's logits each
    wgrad_min: int = value("WG_N")  # wgrad_gemm takes layer inputs wider than this
    wgrad_max: int = WGRAD_GEMM_MAX_ROWS  # and at most this wide (its wide variant's tail)
    wgrad_sets_max: int = value("WG_ROWS")  # wgrad_gemm_sets (the heads' h): at most this wide
    dq_cols: int = value("GB_NQ_MAX")  # glu_backward_gemm's dq: at most this many direction actions
    dq_h: int = 2 * value("GB_BH")  # and GLUs at most this wide (two column tiles: an exact sum)
    gate_terms: int = value("GB_GATE_TERMS_MAX")  # glu_backward_gemm's gate: parameter-gradient terms per unit


KERNEL_LIMITS = Limits()


def heads_fit(offsets: Sequence[int], num_atoms: int, limits: Limits = KERNEL_LIMITS) -> Decision:
    """Whether heads_dueling takes the branch layout: every branch's block of the padded advantage
    row within its tile, and a branch's logits within its dueling warps' registers (the
    kernel's DG_FITS; branches of 13 or more actions with 9 to 12 atoms, or of 25 or more, do not
    fit)."""
    cols = head_columns(offsets, num_atoms, HEAD_ALIGN)
    widest = max(b - a for a, b in zip(cols[:-1], cols[1:]))
    largest = max(int(b) - int(a) for a, b in zip(offsets[:-1], offsets[1:]))
    per_lane = largest * -(-int(num_atoms) // limits.dueling_lanes)
    if widest > limits.head_cols:
        return Decision(False, f"a branch's advantage block of {widest} columns is wider than the heads' tile "
                               f"({limits.head_cols})")
    if not heads_dueling_supported(offsets, num_atoms, limits.dueling_lanes, limits.dueling_budget):
        return Decision(False, f"{largest} actions of {num_atoms} atoms take {per_lane} values per lane of the "
                               f"dueling warps (at most {limits.dueling_budget})")
    return Decision(True, "every branch's advantage block within the heads' tile, its logits within the dueling "
                          "warps' registers")


@dataclass(frozen=True)
class Device:
    """What the plan needs to know of a GPU: its compute capability ("90") and its SMs."""

    capability: str
    sm_count: int
    name: str = ""

    @classmethod
    def current(cls) -> Device:
        """The current CuPy device."""
        import cupy

        dev = cupy.cuda.Device()
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        return cls(str(dev.compute_capability), int(dev.attributes["MultiProcessorCount"]),
                   name.decode() if isinstance(name, bytes) else str(name))

    @classmethod
    def parse(cls, text: str) -> Device:
        """``CAPABILITY:SMS`` (``90:132``, ``9.0:132`` or ``sm_90:132``: an H200) as a device."""
        cap, sep, sms = text.partition(":")
        cap = cap.strip().lower().removeprefix("sm_").replace(".", "")
        if not sep or not cap.isdigit() or not sms.strip().isdigit() or int(sms) < 1:
            raise ValueError(f"device {text!r}: expected CAPABILITY:SMS, e.g. 90:132 (an H200)")
        return cls(cap, int(sms))

    @property
    def wgmma(self) -> bool:
        """Whether the device runs the tensor-core kernels (Hopper's wgmma and TMA)."""
        return self.capability == "90"


@dataclass(frozen=True)
class Decision:
    """A choice of the plan: on or off, and why."""

    on: bool
    why: str

    def __bool__(self) -> bool:
        return self.on


@dataclass(frozen=True)
class StagePlan:
    """How a plugin stage runs: ``path`` "fast" (inside the fused kernels), "slow" (a fallback that
    turns fused arrangements off) or "own" (its own forward, as it is), and why."""

    hook: str
    name: str
    path: str
    why: str


@dataclass(frozen=True)
class Knobs:
    """What a plan can be built with instead of the table's defaults (tests, benchmarks)."""

    stack_max_rows: int = THRESHOLDS["stack_max_rows"].value
    wgrad_heads_min_rows: int = THRESHOLDS["wgrad_heads_min_rows"].value
    relu_gemm_min_rows: int = THRESHOLDS["relu_gemm_min_rows"].value
    fill_sms: int | None = None  # the tiles a fused kernel must have to run (default: the device's SMs)
    glu_gemm: bool = True
    heads_dueling: bool = True
    glu_backward_gemm: bool = True
    glu_backward_dq: bool = True
    wgrad_gemm: bool = True
    relu_gemm: bool = True
    joint_dz: bool = True
    side_stream: bool = True
    q_stream: bool = True
    q_early: bool = True  # on q_stream: the Q pipeline's forward at s beside the bootstrap (else after the loss)
    # how the tensor-core kernels are built (their rings of stages, clusters, staging)
    glu_gemm_config: GluGemmConfig = field(default_factory=GluGemmConfig)
    linear_gemm_config: LinearGemmConfig = field(default_factory=LinearGemmConfig)
    heads_dueling_straight: bool = False  # heads_dueling's distributions not through its staging buffer
    glu_backward_gemm_config: GluBackwardGemmConfig = field(default_factory=GluBackwardGemmConfig)
    wgrad_gemm_config: WgradGemmConfig = field(default_factory=WgradGemmConfig)


@dataclass(frozen=True)
class Shapes:
    """What the plan reads of the network."""

    state_dim: int
    shared_h1: int
    shared_h2: int
    adv_h: int
    num_atoms: int
    offsets: tuple[int, ...]
    head_widths: tuple[int, ...]  # each branch's block of the padded advantage row
    z_width: int
    h_width: int
    joint: bool
    value_joined: bool
    z_input: tuple[bool, ...]  # whether branch d's input is the augmented z (no extra columns, or them in z)
    groups: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, net: Any) -> Shapes:
        s = net.settings
        cols = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
        return cls(s.state_dim, s.shared_h1, s.shared_h2, s.adv_h, net.num_atoms, tuple(net.offsets),
                   tuple(b - a for a, b in zip(cols[:-1], cols[1:])), layout.z_width(net), layout.h_width(net),
                   layout.joint(net), layout.value_joined(net),
                   tuple(layout.z_input(net, d) for d in range(len(net.sizes))),
                   tuple(layout.branch_groups(net)))


@dataclass(frozen=True)
class ExecutionPlan:
    """Every kernel choice of the fused network on one device, for a batch size (see the module)."""

    device: Device
    tf32: bool
    batch: int
    shapes: Shapes
    knobs: Knobs
    limits: Limits
    stages: tuple[StagePlan, ...]
    gate_fast: Decision  # the gate runs inside the GLU kernels (its CUDA fragment; the sigmoid's built in)
    pairs: Decision  # several forwards run as one (stacked trees, rows one after another)
    glu_gemm: Decision  # a forward's GLUs over z (one parameter tree) as glu_gemm, heads as linear_gemm
    heads_dueling: Decision  # where glu_gemm runs: the heads' kernel may take the dueling forward
    glu_backward_gemm: Decision
    glu_backward_dq: Decision  # z's direction-Q gradient in the magnitude branch's glu_backward_gemm
    wgrad_gemm: Decision  # the GLU blocks' weight gradients over z
    wgrad_heads: Decision  # the heads' weight gradients (past wgrad_heads_min_rows)
    relu_gemm: Decision  # the trunk's input gradients (past relu_gemm_min_rows, where the tiles fill)
    joint_dz: Decision
    side_stream: Decision
    q_stream: Decision  # the update's Q pipeline at s (and its backward) beside the network's backward
    act_rows: int | None = None  # the acting forward's rows, for the record
    gate_built_in: bool = True  # the gate is the sigmoid (the elementwise kernels: glu_forward, glu_backward)
    stack_trees: Decision = Decision(True, "the gate has no parameters of its own")  # (pairs) over stacked trees

    @classmethod
    def build(cls, net: Any, device: Device, tf32: bool, batch: int, q_stages: Sequence[tuple[str, str]] = (),
              act_rows: int | None = None, limits: Limits = KERNEL_LIMITS, **overrides: Any) -> ExecutionPlan:
        """The plan of ``net`` (a :class:`~foxhunt_core.net.BranchingC51`, its gate and branch-input
        stages) on ``device`` for updates of ``batch`` rows; ``q_stages`` the Q pipeline's
        ``(hook, name)``; ``limits`` what the kernels take; ``overrides`` :class:`Knobs` fields."""
        from ..network import SigmoidGate

        knobs = Knobs(**overrides)
        L = limits
        sh = Shapes.of(net)
        H = sh.adv_h
        stages = []
        fragment = getattr(net.gate, "fragment", None)
        foreign = fragment is not None and not isinstance(fragment, GateFragment)
        fragment = None if foreign else fragment
        built_in = isinstance(net.gate, SigmoidGate)
        stack_trees = Decision(True, "the gate has no parameters of its own")
        if built_in:
            gate = Decision(True, "the built-in sigmoid gate")
            stages.append(StagePlan("gate_activation", net.gate.name, "fast", "built in: its fragment "
                                    "(gate_sigmoid.cuh) in glu_gemm's and glu_backward_gemm's epilogues, "
                                    "glu_forward and glu_backward"))
        elif fragment is not None:
            gate = Decision(True, f"the gate {net.gate.name!r}'s CUDA fragment")
            stages.append(StagePlan("gate_activation", net.gate.name, "fast", "its CUDA fragment compiled into "
                                    "glu_gemm's and glu_backward_gemm's epilogues and the elementwise "
                                    "gate_glu_forward and gate_glu_backward; its parameter gradients summed "
                                    "there in a fixed order"))
            if fragment.arrays:
                stack_trees = Decision(False, f"the gate {net.gate.name!r} has parameters of its own, which the "
                                              "GLU kernels read from one tree a launch")
        else:
            gate = Decision(False, f"the gate {net.gate.name!r} has no CUDA fragment" + (
                f" (its fragment attribute is a {type(net.gate.fragment).__name__}, not a "
                "foxhunt_core.stages.GateFragment)" if foreign else ""))
            stages.append(StagePlan("gate_activation", net.gate.name, "slow",
                                    f"{gate.why}: its forward and backward run per branch as array operations, "
                                    "and several forwards no longer run as one (no stacking, no target forward "
                                    "beside the online ones), nor glu_gemm, the heads' dueling kernel or "
                                    "glu_backward_gemm"))
        in_z = layout.columns_in_z(net)
        for st in net.branch_inputs if in_z else ():
            stages.append(StagePlan("branch_inputs", st.name, "fast",
                                    f"its columns (observation columns {list(st.observation_columns)}) copied "
                                    f"into the augmented z behind the direction Q's, read by branches "
                                    f"{list(st.branches)} through their rows of the joint GLU blocks"))
        for st in net.branch_inputs if not in_z else ():
            why = (" (the stage declares no observation_columns: its columns are computed)"
                   if getattr(st, "observation_columns", None) is None else
                   " (another branch-input stage computes its columns: the fast path needs every stage "
                   "to declare observation_columns)")
            stages.append(StagePlan("branch_inputs", st.name, "slow",
                                    f"its columns are not appended to the augmented z: branches {list(st.branches)} "
                                    "form inputs of their own (their GLUs and weight gradients through cuBLAS), "
                                    "the GLU weights lose their joint blocks, and several forwards no longer run "
                                    "as one" + why))
        for hook, name in q_stages:
            stages.append(StagePlan(hook, name, "own", "its own forward (and backward) on the device, in the "
                                    "captured graph"))
        terms = fragment.terms if gate and fragment is not None else 0
        terms_fit = Decision(terms <= L.gate_terms, f"the gate's {terms} parameter-gradient terms per unit "
                             + ("within" if terms <= L.gate_terms else "more than")
                             + f" glu_backward_gemm's {L.gate_terms}")
        columns = not net.branch_inputs or in_z
        pairs = (Decision(False, gate.why) if not gate else Decision(False, "branch-input columns (their stages "
                 "keep caches of their own rows)") if not columns else Decision(True, "the built-in gate and no "
                 "branch-input columns" if not net.branch_inputs else "the built-in gate and the branch-input "
                 "columns in z"))
        tc = cls._tensor_cores(device, tf32)
        glu_tile = Decision(H % L.glu_cols == 0, f"adv_h {H} " + ("is" if H % L.glu_cols == 0 else "is not")
                            + f" a multiple of the {L.glu_cols}-column tile")

        def every(name: str, *parts: Decision) -> Decision:
            if not getattr(knobs, name):
                return Decision(False, f"{name} switched off ({ARRANGEMENTS[name].measured})")
            for p in parts:
                if not p:
                    return Decision(False, p.why)
            return Decision(True, "; ".join(p.why for p in parts))

        n_dir = sh.offsets[1]
        dq_ok = H <= L.dq_h and n_dir <= L.dq_cols and sh.z_input[layout.MAGNITUDE]
        dq_fits = Decision(dq_ok, f"adv_h {H} <= {L.dq_h}, {n_dir} direction actions <= {L.dq_cols}, the "
                                  "magnitude branch's input z" if dq_ok else
                           f"adv_h {H} > {L.dq_h}, {n_dir} direction actions > {L.dq_cols} or the magnitude "
                           "branch's input not z")

        def wgrad_width(n: int, what: str, most: int) -> Decision:
            ok = L.wgrad_min < n <= most
            return Decision(ok, f"{what} {n} columns " + ("within" if ok else "outside")
                            + f" wgrad_gemm's {L.wgrad_min + 1}..{most}")

        joined = Decision(sh.joint and sh.value_joined, "every GLU in the value head's block" if sh.joint
                          and sh.value_joined else "the GLU weights in blocks of their own (branch-input columns)")
        return cls(
            device=device, tf32=tf32, batch=int(batch), shapes=sh, knobs=knobs, limits=L, stages=tuple(stages),
            gate_fast=gate, pairs=pairs,
            glu_gemm=every("glu_gemm", gate, tc, glu_tile),
            heads_dueling=every("heads_dueling", heads_fit(sh.offsets, sh.num_atoms, L)),
            glu_backward_gemm=every("glu_backward_gemm", gate, terms_fit, tc, glu_tile),
            glu_backward_dq=every("glu_backward_dq", dq_fits),
            wgrad_gemm=every("wgrad_gemm", tc, wgrad_width(sh.z_width, "the augmented z:", L.wgrad_max)),
            wgrad_heads=every("wgrad_gemm", tc, wgrad_width(sh.h_width, "the augmented h:", L.wgrad_sets_max)),
            relu_gemm=every("relu_gemm", tc),
            joint_dz=every("joint_dz", joined),
            side_stream=every("side_stream", Decision(True, "a second stream")),
            q_stream=every("q_stream", Decision(True, "a third stream")),
            act_rows=act_rows, gate_built_in=built_in, stack_trees=stack_trees,
        )

    @staticmethod
    def _tensor_cores(device: Device, tf32: bool) -> Decision:
        if not tf32:
            return Decision(False, "TF32 off (the tensor-core kernels compute in TF32)")
        if not device.wgmma:
            return Decision(False, f"compute capability {device.capability}: the tensor-core kernels need 9.0 "
                                   "(wgmma, TMA)")
        return Decision(True, "TF32 on, compute capability 9.0")

    def but(self, **overrides: Any) -> ExecutionPlan:
        """This plan for another batch size (``batch=``) or acting rows (``act_rows=``)."""
        return dataclasses.replace(self, **overrides)

    # ------------------------------------------------------------------ rules of rows
    @property
    def fill_sms(self) -> int:
        return self.knobs.fill_sms if self.knobs.fill_sms is not None else self.device.sm_count

    def _tiles(self, rows: int, cols: int, tile_cols: int) -> int:
        return -(-int(rows) // self.limits.tile_rows) * -(-int(cols) // tile_cols)

    def _fills(self, tiles: int, what: str) -> Decision:
        ok = tiles >= self.fill_sms
        return Decision(ok, f"{what}: {tiles} tiles {'>=' if ok else '<'} {self.fill_sms} SMs ({FILL_RULE.measured})")

    def stacks(self, rows: int) -> Decision:
        """Whether forwards of ``rows`` rows each over stacked parameter trees run as one."""
        if not self.pairs:
            return self.pairs
        if not self.stack_trees:
            return self.stack_trees
        limit = self.knobs.stack_max_rows
        ok = rows <= limit
        return Decision(ok, f"{rows} rows {'<=' if ok else '>'} stack_max_rows {limit} "
                            f"({THRESHOLDS['stack_max_rows'].measured})")

    @property
    def gate_kernels(self) -> tuple[str, str]:
        """The elementwise forward and backward of the gate where the GLU kernels do not run."""
        if not self.gate_fast:
            return "the plugin gate's forward, per branch", "the plugin gate's backward, per branch"
        if self.gate_built_in:
            return "glu_forward", "glu_backward"
        return "gate_glu_forward", "gate_glu_backward"

    def glu_gemm_for(self, stacked: bool) -> Decision:
        """Whether a forward's GLUs over z run as glu_gemm (not over stacked trees)."""
        if stacked and self.glu_gemm:
            return Decision(False, "stacked parameter trees (strided-batched cuBLAS GEMMs)")
        return self.glu_gemm

    def batched_advantages(self, rows: int) -> Decision:
        """Whether a GLU group's advantage GEMMs (one tree, blocks of one width) run as one
        strided-batched GEMM rather than one GEMM each, the bias in the epilogue."""
        limit = self.knobs.stack_max_rows
        ok = rows <= limit
        return Decision(ok, f"{rows} rows {'<=' if ok else '>'} stack_max_rows {limit}")

    def heads_dueling_at(self, rows: int, sets: int) -> Decision:
        """Whether ``sets`` advantage heads over ``rows`` rows take their dueling forward."""
        if not self.heads_dueling:
            return self.heads_dueling
        return self._fills(sets * self._tiles(rows, 1, 1), "heads_dueling")

    def glu_backward_at(self, rows: int, blocks: int) -> Decision:
        """Whether a GLU group of ``blocks`` branches takes its backward as glu_backward_gemm."""
        if not self.glu_backward_gemm:
            return self.glu_backward_gemm
        return self._fills(blocks * self._tiles(rows, self.shapes.adv_h, self.limits.glu_cols), "glu_backward_gemm")

    def wgrad_heads_at(self, rows: int) -> Decision:
        if not self.wgrad_heads:
            return self.wgrad_heads
        limit = self.knobs.wgrad_heads_min_rows
        ok = rows >= limit
        return Decision(ok, f"{rows} rows {'>=' if ok else '<'} wgrad_heads_min_rows {limit} "
                            f"({THRESHOLDS['wgrad_heads_min_rows'].measured})")

    def relu_gemm_at(self, rows: int) -> Decision:
        """Whether the trunk's input gradients over ``rows`` rows run as linear_gemm_relu_backward."""
        limit = self.knobs.relu_gemm_min_rows
        if rows < limit:
            return Decision(False, f"{rows} rows < relu_gemm_min_rows {limit} "
                                   f"({THRESHOLDS['relu_gemm_min_rows'].measured})")
        if not self.relu_gemm:
            return self.relu_gemm
        for cols in (self.shapes.shared_h1, self.shapes.shared_h2):
            fill = self._fills(self._tiles(rows, cols, self.limits.relu_cols), "linear_gemm_relu_backward")
            if not fill:
                return fill
        return Decision(True, f"{rows} rows >= relu_gemm_min_rows {limit}; {fill.why}")
