"""Check that the PyTorch peer computes what foxhunt computes (so the benchmark compares equal work).

Loads foxhunt's parameters into the peer, runs both on the same batch in float64 and compares
the loss and every parameter gradient (foxhunt's hand-written backward against autograd).

    python benchmarks/check_peer.py [--batch 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from torch_peer import PeerNet, loss_fn  # noqa: E402

from foxhunt_core.agent import Agent  # noqa: E402
from foxhunt_core.config import NetSettings, RunSettings  # noqa: E402
from foxhunt_core.plugins import PluginSet  # noqa: E402


def peer_names(peer: PeerNet, adv_h: int) -> dict[str, tuple[str, bool, tuple]]:
    """foxhunt core parameter name -> (peer parameter name, transposed, the index of the peer
    tensor it fills: its share of the joint GLU Linear, the unpadded part of a padded layer)."""
    N, Np, sizes = peer.N, peer.Np, peer.sizes
    every = (slice(None),)
    m = {"trunk.b1": ("fc1.bias", False),
         "trunk.w2": ("fc2.weight", True), "trunk.b2": ("fc2.bias", False),
         "vsn.w": ("vsn.weight", True), "vsn.b": ("vsn.bias", False),
         "attn.emb": ("emb", False), "attn.wq": ("wq", False), "attn.wk": ("wk", False),
         "attn.gate": ("agate", False)}
    m = {k: v + (every,) for k, v in m.items()}
    m["trunk.w1"] = ("fc1.weight", True, (slice(None), slice(0, peer.fc1.in_features - peer.obs_pad)))
    m["value.w"] = ("value.weight", True, (slice(0, N),))
    m["value.b"] = ("value.bias", False, (slice(0, N),))
    gate, val = slice(0, adv_h), slice(adv_h, 2 * adv_h)  # the peer's joint GLU Linear: [gate; value]
    for d, n in enumerate(sizes):
        logits = np.concatenate([np.arange(a * Np, a * Np + N) for a in range(n)])  # the padded heads' rows
        cols = slice(0, peer.glu[d].in_features - (peer.mag_pad if d == 1 else 0))
        m[f"branch{d}.w_gate"] = (f"glu.{d}.weight", True, (gate, cols))
        m[f"branch{d}.w_val"] = (f"glu.{d}.weight", True, (val, cols))
        m[f"branch{d}.b_gate"] = (f"glu.{d}.bias", False, (gate,))
        m[f"branch{d}.b_val"] = (f"glu.{d}.bias", False, (val,))
        m[f"branch{d}.w_out"] = (f"out.{d}.weight", True, (torch.from_numpy(logits),))
        m[f"branch{d}.b_out"] = (f"out.{d}.bias", False, (torch.from_numpy(logits),))
    return m


def load_into(peer: PeerNet, core: dict[str, np.ndarray], names) -> None:
    params = dict(peer.named_parameters())
    with torch.no_grad():
        for ours, (theirs, transpose, index) in names.items():
            v = torch.from_numpy(np.asarray(core[ours], dtype=np.float64))
            params[theirs][index] = v.T if transpose else v


def check(agent: Agent, settings: RunSettings, batch: dict, tuned: bool) -> bool:
    """The peer (plain or tuned) against foxhunt: loss, gradients, and zero gradients over the padding."""
    net, t = settings.net, settings.train
    grads, scalars, _, _ = agent.loss_and_grads(batch, t.entropy_coeff)
    ours = float(scalars["loss"] + scalars["aux_loss"])
    kw = dict(h1=net.shared_h1, h2=net.shared_h2, adv_h=net.adv_h, num_atoms=net.num_atoms,
              attn_dim=net.attn_dim, v_min=net.v_min, v_max=net.v_max, dtype=torch.float64, tuned=tuned)
    online, target = PeerNet(**kw).double(), PeerNet(**kw).double()
    names = peer_names(online, net.adv_h)
    load_into(online, agent.online["core"], names)
    load_into(target, agent.target["core"], names)
    tb = tuple(torch.from_numpy(np.asarray(batch[k])) for k in ("obs", "next_obs", "action", "reward", "terminal"))
    loss = loss_fn(online, target, tb, gamma=t.gamma, beta=t.entropy_coeff, aux_w=t.aux_weight)
    loss.backward()
    theirs = float(loss.detach())
    worst = 0.0
    label = "tuned peer" if tuned else "peer"
    params = dict(online.named_parameters())
    covered = {pn: torch.zeros_like(p, dtype=torch.bool) for pn, p in params.items()}
    for k, (pn, transpose, index) in names.items():
        g = params[pn].grad[index].numpy()
        covered[pn][index] = True
        g = g.T if transpose else g
        err = np.abs(g - grads["core"][k]).max() / max(np.abs(g).max(), 1e-12)
        worst = max(worst, err)
        if err > 1e-8:
            print(f"{label}: gradient mismatch {k}: relative {err:.3g}")
    pad_grad = max(float(params[pn].grad[~c].abs().max()) if (~c).any() else 0.0 for pn, c in covered.items())
    print(f"{label}: loss foxhunt {ours:.12f} torch {theirs:.12f}; worst relative gradient difference "
          f"{worst:.3g}; largest gradient over the padding {pad_grad:.3g}")
    return abs(ours - theirs) < 1e-9 and worst < 1e-8 and pad_grad == 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    net = NetSettings(shared_h1=32, shared_h2=32, adv_h=24, num_atoms=51)
    settings = RunSettings(net=net)
    rng = np.random.default_rng(0)
    agent = Agent(settings, PluginSet(), np, rng, dtype=np.float64)
    agent.online["core"]["attn.gate"][:] = rng.normal(size=12) * 0.5
    for k in agent.online["core"]:
        if k.endswith("w_out") or k == "value.w":
            agent.online["core"][k] *= 8
    agent.sync_target()
    agent.target["core"]["value.b"] += 0.2
    B = args.batch
    batch = {"obs": rng.normal(size=(B, 50)), "next_obs": rng.normal(size=(B, 50)),
             "action": rng.integers(0, 3, size=(B, 4)), "reward": rng.normal(size=B),
             "terminal": (rng.random(B) < 0.2).astype(np.float64)}
    ok = [check(agent, settings, batch, tuned) for tuned in (False, True)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
