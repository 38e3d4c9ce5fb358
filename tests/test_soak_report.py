"""The soak's verdict: a failed request, a wrong answer, RSS growth or pages left in use each fail it."""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import soak  # noqa: E402

ARGS = SimpleNamespace(seconds=100.0, clients=2, disconnect=0.1, faults=0.0, prompts=2, lengths="256")
STATS = {"usage": {"requests": 0, "host_pages": 0, "device_window_pages": 0, "device_full_pages": 0},
         "cpu_fallbacks": {"error": 0, "deadline": 0}, "decode_steps": 10}
RSS = [{"t": t, "rss_bytes": 1000} for t in range(0, 100, 10)]


def records(**last):
    done = [{"t": float(t), "latency_s": 0.5, "outcome": "completed", "identical": True} for t in range(0, 100, 5)]
    done.append({"t": 1.0, "latency_s": 0.1, "outcome": "disconnected"})
    return done[:-2] + [{**done[-2], **last}] + done[-1:]


def test_a_clean_run_passes_and_counts_every_outcome():
    result = soak.summarize(records(), RSS, STATS, 200, 0.0, ARGS)
    assert result["passed"], result["verdict"]
    assert (result["completed"], result["disconnected"], result["failed"], result["identical"]) == (20, 1, 0, 20)
    assert result["latency_s"]["p50"] == 0.5 and len(result["latency_over_time"]) == 10


def test_each_defect_fails_the_verdict():
    wrong = soak.summarize(records(identical=False), RSS, STATS, 200, 0.0, ARGS)
    assert not wrong["passed"] and not wrong["verdict"]["all_identical"] and wrong["mismatches"]
    failed = soak.summarize(records(outcome="failed", error="HTTP 500"), RSS, STATS, 200, 0.0, ARGS)
    assert not failed["passed"] and failed["failed"] == 1
    growing = RSS[:-2] + [{"t": 80, "rss_bytes": 1100}, {"t": 90, "rss_bytes": 1100}]
    assert not soak.summarize(records(), growing, STATS, 200, 0.0, ARGS)["verdict"]["rss_growth_under_5pct"]
    leaking = {**STATS, "usage": {**STATS["usage"], "host_pages": 3}}
    assert soak.summarize(records(), RSS, leaking, 200, 0.0, ARGS)["idle_pages"] == 3
    assert not soak.summarize(records(), RSS, leaking, 200, 0.0, ARGS)["passed"]


def test_a_shared_prefix_share_needs_prefix_hits_and_counts_its_answers():
    args = SimpleNamespace(**vars(ARGS), shared_prefix=0.25)
    shared = [{**r, "shared_prefix": True} if r["outcome"] == "completed" and r["t"] < 20 else r for r in records()]
    missed = soak.summarize(shared, RSS, STATS, 200, 0.0, args)
    assert not missed["passed"] and not missed["verdict"]["prefix_reused"]
    reused = soak.summarize(shared, RSS, {**STATS, "prefix": {"hits": 3, "prefill_tokens_saved": 3072}}, 200, 0.0,
                            args)
    assert reused["passed"] and reused["shared_prefix_completed"] == reused["shared_prefix_identical"] == 4


def test_shared_prefix_prompts_start_with_one_preamble():
    from scout_sglang.retrieval import data

    pool = [data.Sample(prompt=[1, 10 + i, 11 + i], answer=[], needle_depth=0.0) for i in range(8)]
    samples, shared = soak.with_shared_prefix(pool, 0.25, seed=3)
    assert shared == {0, 4}
    assert samples[0].prompt[1:1 + soak.PREAMBLE_TOKENS] == samples[4].prompt[1:1 + soak.PREAMBLE_TOKENS]
    assert samples[0].prompt[-2:] == pool[0].prompt[-2:] and samples[1] is pool[1]
