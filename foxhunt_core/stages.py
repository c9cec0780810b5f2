"""Stage objects: what hot-path hooks return when the engine builds its step.

A hot-path hook is called once, when the engine builds the training and collection step for a
flag set. It returns a stage object; the step then calls the stage's methods directly — no hook
dispatch per step — so the whole step is a fixed sequence of array operations (and, on the GPU,
can be captured as a CUDA graph).

Parameters are passed in, never stored on the stage: the engine keeps one parameter tree for the
online network and one for the target network, ``{"core": {...}, "<plugin>": {...}}``, and hands a
stage its own sub-dict. The stage's ``init_params`` says what that sub-dict holds; the engine
checkpoints it under the plugin's name and the optimizer updates it.

``xp`` is the array module (NumPy or CuPy) and ``cache`` is whatever the stage's forward needs to
keep for its backward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .config import RunSettings
from .market import schema

Array = Any
Params = dict[str, Array]


@dataclass(frozen=True)
class BuildContext:
    """What a hot-path hook sees when the engine builds its step."""

    settings: RunSettings
    xp: Any
    options: Mapping[str, Any] = field(default_factory=dict)
    """Validated options of every enabled plugin, by plugin name (a pydantic model or dict)."""

    @property
    def branch_sizes(self) -> tuple[int, ...]:
        return tuple(self.settings.net.branch_sizes)

    @property
    def num_actions(self) -> int:
        return int(sum(self.settings.net.branch_sizes))

    @property
    def num_atoms(self) -> int:
        return self.settings.net.num_atoms

    @property
    def feature_index(self) -> Mapping[str, int]:
        return schema.INDEX

    def options_for(self, plugin: str) -> Any:
        return self.options.get(plugin)


@dataclass(frozen=True)
class GateFragment:
    """A gate's CUDA form: a header of device functions (the contract: ``foxhunt_core/kernels/
    gate.cuh``) that the core compiles into the GLU kernels' epilogues — ``glu_gemm``'s forward,
    ``glu_backward_gemm``'s backward — and into its elementwise GLU kernels, so that the gate runs
    inside the fused update (the execution plan's fast path).

    ``arrays`` names the gate's parameters of branch ``d`` that the fragment reads, with ``{d}``
    for the branch (``("b{d}.coeff", "b{d}.residual")``), at most two; ``unit_floats`` the floats
    of each per unit (each array ``[adv_h, unit_floats]`` or ``[adv_h]``, C-contiguous float32),
    which must be the header's ``GATE_UNIT0`` and ``GATE_UNIT1`` (checked when it compiles). The
    parameter gradients the kernels form are those arrays' gradients, summed over the batch in a
    fixed order.

    The forward's kernels (``gate_value``) may read other arrays: ``forward_arrays`` names them,
    one per array of ``arrays`` with its floats per unit (default: ``arrays``), and ``derive(xp,
    params)`` returns those that are not parameters, by name (kan_gate's spline in a form whose
    evaluation needs no search for the knot interval, from its B-spline coefficients). The core
    calls it once per forward of the fused network with that forward's parameters (online or
    target); it runs inside the captured step, so it may only queue device work (no host
    synchronisation, no copy from the host). The backward's kernels (``gate_backward``) read
    ``backward_arrays`` in the same way (default: ``arrays``) and form the gradients of ``arrays``;
    where they read derived arrays, the fused backward takes those its forward derived (the
    parameters have not changed between them). ``include`` directories the header's own includes
    need besides its own; ``defines`` its compile-time settings."""

    header: str
    arrays: tuple[str, ...] = ()
    unit_floats: tuple[int, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    include: tuple[str, ...] = ()
    forward_arrays: tuple[str, ...] | None = None
    backward_arrays: tuple[str, ...] | None = None
    derive: Any = None  # (xp, params) -> {name: array}; compared by value where it is a dataclass

    def __post_init__(self) -> None:
        if len(self.arrays) > 2 or len(self.unit_floats) != len(self.arrays) or any(
                int(u) < 1 for u in self.unit_floats):
            raise ValueError(f"gate fragment {self.header}: up to two parameter arrays, each with a positive "
                             f"unit_floats; got arrays {self.arrays}, unit_floats {self.unit_floats}")
        for what, names in (("forward_arrays", self.forward_arrays), ("backward_arrays", self.backward_arrays)):
            if names is not None and len(names) != len(self.arrays):
                raise ValueError(f"gate fragment {self.header}: {what} {names} must name one "
                                 f"array per parameter array {self.arrays}")
        if self.derive is not None and not callable(self.derive):
            raise ValueError(f"gate fragment {self.header}: derive must be callable, got "
                             f"{type(self.derive).__name__}")

    @property
    def terms(self) -> int:
        """Parameter-gradient terms per unit: every float of a unit's parameters."""
        return int(sum(self.unit_floats))

    @property
    def forward_names(self) -> tuple[str, ...]:
        """The arrays the forward's kernels read (one per parameter array)."""
        return self.arrays if self.forward_arrays is None else self.forward_arrays

    @property
    def backward_names(self) -> tuple[str, ...]:
        """The arrays the backward's kernels read (one per parameter array)."""
        return self.arrays if self.backward_arrays is None else self.backward_arrays

    @property
    def backward_derives(self) -> bool:
        """Whether the backward's kernels read arrays other than the parameters."""
        return self.backward_arrays is not None and tuple(self.backward_arrays) != tuple(self.arrays)

    def forward_reads(self, xp: Any, params: Params) -> Params:
        """What the forward's kernels read: ``params`` and, with ``derive``, the arrays derived from them."""
        if self.derive is None:
            return params
        return {**params, **self.derive(xp, params)}

    def branch_arrays(self, params: Params, branch: int) -> tuple[Array, ...]:
        """Branch ``branch``'s parameter arrays (the backward's), from the gate's ``params``."""
        return tuple(params[name.format(d=branch)] for name in self.arrays)

    def branch_forward_arrays(self, reads: Params, branch: int) -> tuple[Array, ...]:
        """Branch ``branch``'s arrays the forward reads, from :meth:`forward_reads`'s tree."""
        return tuple(reads[name.format(d=branch)] for name in self.forward_names)

    def branch_backward_arrays(self, reads: Params, branch: int) -> tuple[Array, ...]:
        """Branch ``branch``'s arrays the backward reads, from :meth:`forward_reads`'s tree (or the
        parameters, where it reads only those)."""
        return tuple(reads[name.format(d=branch)] for name in self.backward_names)


