"""The GPU benchmark's resident-first part: scout with SCOUT_RESIDENT_FIRST=on against full attention at the batches
full attention fits, where a server's device memory holds every request's K/V (the low load a plugin must cost
nothing at).

At each context and batch full attention fits on the device, both run on the same stack of
`--equal-batch-layers` layers; scout's pool is sized as a server sizes it (memory_report.resident_pool_size) from
the K/V budget a stock server would have on this device (85% of its free memory, less the weights), so every
request is exact when that budget holds them (and, once its row is filled, every step replays the graph captured
on the exact path). The row says the share of requests attended exactly, the steps on the exact path and the
step's costliest kernels; the ratio is scout's tokens/s over full's (target: at least 0.95). Last, resident-first scout
at the headline's equal-memory shape (the issue's other target: at least 3x full attention's tokens/s there); then,
per context, at the largest batch full attention was measured at, a pool one request short of holding them all:
every request sparse with a row that holds most of it, which the device part attends whole (where the planner's
margin over full attention is thinnest).

Both decode with the engine's kernel, so first, on its own, that kernel against a vendor's at the low-load shapes
(decode_kernels.py): what the ratio to a stock SGLang server's full attention would add.
"""

from __future__ import annotations

import time

import torch

from .decode_kernels import decode_kernel_rates, decode_kernels_text
from .parts import equal_memory, fits, planned_pool, run_config, stack_shape, stack_steps

TARGET = 0.95  # scout's tokens/s over full attention's at a batch full attention fits
BATCHES = (1, 8, 32, 64)
STOCK_SHARE = 0.85  # of the device's free memory, what a stock server gives its weights and K/V (fits())


def stock_kv_bytes(setup, shape) -> int:
    """What a stock server would give its K/V on this device now: STOCK_SHARE of the free memory less the stack's
    weights (a huge budget for the dry run, whose device is the CPU)."""
    if setup.dry:
        return 2**40
    return int(STOCK_SHARE * torch.cuda.mem_get_info()[0]) - shape.num_layers * shape.weight_bytes()


def server_pool(setup, shape, batch: int, context: int, steps: int) -> dict:
    """The resident pool a server would size for `batch` requests of `context` tokens within stock_kv_bytes, in
    pages of one block of every offloaded layer (memory_report.resident_pool_size)."""
    from scout_sglang.config import ScoutConfig
    from scout_sglang.sglang_adapter.memory_report import engine_total_pages, resident_pool_size

    config = ScoutConfig(mode="scout", block_size=setup.block, token_budget=setup.budget, resident_first=True)
    request_tokens = context + steps + 2 * setup.block  # what StackRun's engine holds per request
    sizing = resident_pool_size(config, num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
                                head_dim=shape.head_dim, itemsize=2 if not setup.dry else 4,
                                total_pages=engine_total_pages(batch * request_tokens, setup.block, batch),
                                slots=batch, kv_budget_bytes=stock_kv_bytes(setup, shape))
    return {key: sizing[key] for key in ("pages", "limit", "floor", "ceiling")}


