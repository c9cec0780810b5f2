"""diffusion_refine on the NumPy path: golden values, a naive oracle, float64 gradient checks (no
gradient through Var), the manifest against the options, the stage inside the agent's objective."""

from __future__ import annotations

import numpy as np
import pytest
from foxhunt_diffusion_refine import plugin, refine
from foxhunt_diffusion_refine.stage import DiffusionRefineStage

from foxhunt_core.agent import Agent
from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
from foxhunt_core.plugins import PluginError, discover
from foxhunt_core.stages import BuildContext, PostInputs
from foxhunt_core.testing import check_tree_gradients, numeric_gradient


def _params(rng, K=3, H=24, A=12, scale=0.4):
    p = refine.init_params(K, H, A, rng, zero_output=False)
    return {k: v + rng.normal(size=v.shape) * scale for k, v in p.items()}


def naive_forward(p, q, var, s):
    """Per sample, step and unit, with explicit loops: the equations of refine.py as written."""
    K, H, A = p["w_q"].shape
    out = np.empty_like(q, dtype=np.float64)
    for b in range(q.shape[0]):
        x = [float(v) for v in q[b]]
        sig = [np.sqrt(max(float(v), 0.0)) for v in var[b]]
        for k in range(K):
            c = 1.0 - k / K
            h = []
            for i in range(H):
                pre = p["b1"][k, i]
                for j in range(A):
                    pre += p["w_q"][k, i, j] * x[j] + p["w_sigma"][k, i, j] * c * sig[j]
                h.append(pre / (1.0 + np.exp(-pre)))
            x = [x[a] + s * (p["b2"][k, a] + sum(p["w2"][k, a, i] * h[i] for i in range(H))) for a in range(A)]
        out[b] = x
    return out


def test_the_plan_sizes_give_2700_parameters_not_2772():
    shapes = refine.param_shapes(3, 24, 12)
    assert sum(int(np.prod(s)) for s in shapes.values()) == 2700 == 3 * (24 * 24 + 24 + 12 * 24 + 12)
    assert refine.schedule(3) == pytest.approx([1.0, 2.0 / 3.0, 1.0 / 3.0], rel=1e-15)


def test_default_init_is_the_identity_and_every_weight_gets_a_gradient():
    rng = np.random.default_rng(1)
    p = refine.init_params(3, 24, 12, rng)
    assert not p["w2"].any() and not p["b1"].any() and not p["b2"].any() and np.abs(p["w_q"]).max() > 0.1
    q, var = rng.normal(size=(9, 12)), rng.random((9, 12))
    out, cache = refine.forward(np, p, q, var, 0.1)
    np.testing.assert_array_equal(out, q)
    _, g = refine.backward(np, p, cache, rng.normal(size=(9, 12)))
    # W2 = 0: the second layer learns first (its gradient s dQ h^T is not zero), the first layer's
    # gradient flows through W2 and starts once W2 has moved
    assert all(np.abs(g["w2"][k]).max() > 0 and np.abs(g["b2"][k]).max() > 0 for k in range(3))
    assert not g["w_q"].any() and not g["w_sigma"].any() and not g["b1"].any()
    # with the plan's schedule (k = 1..K) the last step's sigma weights would see sigma * 0
    p2 = _params(rng)
    _, c2 = refine.forward(np, p2, q, var, 0.1)
    _, g2 = refine.backward(np, p2, c2, rng.normal(size=(9, 12)))
    assert all(np.abs(g2["w_sigma"][k]).max() > 0 for k in range(3))


