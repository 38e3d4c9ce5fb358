"""The soak's load ramp: resident-first serving (SCOUT_RESIDENT_FIRST=on) as the load rises, every answer checked.

A second server at the soak's setting, with resident-first on and a pool of --ramp-pool pages (it holds the
longest prompt whole, but not many prompts at once), gets 1, then more concurrent clients, each level for
--ramp-seconds (completions, not streamed). Per level: the requests, failures, latency, the exact share of the
server's recent steps while the level runs, the CPU blocks per decoded token, and the answers identical to full
attention's (the reference decoder in mode full) and to the sparse setting's (the soak's reference). At one
client every request fits: exact, no CPU part, full attention's answers. At the last level the pool is short:
requests turn sparse, and none fails. soak.py runs it after the soak and adds its section to the report.
"""

from __future__ import annotations

import random
import threading
import time


def run_level(base: str, texts: list[str], clients: int, seconds: float, ask, stats, timeout: float) -> dict:
    """`clients` client threads asking random prompts for `seconds` -> the level's records and the server's
    statistics before, in the middle and after."""
    records, lock = [], threading.Lock()
    end = time.monotonic() + seconds

    def loop(index: int) -> None:
        rng = random.Random(7000 + 100 * clients + index)
        while time.monotonic() < end:
            pick, start = rng.randrange(len(texts)), time.monotonic()
            outcome, text = ask(base, texts[pick], chat=False, stream=False, disconnect=False, timeout=timeout)
            with lock:
                records.append({"prompt": pick, "outcome": outcome, "text": text,
                                "latency_s": time.monotonic() - start})

    before = stats(base)
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 2)
    middle = stats(base)  # every client busy: the exact share at this load
    for thread in threads:
        thread.join()
    return {"clients": clients, "records": records, "before": before, "middle": middle, "after": stats(base)}


def level_row(level: dict, full_answers: list, sparse_answers: list) -> dict:
    """One level's figures from run_level's result."""
    records, before, after = level["records"], level["before"], level["after"]
    completed = [r for r in records if r["outcome"] == "completed"]
    decoded = after["decoded_tokens"] - before["decoded_tokens"]
    latencies = sorted(r["latency_s"] for r in completed)
    return {
        "clients": level["clients"], "requests": len(records), "completed": len(completed),
        "failed": sum(r["outcome"] == "failed" for r in records),
        "identical_to_full": sum(r["text"].split() == full_answers[r["prompt"]] for r in completed),
        "identical_to_sparse": sum(r["text"].split() == sparse_answers[r["prompt"]] for r in completed),
        "exact_share": level["middle"]["resident_pool"]["recent_exact_share"],
        "pool_pages_used": level["middle"]["resident_pool"]["used"],
        "cpu_blocks_per_token": round((after["cpu_blocks"] - before["cpu_blocks"]) / decoded, 3) if decoded else 0.0,
        "latency_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "failures": [r["text"] for r in records if r["outcome"] == "failed"][:3],
    }


def ramp_verdict(rows: list[dict]) -> dict:
    """Exact at one client (every step exact, no CPU block, full attention's answers), sparse at the last level
    (the pool ran short), and no failure anywhere."""
    low, high = rows[0], rows[-1]
    return {
        "ramp_zero_failed": all(row["failed"] == 0 for row in rows),
        "ramp_exact_at_low_load": low["exact_share"] == 1.0 and low["cpu_blocks_per_token"] == 0 and
        low["identical_to_full"] == low["completed"] > 0,
        "ramp_sparse_at_full_load": high["exact_share"] < 1.0 and high["cpu_blocks_per_token"] > 0,
    }


def ramp_lines(ramp: dict) -> list[str]:
    """The report's section."""
    lines = ["## Load ramp: resident-first", "",
             f"A second server at the same setting with `SCOUT_RESIDENT_FIRST=on` and a pool of {ramp['pool_pages']} "
             f"pages (the longest prompt fits whole, a few prompts together), {ramp['seconds']:.0f} s per level of "
             "concurrent clients (completions, not streamed). The exact share is the server's over its recent steps "
             "in the middle of the level; answers are compared with full attention's (the reference decoder in mode "
             "full) and with the sparse setting's.", "",
             "| clients | requests | failed | exact share | CPU blocks per token | pool pages used | identical to full "
             "attention | identical to the sparse setting | latency p50 s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in ramp["levels"]:
        lines.append(f"| {row['clients']} | {row['requests']} | {row['failed']} | {row['exact_share']} | "
                     f"{row['cpu_blocks_per_token']} | {row['pool_pages_used']} | {row['identical_to_full']} of "
                     f"{row['completed']} | {row['identical_to_sparse']} of {row['completed']} | "
                     f"{row['latency_p50_s']} |")
    verdict = ramp["verdict"]
    return lines + ["", "Ramp verdict: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in verdict.items())]
