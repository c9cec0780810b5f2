"""The execution plan's table: every threshold and every kernel arrangement it can switch, with the
measurement that chose it.

The plan (:mod:`.plan`) reads its defaults from here; a test or a benchmark builds a plan with
other values (``ExecutionPlan.build(..., stack_max_rows=0)``) instead of changing anything here.
Each entry's ``measured`` names the row of BENCHMARKS.md's table of the plan's thresholds that
holds its figures.
"""

from __future__ import annotations

from dataclasses import dataclass

BENCHMARKS = "BENCHMARKS.md#the-execution-plans-thresholds"


@dataclass(frozen=True)
class Threshold:
    """A row count at which a choice of the plan changes."""

    value: int
    rule: str
    measured: str


@dataclass(frozen=True)
class Arrangement:
    """A fused arrangement of kernels that the plan takes where it applies (on by default; off for
    comparison)."""

    what: str
    measured: str


THRESHOLDS: dict[str, Threshold] = {
    "stack_max_rows": Threshold(
        1024,
        "the update's three forwards run as strided-batched cuBLAS GEMMs over the stacked parameter "
        "trees up to this many rows a forward; beyond, the online pair as one forward and the target's "
        "beside it on the side stream, with glu_gemm and heads_dueling",
        f"{BENCHMARKS} (stack_max_rows)"),
    "wgrad_heads_min_rows": Threshold(
        32768,
        "the advantage heads' weight gradients run as wgrad_gemm_sets from this many rows (below, "
        "cuBLAS's GEMMs, which leave the side stream room)",
        f"{BENCHMARKS} (wgrad_heads_min_rows)"),
    "relu_gemm_min_rows": Threshold(
        32768,
        "the trunk's input gradients run as linear_gemm_relu_backward from this many rows (below, "
        "cuBLAS's GEMM and relu_backward, which leave room for the side stream's weight gradients)",
        f"{BENCHMARKS} (relu_gemm_min_rows)"),
}

# The rule every persistent tensor-core kernel is taken by beside its row threshold: a tile for
# every SM at least (``fill_sms`` tiles); with fewer, a CTA's chain of load, products, epilogue and
# store runs alone while the other SMs idle, and the cuBLAS path (spread over every SM) is faster.
FILL_RULE = Threshold(0, "a fused tensor-core kernel (heads_dueling, glu_backward_gemm, linear_gemm_relu_backward) "
                         "runs where its tiles cover every SM at least once", f"{BENCHMARKS} (fill_sms)")

ARRANGEMENTS: dict[str, Arrangement] = {
    "glu_gemm": Arrangement("each GLU group of a forward over one parameter tree as one kernel, the gate in the "
                            "GEMM's epilogue, the advantage heads as linear_gemm", f"{BENCHMARKS} (glu_gemm)"),
    "heads_dueling": Arrangement("the advantage heads with the dueling forward in their kernel",
                                 f"{BENCHMARKS} (heads_dueling)"),
    "glu_backward_gemm": Arrangement("each GLU group's backward from its heads' gradients in one kernel, the "
                                     "gate's backward in the GEMM's epilogue", f"{BENCHMARKS} (glu_backward_gemm)"),
    "glu_backward_dq": Arrangement("the gradient of z's direction-Q columns in glu_backward_gemm's epilogue",
                                   f"{BENCHMARKS} (glu_backward_dq)"),
    "wgrad_gemm": Arrangement("the GLU blocks' (and, past wgrad_heads_min_rows, the heads') weight gradients on "
                              "the tensor cores, the batch split over the SMs", f"{BENCHMARKS} (wgrad_gemm)"),
    "relu_gemm": Arrangement("the trunk's input gradients with the ReLU's backward in the GEMM's epilogue, past "
                             "relu_gemm_min_rows", f"{BENCHMARKS} (relu_gemm)"),
    "joint_dz": Arrangement("z's gradient as one GEMM over every GLU group and the joined value head",
                            f"{BENCHMARKS} (joint_dz)"),
    "side_stream": Arrangement("the weight gradients beside the input gradients, the target forward beside the "
                               "online ones, on a second stream", f"{BENCHMARKS} (side_stream)"),
    "q_stream": Arrangement("the Q pipeline at s (attention, post-attention stages, the auxiliary loss and their "
                            "backward) beside the network's backward, on a third stream", f"{BENCHMARKS} (q_stream)"),
}
