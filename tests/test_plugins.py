"""Plugin discovery: manifests, validation of every claim, filters, ordering, the list command."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from plugin_fixtures import install_stand_ins
from typer.testing import CliRunner

import foxhunt_core.plugins as plugins_mod
from foxhunt_core.cli import app
from foxhunt_core.manifest import DOCUMENTED_ORDER, parse_spec, version_satisfies
from foxhunt_core.plugins import ENTRY_POINT_GROUP, PluginError, PluginFilter, discover

ROOT = Path(__file__).resolve().parents[1]


def ep(name: str, attr: str | None = None) -> EntryPoint:
    return EntryPoint(name, f"plugin_fixtures:{attr or name}", ENTRY_POINT_GROUP)


def one(name: str, attr: str | None = None) -> list[str]:
    reg = discover(eps=[ep(name, attr)], environ={})
    assert name not in reg.plugins
    return reg.problems[name]


def test_installed_plugins_follow_the_documented_order():
    reg = discover(environ={})
    assert reg.problems == {}
    assert [p.name for p in reg.ordered()][:2] == ["q_mean_center", "atom_entropy"]
    assert reg.rollout_order()[:9] == list(DOCUMENTED_ORDER)


def test_valid_stand_ins_are_registered_with_their_manifests():
    reg = discover(eps=[ep("xlstm_context"), ep("rk4_tau"), ep("my_extension", "extension")], environ={})
    assert reg.problems == {}
    assert [p.name for p in reg.ordered()] == ["xlstm_context", "rk4_tau", "my_extension"]
    assert reg.rollout_order()[-1] == "my_extension"  # extensions come after the documented order
    assert reg.plugins["xlstm_context"].manifest.parameter_count() == 4 * 16
    ps = reg.plugin_set(["rk4_tau", "xlstm_context"])
    assert ps.names == ["xlstm_context", "rk4_tau"]  # the core orders them, by position


@pytest.mark.parametrize(
    "name, attr, reason",
    [
        ("ghost", "plugin_fixtures_missing:thing", "failed to import"),
        ("no_register", None, "does not implement the register_plugin hook"),
        ("misspelled", None, "unknown hook 'q_stat'"),
        ("raises", None, "register_plugin raised RuntimeError: no manifest today"),
        ("registers_twice", None, "called it 2 times"),
        ("wrong_name", None, "manifest name 'not_my_name' differs from its entry-point name"),
        ("kan_gate", "wrong_position", "declares position 3, but the documented rollout order puts it at 5"),
        ("squatter", None, "position 4 belongs to 'graph_message'"),
        ("undeclared_hook", None, "implements hooks its manifest does not declare: ['tau_update']"),
        ("missing_hook", None, "declares hooks it does not implement: ['tau_update']"),
        ("unknown_hook", None, "declares unknown hooks ['warp_drive']"),
        ("loose_options", None, "must set extra='forbid'"),
        ("undescribed", None, "option 'depth' of UndescribedOpts has no description"),
        ("enabled_option", None, "option name 'enabled' is reserved"),
        ("missing_kernel", None, "kernel source"),
        ("wrong_kernel", None, "kernel 'absent_kernel' is not defined in fixture_kernel.cu"),
        ("future_core", None, "requires foxhunt-core >=9.0"),
        ("rk4_tau", "rk4_without_requirement", "documented requirement on ['xlstm_context']"),
        ("dict_manifest", None, "manifest.colour: Extra inputs are not permitted"),
        ("core", "xlstm_context", "reserved by the core"),
        ("model_dump", "xlstm_context", "clashes with the flag-file schema"),
        ("json", "xlstm_context", "clashes with the flag-file schema"),
    ],
)
def test_a_broken_plugin_is_reported_by_name_with_the_reason(name, attr, reason):
    if attr and ":" in attr:
        reg = discover(eps=[EntryPoint(name, attr, ENTRY_POINT_GROUP)], environ={})
        problems = reg.problems[name]
    else:
        problems = one(name, attr)
    assert any(reason in p for p in problems), problems


def test_problems_stop_the_run_with_one_line_each():
    reg = discover(eps=[ep("xlstm_context"), ep("no_register"), ep("raises")], environ={})
    assert list(reg.plugins) == ["xlstm_context"]
    with pytest.raises(PluginError) as exc:
        reg.check()
    lines = str(exc.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("plugin 'no_register': ") and "FOXHUNT_PLUGINS=no:no_register" in lines[0]
    assert lines[1].startswith("plugin 'raises': ")


def test_duplicates_and_shared_positions_are_refused():
    reg = discover(eps=[ep("xlstm_context"), ep("xlstm_context", "rk4_tau")], environ={})
    assert "installed twice" in reg.problems["xlstm_context"][0]
    reg = discover(eps=[ep("my_extension", "extension"), ep("other_extension", "extension_twin")], environ={})
    assert reg.plugins == {}
    assert "position 12 is also claimed by ['other_extension']" in reg.problems["my_extension"][0]


def test_allow_and_block_lists_from_the_environment_and_the_flag_file():
    eps = [ep("xlstm_context"), ep("rk4_tau"), ep("no_register")]
    reg = discover(eps=eps, environ={"FOXHUNT_PLUGINS": "no:no_register"})
    assert reg.problems == {} and reg.excluded == {"no_register": "blocked by FOXHUNT_PLUGINS"}
    reg = discover(eps=eps, environ={"FOXHUNT_PLUGINS": "xlstm_context"})
    assert list(reg.plugins) == ["xlstm_context"]
    assert reg.excluded["rk4_tau"] == "not in the allow-list of FOXHUNT_PLUGINS"
    reg = discover(PluginFilter.parse(["no:rk4_tau", "no:no_register"], "flags"), eps=eps, environ={})
    assert list(reg.plugins) == ["xlstm_context"] and reg.excluded["rk4_tau"] == "blocked by flags"


def test_version_ranges():
    assert parse_spec(">=0.1, <0.2") == [(">=", (0, 1, 0, 0)), ("<", (0, 2, 0, 0))]
    assert version_satisfies("0.1.0", ">=0.1,<0.2") and not version_satisfies("0.2.0", ">=0.1,<0.2")
    assert version_satisfies("1.0", "") and version_satisfies("1.2.3", "!=1.2.4")
    with pytest.raises(ValueError, match="bad version clause"):
        parse_spec("~=1.0")


@pytest.fixture
def fake_installed(monkeypatch):
    install_stand_ins(monkeypatch, "xlstm_context", "rk4_tau")


def test_plugins_list_table_and_json(fake_installed):
    runner = CliRunner()
    res = runner.invoke(app, ["plugins", "list", "--json", "--flags", str(ROOT / "flags/stage-01-q-mean-center.yaml")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {r["name"]: r for r in doc["plugins"]}
    # (in rollout order, among whatever other plugins the checkout installs)
    assert [n for n in rows if n in ("q_mean_center", "atom_entropy", "xlstm_context", "rk4_tau")] == [
        "q_mean_center", "atom_entropy", "xlstm_context", "rk4_tau"]
    assert [r["position"] for r in doc["plugins"]] == sorted(r["position"] for r in doc["plugins"])
    assert rows["q_mean_center"]["enabled"] is True and rows["atom_entropy"]["enabled"] is False
    assert rows["q_mean_center"]["kernels"] == ["q_mean_partial", "q_mean_subtract"]
    assert rows["rk4_tau"]["requires"] == {"plugins": ["xlstm_context"], "core": ""}
    assert rows["xlstm_context"]["parameters"] == 64
    assert rows["atom_entropy"]["hooks"] == ["q_stats", "entropy_coefficient"]
    res = runner.invoke(app, ["plugins", "list"])
    assert res.exit_code == 0
    for word in ("position", "q_mean_center", "q_mean_partial", "entropy_coefficient", "xlstm_context", "0.1.0"):
        assert word in res.stdout


def test_plugins_list_reports_a_broken_plugin_and_exits_2(monkeypatch):
    monkeypatch.setattr(plugins_mod, "entry_points", lambda group: [ep("xlstm_context"), ep("raises")])
    monkeypatch.delenv("FOXHUNT_PLUGINS", raising=False)
    res = CliRunner().invoke(app, ["plugins", "list"])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "plugin 'raises': register_plugin raised RuntimeError: no manifest today "
        "(skip it with FOXHUNT_PLUGINS=no:raises)"
    ]
    monkeypatch.setenv("FOXHUNT_PLUGINS", "no:raises")
    res = CliRunner().invoke(app, ["plugins", "list"])
    assert res.exit_code == 0 and "plugin 'raises': not loaded (blocked by FOXHUNT_PLUGINS)" in res.stdout


def test_declared_kernels_may_carry_launch_bounds(tmp_path):
    from foxhunt_core.manifest import KernelSpec, kernel_problems

    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void __launch_bounds__(128, 3) a(int n) {}\n'
                  'extern "C" __global__ __launch_bounds__(64) void b(int n) {}\n')
    assert kernel_problems(KernelSpec(path=cu, functions=("a", "b"))) == []
    assert kernel_problems(KernelSpec(path=cu, functions=("c",))) == ["kernel 'c' is not defined in k.cu"]
