"""The network's forward and backward on the GPU with fused kernels (CuPy, float32).

Same mathematics as :mod:`foxhunt_core.net.network` (its NumPy reference), arranged for the
device so that each activation makes as few trips through memory as possible, and a step needs
as few launches as possible:

* **Biases ride in the GEMMs.** Where a layer's input is written by one of our kernels, the
  input carries a column of ones (``[x, 0, ..., 0, 1]``, "augmented") and the layer's bias is
  the last row of its weight block in the flat parameter buffer (:func:`.layout.storage_shapes`). The
  backward's weight-gradient GEMM then writes the bias gradient in the same call: no
  column-sum kernels for the first trunk layer, the value head, the GLUs and the advantage
  layers. In the forward the GEMMs read that row as cuBLASLt's epilogue bias over K = 256 (an
  extra K column costs a whole extra k-step per tile), except the first trunk layer and the GEMM
  that needs the direction-Q columns anyway, which take the ones column. (The other two trunk
  layers take their input from a GEMM: their bias rides in the epilogue, its gradient is a gemv.)
* **One augmented z for every head.** ``z`` is written ``[z, q_dir / q_scale, 0, ..., 0, 1]``:
  the magnitude branch's input columns (the direction branch's E[Q], written there by the
  direction branch's dueling kernel) sit in ``z`` itself, so the magnitude branch's GEMMs are
  the same as every branch's. The other heads' weight blocks have zero rows there.
* **Each GLU's gate and value weights side by side** ``[W_gate | W_val]``: one GEMM computes
  both pre-activations; the backward has one weight-gradient GEMM and one input-gradient GEMM
  (K = 2H per branch, all of the augmented z's columns at once). The GLU kernel writes only the
  augmented ``h``; the backward recomputes gate and value from the GEMM output it keeps.
* **The value head in front of the direction branch's GLU** (:func:`.layout.value_joined`): both read z
  with the bias in the epilogue, so their weights share a block ``[W_v | W_gate | W_val]`` and
  one GEMM writes ``[v | pv]``; in the backward the value head's gradient is written in front of
  the direction branch's pre-activation gradients, and one input-gradient and one weight-gradient
  GEMM serve both (two GEMMs fewer each way, z read once less).
* **Aligned extents.** The 51-column value head and each branch's 153-column advantage block are
  computed 52 and 156 columns wide over zero-padded weights, every augmented input is a
  multiple of 4 wide: cuBLAS runs a GEMM on its aligned kernels only when every extent is a
  multiple of 4 floats (its ``align1`` kernels measured a third of the speed). The dueling kernels
  skip the padding columns, and the backward writes zeros into those of the gradients, so the
  padding of the weights stays zero.
* **Several forwards as one** (:func:`.forward.forward_segments`): the update's online forwards on s and
  s' share the weights, and with the target network's parameters in a stacked buffer
  (:meth:`foxhunt_core.gpu.flat.FlatTree.stacked`) its forward on s' runs in the same
  strided-batched GEMMs and kernels too (up to the plan's ``stack_max_rows``; beyond, plain
  GEMMs are faster). Each forward (segment) writes only what its caller reads: the bootstrap needs
  only E[Q] from the online network, and from the target network only its heads, from which
  the C51 loss kernel forms the bootstrap actions' distributions.
* **The GLU as one kernel** (the plan's ``glu_gemm``; TF32 on, one parameter tree per forward,
  GLUs a multiple of 128 wide, a Hopper GPU): ``glu_gemm`` runs the GEMM on the tensor cores (TMA
  loads, wgmma) and applies the gate in its epilogue, so ``h`` is written straight from the
  accumulators and the pre-activations reach memory only for the rows whose backward reads them
  (the online forward on s); the value head, where it shares the direction branch's block, is
  then a GEMM of its own. ``vsn_forward`` then writes z rounded to TF32 (every reader of z is a
  TF32 GEMM, which rounds it the same way), so ``glu_gemm`` need not round it again, and
  ``glu_gemm`` writes h so for the advantage heads, which ``linear_gemm`` then computes (one
  160-column tensor-core tile per head, four stages of loads in flight: the heads, K = 256, are
  bound by memory) with the dueling forward in the same kernel, on warps of its own that read the
  staged tiles while the next tile's products run (the plan's ``heads_dueling``, where the
  heads' tiles fill the GPU): the advantage rows reach memory only for a caller that reads them (the
  target forward's heads).
  Otherwise (the stacked forwards of small batches, plugin gates, fp32) cuBLAS's GEMM writes
  every row's pre-activations and ``glu_forward`` reads them back.
* **One GEMM for several branches** (:func:`.layout.joint`): every GLU's weights share one block and every
  advantage layer's another, so the branches after the direction branch run their GLUs as one
  GEMM and one kernel, forward and backward; z's gradient from all of them and the value head is
  one GEMM (the plan's ``joint_dz``: the gradients lie where the forward's ``[v | pv]`` rows did, column
  for column with the block).
* The advantage GEMMs write straight into one advantage buffer; the backward accumulates input
  gradients in place (GEMMs with ``beta = 1``) and writes the weight gradients straight into the
  optimizer's flat gradient buffer (``grads_into``).
* **The GLU backward in one kernel per group** (the plan's ``glu_backward_gemm``; the
  sigmoid gate, TF32 on, a Hopper GPU, a tile for every SM): ``glu_backward_gemm`` computes the GLU outputs'
  gradient from the heads' (``dadv Wo^T``, the heads' weights rounded to TF32 once per backward)
  on the tensor cores and applies the gate's backward in its epilogue, over the pre-activations
  in place: the GLU outputs' gradient never reaches memory. The magnitude branch's launch also
  takes the gradient of z's direction-Q columns (dq) from the pre-activation gradients in its
  registers (adv_h up to 256), where a separate product read them back.
* **The GLU blocks' and the heads' weight gradients on the tensor cores** (the plan's
  ``wgrad_gemm``; TF32 on, a Hopper GPU, z 257 to 264 wide: the default trunk's 260; likewise h for
  the heads):
  ``wgrad_gemm`` reduces over the batch with z transposed once (both GLU groups read it) and the
  pre-activations' gradient as the register operand of its wgmma, the batch split over the SMs
  and the slices summed in order; ``wgrad_gemm_sets`` does the heads of a group in one launch,
  transposing h in shared memory (no pass writes h transposed).

Which of these arrangements a call takes is the execution plan's choice (:mod:`.plan`: built
once per shapes, stages, device, batch size and TF32, written to the run directory as
``gpu_plan.json``; :mod:`.table` holds its thresholds). A gate activation with a CUDA fragment
(:class:`~foxhunt_core.stages.GateFragment`; the sigmoid's is built in) is compiled into
``glu_gemm``'s and ``glu_backward_gemm``'s epilogues and the elementwise GLU kernels, its
parameter gradients summed there in a fixed order; only the stacked forwards of small batches are
off for it (a launch reads one tree's gate parameters). A gate without a fragment, and
branch-input columns, have no fused form: the plan records them on the slow path, where they run
their own forward/backward exactly as in the reference (captured in the same CUDA graph), each
forward on its own, and a branch with extra input columns forms its augmented input explicitly.
``tests/gpu/test_update_gpu.py`` checks this path against the NumPy one, and
``tests/net/test_fused_arrangement.py`` runs this very code over NumPy twins of the kernels.

Modules: :mod:`.layout` (widths, weight blocks, storage), :mod:`.plan` and :mod:`.table` (the
execution plan), :mod:`.record` (the plan written out), :mod:`.forward`, :mod:`.backward`, and
:mod:`.network` (:class:`FusedNetwork`, which runs them).
"""

from .forward import ALL_OUTPUTS, HEADS
from .layout import storage_shapes
from .network import FusedNetwork
from .plan import KERNEL_LIMITS, Decision, Device, ExecutionPlan, Knobs, Limits, StagePlan, heads_fit

__all__ = ["ALL_OUTPUTS", "HEADS", "KERNEL_LIMITS", "Decision", "Device", "ExecutionPlan", "FusedNetwork", "Knobs",
           "Limits", "StagePlan", "heads_fit", "storage_shapes"]
