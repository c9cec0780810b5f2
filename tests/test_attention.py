"""Cross-branch Q attention: float64 finite-difference gradients and the zero-gate identity."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from foxhunt_core import attention
from foxhunt_core.testing import check_tree_gradients

B, A, K = 3, 9, 4


def _setup(seed, gate):
    rng = np.random.default_rng(seed)
    params = attention.init_params(A, K, rng)
    params["attn.gate"] = gate(rng)
    q = rng.normal(size=(B, A)) * 2.0
    w = rng.normal(size=(B, A))  # loss = sum(w * qc), so dloss/dqc = w
    tree = {"core": params, "input": {"q": q}}

    def loss() -> float:
        qc, _ = attention.forward(tree["core"], tree["input"]["q"])
        return float((w * qc).sum())

    _, cache = attention.forward(params, q)
    dq, grads = attention.backward(params, cache, w)
    return tree, {"core": grads, "input": {"q": dq}}, loss, rng


GATES = {
    "nonzero": lambda rng: rng.uniform(-0.5, 1.5, size=A),
    "zero": lambda rng: np.zeros(A),
}


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize("seed", [0, 1])
def test_backward_matches_finite_differences(gate, seed):
    tree, grads, loss, rng = _setup(seed, GATES[gate])
    for sub in tree.values():
        for x in sub.values():
            assert x.dtype == np.float64
    failures = check_tree_gradients(loss, tree, grads, rng, samples_per_tensor=1000)
    assert failures == []


def test_gradient_check_catches_a_wrong_gradient():
    tree, grads, loss, rng = _setup(0, GATES["nonzero"])
    bad = copy.deepcopy(grads)
    bad["input"]["q"][1, 2] *= 1.01
    bad["core"]["attn.wk"][0, 0] += 1e-3
    failures = check_tree_gradients(loss, tree, bad, rng, samples_per_tensor=1000)
    # every entry is checked, so exactly the two corrupted ones fail
    assert len(failures) == 2, failures
    assert sorted(f.split("[")[0] for f in failures) == ["core/attn.wk", "input/q"]


def test_zero_gate_is_identity():
    rng = np.random.default_rng(5)
    params = attention.init_params(A, K, rng)
    assert (params["attn.gate"] == 0).all()  # the gate starts closed
    q = rng.normal(size=(B, A)) * 10
    qc, cache = attention.forward(params, q)
    np.testing.assert_array_equal(qc, q)
    # ...while the attention output itself differs, so the gate is what holds qc at q.
    assert not np.allclose(cache["o"], q)
    # the gate still receives a gradient, so it can open
    dq, grads = attention.backward(params, cache, np.ones_like(q))
    np.testing.assert_allclose(dq, np.ones_like(q))
    assert np.abs(grads["attn.gate"]).max() > 0


def test_attention_rows_are_convex_combinations():
    tree, _, _, _ = _setup(2, GATES["nonzero"])
    q = tree["input"]["q"]
    _, cache = attention.forward(tree["core"], q)
    np.testing.assert_allclose(cache["a"].sum(-1), 1.0, rtol=1e-12)
    assert (cache["o"] <= q.max(1, keepdims=True) + 1e-12).all()
    assert (cache["o"] >= q.min(1, keepdims=True) - 1e-12).all()
