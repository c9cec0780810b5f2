"""Typed launch wrappers of the core's CUDA kernels (``foxhunt_core/kernels/*.cu``), in one namespace.

Every wrapper checks dtype, shape and contiguity of its arrays (errors name the kernel), accepts
preallocated outputs (keyword arguments named like the outputs) and then neither allocates nor
synchronizes with the host: it only launches on the current CuPy stream, so a sequence of them
can be captured into a CUDA graph and replayed. Without an output argument a new array is
allocated (convenient outside graph capture). Scalars are passed by value as float32/int32.

Kernel: NumPy twin (the oracle of ``tests/gpu``); thread mapping.

- ``dueling_softmax_forward``: ``network.py`` dueling ``V + A - mean A`` (biases added on read),
  ``layers.log_softmax``, ``qpipe.expected_q``; outputs nobody reads can be skipped, per segment
  of rows; a warp per (sample, branch).
- ``dueling_backward``: ``network.py`` ``dadv = dl - mean dl``, ``dv = sum_a dl``, with the
  direction-conditioning term ``dq * p * (z - q)`` optionally fused, over a range of branches; a
  warp per sample.
- ``branch_argmax``: ``qpipe.branch_argmax`` (the first of ties); a thread per (sample, branch).
- ``aux_error``: the auxiliary loss's ``take_along_axis`` / ``put_along_axis`` lines of
  ``agent.py`` (squared error and gradient at the taken actions); a thread per (sample, action).
- ``c51_target_loss``: ``c51.project`` + ``c51.loss_and_grad`` (gradient / (B D), as
  ``agent.py``), optionally reading the chosen rows of whole outputs and writing the gradient
  over all actions; a warp per (sample, branch).
- ``glu_forward/backward`` (the gate and value GEMM outputs side by side, the backward
  recomputing both), ``bias_relu_forward``, ``relu_backward``, ``vsn_forward/backward``:
  the GLU (several branches side by side), trunk and VSN lines of ``network.py`` with
  ``layers.sigmoid/relu``, outputs augmented with a ones column where asked; ``pack_rows`` (the
  network's augmented input) and ``copy`` (flat buffers); a thread per element (four per thread,
  ``float4``, where the rows allow).
- ``glu_gemm`` and ``linear_gemm`` (TF32 tensor-core GEMMs: TMA, wgmma, warp-specialized and
  persistent, ``tc_gemm.cuh``): ``reference.glu_gemm`` (the GLU layer, the gate in the GEMM's
  epilogue) and ``reference.linear_gemm`` (up to four linear layers per launch); a CTA per SM,
  a tile of 128 rows per two consumer warpgroups. ``heads_dueling``: ``linear_gemm`` over the
  advantage heads and the dueling forward of ``dueling_softmax_forward`` from the staged tiles,
  by seven dueling warps per CTA beside the consumers (eight lanes per row, four rows at once).
  ``transpose``: the weights transposed and rounded to TF32 as both read them. ``wgrad_gemm``:
  ``reference.wgrad_gemm`` (a weight gradient over the batch, its operand A from registers); a
  CTA per 128 output columns and slice of the batch, then a thread per element sums the slices;
  ``wgrad_gemm_sets`` likewise for up to four products at once, the batch-major input transposed
  in shared memory. ``glu_backward_gemm``: ``reference.glu_backward_gemm`` (the heads' input
  gradient and the GLU's backward in its epilogue); a CTA per SM, a tile of 128 rows and 128 GLU
  columns. ``round_tf32``: a thread per element. Both GEMM epilogues compile a gate's CUDA
  fragment in (``gate.cuh``; the sigmoid by default): the gate, and in the backward the sums of
  its parameter gradients (per CTA, then ``gate_terms_reduce`` in a fixed order).
- ``gate_glu_forward/backward`` (:mod:`.gate`): ``reference.gate_glu_forward/backward`` (the GLU
  with a fragment's gate: the stage's own forward and backward); a thread per element forward,
  a block of 32 units x 8 row threads backward with per-block sums, then ``gate_glu_reduce``.
- ``attention_forward/backward`` (:mod:`.qkernels`): ``attention.forward/backward``; 16 threads
  per sample, then a deterministic two-pass reduction of the parameter gradients.
- ``q_stats_reduce`` (:mod:`.qkernels`): ``qpipe.q_statistics``; multi-block partials + one block.
- ``boltzmann_select`` (:mod:`.qkernels`): ``explore.boltzmann_select`` fed by :mod:`.philox`;
  a thread per sample.
- ``adam_step`` (:mod:`.optim`): ``optim.Adam.step`` over a :class:`.flat.FlatTree`; multi-block
  norm, one-warp prepare, a thread per element.

The wrappers live by kernel family: :mod:`.dueling`, :mod:`.c51_loss`, :mod:`.elementwise` (and
:mod:`.arrays`, the checks they share), the tensor-core GEMMs in :mod:`.tc` (:mod:`.tc.glu`,
:mod:`.tc.linear`, :mod:`.tc.glu_backward`, :mod:`.tc.wgrad`; how each is built, its stages and
clusters, is a config object the caller passes), :mod:`.qkernels` and :mod:`.optim`; this module
gathers them (``from foxhunt_core.gpu import kernels as K``). The constants the kernels share with
the wrappers come from one table, :mod:`.defines`.

Shapes: ``B`` samples, ``A`` actions in branches given by ``offsets`` (``(0, 3, 6, 9, 12)``),
``N`` atoms on the support ``z`` [N] (``z_j = v_min + j dz``).
"""