def part_resident(setup, args, deadline: float) -> dict:
    """Full and resident-first scout at each context and each batch of BATCHES full attention fits (the dry run:
    its one batch), the shorter context first; then resident-first scout at the headline's equal-memory shape (the
    whole stack at scout's batch, the pool: the device budget less scout's other stores). After each row the part
    so far goes to args.checkpoint (where given), so a call cut short keeps the rows it measured: the first
    resident-first row of each row width compiles the wide-row stages (about a minute on Triton 3.6)."""
    shape = stack_shape(setup, args.equal_batch_layers)
    checkpoint = getattr(args, "checkpoint", None) or (lambda part: None)
    out = dict(layers=shape.num_layers, target=TARGET, rows=[], scout_over_full={})
    out["decode_kernels"] = decode_kernel_rates(setup, deadline)  # seconds: the kernels alone, one layer
    checkpoint(out)
    rows = out["rows"]
    for context in setup.contexts:
        for batch in (setup.batches if setup.dry else BATCHES):
            rows.extend(low_load_rows(setup, shape, batch, context, deadline))
            out["scout_over_full"] = ratios(rows)
            out["scout_over_full_overlapped"] = ratios(rows, "overlapped_tokens_per_s")
            checkpoint(out)
    plan = equal_memory(setup, args)
    batch, limit = plan["batches"]["scout"]
    if time.perf_counter() > deadline:
        out["equal_memory"] = dict(batch=batch, limit=limit, skipped="the call's time budget ran out")
        return out
    # the dry run's pool holds its 3 tiny requests whole (every one exact)
    pool = dict(pages=3 * (plan["context"] // setup.block + 4), limit="dry run") if setup.dry else \
        planned_pool(plan["capacities"]["scout"], plan["budgets"])
    out["equal_memory"] = dict(batch=batch, limit=limit, pool=pool) | run_config(
        setup, stack_shape(setup), "scout", batch, plan["context"], resident_first=True,
        resident_pool_blocks=pool["pages"])
    checkpoint(out)
    for context in setup.contexts:  # last: where the planner's margin is thinnest
        rows.extend(past_exact_rows(setup, shape, context, rows, deadline))
        out["scout_over_full"] = ratios(rows)
        out["scout_over_full_overlapped"] = ratios(rows, "overlapped_tokens_per_s")
        checkpoint(out)
    return out


PAST_EXACT = "past_exact"  # the variant of a row whose pool holds one request fewer than its batch


def past_exact_rows(setup, shape, context: int, rows: list[dict], deadline: float) -> list[dict]:
    """Resident-first scout at the largest batch full attention was measured at for `context`, with a pool one
    request short of holding them all: each request's even share is just below its blocks, so every one is
    sparse with a row that holds most of it, attended whole (the planner's least ratio past the exact batch).
    Against that batch's full attention row."""
    measured = [r["batch"] for r in rows if r.get("mode") == "full" and r.get("context") == context
                and "step_ms" in r]
    if not measured:
        return []
    batch = max(measured)
    if batch < 2:
        return []
    if time.perf_counter() > deadline:
        return [dict(mode="scout", variant=PAST_EXACT, batch=batch, context=context,
                     skipped="the call's time budget ran out")]
    from scout_sglang.config import ScoutConfig

    config = ScoutConfig(mode="scout", block_size=setup.block, token_budget=setup.budget)
    outside = (context + stack_steps(setup.steps)) // setup.block - config.sink_blocks - config.local_blocks
    # at least every request's resident_blocks (the engine's floor; the dry run's tiny requests have few more)
    pages = max((batch - 1) * outside, batch * config.resident_capacity)
    pool = dict(pages=pages, limit=f"{batch - 1} requests' blocks outside the window, for {batch}")
    row = run_config(setup, shape, "scout", batch, context, resident_first=True, resident_pool_blocks=pool["pages"])
    return [row | dict(variant=PAST_EXACT, pool=pool)]


def low_load_rows(setup, shape, batch: int, context: int, deadline: float) -> list[dict]:
    """Full attention and resident-first scout at one shape (or why not)."""
    ok, why = fits(setup, "full", shape, batch, context)
    if not ok:
        return [dict(batch=batch, context=context, skipped=f"full attention does not fit: {why}")]
    if time.perf_counter() > deadline:
        return [dict(batch=batch, context=context, skipped="the call's time budget ran out")]
    rows = [run_config(setup, shape, "full", batch, context)]
    if time.perf_counter() > deadline:
        return rows + [dict(mode="scout", batch=batch, context=context, skipped="the call's time budget ran out")]
    try:
        pool = server_pool(setup, shape, batch, context, stack_steps(setup.steps))
    except Exception as error:  # noqa: BLE001 - reported in the row, the part goes on
        return rows + [dict(mode="scout", batch=batch, context=context, error=f"{type(error).__name__}: {error}")]
    row = run_config(setup, shape, "scout", batch, context, resident_first=True, resident_pool_blocks=pool["pages"])
    return rows + [row | dict(pool=pool)]


def ratios(rows: list[dict], key: str = "tokens_per_s") -> dict:
    """'<context>x<batch>' -> scout's tokens/s over full's, where both were measured (key: the steps timed one by
    one, or overlapped_tokens_per_s: back to back as SGLang's overlap scheduler runs them)."""
    out = {}
    for row in rows:
        if row.get("mode") != "scout" or key not in row:
            continue
        full = next((r for r in rows if r.get("mode") == "full" and key in r
                     and (r["batch"], r["context"]) == (row["batch"], row["context"])), None)
        if full is not None:
            variant = f"+{row['variant']}" if row.get("variant") else ""
            out[f"{row['context']}x{row['batch']}{variant}"] = round(row[key] / full[key], 3)
    return out


def resident_text(part: dict) -> list[str]:
    """The report's section: one line per shape, scout against full with the exact share and the CPU ratio."""
    lines = ["## Resident-first at the batches full attention fits", "",
             f"{part.get('layers')} layers of Qwen3-8B's shape; scout with SCOUT_RESIDENT_FIRST=on, its pool sized "
             "as a server sizes it from a stock server's K/V budget on this device. Target: scout's tokens/s at least "
             f"{part.get('target')}x full attention's.", "",
             "Steps timed one by one (the plan, then the replay, then a wait) and back to back as SGLang's overlap "
             "scheduler runs them (each step planned while the device runs the one before).", "",
             "| context | batch | full ms | scout ms | scout / full tokens/s | overlapped: full ms | scout ms "
             "| scout / full | exact share | exact-path steps | CPU ratio | pool pages |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    overlapped = part.get("scout_over_full_overlapped", {})
    rows = part.get("rows", [])
    for key, ratio in part.get("scout_over_full", {}).items():
        shape, _, variant = key.partition("+")
        context, batch = (int(x) for x in shape.split("x"))
        at = [r for r in rows if (r.get("context"), r.get("batch")) == (context, batch)]
        full = next((r for r in at if r.get("mode") == "full"), {})
        scout = next((r for r in at if r.get("mode") == "scout" and r.get("variant", "") == variant), {})
        batch = f"{batch} (pool one request short)" if variant == PAST_EXACT else batch
        lines.append(f"| {context} | {batch} | {full.get('step_ms')} | {scout.get('step_ms')} | {ratio} "
                     f"| {full.get('overlapped_step_ms', '-')} | {scout.get('overlapped_step_ms', '-')} "
                     f"| {overlapped.get(key, '-')} | {(scout.get('resident') or {}).get('exact_share', '-')} "
                     f"| {(scout.get('resident') or {}).get('exact_path_steps', '-')} | {scout.get('cpu_ratio', '-')} "
                     f"| {(scout.get('pool') or {}).get('pages', '-')} |")
    return lines + [""] + decode_kernels_text(part.get("decode_kernels"))