@runtime_checkable
class GateActivation(Protocol):
    """Replaces the sigmoid inside each branch's GLU: ``h = gate(pre) * value``.

    An optional attribute ``fragment`` (read with ``getattr``, default None) is the gate's CUDA
    form (:class:`GateFragment`): with it the gate runs inside the fused GLU kernels on the GPU;
    without it, on the slow path (its ``forward`` and ``backward`` per branch, the fused
    arrangements off), which the run reports once.
    """

    name: str

    def init_params(self, widths: tuple[int, ...], rng: np.random.Generator) -> Params:
        """Parameters for all branches (``widths[d]`` gate units in branch ``d``)."""

    def forward(self, xp: Any, params: Params, branch: int, pre: Array) -> tuple[Array, Any]:
        """Gate values from pre-activations ``pre`` [B, width]; returns ``(gate, cache)``."""

    def backward(
        self, xp: Any, params: Params, branch: int, cache: Any, dgate: Array
    ) -> tuple[Array, Params]:
        """``(dpre, grads)`` where ``grads`` has the keys of ``params`` this branch touches."""


def index_runs(indices: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """Maximal runs of consecutive ``indices`` as ``(src_start, src_stop, dst_start)``: the slice
    copies that gather ``obs[:, indices]`` without an index array (which a captured CUDA graph
    could not copy from the host)."""
    runs: list[list[int]] = []
    for j, i in enumerate(indices):
        if runs and runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, i + 1, j])
    return tuple((a, b, c) for a, b, c in runs)


@runtime_checkable
class BranchInputStage(Protocol):
    """Widens the input of some branches with extra columns computed from the observation.

    An optional attribute ``zero_init_rows`` (read with ``getattr``, default false): when true, the
    core initialises the GLU weight rows that read this stage's columns at zero and draws the other
    rows as it would without the stage, so the network's function at init is the one without it.

    An optional attribute ``observation_columns`` (a tuple of ``width`` indices into the
    observation, default None): when given, the stage promises that ``forward`` returns exactly
    those columns of the observation, owns no parameters and needs no cache. The GPU network then
    copies the columns into its augmented z itself, beside the direction-Q columns, and the
    branches keep their joint GLU blocks and fused kernels (the fast path); without it the
    widened branches form inputs of their own.
    """

    name: str
    branches: tuple[int, ...]
    width: int

    def init_params(self, rng: np.random.Generator) -> Params: ...

    def forward(self, xp: Any, params: Params, obs: Array) -> tuple[Array, Any]:
        """Extra columns [B, width] from the observation [B, state_dim]; ``(cols, cache)``."""

    def backward(self, xp: Any, params: Params, cache: Any, dcols: Array) -> Params:
        """Parameter gradients from the gradient of the columns (summed over branches)."""


@runtime_checkable
class PreAttentionStage(Protocol):
    """Transforms expected Q [B, A] before the cross-branch attention. Not differentiated."""

    name: str

    def forward(self, xp: Any, q: Array) -> Array: ...


@dataclass(frozen=True)
class PostInputs:
    """What a post-attention stage reads: Q and, beside it, the variance of the raw atoms."""

    q: Array  # [B, A] coordinated Q so far (after attention and the earlier post-attention stages)
    var: Array  # [B, A] Var[Q] of the atom distributions; a constant: no gradient flows into it


@runtime_checkable
class PostAttentionStage(Protocol):
    """Transforms coordinated Q [B, A] after attention; trained by the auxiliary Q loss."""

    name: str

    def init_params(self, rng: np.random.Generator) -> Params: ...

    def forward(self, xp: Any, params: Params, inputs: PostInputs) -> tuple[Array, Any]:
        """The new Q [B, A] from ``inputs``; returns ``(q, cache)``."""

    def backward(
        self, xp: Any, params: Params, cache: Any, dq: Array, grads_into: Params | None = None
    ) -> tuple[Array, Params]:
        """``(d inputs.q, grads)`` from the gradient ``dq`` of the stage's output.

        ``grads_into``, when given (the fused GPU update), holds preallocated float32 arrays keyed
        like ``params`` (views of the optimizer's flat gradient buffer); a stage may write its
        gradients into them and return them, which spares the optimizer a copy per tensor.
        """


@dataclass(frozen=True)
class SelectInputs:
    """What an action-select stage may read."""

    probs: Array  # [B, A, num_atoms] atom distributions
    support: Array  # [num_atoms]
    q_raw: Array  # [B, A] expected Q before pre-attention stages
    q_coordinated: Array  # [B, A]
    iqn_readiness: Any  # a float, or a 0-d device array on the GPU (use it in array arithmetic)


@runtime_checkable
class ActionSelectStage(Protocol):
    """Supplies the values [B, A] that collection's Boltzmann draws choose by, and greedy
    evaluation too where ``in_evaluation`` is true (otherwise evaluation uses coordinated Q)."""

    name: str
    in_evaluation: bool

    def select_values(self, xp: Any, inputs: SelectInputs) -> Array: ...
