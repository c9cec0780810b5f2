"""The fused network's backward: the dueling backward in two passes, each GLU group's backward, z's
gradient, the trunk's; weight gradients beside the input gradients (see :mod:`foxhunt_core.net.fused`)."""

from __future__ import annotations

from typing import Any

from ...gpu.flat import storage_of
from ...gpu.launch import HEAD_ALIGN, head_columns, padded
from . import layout as Lay
from .layout import DIRECTION, MAGNITUDE

Array = Any


class Backward:
    """Gradients of every parameter from ``dlogits`` and a forward's cache (see :meth:`run`)."""

    def __init__(self, fn: Any, params: dict, out: Any, dlogits: Array, grads_into: dict | None) -> None:
        net, xp = fn.net, fn.xp
        self.fn, self.net, self.plan, self.K, self.xp = fn, net, fn.plan, fn.K, xp
        self.params, self.out = params, out
        self.c = out.cache
        self.p = params["core"]
        self.gp = params.get(net.gate.name, {})
        self.B = dlogits.shape[0]
        self.H2, self.H = net.settings.shared_h2, net.settings.adv_h
        self.n_dir = net.sizes[DIRECTION]
        self.z_sup = net.support(dlogits)
        self.dlogits = xp.ascontiguousarray(dlogits)
        self.slots = (grads_into or {}).get("core", {})
        self.g: dict[str, Array] = {}
        self.pending: list[tuple[Array, Array]] = []
        self.hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
        self.layout = Lay.blocks(net)
        self.gblocks: dict[str, Array] = {}
        self.pblocks: dict[str, Array] = {}
        self.ggate: dict[str, Array] = {}
        self.gate_slots_into = (grads_into or {}).get(net.gate.name, {})
        self.ggate_slots: dict[str, Array] | None = None  # the gate's gradients, where its fragment writes them
        self.zt: list[Array] = []  # z transposed and rounded to TF32 (wgrad_gemm's xt), made once for every group

    # ------------------------------------------------------------------ where gradients go
    def gate_grads(self) -> dict[str, Array]:
        """Where the gate's fragment writes its parameter gradients: the gradient buffer's slots
        of the gate where given, else new arrays (every branch's, each written by its group)."""
        if self.ggate_slots is None:
            into, xp = self.gate_slots_into, self.xp
            self.ggate_slots = {k: into[k] if k in into else xp.empty(v.shape, dtype=v.dtype)
                                for k, v in self.gp.items()}
        return self.ggate_slots

    def slot(self, name: str) -> Array:
        s = self.slots.get(name)
        self.g[name] = s if s is not None else self.xp.empty(self.p[name].shape, dtype=self.xp.float32)
        return self.g[name]

    def grad_block(self, home: str) -> Array:
        """Where block ``home``'s gradient goes: the gradient buffer's own block, or a scratch
        block whose parts are copied into the slots at the end."""
        if home in self.gblocks:
            return self.gblocks[home]
        shape, members = self.layout[home]
        views = [self.slot(n) for n, _, _ in members]
        slots = self.slots
        blk = storage_of(slots, home)
        if not (blk is not None and tuple(blk.shape) == shape and all(n in slots for n, _, _ in members)
                and all(storage_of(slots, n) is blk for n, _, _ in members)):
            blk = self.xp.empty(shape, dtype=self.xp.float32)
            self.pending.extend((v, Lay.placed(blk, m, v)) for v, m in zip(views, members))
        self.gblocks[home] = blk
        return blk

    def block(self, home: str) -> Array:
        if home not in self.pblocks:
            self.pblocks[home] = Lay.block_of(self.p, self.net, home, self.xp)
        return self.pblocks[home]

    def rounded_block(self, home: str) -> Array:  # the block's weight rows rounded to TF32 (glu_backward_gemm's wo)
        key = "TF32 " + home
        if key not in self.pblocks:
            self.pblocks[key] = self.K.round_tf32(self.block(home)[: self.H])
        return self.pblocks[key]

    # ------------------------------------------------------------------ the backward
    def run(self) -> dict:
        """Gradients of every parameter; the gradient tree's views (e.g. the optimizer's flat
        gradient buffer) receive the core's weight gradients in place when given. The backward
        consumes the forward's cache (it writes its gradients over parts of it): once per forward."""
        fn, net, plan, K, xp, c = self.fn, self.net, self.plan, self.K, self.xp, self.c
        B, H2, H, n_dir, D = self.B, self.H2, self.H, self.n_dir, len(net.sizes)
        offs, N = net.offsets, net.num_atoms
        self.gextra: list[Any] = [None] * len(net.branch_inputs)
        z = c["z"]  # [B, Wz] augmented
        # ([v] |) every branch's [gate | value] pre-activations, augmented h
        self.pv_all, self.h_all = c["pv"], c["h"]
        self.Wh, self.lead = Lay.h_width(net), Lay.pv_lead(net)
        groups = Lay.branch_groups(net)
        # Each GLU group's backward is one kernel from its heads' gradients (glu_backward_gemm)
        # where the plan takes it at these rows; otherwise the GLU outputs' gradient is written first.
        written_dh = not all(plan.glu_backward_at(B, len(gr)) for gr in groups)
        # every branch's GLU output gradient
        self.dh_all = xp.empty((B, D * H), dtype=xp.float32) if written_dh else None
        self.in_z = Lay.columns_in_z(net)  # the branch-input columns in z: every branch reads z
        own_inputs = bool(net.branch_inputs) and not self.in_z
        self.dz = (xp.zeros if own_inputs else xp.empty)((B, z.shape[1]), dtype=xp.float32)
        # Whether z carries the direction-Q columns (the magnitude branch reads z): only the magnitude
        # branch's weights meet them, so every other weight gradient is zero over those rows. (The
        # weight gradients run beside the input gradients, on the side stream: see gpu/streams.py.)
        self.use_zq = Lay.z_input(net, MAGNITUDE)
        # d loss / d z's direction-Q columns
        self.dq_z = xp.empty((B, -(-n_dir // 4) * 4), dtype=xp.float32) if self.use_zq else None
        self.dz_started = own_inputs
        self.use_wgrad_h = plan.wgrad_heads_at(B)

        # Every branch but direction first: the magnitude branch's input gradient reaches the
        # direction branch's Q, which then enters the direction branch's logit gradient.
        # (A joined value head's gradient goes where its forward output was, in front of the
        # direction branch's pre-activations: one GEMM each way serves both. The columns behind its
        # 4-aligned width hold the forward's zeros: its weights there are zero.)
        lead = self.lead
        dv, self.dadv = K.dueling_backward(self.dlogits, self.z_sup, offs, branches=(1, D), padded=True,
                                           dv=self.pv_all[:, : padded(N)] if lead else None)
        first = next(gr for gr in groups if MAGNITUDE in gr)
        dxes: dict[int, Array | None] = {first[0]: self.group_backward(first)}
        # The conditioning path into the direction branch's Q: d loss / d (q_dir / q_scale), the
        # direction-Q columns' gradient (dq_z, or the extra columns' gradient), read by the kernel as it is.
        dxq = dxes[first[0]]
        dq = self.dq_z[:, :n_dir] if dxq is None else dxq[:, :n_dir]
        K.dueling_backward(self.dlogits, self.z_sup, offs, branches=(0, 1), accumulate_dv=True, dq=dq,
                           dq_scale=1.0 / net.q_scale, probs=self.out.probs, q=c["q"], dv=dv, dadv=self.dadv,
                           padded=True)
        for gr in groups:
            if gr is not first:
                dxes[gr[0]] = self.group_backward(gr)
        dz = self.dz
        if plan.joint_dz:  # every group's [dv | dpv] and the value head's block: K = lead + D 2H
            fn.mm(self.pv_all, self.block("value.w")[:H2].T, out=dz[:, :H2], beta=1.0 if self.dz_started else 0.0)
        for d, dxe in dxes.items() if not self.in_z else ():  # (columns in z are data: no gradient on)
            col = n_dir if d == MAGNITUDE else 0
            for i, st in enumerate(net.branch_inputs):
                if d in st.branches:
                    dcols = dxe[:, col : col + st.width]
                    self.gextra[i] = dcols if self.gextra[i] is None else self.gextra[i] + dcols
                    col += st.width

        if not lead:  # the value head on its own (with it joined, the direction branch's GEMMs did this)
            fn.mm(dv, self.block("value.w")[:H2].T, out=dz[:, :H2], beta=1.0)
            gv = self.grad_block("value.w")
            with fn.streams.beside():
                fn.mm(z.T, dv, out=gv)  # weights and (ones column) bias
                if self.use_zq:
                    gv[H2 : H2 + n_dir] = 0.0
        self.trunk_backward()
        for dst, blk in self.pending:
            dst[...] = blk

        grads = {"core": self.g}
        if net.gate.name in self.params and net.gate.name != "core":
            if self.ggate_slots is not None:  # (the fragment's kernels wrote every branch's)
                grads[net.gate.name] = dict(self.ggate_slots)
            else:
                grads[net.gate.name] = {k: self.ggate.get(k, xp.zeros_like(v)) for k, v in self.gp.items()}
        for i, st in enumerate(net.branch_inputs):
            if st.name in self.params:
                dcols = self.gextra[i] if self.gextra[i] is not None else xp.zeros_like(c["extra_cols"][i])
                grads[st.name] = st.backward(xp, self.params[st.name], c["extra_caches"][i],
                                             xp.ascontiguousarray(dcols))
        return grads

    def trunk_backward(self) -> None:
        """z's gradient through the VSN and the trunk, their weight gradients beside."""
        fn, K, c, p = self.fn, self.K, self.c, self.p
        tc_relu = self.plan.relu_gemm_at(self.B)  # (dmpre then written rounded to TF32: read as it is)
        cfg = self.plan.knobs.linear_gemm_config
        dh2_mask, dmpre = K.vsn_backward(self.dz[:, : self.H2], c["h2"], c["m"], tf32=bool(tc_relu))
        gm, gmb = self.slot("vsn.w"), self.slot("vsn.b")
        with fn.streams.beside():
            fn.mm(c["h2"].T, dmpre, out=gm)
            fn.colsum(dmpre, gmb)
        if tc_relu:  # dh2 written rounded to TF32: the next one reads it as it is
            dh2 = K.linear_gemm_relu_backward(dmpre, K.round_tf32(p["vsn.w"]), c["h2"], addend=dh2_mask,
                                              rounded=dmpre.shape[1], tf32_out=True, config=cfg)
        else:
            dh2 = K.relu_backward(dh2_mask, c["h2"], addend=fn.mm(dmpre, p["vsn.w"].T))
        g2, g2b = self.slot("trunk.w2"), self.slot("trunk.b2")
        with fn.streams.beside():
            fn.mm(c["h1"].T, dh2, out=g2)
            fn.colsum(dh2, g2b)
        if tc_relu:
            dh1 = K.linear_gemm_relu_backward(dh2, K.round_tf32(p["trunk.w2"]), c["h1"], rounded=dh2.shape[1],
                                              config=cfg)
        else:
            dh1 = K.relu_backward(fn.mm(dh2, p["trunk.w2"].T), c["h1"])
        fn.mm(c["x"].T, dh1, out=self.grad_block("trunk.w1"))  # weights and (ones column) bias
        fn.streams.join()  # the weight gradients above ran beside the input gradients

    def extra_rows_mask(self, g: tuple[int, ...], with_v: int, cols: int) -> Array:
        """Ones where a weight of group ``g``'s gradient block (``with_v`` value-head columns in
        front, then each branch's ``[gate | value]``) reads a branch-input column of z and belongs
        to a tensor (the branch's ``w_gate_in`` / ``w_val_in``), zeros elsewhere: z's branch-input
        rows of the other weights are padding, and stay zero. Made once per group (device fills,
        no host copy: it may be made inside a graph capture), kept by the network."""
        key = (g, with_v, cols)
        mask = self.fn.masks.get(key)
        if mask is None:
            net, H = self.net, self.H
            r0 = self.H2 + self.n_dir
            mask = self.xp.zeros((sum(net.extra_width), cols), dtype=self.xp.float32)
            for i, d in enumerate(g):
                if net.extra_width[d]:
                    r = Lay.z_extra_col(net, d) - r0
                    c = with_v + 2 * H * i
                    mask[r : r + net.extra_width[d], c : c + 2 * H] = 1.0
            self.fn.masks[key] = mask
        return mask

    def group_backward(self, g: tuple[int, ...]) -> Array | None:
        """The gradients of branches ``g`` (one GLU group); returns the gradient of the extra
        input columns of a branch that has them, or None (the input is z: its gradient is in dz)."""
        fn, net, plan, K, xp, c = self.fn, self.net, self.plan, self.K, self.xp, self.c
        B, H2, H, n_dir, hcol = self.B, self.H2, self.H, self.n_dir, self.hcol
        pv_all, h_all, dadv, dh_all, Wh, lead = self.pv_all, self.h_all, self.dadv, self.dh_all, self.Wh, self.lead
        z = c["z"]
        d0, d1, n = g[0], g[-1] + 1, len(g)
        tc_dh = bool(plan.glu_backward_at(B, n))
        uniform = Lay.uniform(net, g)
        # The advantage layers: input gradients (one strided-batched GEMM where the blocks are of
        # one width; with tc_dh, inside glu_backward_gemm below), weight and (ones column) bias
        # gradients one branch each (split-K).
        if uniform and not tc_dh:
            w = hcol[d0 + 1] - hcol[d0]
            home, col = Lay.out_home(net, d0)
            fn.mm(dadv[:, hcol[d0] : hcol[d0] + w], self.block(home)[:H, col : col + w].T,
                  out=dh_all[:, H * d0 : H * (d0 + 1)], batch=(n, w, w, H))
        wgrads = []
        for d in g:
            home, col = Lay.out_home(net, d)
            w = hcol[d + 1] - hcol[d]
            dh = dadv[:, hcol[d] : hcol[d + 1]]  # zeros in the padding
            if not (uniform or tc_dh):
                fn.mm(dh, self.block(home)[:H, col : col + w].T, out=dh_all[:, H * d : H * (d + 1)])
            wgrads.append((h_all[:, Wh * d : Wh * (d + 1)].T, dh, self.grad_block(home)[:, col : col + w]))
        with fn.streams.beside():
            if self.use_wgrad_h and len({dy.shape[1] for _, dy, _ in wgrads}) == 1 \
                    and len({gw_out.strides for _, _, gw_out in wgrads}) == 1:
                # One launch, h transposed in the kernel (wgrad_gemm_sets).
                K.wgrad_gemm_sets([x.T for x, _, _ in wgrads], [dy for _, dy, _ in wgrads],
                                  [gw_out for _, _, gw_out in wgrads], config=plan.knobs.wgrad_gemm_config)
            else:
                # One GEMM each: cuBLAS splits their long K = B reduction, which it never does inside a
                # strided batch (benchmarks/bench_stack.py).
                for x, dy, gw_out in wgrads:
                    fn.mm(x, dy, out=gw_out)
        dpv = pv_all[:, lead + 2 * H * d0 : lead + 2 * H * d1]  # [d pre_gate | d val] ..., over the forward's
        ghome, gcol = Lay.glu_home(net, d0)
        # dq (below) in glu_backward_gemm's epilogue, from the magnitude branch's gradients there.
        dq_in_gemm = tc_dh and self.use_zq and MAGNITUDE in g and bool(plan.glu_backward_dq)
        launch = None  # the gate's fragment (None: the sigmoid), its gradients written into ggate_slots
        reads = c.get("gate_reads")  # (what the forward derived from these parameters, where the backward reads it)
        if plan.gate_fast and not plan.gate_built_in:
            launch = K.branch_launch(net.gate, self.gp, g, self.gate_grads(), reads=reads)
        if tc_dh:  # dh never reaches memory: the gate's backward in the epilogue of dh's GEMM
            sets = K.GLU_BACKWARD_GEMM_SETS
            for i in range(0, n, sets):
                part = g[i : i + sets]
                wos = []
                for d in part:
                    home, col = Lay.out_home(net, d)
                    wos.append(self.rounded_block(home)[:, col : col + hcol[d + 1] - hcol[d]])
                q_kw = {}
                if dq_in_gemm and MAGNITUDE in part:
                    c0 = gcol + 2 * H * g.index(MAGNITUDE)
                    q_kw = {"dq": self.dq_z[:, :n_dir], "wq": self.block(ghome)[H2 : H2 + n_dir, c0 : c0 + 2 * H],
                            "dq_set": part.index(MAGNITUDE)}
                if launch is not None:  # the part's branches
                    q_kw["gate"] = K.branch_launch(net.gate, self.gp, part, self.gate_grads(), reads=reads)
                K.glu_backward_gemm([dadv[:, hcol[d] : hcol[d + 1]] for d in part], wos,
                                    dpv[:, 2 * H * i : 2 * H * (i + len(part))],
                                    config=plan.knobs.glu_backward_gemm_config, **q_kw)
        elif launch is not None:
            K.gate_glu_backward(dh_all[:, H * d0 : H * d1], dpv, launch, blocks=n, dpv=dpv)
        elif plan.gate_fast:
            K.glu_backward(dh_all[:, H * d0 : H * d1], dpv, blocks=n, dpv=dpv)
        else:  # the plugin's gate, per branch
            for d in g:
                bc, dh_in = c["branches"][d], dh_all[:, H * d : H * (d + 1)]
                dpre, gg = net.gate.backward(xp, self.gp, d, bc["gcache"], dh_in * bc["val"])
                xp.multiply(dh_in, bc["gate"], out=pv_all[:, lead + 2 * H * d + H : lead + 2 * H * (d + 1)])
                pv_all[:, lead + 2 * H * d : lead + 2 * H * d + H] = dpre
                for k, val in gg.items():
                    self.ggate[k] = self.ggate[k] + val if k in self.ggate else val
        with_v = lead if d0 == DIRECTION else 0  # the joined value head's gradient rides along
        wj = self.block(ghome)[:, gcol - with_v : gcol + 2 * H * n]
        gw = self.grad_block(ghome)[:, gcol - with_v : gcol + 2 * H * n]
        dy = pv_all[:, lead + 2 * H * d0 - with_v : lead + 2 * H * d1]  # ([dv] |) dpv
        bu = c["branches"][d0]["u"]  # (a branch with extra input columns is a group of its own)
        with fn.streams.beside():
            if bu is None and plan.wgrad_gemm:
                # Weights and (ones column) biases; the direction-Q rows zero but the magnitude branch's.
                if not self.zt:
                    self.zt.append(K.transpose(z))
                keep = (0, 0)
                if self.use_zq and MAGNITUDE in g:
                    i = g.index(MAGNITUDE)
                    keep = (with_v + 2 * H * i, with_v + 2 * H * (i + 1))
                K.wgrad_gemm(self.zt[0], dy, out=gw, zero_rows=(H2, H2 + n_dir) if self.use_zq else (0, 0),
                             keep_cols=keep, config=plan.knobs.wgrad_gemm_config)
            else:
                fn.mm(z.T if bu is None else bu.T, dy, out=gw)  # weights and (ones column) biases
            if bu is None and self.in_z:  # the branch-input columns meet only their own branches' rows
                r0 = H2 + n_dir
                gw[r0 : r0 + sum(net.extra_width)] *= self.extra_rows_mask(g, with_v, gw.shape[1])
            if bu is None and self.use_zq and not plan.wgrad_gemm:
                # The direction-Q columns of z meet only the magnitude branch's weights: the other
                # branches' (and the value head's) gradients over those rows of the block are zero.
                if with_v:
                    gw[H2 : H2 + n_dir, :with_v] = 0.0
                for i, d in enumerate(g):
                    if d != MAGNITUDE:
                        gw[H2 : H2 + n_dir, with_v + 2 * H * i : with_v + 2 * H * (i + 1)] = 0.0
        dz = self.dz
        if bu is None:  # K = n 2H (+ the value head's): every branch's gate and value at once, into dz
            # Only z's first H2 columns' gradient goes on (vsn_backward reads it): N = 256 where the
            # whole row's 260 took a third more tiles. The direction-Q columns' (dq, which the
            # direction branch's dueling backward reads) comes from the magnitude branch's
            # pre-activation gradients alone: only its weights meet those columns (done above where
            # glu_backward_gemm had them in its registers).
            if self.use_zq and MAGNITUDE in g and not dq_in_gemm:
                c0 = with_v + 2 * H * g.index(MAGNITUDE)
                fn.mm(dy[:, c0 : c0 + 2 * H], wj[H2 : H2 + n_dir, c0 : c0 + 2 * H].T, out=self.dq_z[:, :n_dir])
            if not plan.joint_dz:
                fn.mm(dy, wj[:H2].T, out=dz[:, :H2], beta=1.0 if self.dz_started else 0.0)
                self.dz_started = True
            return None
        fn.mm(dpv, wj[:H2].T, out=dz[:, :H2], beta=1.0)
        return fn.mm(dpv, wj[H2:].T)[:, : net.in_width[d0] - H2]  # 4-aligned over the block's rows
