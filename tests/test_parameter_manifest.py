"""A manifest's declared parameters against the tensors its stages create, checked at Agent build."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from foxhunt_core.agent import Agent
from foxhunt_core.config import NetSettings, RunSettings
from foxhunt_core.manifest import ParamSpec, PluginManifest, parameter_mismatches, parameter_spec_problems
from foxhunt_core.plugins import LoadedPlugin, PluginError, PluginSet
from hook_plugins import AffinePostPlugin, OfiColumnPlugin, TanhGatePlugin


class Width(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = Field(5, ge=1, description="A width.")


def _manifest(name: str, position: int, hook: str, params: tuple[ParamSpec, ...], options=Width) -> PluginManifest:
    return PluginManifest(name=name, version="0.0.1", position=position, hooks=(hook,), options=options,
                          parameters=params, description="test")


def _spec(name: str, *shape) -> ParamSpec:
    return ParamSpec(name=name, shape=shape, description=name)


AFFINE = (_spec("a", "num_actions"), _spec("b", "num_actions"), _spec("c", "num_actions"))
GATE = tuple(_spec(f"b{d}.slope", "adv_h") for d in range(4))
OFI = (_spec("w", 1),)


def _settings() -> RunSettings:
    return RunSettings(net=NetSettings(shared_h1=8, shared_h2=8, adv_h=6, num_atoms=5))


def _agent(affine=AFFINE, gate=GATE, ofi=OFI) -> Agent:
    ps = PluginSet([
        LoadedPlugin("affine_post", 4, AffinePostPlugin(), _manifest("affine_post", 4, "post_attention", affine)),
        LoadedPlugin("tanh_gate", 5, TanhGatePlugin(), _manifest("tanh_gate", 5, "gate_activation", gate)),
        LoadedPlugin("ofi_column", 7, OfiColumnPlugin(), _manifest("ofi_column", 7, "branch_inputs", ofi)),
    ])
    return Agent(_settings(), ps, np, np.random.default_rng(0))


def test_declared_parameters_that_match_build_an_agent():
    agent = _agent()
    assert set(agent.online) == {"core", "affine_post", "tanh_gate", "ofi_column"}


@pytest.mark.parametrize(
    ("kind", "kw", "plugin", "why"),
    [
        ("post shape", {"affine": AFFINE[:2] + (_spec("c", "num_branches"),)}, "affine_post",
         "parameter 'c' has shape (12,), the manifest declares (4,)"),
        ("post missing", {"affine": AFFINE[:2]}, "affine_post", "does not declare: ['c']"),
        ("post extra", {"affine": AFFINE + (_spec("d", 3),)}, "affine_post", "does not create: ['d']"),
        ("gate shape", {"gate": GATE[:3] + (_spec("b3.slope", "adv_h", 2),)}, "tanh_gate",
         "parameter 'b3.slope' has shape (6,), the manifest declares (6, 2)"),
        ("gate name", {"gate": GATE[:3] + (_spec("b3.slopes", "adv_h"),)}, "tanh_gate", "['b3.slope']"),
        ("branch input count", {"ofi": (_spec("w", 2),)}, "ofi_column", "1 parameters created, 2 declared"),
        ("branch input none", {"ofi": ()}, "ofi_column", "does not declare: ['w']"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else "",
)
def test_a_mismatch_is_a_load_error_naming_the_plugin(kind, kw, plugin, why):
    with pytest.raises(PluginError, match=rf"^plugin '{plugin}': .*") as err:
        _agent(**kw)
    assert why in str(err.value), str(err.value)


def test_shapes_may_name_branch_sizes_and_integer_options():
    m = _manifest("ext", 10, "post_attention",
                  (_spec("w", "options.width", "branch_size_1"), _spec("v", "branch_size_3")))
    s = RunSettings(net=NetSettings(branch_sizes=(3, 2, 4, 5)))
    assert m.parameters[0].resolve(s, Width(width=7)) == (7, 2)
    assert m.parameters[0].resolve(s, {"width": 2}) == (2, 2)
    assert m.parameter_count(s) == 5 * 2 + 5  # the options' defaults
    assert m.parameter_count(s, Width(width=1)) == 2 + 5
    ok = {"w": np.zeros((7, 2)), "v": np.zeros(5)}
    assert parameter_mismatches(m, ok, s, Width(width=7)) == []
    assert parameter_mismatches(m, ok, s, Width(width=6)) == [
        "parameter 'w' has shape (7, 2), the manifest declares (6, 2)", "19 parameters created, 17 declared"]
    assert "not a positive integer" in parameter_mismatches(m, ok, s, {"width": "wide"})[0]


def test_an_option_dimension_the_options_model_lacks_is_a_manifest_problem():
    m = _manifest("ext", 10, "post_attention", (_spec("w", "options.depth"), _spec("w", 2)))
    assert parameter_spec_problems(m) == [
        "parameter 'w': shape entry 'options.depth' names no option of the options model",
        "parameter 'w' is declared twice",
    ]
    with pytest.raises(ValueError, match="unknown dimension 'optins.width'"):
        _spec("w", "optins.width")


def test_discovery_reports_an_option_dimension_the_options_model_lacks():
    from plugin_fixtures import Stub

    from foxhunt_core.plugins import validate_plugin

    m = PluginManifest(name="extension", version="0.0.1", position=10, hooks=("q_stats",), options=Width,
                       parameters=(_spec("w", "options.depth"),), description="test")
    _, problems = validate_plugin("extension", Stub(m))
    assert problems == ["parameter 'w': shape entry 'options.depth' names no option of the options model"]
