"""The PyTorch peer of foxhunt's training update: the same network, C51 step and optimizer.

Mirrors foxhunt_core (net/network.py, qpipe.py, attention.py, c51.py, agent.py) so that the
benchmark compares equal work:

* trunk (ReLU, ReLU) -> VSN mask ``z = h2 * sigmoid(h2 Wm + bm)`` -> value head [N];
* four GLU branches ``sigmoid(u Wg) * (u Wb)`` -> C51 logits, the magnitude branch's input
  conditioned on the direction branch's expected Q (scaled by ``q_scale``);
* per-atom dueling ``V + A - mean_a A``, log-softmax over atoms;
* expected Q -> cross-branch attention -> coordinated Q;
* double-DQN targets per branch from the target network, categorical projection, loss
  ``CE - beta H`` on the taken actions, auxiliary ``aux_w (Qc(s,a) - E[m])^2`` with the
  gradient stopped at the raw Q, Adam with global-norm clipping.

``PeerNet(tuned=True)`` computes the same function laid out the way the GPU wants it (and
``bench_update.py`` gives it a fused Adam): the layers cuBLAS would otherwise run on its slow
unaligned kernels are padded with zeros, as foxhunt's parameter storage pads them (the
observation 50 -> 52 columns, the value head 51 -> 52, each advantage head 3 x 51 -> 3 x 52, the
magnitude branch's input 259 -> 260); the padding never reaches the loss, so its gradients are
zero and Adam leaves it at zero. The cross-branch attention's products over extents of 8 and 12
become broadcast products the compiler fuses. The loss and gradients are those of the plain
network (benchmarks/check_peer.py checks both layouts against foxhunt).

Only used by the benchmarks; torch is not a dependency of foxhunt.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class PeerNet(nn.Module):
    """The network; ``tuned`` gives the same function laid out for the GPU (see the module doc)."""

    def __init__(self, state_dim=50, h1=256, h2=256, adv_h=256, num_atoms=51, sizes=(3, 3, 3, 3),
                 attn_dim=8, v_min=-10.0, v_max=10.0, dtype=torch.float32, tuned=False):
        super().__init__()
        self.sizes, self.N, self.tuned = tuple(sizes), num_atoms, tuned
        align = 4 if tuned else 1
        self.Np = _up(num_atoms, align)  # an action's logits in the padded heads
        self.obs_pad = _up(state_dim, align) - state_dim  # zero columns behind the observation
        self.mag_pad = _up(h2 + sizes[0], align) - (h2 + sizes[0])  # zero columns behind the direction Q
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)
        self.A = self.offsets[-1]
        # the support computed in float64, like foxhunt's, then cast
        self.register_buffer("z", torch.linspace(v_min, v_max, num_atoms, dtype=torch.float64).to(dtype))
        self.register_buffer("offs", torch.tensor(self.offsets[:-1]))  # first action of each branch
        self.v_min, self.v_max = float(v_min), float(v_max)
        self.q_scale = max(abs(v_min), abs(v_max))
        self.fc1, self.fc2 = nn.Linear(state_dim + self.obs_pad, h1), nn.Linear(h1, h2)
        self.vsn, self.value = nn.Linear(h2, h2), nn.Linear(h2, self.Np)
        ins = [h2 + (sizes[0] + self.mag_pad if d == 1 else 0) for d in range(len(sizes))]
        # Each GLU's gate and value layers as one Linear (one GEMM for both, as foxhunt does).
        self.glu = nn.ModuleList(nn.Linear(i, 2 * adv_h) for i in ins)
        self.out = nn.ModuleList(nn.Linear(adv_h, n * self.Np) for n in sizes)
        with torch.no_grad():  # the padding starts at zero (its gradients are zero: it stays there)
            for lin in [self.value, *self.out]:
                lin.weight.view(-1, self.Np, lin.in_features)[:, num_atoms:] = 0
                lin.bias.view(-1, self.Np)[:, num_atoms:] = 0
            self.fc1.weight[:, state_dim:] = 0
            self.glu[1].weight[:, ins[1] - self.mag_pad:] = 0
        k = attn_dim
        self.emb = nn.Parameter(torch.randn(self.A, k))
        self.wq = nn.Parameter(torch.randn(k + 1, k) / math.sqrt(k))
        self.wk = nn.Parameter(torch.randn(k + 1, k) / math.sqrt(k))
        self.agate = nn.Parameter(torch.zeros(self.A))

    def branch_logits(self, v, u, d):
        gate, val = self.glu[d](u).chunk(2, dim=1)
        h = torch.sigmoid(gate) * val
        adv = self.out[d](h).view(u.shape[0], self.sizes[d], self.Np)[:, :, : self.N]
        return v[:, None, :] + adv - adv.mean(dim=1, keepdim=True)

    def forward(self, obs):
        if self.obs_pad:
            obs = F.pad(obs, (0, self.obs_pad))
        h = F.relu(self.fc2(F.relu(self.fc1(obs))))
        z = h * torch.sigmoid(self.vsn(h))
        v = self.value(z)[:, : self.N]
        l0 = self.branch_logits(v, z, 0)
        q_dir = (torch.softmax(l0, -1) * self.z).sum(-1)
        u1 = [z, q_dir / self.q_scale] + ([z.new_zeros(z.shape[0], self.mag_pad)] if self.mag_pad else [])
        logits = [l0, self.branch_logits(v, torch.cat(u1, 1), 1)]
        logits += [self.branch_logits(v, z, d) for d in range(2, len(self.sizes))]
        return torch.log_softmax(torch.cat(logits, 1), -1)

    def coordinated(self, q):
        B, A = q.shape
        k = self.emb.shape[1]
        if self.tuned:
            # [q, emb] @ W = q * W[0] + emb @ W[1:]: the embedding's share is one [A, k] product for
            # the whole batch, the rest broadcast products and sums that the compiler fuses (no
            # GEMMs over extents of 8 and 12, which cuBLAS runs on its FP32 kernels)
            qq = q[:, :, None] * self.wq[0] + self.emb @ self.wq[1:]
            kk = q[:, :, None] * self.wk[0] + self.emb @ self.wk[1:]
            s = (qq[:, :, None, :] * kk[:, None, :, :]).sum(-1)
            o = (torch.softmax(s / math.sqrt(k), -1) * q[:, None, :]).sum(-1)
        else:
            t = torch.cat([q[:, :, None], self.emb.expand(B, A, k)], 2)
            a = torch.softmax((t @ self.wq) @ (t @ self.wk).transpose(1, 2) / math.sqrt(k), -1)
            o = (a @ q[:, :, None])[:, :, 0]
        return q + self.agate * (o - q)


def _up(n: int, align: int) -> int:
    return -(-n // align) * align


def project(p_next, reward, discount, z, v_min, v_max):
    B, N = p_next.shape
    dz = (v_max - v_min) / (N - 1)
    tz = (reward[:, None] + discount[:, None] * z[None, :]).clamp(v_min, v_max)
    b = ((tz - v_min) / dz).clamp(0, N - 1)
    lo, up = b.floor(), b.ceil()
    w_lo = (up - b) + (lo == up).to(b.dtype)
    w_up = b - lo
    rows = (torch.arange(B, device=p_next.device) * N)[:, None]
    m = torch.zeros(B * N, device=p_next.device, dtype=p_next.dtype)
    m.index_add_(0, (rows + lo.long()).reshape(-1), (p_next * w_lo).reshape(-1))
    m.index_add_(0, (rows + up.long()).reshape(-1), (p_next * w_up).reshape(-1))
    return m.view(B, N)


def loss_fn(online: PeerNet, target: PeerNet, batch, gamma=0.9, beta=1e-3, aux_w=1.0):
    obs, nxt, act, rew, term = batch
    B, D = act.shape
    offs = online.offs
    with torch.no_grad():
        qn = online.coordinated((online(nxt).exp() * online.z).sum(-1))
        a_star = torch.stack([qn[:, online.offsets[d]:online.offsets[d + 1]].argmax(1) for d in range(D)], 1)
        p_t = target(nxt).exp().gather(1, (a_star + offs)[:, :, None].expand(B, D, online.N))
        disc = gamma * (1.0 - term)
        m = project(p_t.reshape(B * D, -1), rew.repeat_interleave(D), disc.repeat_interleave(D), online.z,
                    online.v_min, online.v_max)
        m = m.view(B, D, -1)
    logp_all = online(obs)
    idx = (act + offs)[:, :, None].expand(B, D, online.N)
    logp = logp_all.gather(1, idx)
    p = logp.exp()
    loss = (-(m * logp).sum(-1) + beta * (p * logp).sum(-1)).mean()
    q_raw = (logp_all.exp() * online.z).sum(-1).detach()
    qc = online.coordinated(q_raw).gather(1, act + offs)
    aux = aux_w * ((qc - (m * online.z).sum(-1)) ** 2).mean()
    return loss + aux


def make_batch(B, device, state_dim=50, D=4, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (
        torch.randn(B, state_dim, generator=g).to(device),
        torch.randn(B, state_dim, generator=g).to(device),
        torch.randint(0, 3, (B, D), generator=g).to(device),
        torch.randn(B, generator=g).to(device),
        (torch.rand(B, generator=g) < 0.01).float().to(device),
    )
