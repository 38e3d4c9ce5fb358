"""docs/configuration.md is generated from the code that reads the settings
(scripts/gen_config_docs.py): it must equal a fresh generation, name every
ScoutConfig field and every other SCOUT_* variable, and a setting added without
its description must stop the generator."""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

import scout_sglang.config
import scout_sglang.env
from scout_sglang.config import ScoutConfig
from scout_sglang.env import OTHER_VARIABLES, PREFIX, available_presets

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_the_page_equals_a_fresh_generation(generator):
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == generator.render(), "docs/configuration.md is stale: run python -P scripts/gen_config_docs.py"


def test_every_setting_and_preset_has_its_line():
    page = (ROOT / "docs" / "configuration.md").read_text()
    fields = [f.name for f in dataclasses.fields(ScoutConfig) if f.name != "extra"]
    variables = [PREFIX + name.upper() for name in fields] + sorted(OTHER_VARIABLES)
    lines = page.splitlines()
    missing = [v for v in variables if not any(line.startswith(f"| `{v}` |") for line in lines)]
    assert not missing, f"no table line for {missing}"
    assert not [p for p in available_presets() if f"`{p}`" not in page]


def test_a_field_without_a_description_stops_the_generator(generator, monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class WithFakeSetting(ScoutConfig):
        fake_setting: int = 0

    monkeypatch.setattr(scout_sglang.config, "ScoutConfig", WithFakeSetting)
    with pytest.raises(SystemExit, match="fake_setting has no comment"):
        generator.render()


def test_a_variable_without_a_description_stops_the_generator(generator, monkeypatch):
    monkeypatch.setattr(scout_sglang.env, "OTHER_VARIABLES", OTHER_VARIABLES | {"SCOUT_FAKE_SETTING"})
    with pytest.raises(SystemExit, match="SCOUT_FAKE_SETTING"):
        generator.render()
