"""ScoutConfig validation, presets and SCOUT_* overrides."""

import pytest

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.env import available_presets, config_from_env, load_preset


def test_defaults_follow_the_design():
    config = ScoutConfig()
    assert (config.mode, config.block_size, config.token_budget, config.recall_beta) == ("scout", 32, 2048, 0.12)
    assert config.topk_blocks == 64 and config.resident_capacity == 64 and config.dense_layers == (0,)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as error:
        ScoutConfig(mode="dense", block_size=32, token_budget=48, recall_beta=1.5)
    message = str(error.value)
    assert "mode must be one of" in message and "multiple of block_size" in message and "recall_beta" in message


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        ScoutConfig().mode = "full"


def test_per_layer_interval_falls_back_to_the_default():
    config = ScoutConfig(recall_intervals=(3, 5), recall_interval=9)
    assert [config.interval_for_layer(i) for i in range(4)] == [3, 5, 9, 9]


@pytest.mark.parametrize("preset", available_presets())
def test_every_shipped_preset_is_valid(preset):
    assert ScoutConfig(**load_preset(preset)).mode in MODES


def test_overrides_apply_on_top_of_the_named_preset():
    config = config_from_env({"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": "256", "SCOUT_DENSE_LAYERS": "0,1",
                              "SCOUT_LAYER_AHEAD": "off", "SCOUT_KERNEL_IMPL": "none", "PATH": "/bin"})
    assert config.block_size == 16 and config.token_budget == 256 and config.topk_blocks == 16
    assert config.dense_layers == (0, 1) and config.layer_ahead is False and config.kernel_impl is None


def test_a_yaml_path_is_a_preset(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("mode: quest\ntoken_budget: 512\n")
    assert config_from_env({"SCOUT_CONFIG": str(path)}).mode == "quest"


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"SCOUT_MODE": "fast"}, "SCOUT_MODE='fast' is not accepted; accepted values: full, quest, infinigen, hgca, scout"),
        ({"SCOUT_TOKEN_BUDGET": "lots"}, "SCOUT_TOKEN_BUDGET='lots' is not a valid int"),
        ({"SCOUT_LAYER_AHEAD": "maybe"}, "SCOUT_LAYER_AHEAD='maybe' is not a valid bool"),
        ({"SCOUT_TOKENBUDGET": "1"}, "unknown setting SCOUT_TOKENBUDGET; accepted: SCOUT_BLOCK_SIZE"),
        ({"SCOUT_CONFIG": "nope"}, "SCOUT_CONFIG='nope' is neither a preset"),
        ({"SCOUT_TOKEN_BUDGET": "40"}, "token_budget (40) must be a multiple of block_size (32)"),
    ],
)
def test_bad_settings_name_the_variable_and_what_it_accepts(environ, expected):
    with pytest.raises(ValueError) as error:
        config_from_env(environ)
    assert expected in str(error.value)


def test_a_preset_with_an_unknown_key_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("mode: scout\ntopk: 3\n")
    with pytest.raises(ValueError, match=r"unknown settings \['topk'\]"):
        load_preset(str(path))