def test_one_step_by_hand():
    """K = 1, H = 1, A = 1: pre = wq q + ws sqrt(var) + b1; out = q + s (w2 SiLU(pre) + b2)."""
    p = {"w_q": np.array([[[0.5]]]), "w_sigma": np.array([[[2.0]]]), "b1": np.array([[-0.25]]),
         "w2": np.array([[[3.0]]]), "b2": np.array([[0.1]])}
    q, var = np.array([[2.0]]), np.array([[0.25]])
    pre = 0.5 * 2.0 + 2.0 * 0.5 - 0.25  # 1.75
    want = 2.0 + 0.1 * (3.0 * pre / (1.0 + np.exp(-pre)) + 0.1)
    out, _ = refine.forward(np, p, q, var, 0.1)
    assert out[0, 0] == pytest.approx(want, rel=1e-14)
    neg, _ = refine.forward(np, p, q, np.array([[-1e-6]]), 0.1)  # a variance rounded below 0: sigma 0
    pre0 = 0.5 * 2.0 - 0.25
    assert neg[0, 0] == pytest.approx(2.0 + 0.1 * (3.0 * pre0 / (1.0 + np.exp(-pre0)) + 0.1), rel=1e-14)


@pytest.mark.parametrize(("K", "H", "A"), [(3, 24, 12), (2, 5, 7), (1, 3, 4)])
def test_forward_matches_the_naive_oracle(K, H, A):
    rng = np.random.default_rng()
    p = _params(rng, K, H, A)
    q, var = rng.normal(size=(4, A)) * 2.0, rng.random((4, A)) * 3.0
    out, _ = refine.forward(np, p, q, var, 0.1)
    np.testing.assert_allclose(out, naive_forward(p, q, var, 0.1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("K", "H", "A", "s"), [(3, 24, 12, 0.1), (2, 5, 7, 0.7)])
def test_backward_matches_central_differences_and_var_has_no_gradient(K, H, A, s):
    rng = np.random.default_rng(29)
    p = _params(rng, K, H, A)
    q, var = rng.normal(size=(5, A)) * 1.5, rng.random((5, A)) * 2.0 + 0.1
    w = rng.normal(size=q.shape)

    def loss():
        return float((w * refine.forward(np, p, q, var, s)[0]).sum())

    _, cache = refine.forward(np, p, q, var, s)
    dq, grads = refine.backward(np, p, cache, w)
    assert check_tree_gradients(loss, {"dr": p}, {"dr": grads}, rng, samples_per_tensor=10, rtol=1e-6) == []
    for idx in [(0, 0), (1, A // 2), (4, A - 1), (2, 1)]:
        assert dq[idx] == pytest.approx(numeric_gradient(loss, q, idx), rel=1e-6, abs=1e-9)
    # Var[Q] is a constant of the stage: the loss does depend on it, but no gradient is formed
    assert abs(numeric_gradient(loss, var, (1, 1))) > 1e-6


def test_manifest_declares_option_dependent_shapes():
    reg = discover()
    assert "diffusion_refine" not in reg.problems
    m = reg.plugins["diffusion_refine"].manifest
    assert m.position == 6 and m.hooks == ("post_attention",)
    assert m.parameter_count() == 2700
    assert m.parameter_count(options=plugin.DiffusionRefineOptions(steps=2, hidden=8)) == 2 * (3 * 8 * 12 + 8 + 12)
    assert m.kernel_names() == ["diffusion_refine_forward", "diffusion_refine_backward", "diffusion_refine_grad_reduce"]


def _settings(**net):
    base = dict(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0)
    return RunSettings(net=NetSettings(**{**base, **net}), train=TrainSettings(entropy_coeff=0.05, aux_weight=0.7))


def test_agent_checks_the_stage_against_the_manifest_with_its_options():
    rng = np.random.default_rng(0)
    opts = {"diffusion_refine": plugin.DiffusionRefineOptions(steps=2, hidden=6)}
    agent = Agent(_settings(), discover().plugin_set(["diffusion_refine"]), np, rng, options=opts)
    assert agent.online["diffusion_refine"]["w2"].shape == (2, 12, 6)
    # a manifest that does not say what the stage makes stops the build, naming the plugin
    ps = discover().plugin_set(["diffusion_refine"])
    bad = ps.plugins[0].manifest.model_copy(update={"parameters": ps.plugins[0].manifest.parameters[:4]})
    object.__setattr__(ps.plugins[0], "manifest", bad)
    with pytest.raises(PluginError, match="plugin 'diffusion_refine': its stage creates parameters"):
        Agent(_settings(), ps, np, rng, options=opts)


def test_options_and_hook():
    with pytest.raises(ValueError, match="extra"):
        plugin.DiffusionRefineOptions.model_validate({"step": 2})
    with pytest.raises(ValueError, match="greater than 0"):
        plugin.DiffusionRefineOptions(step_scale=0.0)
    ctx = BuildContext(settings=RunSettings(net=NetSettings(branch_sizes=(3, 2, 4, 2))), xp=np,
                       options={"diffusion_refine": {"steps": 4, "hidden": 10, "step_scale": 0.2,
                                                     "zero_init_output": False, "trainable": False}})
    st = plugin.post_attention(ctx)
    assert (st.actions, st.steps, st.hidden, st.step_scale, st.trainable) == (11, 4, 10, 0.2, False)
    assert st.init_params(np.random.default_rng()).get("w2").any()


def test_frozen_stage_passes_the_gradient_but_not_to_its_parameters():
    rng = np.random.default_rng(2)
    p = _params(rng)
    inputs = PostInputs(rng.normal(size=(4, 12)), rng.random((4, 12)))
    dy = rng.normal(size=(4, 12))
    live, frozen = DiffusionRefineStage(12), DiffusionRefineStage(12, trainable=False)
    dq_a, g_a = live.backward(np, p, live.forward(np, p, inputs)[1], dy)
    dq_b, g_b = frozen.backward(np, p, frozen.forward(np, p, inputs)[1], dy)
    np.testing.assert_array_equal(dq_a, dq_b)
    assert all(np.abs(g_a[k]).max() > 0 and not g_b[k].any() for k in g_a)


def test_the_auxiliary_loss_reaches_the_parameters_through_the_agent():
    """Defect 5: the plan gave the stage Adam state but no backward. The whole objective's gradient
    of the plugin's (after graph_message's) and the attention's parameters, by central differences."""
    rng = np.random.default_rng(31)
    opts = {"diffusion_refine": {"hidden": 6}}
    agent = Agent(_settings(), discover().plugin_set(["graph_message", "diffusion_refine"]), np, rng,
                  dtype=np.float64, options=opts)
    assert agent.stage_owners["post_attention"] == ["graph_message", "diffusion_refine"]
    for owner in ("graph_message", "diffusion_refine"):
        for v in agent.online[owner].values():
            v[...] += rng.normal(size=v.shape) * 0.4
    for k in agent.online["core"]:
        if k.endswith("w_out") or k == "value.w":
            agent.online["core"][k] *= 10
    agent.online["core"]["attn.gate"][:] = rng.normal(size=12) * 0.5
    agent.sync_target()
    B = 6
    batch = {"obs": rng.normal(size=(B, 50)), "next_obs": rng.normal(size=(B, 50)),
             "action": rng.integers(0, 3, size=(B, 4)), "reward": rng.normal(size=B) * 0.5,
             "terminal": (rng.random(B) < 0.3).astype(np.float64)}

    def objective():
        _, s, _, _ = agent.loss_and_grads(batch, 0.05)
        return float(s["loss"] + s["aux_loss"])

    grads, _, _, _ = agent.loss_and_grads(batch, 0.05)
    q_side = {"diffusion_refine": agent.online["diffusion_refine"], "graph_message": agent.online["graph_message"],
              "core": {k: v for k, v in agent.online["core"].items() if k.startswith("attn.")}}
    assert check_tree_gradients(objective, q_side, grads, rng, samples_per_tensor=4, rtol=1e-4) == []
    assert all(np.abs(g).max() > 0 for g in grads["diffusion_refine"].values())