from .c51_loss import c51_target_loss
from .defines import DEFAULT_DEFINES
from .dueling import aux_error, branch_argmax, dueling_backward, dueling_softmax_forward
from .elementwise import (
    bias_relu_forward,
    copy,
    glu_backward,
    glu_forward,
    pack_rows,
    relu_backward,
    vsn_backward,
    vsn_forward,
)
from .gate import GateLaunch, branch_launch, built_in, gate_glu_backward, gate_glu_forward, gate_terms_reduce
from .launch import THREADS, sm_count
from .optim import adam_step, adam_workspace
from .qkernels import (
    attention_backward,
    attention_forward,
    attention_workspace,
    boltzmann_select,
    q_stats_keys,
    q_stats_reduce,
    q_stats_workspace,
)
from .tc.common import (
    GLU_GEMM_BOX_K,
    GLU_GEMM_CLUSTER,
    GLU_GEMM_COLS,
    GLU_GEMM_ROWS,
    GLU_GEMM_STAGED_BOXES,
    GLU_GEMM_STAGES,
    GLU_GEMM_STORE_BOXES,
    GLU_GEMM_THREADS,
    glu_gemm_supported,
    transpose,
)
from .tc.glu import GluGemmConfig, glu_gemm
from .tc.glu_backward import (
    GLU_BACK_ARGS,
    GLU_BACKWARD_GEMM_DQ_COLS,
    GLU_BACKWARD_GEMM_DQ_H,
    GLU_BACKWARD_GEMM_PARTS,
    GLU_BACKWARD_GEMM_SETS,
    GLU_BACKWARD_GEMM_STAGES,
    GLU_BACKWARD_GEMM_THREADS,
    GluBackwardGemmConfig,
    glu_backward_gemm,
    round_tf32,
)
from .tc.linear import (
    DUELING_ARGS,
    HEADS_DUELING_BUDGET,
    HEADS_DUELING_LANES,
    LINEAR_ARGS,
    LINEAR_GEMM_CLUSTER,
    LINEAR_GEMM_COLS,
    LINEAR_GEMM_DUELING_THREADS,
    LINEAR_GEMM_DUELING_WARPS,
    LINEAR_GEMM_SETS,
    LINEAR_GEMM_STAGES,
    LINEAR_RELU_BACKWARD_COLS,
    LinearGemmConfig,
    heads_dueling,
    heads_dueling_supported,
    linear_gemm,
    linear_gemm_relu_backward,
    linear_gemm_smem,
)
from .tc.wgrad import (
    OUT_SETS,
    WGRAD_GEMM_BOX_ROWS,
    WGRAD_GEMM_MAX_ROWS,
    WGRAD_GEMM_ROWS,
    WGRAD_GEMM_STAGES,
    WGRAD_GEMM_THREADS,
    WGRAD_GEMM_TX_STAGES,
    WGRAD_SETS,
    WGRAD_SETS_ARGS,
    WgradGemmConfig,
    wgrad_gemm,
    wgrad_gemm_sets,
    wgrad_gemm_supported,
    wgrad_gemm_tx_smem,
    wgrad_splits,
)

