"""tlob_inject's options, stages, hook and manifest, and its flag-file errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from foxhunt_tlob_inject import plugin
from foxhunt_tlob_inject.options import ORDER_FEATURES, URGENCY_FEATURES, TlobInjectOptions
from foxhunt_tlob_inject.stage import FeatureColumns, gather_columns, runs_of, stages_for
from pydantic import ValidationError

from foxhunt_core.config import RunSettings
from foxhunt_core.market import schema
from foxhunt_core.plugins import discover
from foxhunt_core.stages import BranchInputStage, BuildContext

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_are_the_plans_features_by_name():
    o = TlobInjectOptions()
    assert o.order_features == ("bid_ask_spread", "l1_depth_imbalance", "queue_pressure")
    assert o.urgency_features == ("spread_velocity", "depth_change_rate", "trade_arrival_rate")
    order, urgency = stages_for(o.order_features, o.urgency_features)
    assert order.branches == (2,) and urgency.branches == (3,)
    assert order.indices == tuple(schema.INDEX[n] for n in ORDER_FEATURES)
    assert urgency.indices == tuple(schema.INDEX[n] for n in URGENCY_FEATURES)


@pytest.mark.parametrize(("field", "value", "why"), [
    ("order_features", ["bid_ask_spred"], "unknown feature 'bid_ask_spred' (did you mean 'bid_ask_spread'?"),
    ("urgency_features", ["no_such_thing"], "unknown feature 'no_such_thing' (the names are"),
    ("order_features", [], "the list is empty"),
    ("urgency_features", ["ofi", "queue_pressure", "ofi"], "feature 'ofi' is named twice"),
    ("order_features", "bid_ask_spread", "valid tuple"),
    ("colour", "red", "Extra inputs are not permitted"),
])
def test_options_reject_bad_lists(field, value, why):
    with pytest.raises(ValidationError) as err:
        TlobInjectOptions.model_validate({field: value})
    assert why in str(err.value)


def test_the_same_feature_may_feed_both_branches():
    o = TlobInjectOptions(order_features=["ofi"], urgency_features=["ofi", "microprice_dev"])
    order, urgency = stages_for(o.order_features, o.urgency_features)
    assert (order.width, urgency.width) == (1, 2)


@pytest.mark.parametrize(("body", "where", "why"), [
    ("order_features: [bid_ask_spred, queue_pressure]", "6: plugins.tlob_inject.order_features",
     "unknown feature 'bid_ask_spred' (did you mean 'bid_ask_spread'?"),
    ("urgency_features: []", "6: plugins.tlob_inject.urgency_features", "the list is empty"),
    ("order_features: [ofi, ofi]", "6: plugins.tlob_inject.order_features", "feature 'ofi' is named twice"),
])
def test_a_bad_list_in_a_flag_file_is_one_line_and_exit_2(tmp_path, body, where, why):
    path = tmp_path / "bad.yaml"
    path.write_text(f"version: 1\nout_of_order: test\nplugins:\n  tlob_inject:\n    enabled: true\n    {body}\n")
    exe = Path(sys.executable).parent / "foxhunt"
    res = subprocess.run([str(exe), "flags", "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}:{where}: ") and why in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_runs_and_gather_match_fancy_indexing():
    assert runs_of((42, 43, 44)) == ((42, 45, 0),)
    assert runs_of((45, 3, 4, 49, 48)) == ((45, 46, 0), (3, 5, 1), (49, 50, 3), (48, 49, 4))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(9, 50)).astype(np.float32)
    for names in (ORDER_FEATURES, ("microprice_dev", "ret_1", "ret_2", "ofi", "position")):
        st = FeatureColumns(2, names)
        cols, cache = st.forward(np, {}, obs)
        assert cols.dtype == np.float32 and cache is None
        assert np.array_equal(cols, obs[:, [schema.INDEX[n] for n in names]])
        out = np.full((9, len(names)), np.nan, np.float32)
        assert gather_columns(np, obs, st.runs, st.width, out=out) is out and np.array_equal(out, cols)


def test_stage_is_a_branch_input_stage_without_parameters():
    st = FeatureColumns(3, URGENCY_FEATURES)
    assert isinstance(st, BranchInputStage)
    assert st.name == "tlob_inject" and st.zero_init_rows and st.width == 3
    assert st.init_params(np.random.default_rng(0)) == {}
    assert st.backward(np, {}, None, np.ones((4, 3))) == {}
    with pytest.raises(KeyError, match="unknown feature 'spread'"):
        FeatureColumns(2, ("spread",))


@pytest.mark.parametrize("source", [None, {}, {"order_features": ["ofi"]}, TlobInjectOptions(urgency_features=["ofi"])])
def test_hook_reads_options(source):
    ctx = BuildContext(settings=RunSettings(), xp=np, options={} if source is None else {"tlob_inject": source})
    order, urgency = plugin.branch_inputs(ctx)
    want = TlobInjectOptions.model_validate(source or {}) if not isinstance(source, TlobInjectOptions) else source
    assert order.features == want.order_features and urgency.features == want.urgency_features


def test_manifest_is_discovered_and_validated():
    reg = discover()
    assert "tlob_inject" in reg.plugins, reg.problems
    m = reg.plugins["tlob_inject"].manifest
    assert m.position == 7 and m.hooks == ("branch_inputs",) and m.starts_as_identity
    assert m.parameters == () and m.parameter_count() == 0  # the widened rows are the core's
    assert reg.rollout_order().index("tlob_inject") == 6
