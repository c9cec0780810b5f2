"""The fused network's forward: several forwards as one where the plan allows, each GLU group's
GEMMs and kernels, the dueling forward where its outputs are wanted (see :mod:`foxhunt_core.net.fused`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...gpu.launch import HEAD_ALIGN, head_columns, padded
from ...stages import index_runs
from . import layout as Lay
from .layout import DIRECTION, MAGNITUDE

Array = Any
Segment = tuple[dict, Array, Sequence[str]]
ALL_OUTPUTS = ("log_probs", "probs", "q", "var")
# A segment may also ask for "heads": its value head and advantage row as the GEMMs wrote them
# (NetOutput.heads). A segment that asks for nothing else runs no dueling kernel past the
# direction branch's (whose Q the magnitude branch reads).
HEADS = "heads"


def forward_segments(fn: Any, segments: Sequence[Segment], keep_cache: bool) -> list:
    """Several forwards ``(params, obs, outputs)`` of the fused network ``fn``
    (:class:`~foxhunt_core.net.fused.FusedNetwork`), as few launches as the parameters allow; one
    :class:`~foxhunt_core.net.network.NetOutput` each, the first with its cache when
    ``keep_cache`` (it then has every output). Segments of one parameter tree run as one (their
    rows one after another); parameter trees stacked in one allocation (equal row counts, where
    the plan stacks them) run as strided-batched GEMMs and segmented kernels; the rest separately,
    those after the first beside it on the side stream. Where the plan does not pair forwards
    (plugin stages) every segment runs on its own."""
    net, plan = fn.net, fn.plan
    segs = list(segments)
    if not segs:
        return []
    if plan.pairs:
        trees = [p for p, _, _ in segs]
        stride = Lay.tree_stride(net, trees)
        rows = {x.shape[0] for _, x, _ in segs}
        if stride is not None and (stride == 0 or (len(rows) == 1 and plan.stacks(rows.pop()))) and len(segs) <= 3:
            return ForwardGroup(fn, segs, keep_cache, stride).run()
    runs = []
    i = 0
    while i < len(segs):  # runs of one parameter tree, each as one forward
        j = i + 1
        while plan.pairs and j < len(segs) and j - i < 3 and segs[j][0] is segs[i][0]:
            j += 1
        runs.append((i, j))
        i = j
    outs: list = []
    # The runs after the first are independent of it: on the side stream they overlap it (the
    # update's target forward beside its online forwards, past the stacking threshold).
    side = bool(plan.pairs) and len(runs) > 1
    for i, j in runs[1:] if side else []:
        with fn.streams.beside():
            outs.append((i, ForwardGroup(fn, segs[i:j], False, 0).run()))
    for i, j in runs[: 1 if side else len(runs)]:
        outs.append((i, ForwardGroup(fn, segs[i:j], keep_cache and i == 0, 0).run()))
    if side:
        fn.streams.join()
    return [o for _, group in sorted(outs, key=lambda t: t[0]) for o in group]


class ForwardGroup:
    """Forwards that run as one: one tree (``stride`` 0) or stacked trees ``stride`` apart."""

    def __init__(self, fn: Any, segs: Sequence[Segment], keep_cache: bool, stride: int) -> None:
        net = fn.net
        self.fn, self.net, self.plan, self.K, self.xp = fn, net, fn.plan, fn.K, fn.xp
        self.segs, self.keep_cache = segs, keep_cache
        self.params = segs[0][0]
        self.p = self.params["core"]
        self.xs = [x for _, x, _ in segs]
        self.rows = [x.shape[0] for x in self.xs]
        self.starts = [sum(self.rows[:i]) for i in range(len(self.rows) + 1)]
        self.B, self.R = self.rows[0], self.starts[-1]
        self.wants = [tuple(ALL_OUTPUTS) if keep_cache and i == 0 else tuple(w) for i, (_, _, w) in enumerate(segs)]
        self.stack = (len(segs), stride) if stride else None
        self.H2, self.H = net.settings.shared_h2, net.settings.adv_h
        self.n_dir = net.sizes[DIRECTION]
        self.z_sup = net.support(self.xs[0])
        self.hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)  # each branch's block of the advantage row
        self.use_z = [Lay.z_input(net, d) for d in range(len(net.sizes))]  # the branch's input is the augmented z
        self.kernel_wants = [tuple(x for x in w if x != HEADS) for w in self.wants]
        self.needs = [bool(w) for w in self.kernel_wants]  # (E[Q] comes with any of the kernel's outputs)
        self.blk: dict[str, Array] = {}

    # ------------------------------------------------------------------ weights
    def block(self, home: str) -> Array:
        if home not in self.blk:
            self.blk[home] = Lay.block_of(self.p, self.net, home, self.xp)
        return self.blk[home]

    def transposed(self, home: str) -> Array:  # the block's weight rows transposed, rounded to TF32
        key = "T " + home
        if key not in self.blk:
            self.blk[key] = self.K.transpose(self.block(home)[: self.H])
        return self.blk[key]

    # ------------------------------------------------------------------ the forward
    def run(self) -> list:
        from ..network import NetOutput

        fn, net, plan, K, xp = self.fn, self.net, self.plan, self.K, self.xp
        B, R, H2, H, stack = self.B, self.R, self.H2, self.H, self.stack
        N, D = net.num_atoms, len(net.sizes)
        x = K.pack_rows(self.xs, Lay.x_width(net))  # [R, Wx] = [obs, 0, ..., 0, 1]
        h1 = fn.mm(x, Lay.block_of(self.p, net, "trunk.w1", xp), relu=True, stack=stack)
        h2 = fn.mm(h1, self.p["trunk.w2"], bias=self.p["trunk.b2"], relu=True, stack=stack)
        mpre = fn.mm(h2, self.p["vsn.w"], bias=self.p["vsn.b"], stack=stack)
        keep = B if self.keep_cache else 0
        # With the GLUs in one kernel each, z is written rounded to TF32 (to nearest): its readers are
        # all TF32 GEMMs, which round it so anyway, and glu_gemm then takes its first H2 columns as
        # they are instead of rounding them in shared memory.
        z_tf32 = bool(plan.glu_gemm_for(stack is not None))
        m, z = K.vsn_forward(h2, mpre, width=Lay.z_width(net), keep_rows=keep, m=mpre[:keep] if keep else None,
                             tf32=z_tf32)
        self.z = z
        Wh, lead = Lay.h_width(net), Lay.pv_lead(net)
        # Each branch's [gate | value] pre-activations, behind the value head when it is joined (its
        # GEMM is then the direction branch's); else the value head on its own.
        pv_all = xp.empty((R, lead + D * 2 * H), dtype=xp.float32)
        if lead:
            v = pv_all[:, : padded(N)]
        else:
            vb = Lay.block_of(self.p, net, "value.w", xp)
            v = fn.mm(z[:, :H2], vb[:H2], bias=vb[-1], stack=stack)  # [R, 52]; K = H2, the bias in the epilogue
        self.v = v

        extra_cols, extra_caches = [], []
        if Lay.columns_in_z(net):  # the observation's columns into z, behind the direction Q's
            self.columns_into_z(x)
        else:
            for st in net.branch_inputs:  # (single segments only: the plan pairs no forwards with them)
                cols, c = st.forward(xp, self.params.get(st.name, {}), self.xs[0])
                extra_cols.append(xp.ascontiguousarray(cols))
                extra_caches.append(c)

        self.adv = xp.empty((R, self.hcol[-1]), dtype=xp.float32)
        A = net.num_actions
        res: dict[str, Any] = {name: xp.empty((self.rows_of(name), A, N), dtype=xp.float32)
                               if self.rows_of(name) else None for name in ("log_probs", "probs")}
        res["var"] = xp.empty((self.rows_of("var"), A), dtype=xp.float32) if self.rows_of("var") else None
        res["q"] = xp.empty((R, A), dtype=xp.float32)
        self.res = res
        self.heads_wanted = any(HEADS in w for w in self.wants)

        # What the gate's fragment reads in the forward: its parameters and what it derives from
        # them, once for every branch group (kept in the cache for a backward that reads the same)
        gate_reads = None
        if plan.gate_fast and not plan.gate_built_in:
            gate_reads = net.gate.fragment.forward_reads(xp, self.params.get(net.gate.name, {}))
        h_all = xp.empty((R, D * Wh), dtype=xp.float32)  # each branch's augmented GLU output
        branches: list[dict[str, Any]] = [dict() for _ in net.sizes]
        done: set[tuple[int, int]] = set()  # the dueling forwards run in their heads' kernel
        for g in Lay.branch_groups(net):  # the direction branch first: the magnitude branch reads its Q
            d0, d1 = g[0], g[-1] + 1
            home, c0 = Lay.glu_home(net, d0)
            with_v = lead if d0 == DIRECTION else 0  # the value head's columns ride along
            wj = self.block(home)[:, c0 - with_v : c0 + 2 * H * len(g)]  # ([W_v] |) [W_gate | W_val] ... over biases
            u = z if self.use_z[d0] else self.branch_input(d0, extra_cols, wj.shape[0])
            pv = pv_all[:, lead + 2 * H * d0 : lead + 2 * H * d1]
            out_cols = pv_all[:, lead + 2 * H * d0 - with_v : lead + 2 * H * d1]
            h = h_all[:, Wh * d0 : Wh * d1]
            # K = H2, the biases in the epilogue (no K tail): z's first H2 columns are all it reads
            no_tail = self.use_z[d0] and MAGNITUDE not in g and not any(net.extra_width[d] for d in g)
            tc = z_tf32 and self.use_z[d0]
            # the gate's fragment, branch g[i]'s arrays for the launch's block i (None: the sigmoid)
            launch = None if gate_reads is None else K.branch_launch(
                net.gate, self.params.get(net.gate.name, {}), g, reads=gate_reads)
            if tc:
                # The GLU in one kernel: h from the GEMM's epilogue, pv only for the rows the backward
                # reads (the value head, when it rides along, as a GEMM of its own); h written rounded
                # to TF32 for the advantage heads' kernel (linear_gemm) to read as it is.
                if with_v:
                    fn.mm(z[:, :H2], wj[:H2, :with_v], out=pv_all[:, :with_v], bias=wj[-1, :with_v])
                wg = wj[:, with_v:]
                u_, w_ = (z[:, :H2], wg[:H2]) if no_tail else (z, wg)
                K.glu_gemm(u_, w_, bias=wg[-1] if no_tail else None, width=Wh, blocks=len(g), h=h,
                           pv=pv[:keep] if keep else None, wt=K.transpose(w_), rounded=H2 if z_tf32 else 0,
                           tf32_h=True, config=plan.knobs.glu_gemm_config, **({"gate": launch} if launch else {}))
            else:
                if no_tail:
                    fn.mm(z[:, :H2], wj[:H2], out=out_cols, bias=wj[-1], stack=stack)
                else:  # the direction Q and the ones column of the augmented input as well
                    fn.mm(u, wj, out=out_cols, stack=stack)
                if launch is not None:  # the gate's fragment; only h is written, as with the sigmoid
                    K.gate_glu_forward(pv, launch, width=Wh, blocks=len(g), h=h)
                elif plan.gate_fast:  # only h is written: the backward recomputes gate and value from pv
                    K.glu_forward(pv, width=Wh, blocks=len(g), h=h)
            for i, d in enumerate(g):
                gate = gcache = val = None
                if not plan.gate_fast:  # the plugin's gate, per branch
                    pre = xp.ascontiguousarray(pv[:, 2 * H * i : 2 * H * i + H])
                    val = pv[:, 2 * H * i + H : 2 * H * (i + 1)]
                    gate, gcache = net.gate.forward(xp, self.params.get(net.gate.name, {}), d, pre)
                    hd = h[:, Wh * i : Wh * (i + 1)]
                    hd[...] = 0.0
                    hd[:, :H] = gate * val
                    hd[:, -1] = 1.0
                if self.keep_cache:  # the rows of the first segment (views; the backward writes over pv's)
                    branches[d] = dict(u=None if self.use_z[d] else u[:B], gate=gate, gcache=gcache, val=val)
            if tc and self.heads_dueling(g, h):
                done.add((d0, d1))
            elif tc:
                self.advantages_tc(g, h)
            else:
                self.advantages(g, h)
            if d0 == DIRECTION and (0, 1) not in done:
                self.dueling((0, 1))
        if (1, D) not in done:
            self.dueling((1, D))

        outs = []
        for i, w in enumerate(self.wants):
            r0, r1 = self.starts[i], self.starts[i + 1]

            def part(name: str, _w: tuple = w, _r0: int = r0, _r1: int = r1, _n: bool = self.needs[i]) -> Array | None:
                a = res[name]
                return a[_r0:_r1] if a is not None and (name in _w or (name == "q" and _n)) else None

            cache = None
            if self.keep_cache and i == 0:
                cache = dict(fused=True, x=x[:B], h1=h1[:B], h2=h2[:B], m=m, z=z[:B], pv=pv_all[:B], h=h_all[:B],
                             branches=branches, q=res["q"][:B], extra_cols=extra_cols, extra_caches=extra_caches,
                             gate_reads=gate_reads)
            # The kernel returns normalised logits (log-probabilities); they differ from the raw
            # dueling logits by a per-distribution constant, which no consumer depends on.
            lp = part("log_probs")
            outs.append(NetOutput(lp, part("probs"), lp, cache, q=part("q"), var=part("var"),
                                  heads=(v[r0:r1], self.adv[r0:r1]) if HEADS in w else None))
        return outs

    def rows_of(self, name: str) -> int:
        """An output's rows: up to the last segment that wants it."""
        return max((self.starts[i + 1] for i, w in enumerate(self.wants) if name in w), default=0)

    # ------------------------------------------------------------------ the dueling forward
    def dueling_scope(self, branches: tuple[int, int]) -> tuple[int, Array | None]:
        """The segments the dueling forward of ``branches`` covers (every one for the direction
        branch, whose Q the magnitude branch reads; past it only up to the last segment that
        wants something of it) and the direction Q's columns in z, where the magnitude branch
        reads them."""
        first = branches[0] == DIRECTION
        n = len(self.segs) if first else max((i + 1 for i, x in enumerate(self.needs) if x), default=0)
        return n, self.z[:, self.H2 : self.H2 + self.n_dir] if first and self.use_z[MAGNITUDE] else None

    def dueling(self, branches: tuple[int, int]) -> None:
        K, net, res, rows, starts = self.K, self.net, self.res, self.rows, self.starts
        n, zq = self.dueling_scope(branches)
        if n and len(set(rows)) == 1:  # one launch, each segment writing what it wants
            r1 = starts[n]
            outs = {k: (a[:r1] if a is not None else None) for k, a in res.items()}
            K.dueling_softmax_forward(self.v[:r1], self.adv[:r1], self.z_sup, net.offsets, branches=branches,
                                      segments=self.kernel_wants[:n], zq=zq, zq_scale=1.0 / net.q_scale, **outs)
            return
        for i, w in enumerate(self.kernel_wants[:n]):
            if not (w or branches[0] == DIRECTION):
                continue
            r0, r1 = starts[i], starts[i + 1]
            outs = {k: (a[r0:r1] if a is not None and (k in w or k == "q") else None) for k, a in res.items()}
            K.dueling_softmax_forward(self.v[r0:r1], self.adv[r0:r1], self.z_sup, net.offsets, branches=branches,
                                      want=w, zq=None if zq is None else zq[r0:r1], zq_scale=1.0 / net.q_scale,
                                      **outs)

    def heads_dueling(self, g: Sequence[int], h: Array) -> bool:
        """Branches ``g``'s advantage heads with their dueling forward in the GEMM's kernel
        (:func:`foxhunt_core.gpu.kernels.heads_dueling`; the heads reach memory only where a
        segment wants them), where the branches are one of the two dueling launches, the rows'
        segments are of one size and the plan takes it (the layout fits, the tiles fill the GPU);
        False (nothing run) otherwise."""
        D = len(self.net.sizes)
        span = (g[0], g[-1] + 1)
        n, zq = self.dueling_scope(span)
        if span not in ((DIRECTION, 1), (1, D)) or not n or len(set(self.rows)) != 1 \
                or not self.plan.heads_dueling_at(self.R, len(g)):
            return False
        r1 = self.starts[n]
        ins, wts, biases, outs = self.advantage_sets(g, h)
        self.K.heads_dueling(ins, wts, self.v, self.z_sup, self.net.offsets, branches=span,
                             segments=self.kernel_wants[:n], seg_rows=self.rows[0], bias=biases,
                             adv=outs if self.heads_wanted else None, zq=None if zq is None else zq[:r1],
                             zq_scale=1.0 / self.net.q_scale, rounded=self.H,
                             straight=self.plan.knobs.heads_dueling_straight, config=self.plan.knobs.linear_gemm_config,
                             **{k: (a[:r1] if a is not None else None) for k, a in self.res.items()})
        return True

    # ------------------------------------------------------------------ the advantage heads
    def advantages(self, g: Sequence[int], h: Array) -> None:
        """The advantage GEMMs of branches ``g`` (their augmented GLU outputs ``h`` side by side)
        into their columns of the advantage row: one strided-batched GEMM over the branches where
        one set of parameters runs (no stack), their blocks are of one width and the plan batches
        them at these rows (the launches it saves are what small batches cost), else one GEMM
        each, the bias in the epilogue (faster on large batches)."""
        net, hcol, adv, fn = self.net, self.hcol, self.adv, self.fn
        Wh = Lay.h_width(net)
        if self.stack is None and Lay.uniform(net, g) and self.plan.batched_advantages(h.shape[0]):
            d, w = g[0], hcol[g[0] + 1] - hcol[g[0]]
            home, c = Lay.out_home(net, d)
            fn.mm(h[:, :Wh], self.block(home)[:, c : c + w], out=adv[:, hcol[d] : hcol[d] + w],
                  batch=(len(g), Wh, w, w))
            return
        H = self.H
        for i, d in enumerate(g):  # K = H, the bias in the epilogue
            home, c = Lay.out_home(net, d)
            w = hcol[d + 1] - hcol[d]
            wo = self.block(home)
            fn.mm(h[:, Wh * i : Wh * i + H], wo[:H, c : c + w], out=adv[:, hcol[d] : hcol[d + 1]],
                  bias=wo[-1, c : c + w], stack=self.stack)

    def advantage_sets(self, g: Sequence[int], h: Array) -> tuple[list, list, list, list]:
        """Branches ``g``'s advantage layers as linear_gemm's sets: their GLU outputs' columns of
        ``h``, transposed weights, biases and columns of the advantage row."""
        hcol, H, Wh = self.hcol, self.H, Lay.h_width(self.net)
        ins, wts, biases, outs = [], [], [], []
        for i, d in enumerate(g):
            home, c = Lay.out_home(self.net, d)
            w = hcol[d + 1] - hcol[d]
            ins.append(h[:, Wh * i : Wh * i + H])
            wts.append(self.transposed(home)[c : c + w])
            biases.append(self.block(home)[-1, c : c + w])
            outs.append(self.adv[:, hcol[d] : hcol[d + 1]])
        return ins, wts, biases, outs

    def advantages_tc(self, g: Sequence[int], h: Array) -> None:
        """The advantage layers of branches ``g`` as one linear_gemm (the TF32 tensor cores, one
        160-column tile per branch; the bias in its epilogue), from their GLU outputs ``h`` as
        glu_gemm wrote them: rounded to TF32."""
        ins, wts, biases, outs = self.advantage_sets(g, h)
        self.K.linear_gemm(ins, wts, outs, bias=biases, rounded=self.H, config=self.plan.knobs.linear_gemm_config)

    def columns_into_z(self, x: Array) -> None:
        """Every branch's branch-input columns (:func:`.layout.columns_in_z`): the observation's
        columns, from the packed input ``x``, into their columns of z; one slice copy per run of
        consecutive indices (no index array: nothing is copied from the host in a captured graph)."""
        net, z = self.net, self.z
        for d in range(len(net.sizes)):
            col = Lay.z_extra_col(net, d)
            for st in net.branch_inputs:
                if d not in st.branches:
                    continue
                for a, b, c in index_runs(tuple(st.observation_columns)):
                    z[:, col + c : col + c + b - a] = x[:, a:b]
                col += st.width

    def branch_input(self, d: int, extra_cols: list[Array], width: int) -> Array:
        """Branch ``d``'s augmented input ``[z, (q_dir / q_scale), extra columns, 0, ..., 0, 1]``
        [R, width] (a branch with branch-input columns)."""
        net, xp, z, H2 = self.net, self.xp, self.z, self.H2
        u = xp.zeros((z.shape[0], width), dtype=xp.float32)
        u[:, :H2] = z[:, :H2]
        col = H2
        if d == MAGNITUDE:
            n_dir = net.sizes[DIRECTION]
            u[:, col : col + n_dir] = self.res["q"][:, :n_dir] * (1.0 / net.q_scale)
            col += n_dir
        for st, cols in zip(net.branch_inputs, extra_cols):
            if d in st.branches:
                u[:, col : col + st.width] = cols
                col += st.width
        u[:, -1] = 1.0
        return u
