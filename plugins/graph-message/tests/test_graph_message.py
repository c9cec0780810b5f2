"""graph_message on the NumPy path: golden values, a naive oracle, float64 gradient checks, the
manifest, the options and the stage inside the agent's objective."""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_graph_message import graph, plugin
from foxhunt_graph_message.stage import GraphMessageStage

from foxhunt_core.agent import Agent
from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
from foxhunt_core.plugins import discover
from foxhunt_core.stages import BuildContext, PostInputs
from foxhunt_core.testing import check_tree_gradients, numeric_gradient

UNEVEN = (3, 2, 4, 2)


def _offsets(sizes):
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)]))


def _random_params(rng, sizes, scale=0.7):
    return {k: rng.normal(size=s) * scale for k, s in graph.param_shapes(sizes).items()}


def naive_forward(params, q, sizes):
    """Per sample and edge, with explicit loops: the equations of graph.py as written."""
    offs = _offsets(sizes)
    out = q.astype(np.float64).copy()
    incoming = [0, 0, 0, 0]
    for _, _, d in graph.EDGES:
        incoming[d] += 1
    for b in range(q.shape[0]):
        for e, s, d in graph.EDGES:
            qs = [q[b, offs[s] + j] for j in range(sizes[s])]
            qd = [q[b, offs[d] + j] for j in range(sizes[d])]
            pre = sum(params[f"{e}.gate_src"][j] * qs[j] for j in range(sizes[s]))
            pre += sum(params[f"{e}.gate_dst"][j] * qd[j] for j in range(sizes[d]))
            g = 1.0 / (1.0 + np.exp(-pre))
            for i in range(sizes[d]):
                m = sum(params[f"{e}.msg"][i, j] * qs[j] for j in range(sizes[s]))
                out[b, offs[d] + i] += g * m / incoming[d]
    return out


def test_sixty_parameters_for_four_branches_of_three():
    shapes = graph.param_shapes((3, 3, 3, 3))
    assert sum(int(np.prod(s)) for s in shapes.values()) == 60
    assert len(shapes) == 12 and graph.incoming() == (0, 1, 1, 2)


def test_init_is_a_weak_identity_message_with_half_open_gates():
    """At the init every gate is sigmoid(0) = 1/2 and M = 0.1 I: hand-worked values."""
    q = np.array([[1.0, 2.0, 3.0, 10.0, 20.0, 30.0, -1.0, -2.0, -3.0, 5.0, 6.0, 7.0]])
    p = graph.init_params((3, 3, 3, 3), 0.1)
    out, _ = graph.forward(np, p, q, (0, 3, 6, 9, 12))
    want = q.copy()
    want[0, 3:6] += 0.5 * 0.1 * q[0, 0:3]  # magnitude <- direction
    want[0, 6:9] += 0.5 * 0.1 * q[0, 0:3]  # order <- direction
    want[0, 9:12] += 0.5 * (0.5 * 0.1 * q[0, 3:6] + 0.5 * 0.1 * q[0, 6:9])  # urgency: mean of two
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    assert out[0, 3] == pytest.approx(10.05) and out[0, 9] == pytest.approx(5.0 + 0.5 * (0.05 * 10.0 + 0.05 * -1.0))


def test_non_square_messages_start_at_the_leading_diagonal():
    p = graph.init_params(UNEVEN, 0.1)
    np.testing.assert_array_equal(p["dir_mag.msg"], 0.1 * np.array([[1, 0, 0], [0, 1, 0]]))
    np.testing.assert_array_equal(p["dir_ord.msg"], 0.1 * np.eye(4, 3))
    assert all(not p[f"{e}.gate_src"].any() and not p[f"{e}.gate_dst"].any() for e, _, _ in graph.EDGES)


@pytest.mark.parametrize("sizes", [(3, 3, 3, 3), UNEVEN, (1, 2, 1, 3)], ids=str)
def test_forward_matches_the_naive_oracle(sizes):
    rng = np.random.default_rng()
    params = _random_params(rng, sizes)
    q = rng.normal(size=(7, sum(sizes))) * 2.0
    out, _ = graph.forward(np, params, q, _offsets(sizes))
    np.testing.assert_allclose(out, naive_forward(params, q, sizes), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out[:, : sizes[0]], q[:, : sizes[0]])  # no edge ends at direction


@pytest.mark.parametrize("sizes", [(3, 3, 3, 3), UNEVEN], ids=str)
def test_backward_matches_central_differences_in_float64(sizes):
    rng = np.random.default_rng(17)
    offs = _offsets(sizes)
    params = _random_params(rng, sizes)
    q = rng.normal(size=(5, sum(sizes))) * 1.5
    w = rng.normal(size=q.shape)  # loss = sum(w * Q')

    def loss():
        return float((w * graph.forward(np, params, q, offs)[0]).sum())

    _, cache = graph.forward(np, params, q, offs)
    dq, grads = graph.backward(np, params, cache, w, offs)
    fails = check_tree_gradients(loss, {"gm": params}, {"gm": grads}, rng, samples_per_tensor=12, rtol=1e-7)
    assert fails == []
    for idx in [(0, 0), (1, offs[1]), (2, offs[2] + 1), (4, offs[3]), (3, offs[4] - 1)]:
        assert dq[idx] == pytest.approx(numeric_gradient(loss, q, idx), rel=1e-7, abs=1e-9)


