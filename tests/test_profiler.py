"""Recall-interval profiler: interval derivation on hand-made ratio curves, and
one small profile of a random tiny model whose preset loads through env."""

import pytest
import yaml

from scout_sglang.env import config_from_env, load_preset
from scout_sglang.profiler import (
    first_exceedance,
    intervals_from_ratios,
    main,
    mean_curve,
    min_intervals,
    preset_fields,
    profile_intervals,
)

BETA = 0.12


def columns(*curves):
    """[steps][layers] from one curve per layer."""
    return [list(row) for row in zip(*curves)]


def test_never_above_beta_gives_the_cap_and_above_at_once_gives_one():
    quiet = [0.0, 0.05, 0.12, 0.1, 0.11]  # == beta is not above it
    loud = [0.5, 0.0, 0.0, 0.0, 0.0]
    assert intervals_from_ratios(columns(quiet, loud), BETA, 16) == [16, 1]


def test_interval_counts_the_steps_before_the_first_one_above_beta():
    rising = [0.0, 0.02, 0.05, 0.08, 0.13, 0.2]  # step 4 is the first above: steps 0-3 are covered
    dips_back = [0.0, 0.2, 0.0, 0.0, 0.0, 0.0]  # a later dip does not extend it
    assert first_exceedance(rising, BETA) == 4
    assert first_exceedance([0.0, 0.1], BETA) is None
    assert intervals_from_ratios(columns(rising, dips_back), BETA, 16) == [4, 1]


def test_the_cap_bounds_long_intervals():
    slow = [0.0] * 10 + [0.5]
    assert intervals_from_ratios(columns(slow), BETA, 16) == [10]
    assert intervals_from_ratios(columns(slow), BETA, 3) == [3]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="beta"):
        intervals_from_ratios([[0.0]], 1.5, 4)
    with pytest.raises(ValueError, match="max_interval"):
        intervals_from_ratios([[0.0]], BETA, 0)
    with pytest.raises(ValueError, match="layer ratios"):
        intervals_from_ratios([[0.0, 0.0], [0.0]], BETA, 4)
    with pytest.raises(ValueError, match="aggregate"):
        profile_intervals([[[0.0]]], beta=BETA, max_interval=4, aggregate="median")


def test_requests_combine_by_mean_curve_or_by_minimum():
    # layer 0 dense (ratio always 0), layer 1 drifts at different speeds in two requests
    early = columns([0.0] * 6, [0.0, 0.1, 0.2, 0.2, 0.2, 0.2])  # above beta from step 2
    late = columns([0.0] * 6, [0.0, 0.0, 0.0, 0.0, 0.0, 0.3])  # above beta at step 5
    assert mean_curve([early, late])[2] == [0.0, 0.1]
    assert min_intervals([[8, 5], [8, 2]]) == [8, 2]
    common = dict(beta=BETA, max_interval=8, dense_layers=(0,), default_interval=7)
    # the mean curve of layer 1 (0, 0.05, 0.1, 0.1, 0.1, 0.25) first exceeds beta at step 5
    assert profile_intervals([early, late], aggregate="mean", **common) == [7, 5]
    # the minimum follows the earliest request
    assert profile_intervals([early, late], aggregate="min", **common) == [7, 2]


def test_mean_curve_covers_requests_of_different_lengths():
    assert mean_curve([[[0.2]], [[0.0], [0.4]]]) == [[0.1], [0.4]]


def test_preset_fields_keep_the_base_and_validate():
    base = load_preset("tiny")
    fields = preset_fields(base, [4, 1, 2], {"model": "m"})
    assert fields["recall_policy"] == "interval"
    assert fields["recall_intervals"] == [4, 1, 2]
    assert fields["dense_layers"] == list(base["dense_layers"])
    assert fields["extra"] == {"profile": {"model": "m"}}
    with pytest.raises(ValueError, match="recall_intervals"):
        preset_fields(base, [0, 1], {})


def test_profiling_a_tiny_model_writes_a_preset_that_loads(tmp_path):
    out = tmp_path / "tiny-profiled.yaml"
    argv = ["--tiny", "llama", "--preset", "tiny", "--out", str(out), "--layers", "3", "--hidden", "64",
            "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--vocab", "128", "--prompts", "2",
            "--prompt-len", "160", "--max-interval", "6", "--decode-steps", "8"]
    assert main(argv) == 0
    config = config_from_env({"SCOUT_CONFIG": str(out)})
    assert config.recall_policy == "interval"
    assert len(config.recall_intervals) == 3
    assert all(1 <= i <= 6 for i in config.recall_intervals)
    assert config.recall_intervals[0] == config.recall_interval  # dense layer 0 keeps the default
    assert config.token_budget == load_preset("tiny")["token_budget"]
    profile = yaml.safe_load(out.read_text())["extra"]["profile"]
    assert profile["beta"] == config.recall_beta and profile["decode_steps"] == 8
    assert "random-weight tiny llama" in profile["model"]
