"""Float64 finite-difference checks of every layer and of the whole network."""

import numpy as np
import pytest

from foxhunt_core.config import NetSettings
from foxhunt_core.net import BranchingC51
from foxhunt_core.net import layers as L
from foxhunt_core.testing import check_tree_gradients
from hook_plugins import OfiColumnStage, TanhGateStage

SMALL = dict(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0)


def _fd_check(fn, arrays, grads, rng):
    tree = {"x": arrays}
    return check_tree_gradients(fn, tree, {"x": grads}, rng, samples_per_tensor=12)


@pytest.mark.parametrize("layer", ["linear", "relu", "sigmoid", "softmax", "log_softmax"])
def test_layer_gradients(layer):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 6))
    w = rng.normal(size=(6, 5))
    b = rng.normal(size=5)
    W = rng.normal(size=(4, 5 if layer == "linear" else 6))
    if layer == "linear":
        f = lambda: float((L.linear(x, w, b) * W).sum())  # noqa: E731
        dx, dw, db = L.linear_backward(x, w, W)
        fails = _fd_check(f, {"x": x, "w": w, "b": b}, {"x": dx, "w": dw, "b": db}, rng)
    else:
        fwd = {"relu": L.relu, "sigmoid": L.sigmoid, "softmax": L.softmax, "log_softmax": L.log_softmax}[layer]
        y = fwd(x)
        f = lambda: float((fwd(x) * W).sum())  # noqa: E731
        if layer == "relu":
            dx = L.relu_backward(y, W)
        elif layer == "sigmoid":
            dx = L.sigmoid_backward(y, W)
        elif layer == "softmax":
            dx = L.softmax_backward(y, W)
        else:
            dx = W - np.exp(y) * W.sum(axis=-1, keepdims=True)
        fails = _fd_check(f, {"x": x}, {"x": dx}, rng)
    assert fails == []


def _loss_and_dlogits(net, params, obs, W):
    """A loss that touches log-probs and probs of every action and atom."""

    def loss():
        o = net.forward(params, obs)
        return float((o.log_probs * W).sum() + (o.probs**2).sum())

    o = net.forward(params, obs, keep_cache=True)
    p = o.probs
    d1 = W - p * W.sum(-1, keepdims=True)
    d2 = p * (2 * p - (2 * p * p).sum(-1, keepdims=True))
    return loss, o, d1 + d2


@pytest.mark.parametrize("with_stages", [False, True], ids=["sigmoid-gate", "tanh-gate+ofi-column"])
def test_whole_network_gradient(with_stages):
    rng = np.random.default_rng(11)
    net = BranchingC51(
        NetSettings(**SMALL),
        gate=TanhGateStage() if with_stages else None,
        branch_inputs=[OfiColumnStage()] if with_stages else (),
    )
    params = net.init_params(rng, np.float64)
    for k in params["core"]:  # larger output layers so every path carries a visible gradient
        if k.endswith("w_out") or k == "value.w":
            params["core"][k] *= 10
    if with_stages:
        params["tanh_gate"] = {k: v * 1.3 for k, v in params["tanh_gate"].items()}
    obs = rng.normal(size=(6, 50))
    W = rng.normal(size=(6, net.num_actions, net.num_atoms))
    loss, out, dlogits = _loss_and_dlogits(net, params, obs, W)
    grads = net.backward(params, out, dlogits)
    assert set(grads) == set(params)
    assert check_tree_gradients(loss, params, grads, rng, samples_per_tensor=10) == []


def test_magnitude_branch_reads_direction_branch():
    rng = np.random.default_rng(5)
    net = BranchingC51(NetSettings(**SMALL))
    params = net.init_params(rng, np.float64)
    obs = rng.normal(size=(3, 50))
    before = net.forward(params, obs).logits.copy()
    params["core"]["branch0.w_out"] += rng.normal(size=params["core"]["branch0.w_out"].shape)
    after = net.forward(params, obs).logits
    mag = slice(net.offsets[1], net.offsets[2])
    order = slice(net.offsets[2], net.offsets[3])
    assert not np.allclose(before[:, mag], after[:, mag])  # conditioned on direction
    assert np.allclose(before[:, order], after[:, order])  # other branches are not


def test_initial_distributions_use_every_atom():
    net = BranchingC51(NetSettings())
    params = net.init_params(np.random.default_rng(0))
    obs = np.random.default_rng(1).normal(size=(64, 50)).astype(np.float32)
    p = net.forward(params, obs).probs
    assert p.dtype == np.float32
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    assert (p > 0.1 / net.num_atoms).all()


def test_dueling_aggregation_is_identifiable():
    """Adding a constant to every advantage of a branch leaves the logits unchanged."""
    rng = np.random.default_rng(2)
    net = BranchingC51(NetSettings(**SMALL))
    params = net.init_params(rng, np.float64)
    obs = rng.normal(size=(4, 50))
    before = net.forward(params, obs).logits.copy()
    b = params["core"]["branch2.b_out"].reshape(net.sizes[2], net.num_atoms)
    b += rng.normal(size=net.num_atoms)[None, :]  # same shift for every action of branch 2
    np.testing.assert_allclose(net.forward(params, obs).logits, before, atol=1e-12)
