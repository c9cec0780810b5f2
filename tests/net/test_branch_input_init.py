"""Branch-input stages at init: rows drawn at random unless the stage asks for zero rows, and a
hook that answers with a tuple of stages."""

from __future__ import annotations

import numpy as np

from foxhunt_core.agent import build_stages
from foxhunt_core.config import NetSettings, RunSettings
from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.net import BranchingC51
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from hook_plugins import OfiColumnStage, ZeroRows

NET = NetSettings(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0)


def test_rows_are_drawn_unless_the_stage_asks_for_zero_rows():
    plain = BranchingC51(NET).init_params(np.random.default_rng(4), np.float64)["core"]
    mixed = BranchingC51(NET, branch_inputs=[OfiColumnStage(), ZeroRows((1, 2))])
    tree = mixed.init_params(np.random.default_rng(4), np.float64)["core"]
    assert [list(mixed.drawn_rows(d)).count(False) for d in range(4)] == [0, 2, 2, 0]
    for d in range(4):
        for k in (f"branch{d}.w_gate", f"branch{d}.w_val"):
            base = tree[k]
            assert base.shape[0] == mixed.base_width(d) == NET.shared_h2 + (3 if d == 1 else 0)
            # the rows reading the branch-input columns are a tensor of their own, below the base rows
            w = np.concatenate([base, tree[k + "_in"]]) if mixed.extra_width[d] else base
            assert (k + "_in" in tree) == bool(mixed.extra_width[d])
            drawn = mixed.drawn_rows(d)
            assert w.shape[0] == mixed.in_width[d]
            assert not w[~drawn].any() and (w[drawn] != 0).all(), k
    only_zero = BranchingC51(NET, branch_inputs=[ZeroRows((0, 3))]).init_params(np.random.default_rng(4), np.float64)
    assert set(only_zero["core"]) - set(plain) == {f"branch{d}.{w}_in" for d in (0, 3) for w in ("w_gate", "w_val")}
    for k, v in plain.items():  # zero rows only: every other tensor and row as without the stage
        assert np.array_equal(only_zero["core"][k], v), k
    assert not any(only_zero["core"][f"branch{d}.{w}_in"].any() for d in (0, 3) for w in ("w_gate", "w_val"))
    # a stage without the attribute keeps the drawn rows (the tests' OFI column)
    ofi = BranchingC51(NET, branch_inputs=[OfiColumnStage()])
    assert all(ofi.drawn_rows(d).all() for d in range(4))


class TwoStages:
    @hookimpl
    def branch_inputs(self, ctx):
        return ZeroRows((2,)), ZeroRows((3,), width=2)


def test_a_hook_may_answer_with_a_tuple_of_stages():
    ps = PluginSet([LoadedPlugin("zero_rows", 10, TwoStages(), None)])
    st = build_stages(ps, RunSettings(net=NET), np)
    assert [s.branches for s in st.branch_inputs] == [(2,), (3,)]
    assert st.owners["branch_inputs"] == ["zero_rows"]
    net = BranchingC51(NET, branch_inputs=st.branch_inputs)
    assert net.in_width == [10, 13, 12, 12]


def test_checkpoints_with_the_rows_inside_w_gate_load_split():
    """Checkpoint tensors written when the rows reading branch-input columns were the last rows of
    ``w_gate`` / ``w_val``: split into ``w_gate_in`` / ``w_val_in`` as the network keeps them now."""
    from foxhunt_core.checkpoint import flatten
    from foxhunt_core.net.network import split_widened_rows

    net = BranchingC51(NET, branch_inputs=[ZeroRows((1, 2))])
    tree = net.init_params(np.random.default_rng(5), np.float64)
    tree["core"]["branch1.w_val_in"][...] = 7.0
    old = {o: dict(sub) for o, sub in tree.items()}
    for d in (1, 2):
        for w in ("w_gate", "w_val"):
            old["core"][f"branch{d}.{w}"] = np.concatenate([old["core"][f"branch{d}.{w}"],
                                                            old["core"].pop(f"branch{d}.{w}_in")])
    flat_old, flat_new = flatten("online", old), flatten("online", tree)
    assert flat_old["online/core/branch1.w_gate"].shape == (NET.shared_h2 + 3 + 2, NET.adv_h)
    split = split_widened_rows(flat_old, net)
    assert set(split) == set(flat_new)
    assert all(np.array_equal(split[k], flat_new[k]) for k in flat_new)
    assert split_widened_rows(flat_new, net).keys() == flat_new.keys()  # already split: unchanged
    assert all(split_widened_rows(flat_new, net)[k] is v for k, v in flat_new.items())