def test_manifest_is_discovered_and_declares_what_the_stage_creates():
    reg = discover()
    assert "graph_message" not in reg.problems
    p = reg.plugins["graph_message"]
    assert p.position == 4 and p.manifest.hooks == ("post_attention",)
    assert p.manifest.kernel_names() == ["graph_message_forward", "graph_message_backward",
                                         "graph_message_grad_reduce"]
    assert p.manifest.parameter_count() == 60
    uneven = RunSettings(net=NetSettings(branch_sizes=UNEVEN))
    assert p.manifest.parameter_count(uneven) == sum(int(np.prod(s)) for s in graph.param_shapes(UNEVEN).values())
    assert p.distribution.startswith("foxhunt-graph-message ")


def test_options_and_hook():
    with pytest.raises(ValueError, match="extra"):
        plugin.GraphMessageOptions.model_validate({"msg_int": 0.2})
    ctx = BuildContext(settings=RunSettings(net=NetSettings(branch_sizes=UNEVEN)), xp=np,
                       options={"graph_message": {"msg_init": 0.3, "trainable": False}})
    st = plugin.post_attention(ctx)
    assert st.sizes == UNEVEN and st.offsets == (0, 3, 5, 9, 11) and st.name == "graph_message"
    assert st.msg_init == 0.3 and st.trainable is False and st.use_cuda_kernel is True
    assert st.init_params(np.random.default_rng())["dir_ord.msg"][1, 1] == 0.3


def test_frozen_stage_passes_the_gradient_but_not_to_its_parameters():
    rng = np.random.default_rng(2)
    params = _random_params(rng, UNEVEN)
    q = rng.normal(size=(4, 11))
    dy = rng.normal(size=(4, 11))
    live, frozen = GraphMessageStage(UNEVEN), GraphMessageStage(UNEVEN, trainable=False)
    inputs = PostInputs(q, np.abs(q))
    out, cache = live.forward(np, params, inputs)
    dq_live, g_live = live.backward(np, params, cache, dy)
    dq_frozen, g_frozen = frozen.backward(np, params, frozen.forward(np, params, inputs)[1], dy)
    np.testing.assert_array_equal(dq_live, dq_frozen)
    assert all(np.abs(g_live[k]).max() > 0 and not g_frozen[k].any() for k in g_live)


def _settings():
    net = NetSettings(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0, branch_sizes=UNEVEN)
    return RunSettings(net=net, train=TrainSettings(entropy_coeff=0.05, aux_weight=0.7))


def test_the_auxiliary_loss_reaches_the_parameters_through_the_agent():
    """Defect 5: the plan gave the stage Adam state but no backward. Here the whole objective's
    gradient of the plugin's and the attention's parameters is checked by central differences."""
    rng = np.random.default_rng(23)
    agent = Agent(_settings(), discover().plugin_set(["graph_message"]), np, rng, dtype=np.float64)
    assert agent.stage_owners["post_attention"] == ["graph_message"]
    for v in agent.online["graph_message"].values():
        v[...] = rng.normal(size=v.shape) * 0.5
    for k in agent.online["core"]:
        if k.endswith("w_out") or k == "value.w":
            agent.online["core"][k] *= 10
    agent.online["core"]["attn.gate"][:] = rng.normal(size=11) * 0.5
    agent.sync_target()
    B = 6
    batch = {"obs": rng.normal(size=(B, 50)), "next_obs": rng.normal(size=(B, 50)),
             "action": np.stack([rng.integers(0, n, size=B) for n in UNEVEN], axis=1),
             "reward": rng.normal(size=B) * 0.5, "terminal": (rng.random(B) < 0.3).astype(np.float64)}

    def objective():
        _, s, _, _ = agent.loss_and_grads(batch, 0.05)
        return float(s["loss"] + s["aux_loss"])

    grads, _, _, _ = agent.loss_and_grads(batch, 0.05)
    q_side = {"graph_message": agent.online["graph_message"],
              "core": {k: v for k, v in agent.online["core"].items() if k.startswith("attn.")}}
    assert check_tree_gradients(objective, q_side, grads, rng, samples_per_tensor=4, rtol=1e-4) == []
    assert all(np.abs(g).max() > 0 for g in grads["graph_message"].values())


def test_float32_agent_update_stays_float32():
    rng = np.random.default_rng(5)
    agent = Agent(_settings(), discover().plugin_set(["graph_message"]), np, rng)
    B = 8
    batch = {"obs": rng.normal(size=(B, 50)).astype(np.float32),
             "next_obs": rng.normal(size=(B, 50)).astype(np.float32),
             "action": np.stack([rng.integers(0, n, size=B) for n in UNEVEN], axis=1),
             "reward": rng.normal(size=B).astype(np.float32), "terminal": np.zeros(B, np.float32)}
    grads, _, _, q = agent.loss_and_grads(batch, 0.01)
    assert q.q_coord.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads["graph_message"].values())
