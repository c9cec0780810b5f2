"""The gate fragment's contract on the host (foxhunt_core.stages.GateFragment and
foxhunt_core.gpu.gate.branch_launch): the arrays the forward's kernels read, derived arrays, and
the parameters the backward's read and whose gradients they form."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core.gpu.gate import branch_launch
from foxhunt_core.stages import GateFragment


def _double(xp, params):
    """A derive: each branch's ``w`` doubled, as ``b{d}.w2``."""
    return {k[: -len(".w")] + ".w2": 2 * v for k, v in params.items() if k.endswith(".w")}


class _Stage:
    fragment = GateFragment("gate.cuh", arrays=("b{d}.w", "b{d}.r"), unit_floats=(3, 1),
                            forward_arrays=("b{d}.w2", "b{d}.r"), derive=_double)


def _tree(branches=(0, 1, 2)):
    rng = np.random.default_rng(0)
    out = {}
    for d in branches:
        out[f"b{d}.w"] = rng.normal(size=(4, 3))
        out[f"b{d}.r"] = rng.normal(size=4)
    return out


def test_forward_reads_hold_the_parameters_and_the_derived_arrays():
    f = _Stage.fragment
    tree = _tree()
    reads = f.forward_reads(np, tree)
    assert set(reads) == set(tree) | {"b0.w2", "b1.w2", "b2.w2"}
    np.testing.assert_array_equal(reads["b1.w2"], 2 * tree["b1.w"])
    assert f.forward_names == ("b{d}.w2", "b{d}.r") and f.terms == 4
    plain = GateFragment("gate.cuh", arrays=("b{d}.w",), unit_floats=(3,))
    assert plain.forward_reads(np, tree) is tree and plain.forward_names == plain.arrays


def test_forward_launches_read_derived_arrays_and_backward_launches_the_parameters():
    tree = _tree()
    launch = branch_launch(_Stage, tree, (2, 0))
    (w2_2, r_2), (w2_0, r_0) = launch.params
    np.testing.assert_array_equal(w2_2, 2 * tree["b2.w"])
    np.testing.assert_array_equal(w2_0, 2 * tree["b0.w"])
    assert r_2 is tree["b2.r"] and r_0 is tree["b0.r"] and launch.grads is None
    # arrays derived once (the step's) are taken as they are
    reads = _Stage.fragment.forward_reads(np, tree)
    assert branch_launch(_Stage, tree, (1,), reads=reads).params[0][0] is reads["b1.w2"]
    grads = {k: np.zeros_like(v) for k, v in tree.items()}
    back = branch_launch(_Stage, tree, (2, 0), grads)
    assert back.params[0][0] is tree["b2.w"] and back.params[1][1] is tree["b0.r"]
    assert back.grads[0][0] is grads["b2.w"] and back.grads[1][1] is grads["b0.r"]
    with pytest.raises(ValueError, match="gate_glu_forward: the gate's forward reads"):
        back.check_forward("gate_glu_forward")
    launch.check_forward("glu_gemm")  # (a forward's launch passes)


@pytest.mark.parametrize(("kw", "msg"), [
    ({"arrays": ("a", "b", "c"), "unit_floats": (1, 1, 1)}, "up to two parameter arrays"),
    ({"arrays": ("a",), "unit_floats": (0,)}, "positive unit_floats"),
    ({"arrays": ("a",), "unit_floats": (1,), "forward_arrays": ("a", "b")}, "one array per parameter array"),
    ({"arrays": ("a",), "unit_floats": (1,), "derive": 3}, "derive must be callable"),
])
def test_bad_fragments_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GateFragment("gate.cuh", **kw)
