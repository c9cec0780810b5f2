"""Launch wrappers of the TF32 tensor-core GEMM kernels (TMA, wgmma; compute capability 9.0):
:mod:`.glu` (glu_gemm), :mod:`.linear` (linear_gemm, linear_gemm_relu_backward, heads_dueling),
:mod:`.glu_backward` (glu_backward_gemm, round_tf32), :mod:`.wgrad` (wgrad_gemm, wgrad_gemm_sets),
and :mod:`.common`, what they share. Each kernel's build (ring of stages, cluster, staging) is a
frozen config the caller passes (the execution plan's knobs); its defaults are the table's
(:mod:`foxhunt_core.gpu.defines`)."""
