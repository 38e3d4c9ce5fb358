"""SCOUT_CPU_DEADLINE_MS and the test-only SCOUT_TEST_FAULTS: defaults, parsing, refusals that name the
variable, and the refusal of injected faults outside a test run."""

import pytest

from scout_sglang.cpu_worker.faults import FaultInjector, FaultPlan, InjectedFault
from scout_sglang.env import DEFAULT_CPU_DEADLINE_MS, config_from_env, cpu_deadline_ms, injected_faults


def test_the_deadline_has_a_default_and_takes_milliseconds():
    assert cpu_deadline_ms({}) == DEFAULT_CPU_DEADLINE_MS
    assert cpu_deadline_ms({"SCOUT_CPU_DEADLINE_MS": "250"}) == 250.0


@pytest.mark.parametrize("text", ["soon", "0", "-5"])
def test_a_bad_deadline_is_refused_by_name(text):
    with pytest.raises(ValueError, match="SCOUT_CPU_DEADLINE_MS"):
        cpu_deadline_ms({"SCOUT_CPU_DEADLINE_MS": text})


def test_the_new_variables_are_not_taken_for_unknown_config_fields():
    config_from_env({"SCOUT_CPU_DEADLINE_MS": "100", "SCOUT_TEST_FAULTS": "cpu_raise:1",
                     "SCOUT_TEST_FAULTS_ALLOW": "1"})


def test_faults_are_off_by_default_and_parsed_under_pytest():
    assert injected_faults({}) is None
    plan = injected_faults({"SCOUT_TEST_FAULTS": "cpu_raise:0.1,cpu_delay_ms:200,seed:1",
                            "PYTEST_CURRENT_TEST": "x"})
    assert plan == FaultPlan(raise_probability=0.1, delay_probability=1.0, delay_ms=200.0, seed=1)


def test_faults_are_refused_outside_a_test_run_unless_explicitly_allowed():
    with pytest.raises(ValueError, match="refused outside pytest unless SCOUT_TEST_FAULTS_ALLOW=1"):
        injected_faults({"SCOUT_TEST_FAULTS": "cpu_raise:0.1"})
    assert injected_faults({"SCOUT_TEST_FAULTS": "cpu_raise:0.1", "SCOUT_TEST_FAULTS_ALLOW": "1"}) is not None


@pytest.mark.parametrize("text", ["cpu_raise", "cpu_explode:1", "cpu_raise:2", "cpu_delay_ms:x"])
def test_a_bad_fault_list_is_refused_by_name(text):
    with pytest.raises(ValueError, match="SCOUT_TEST_FAULTS"):
        injected_faults({"SCOUT_TEST_FAULTS": text, "SCOUT_TEST_FAULTS_ALLOW": "1"})


def test_the_injector_raises_as_often_as_planned_and_repeats_with_its_seed():
    def draws(seed):
        injector, outcomes = FaultInjector(FaultPlan(raise_probability=0.25, seed=seed)), []
        for _ in range(400):
            try:
                injector.before_work(layer=1)
                outcomes.append(False)
            except InjectedFault:
                outcomes.append(True)
        return outcomes

    assert draws(1) == draws(1) != draws(2)
    assert 60 < sum(draws(1)) < 140


def test_a_request_state_fault_names_requests_and_injects_nothing_into_the_cpu_worker():
    plan = injected_faults({"SCOUT_TEST_FAULTS": "request_state:victim", "PYTEST_CURRENT_TEST": "x"})
    assert plan.request_state == "victim" and not plan.cpu_faults
    both = FaultPlan.parse("cpu_raise:0.1,request_state:victim-3")
    assert both.request_state == "victim-3" and both.cpu_faults