# The wrappers (and their configs); the constants above are the table's, for tests and benchmarks.
__all__ = [
    "DEFAULT_DEFINES",
    "GluBackwardGemmConfig",
    "GluGemmConfig",
    "LinearGemmConfig",
    "WgradGemmConfig",
    "adam_step",
    "adam_workspace",
    "attention_backward",
    "attention_forward",
    "attention_workspace",
    "aux_error",
    "bias_relu_forward",
    "boltzmann_select",
    "branch_argmax",
    "c51_target_loss",
    "copy",
    "dueling_backward",
    "dueling_softmax_forward",
    "GateLaunch",
    "branch_launch",
    "built_in",
    "gate_glu_backward",
    "gate_glu_forward",
    "gate_terms_reduce",
    "glu_backward",
    "glu_backward_gemm",
    "glu_forward",
    "glu_gemm",
    "glu_gemm_supported",
    "heads_dueling",
    "heads_dueling_supported",
    "linear_gemm",
    "linear_gemm_relu_backward",
    "pack_rows",
    "q_stats_keys",
    "q_stats_reduce",
    "q_stats_workspace",
    "relu_backward",
    "round_tf32",
    "transpose",
    "vsn_backward",
    "vsn_forward",
    "wgrad_gemm",
    "wgrad_gemm_sets",
    "wgrad_gemm_supported",
]
_CONSTANTS = (GLU_GEMM_BOX_K, GLU_GEMM_CLUSTER, GLU_GEMM_COLS, GLU_GEMM_ROWS, GLU_GEMM_STAGED_BOXES, GLU_GEMM_STAGES,
              GLU_GEMM_STORE_BOXES, GLU_GEMM_THREADS, GLU_BACK_ARGS, GLU_BACKWARD_GEMM_DQ_COLS, GLU_BACKWARD_GEMM_DQ_H,
              GLU_BACKWARD_GEMM_PARTS, GLU_BACKWARD_GEMM_SETS, GLU_BACKWARD_GEMM_STAGES, GLU_BACKWARD_GEMM_THREADS,
              DUELING_ARGS, HEADS_DUELING_BUDGET, HEADS_DUELING_LANES, LINEAR_ARGS, LINEAR_GEMM_CLUSTER,
              LINEAR_GEMM_COLS, LINEAR_GEMM_DUELING_THREADS, LINEAR_GEMM_DUELING_WARPS, LINEAR_GEMM_SETS,
              LINEAR_GEMM_STAGES, LINEAR_RELU_BACKWARD_COLS, OUT_SETS, WGRAD_GEMM_BOX_ROWS, WGRAD_GEMM_MAX_ROWS,
              WGRAD_GEMM_ROWS, WGRAD_GEMM_STAGES, WGRAD_GEMM_THREADS, WGRAD_GEMM_TX_STAGES, WGRAD_SETS, WGRAD_SETS_ARGS,
              THREADS, sm_count, linear_gemm_smem, wgrad_gemm_tx_smem, wgrad_splits)  # (re-exported, not wrappers)
