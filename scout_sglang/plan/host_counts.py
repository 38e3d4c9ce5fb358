"""The engine's host work per layer: kernel launches and device-to-host reads, by mode and batch.

Read at run time from benchmarks/results/host_overhead.json (written by
benchmarks/bench_host_overhead.py, which counts the aten ops the engine
dispatches per layer): the engine changes, and so do these counts. Rows are
taken at the measured number of KV heads nearest the model's, interpolated
linearly in the batch and extended past the largest measured batch along the
last segment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "host_overhead.json"
VARIANT = "steady"  # a decode step with no first fill and no recall due (the common step)
# Without the file: what the counts were when this model was written (scout, 8 KV heads, batch 8). Used only
# when no measurement can be read, and labelled assumed.
FALLBACK = {"ops_per_layer": 1365.0, "scalar_reads_per_layer": 68.0}


@dataclass(frozen=True)
class HostCounts:
    """Per-layer host work of one mode at one batch size.

    Parameters
    ----------
    ops_per_layer : float
        Aten ops dispatched per layer, views included.
    scalar_reads_per_layer : float
        Device-to-host reads per layer (each a synchronisation on a GPU).
    how, source : str
        As in Figure.
    launches_per_layer : float
        Ops that launch a kernel on a GPU (views and other metadata-only ops do not); `ops_per_layer` where the
        file predates the distinction.
    plan_ms_per_step : float
        Host ms of the engine's once-a-step work (begin_step's plan and end_step's bookkeeping and host copies of
        completed blocks), measured on the host that wrote the file; 0 where the file has no such column.
    """

    ops_per_layer: float
    scalar_reads_per_layer: float
    how: str
    source: str
    launches_per_layer: float = 0.0
    plan_ms_per_step: float = 0.0


def _interpolate(points: list[tuple[int, float]], batch: float) -> float:
    """Piecewise linear through (batch, value) points, extended along the end segments."""
    points = sorted(points)
    if len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if batch <= x1 or (x1, y1) == points[-1]:
            return max(0.0, y0 + (y1 - y0) * (batch - x0) / (x1 - x0))
    raise AssertionError("unreachable")


def load_rows(path: Path | None = None) -> tuple[list[dict], str]:
    """The rows of host_overhead.json and its path ([] if absent)."""
    path = Path(path or DEFAULT_PATH)
    if not path.is_file():
        return [], str(path)
    return json.loads(path.read_text()).get("rows", []), str(path)


def host_counts(mode: str, batch: int, num_kv_heads: int, path: Path | None = None) -> HostCounts:
    """Launches and host reads per layer of `mode` at `batch` requests, for a model with `num_kv_heads`."""
    rows, where = load_rows(path)
    rows = [r for r in rows if r["mode"] == mode and r.get("variant") == VARIANT]
    if not rows:
        return HostCounts(FALLBACK["ops_per_layer"], FALLBACK["scalar_reads_per_layer"], "assumed",
                          f"no {mode} rows in {where}; counts of the scout engine at batch 8, 8 KV heads",
                          launches_per_layer=FALLBACK["ops_per_layer"])
    heads = min({r["num_kv_heads"] for r in rows}, key=lambda h: (abs(h - num_kv_heads), -h))
    rows = [r for r in rows if r["num_kv_heads"] == heads]
    ops = _interpolate([(r["batch"], r["ops_per_layer"]) for r in rows], batch)
    reads = _interpolate([(r["batch"], r["scalar_reads_per_layer"]) for r in rows], batch)
    launches = _interpolate([(r["batch"], r.get("launches_per_layer", r["ops_per_layer"])) for r in rows], batch)
    plan = _interpolate([(r["batch"], r.get("plan_host_ms", 0.0)) for r in rows], batch)
    batches = sorted(r["batch"] for r in rows)
    return HostCounts(ops, reads, "measured",
                      f"{Path(where).name}: {mode}, {heads} KV heads, batches {batches}, interpolated to {batch}",
                      launches_per_layer=launches, plan_ms_per_step=plan)
