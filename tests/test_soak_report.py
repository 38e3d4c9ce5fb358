"""The soak's verdict: a failed request, a wrong answer, RSS growth, pages left in use or a negative control whose
answers mostly equal the reference decoder's (no power) each fail it."""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import soak  # noqa: E402

ARGS = SimpleNamespace(seconds=100.0, clients=2, disconnect=0.1, faults=0.0, prompts=2, lengths="256")
STATS = {"usage": {"requests": 0, "host_pages": 0, "device_window_pages": 0, "device_full_pages": 0},
         "cpu_fallbacks": {"error": 0, "deadline": 0}, "decode_steps": 10}
RSS = [{"t": t, "rss_bytes": 1000} for t in range(0, 100, 10)]
CONTROL = {"fault": "cpu_drop:1", "prompts": 4, "completed": 4, "differ": 4}


def records(**last):
    done = [{"t": float(t), "latency_s": 0.5, "outcome": "completed", "identical": True} for t in range(0, 100, 5)]
    done.append({"t": 1.0, "latency_s": 0.1, "outcome": "disconnected"})
    return done[:-2] + [{**done[-2], **last}] + done[-1:]


def test_a_clean_run_passes_and_counts_every_outcome():
    result = soak.summarize(records(), RSS, STATS, 200, 0.0, ARGS, control=CONTROL)
    assert result["passed"], result["verdict"]
    assert (result["completed"], result["disconnected"], result["failed"], result["identical"]) == (20, 1, 0, 20)
    assert result["latency_s"]["p50"] == 0.5 and len(result["latency_over_time"]) == 10


def test_each_defect_fails_the_verdict():
    wrong = soak.summarize(records(identical=False), RSS, STATS, 200, 0.0, ARGS, control=CONTROL)
    assert not wrong["passed"] and not wrong["verdict"]["all_identical"] and wrong["mismatches"]
    failed = soak.summarize(records(outcome="failed", error="HTTP 500"), RSS, STATS, 200, 0.0, ARGS, control=CONTROL)
    assert not failed["passed"] and failed["failed"] == 1
    growing = RSS[:-2] + [{"t": 80, "rss_bytes": 1100}, {"t": 90, "rss_bytes": 1100}]
    grown = soak.summarize(records(), growing, STATS, 200, 0.0, ARGS, control=CONTROL)
    assert not grown["verdict"]["rss_growth_under_5pct"]
    leaking = {**STATS, "usage": {**STATS["usage"], "host_pages": 3}}
    assert soak.summarize(records(), RSS, leaking, 200, 0.0, ARGS, control=CONTROL)["idle_pages"] == 3
    assert not soak.summarize(records(), RSS, leaking, 200, 0.0, ARGS, control=CONTROL)["passed"]


def test_a_control_that_changes_few_answers_fails_the_verdict():
    """Answers identical under faults say nothing where dropping the CPU part changes no answer either."""
    weak = soak.summarize(records(), RSS, STATS, 200, 0.0, ARGS, control={**CONTROL, "differ": 2})
    assert not weak["passed"] and not weak["verdict"]["cpu_part_decides"]
    assert not soak.summarize(records(), RSS, STATS, 200, 0.0, ARGS, control=None)["passed"]
    strong = soak.summarize(records(), RSS, STATS, 200, 0.0, ARGS, control={**CONTROL, "differ": 3})
    assert strong["passed"] and strong["control"]["differ"] == 3 and strong["setting"] == soak.SCOUT_ENV


def test_a_shared_prefix_share_needs_prefix_hits_and_counts_its_answers():
    args = SimpleNamespace(**vars(ARGS), shared_prefix=0.25)
    shared = [{**r, "shared_prefix": True} if r["outcome"] == "completed" and r["t"] < 20 else r for r in records()]
    missed = soak.summarize(shared, RSS, STATS, 200, 0.0, args, control=CONTROL)
    assert not missed["passed"] and not missed["verdict"]["prefix_reused"]
    reused = soak.summarize(shared, RSS, {**STATS, "prefix": {"hits": 3, "prefill_tokens_saved": 3072}}, 200, 0.0,
                            args, control=CONTROL)
    assert reused["passed"] and reused["shared_prefix_completed"] == reused["shared_prefix_identical"] == 4


def test_shared_prefix_prompts_start_with_one_preamble():
    from scout_sglang.retrieval import data

    pool = [data.Sample(prompt=[1, 10 + i, 11 + i], answer=[], needle_depth=0.0) for i in range(8)]
    samples, shared = soak.with_shared_prefix(pool, 0.25, seed=3)
    assert shared == {0, 4}
    assert samples[0].prompt[1:1 + soak.PREAMBLE_TOKENS] == samples[4].prompt[1:1 + soak.PREAMBLE_TOKENS]
    assert samples[0].prompt[-2:] == pool[0].prompt[-2:] and samples[1] is pool[1]


def ramp_level(clients, *, outcome="completed", text="K V1 V2 .", exact=1.0, cpu=0):
    """A load-ramp level as soak_ramp.run_level returns it: two requests of prompt 0, statistics around them."""
    before = {"decoded_tokens": 100, "cpu_blocks": 50}
    return {"clients": clients, "records": [{"prompt": 0, "outcome": "completed", "text": "K V1 V2 .", "latency_s": 1.0},
                                            {"prompt": 0, "outcome": outcome, "text": text, "latency_s": 2.0}],
            "before": before, "middle": {"resident_pool": {"recent_exact_share": exact, "used": 30}},
            "after": {"decoded_tokens": 110, "cpu_blocks": 50 + cpu}}


def test_the_load_ramp_needs_exact_answers_at_low_load_sparse_steps_at_full_load_and_no_failure():
    from soak_ramp import level_row, ramp_lines, ramp_verdict

    full, sparse = [["K", "V1", "V2", "."]], [["K", "V1", "V9", "."]]
    low = level_row(ramp_level(1), full, sparse)
    assert (low["completed"], low["identical_to_full"], low["identical_to_sparse"]) == (2, 2, 0)
    high = level_row(ramp_level(8, text="K V1 V9 .", exact=0.25, cpu=40), full, sparse)
    assert (high["identical_to_full"], high["identical_to_sparse"], high["cpu_blocks_per_token"]) == (1, 1, 4.0)
    verdict = ramp_verdict([low, high])
    assert all(verdict.values()), verdict
    result = soak.summarize(records(), RSS, STATS, 200, 0.0, ARGS, control=CONTROL)
    soak.with_ramp(result, {"pool_pages": 160, "seconds": 12.0, "levels": [low, high], "verdict": verdict})
    assert result["passed"] and "ramp_exact_at_low_load" in result["verdict"]
    assert any(line.startswith("| 8 | 2 | 0 | 0.25 | 4.0 |") for line in ramp_lines(result["ramp"]))
    wrong_at_low = level_row(ramp_level(1, text="K V1 V9 ."), full, sparse)
    failing = level_row(ramp_level(8, outcome="failed", text="HTTP 500", exact=0.25, cpu=40), full, sparse)
    never_sparse = level_row(ramp_level(8), full, sparse)
    for rows, broken in (([wrong_at_low, high], "ramp_exact_at_low_load"), ([low, failing], "ramp_zero_failed"),
                         ([low, never_sparse], "ramp_sparse_at_full_load")):
        assert not ramp_verdict(rows)[broken]
        soak.with_ramp(result, {"levels": rows, "verdict": ramp_verdict(rows)})
        assert not result["passed"]
