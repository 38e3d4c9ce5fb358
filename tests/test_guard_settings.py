"""SCOUT_MAX_N and SCOUT_DRAIN_S (defaults, parsing, refusals that name the variable) and the fan-out count
of the HTTP front's guard (sglang_adapter/guards.py); the guards themselves run against the real server in
test_sglang_guards.py."""

import pytest

from scout_sglang.env import DEFAULT_DRAIN_S, DEFAULT_MAX_N, config_from_env, drain_seconds, max_n
from scout_sglang.sglang_adapter.guards import batch_size, fan_out_problem, sampling_n, serves_scout


def test_the_guards_have_defaults_and_take_their_values():
    assert max_n({}) == DEFAULT_MAX_N == 16 and max_n({"SCOUT_MAX_N": "4"}) == 4
    assert drain_seconds({}) == DEFAULT_DRAIN_S == 25.0 and drain_seconds({"SCOUT_DRAIN_S": "0"}) == 0.0


@pytest.mark.parametrize("variable, text", [("SCOUT_MAX_N", "0"), ("SCOUT_MAX_N", "2.5"), ("SCOUT_MAX_N", "many"),
                                            ("SCOUT_DRAIN_S", "-1"), ("SCOUT_DRAIN_S", "soon")])
def test_a_bad_guard_setting_is_refused_by_name(variable, text):
    with pytest.raises(ValueError, match=variable):
        (max_n if variable == "SCOUT_MAX_N" else drain_seconds)({variable: text})


def test_the_guard_settings_are_not_taken_for_unknown_config_fields():
    config_from_env({"SCOUT_MAX_N": "8", "SCOUT_DRAIN_S": "10"})


def test_fan_out_counts_n_times_the_prompts():
    assert batch_size("text") == batch_size([5, 6, 7]) == 1
    assert batch_size(["a", "b"]) == batch_size([[5, 6], [7]]) == 2
    assert sampling_n(None) == sampling_n({}) == 1 and sampling_n({"n": 3}) == 3
    assert sampling_n([{"n": 2}, {"n": 2}]) == 2
    assert fan_out_problem(16, 1, 16) is None and fan_out_problem(4, 4, 16) is None
    assert "n=17 asks for 17 sequences" in fan_out_problem(17, 1, 16)
    assert "n=3 for each of 6 prompts asks for 18 sequences" in fan_out_problem(3, 6, 16)


def test_only_a_server_that_decodes_with_scout_is_guarded():
    class Args:
        def __init__(self, backend, decode=None):
            self.attention_backend, self.decode_attention_backend = backend, decode

    assert serves_scout(Args("scout")) and serves_scout(Args("triton", "scout"))
    assert not serves_scout(Args("triton")) and not serves_scout(Args("scout", "triton"))
