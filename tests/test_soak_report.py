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
