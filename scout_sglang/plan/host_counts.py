"""The engine's host work per layer: kernel launches and device-to-host reads, by mode and batch.

Read at run time from benchmarks/results/host_overhead.json (written by
benchmarks/bench_host_overhead.py, which counts the aten ops the engine
dispatches per layer on its torch path, what a CPU device runs, and the Triton
launches plus non-view aten ops per offloaded and per dense layer on its Triton
path, what a GPU runs): the engine changes, and so do these counts. Rows are
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
    gpu_launches_per_offloaded_layer, gpu_launches_per_dense_layer : float
        What a GPU executes per layer on the engine's Triton path: Triton launches plus aten ops that are not
        views, in an offloaded layer and in a dense one; `launches_per_layer` where the file has no such column.
    """

    ops_per_layer: float
    scalar_reads_per_layer: float
    how: str
    source: str
    launches_per_layer: float = 0.0
    plan_ms_per_step: float = 0.0
    gpu_launches_per_offloaded_layer: float = 0.0
    gpu_launches_per_dense_layer: float = 0.0

    def gpu_launches(self, *, dense: bool) -> float:
        """A GPU's launches in one layer of the engine (dense or offloaded)."""
        return self.gpu_launches_per_dense_layer if dense else self.gpu_launches_per_offloaded_layer


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


def host_counts(mode: str, batch: int, num_kv_heads: int, path: Path | None = None, *,
                recall_share: float = 0.0, variant: str = VARIANT) -> HostCounts:
    """Launches and host reads per layer of `mode` at `batch` requests, for a model with `num_kv_heads`;
    with `recall_share` of the steps running a recall, what a recall step adds (the file's "recall" rows over
    its "steady" rows at the same heads) weighted by that share. `variant` "exact": resident-first's exact path
    (the file's "exact" rows; it recalls nothing, so recall_share is ignored)."""
    rows, where = load_rows(path)
    mine = [r for r in rows if r["mode"] == mode]
    steady = [r for r in mine if r.get("variant") == variant]
    if not steady:
        return HostCounts(FALLBACK["ops_per_layer"], FALLBACK["scalar_reads_per_layer"], "assumed",
                          f"no {mode} {variant} rows in {where}; counts of the scout engine at batch 8, 8 KV heads",
                          launches_per_layer=FALLBACK["ops_per_layer"],
                          gpu_launches_per_offloaded_layer=FALLBACK["ops_per_layer"],
                          gpu_launches_per_dense_layer=FALLBACK["ops_per_layer"])
    counts = _at(steady, batch, num_kv_heads)
    source = (f"{Path(where).name}: {mode}{'' if variant == VARIANT else ' ' + variant}, {counts['heads']} KV "
              f"heads, batches {counts['batches']}, interpolated to {batch}")
    recalls = [r for r in mine if r.get("variant") == "recall"]
    if recall_share > 0 and recalls and variant == VARIANT:
        recall = _at(recalls, batch, num_kv_heads)
        base = _at([r for r in steady if r["num_kv_heads"] == recall["heads"]], batch, recall["heads"])
        for key in FIELDS:
            counts[key] += recall_share * (recall[key] - base[key])
        source += f"; recall steps ({recall_share:.2f} of the steps) from its recall rows"
    return HostCounts(counts["ops_per_layer"], counts["scalar_reads_per_layer"], "measured", source,
                      launches_per_layer=counts["launches_per_layer"], plan_ms_per_step=counts["plan_host_ms"],
                      gpu_launches_per_offloaded_layer=counts["gpu_launches_per_offloaded_layer"],
                      gpu_launches_per_dense_layer=counts["gpu_launches_per_dense_layer"])


FIELDS = ("ops_per_layer", "scalar_reads_per_layer", "launches_per_layer", "plan_host_ms",
          "gpu_launches_per_offloaded_layer", "gpu_launches_per_dense_layer")


def _at(rows: list[dict], batch: int, num_kv_heads: int) -> dict:
    """Every field of FIELDS at `batch`, from the rows at the measured KV heads nearest `num_kv_heads`."""
    heads = min({r["num_kv_heads"] for r in rows}, key=lambda h: (abs(h - num_kv_heads), -h))
    rows = [r for r in rows if r["num_kv_heads"] == heads]
    defaults = {"launches_per_layer": lambda r: r["ops_per_layer"], "plan_host_ms": lambda r: 0.0,
                "gpu_launches_per_offloaded_layer": _launches, "gpu_launches_per_dense_layer": _launches}
    out = {key: _interpolate([(r["batch"], r[key] if r.get(key) is not None else defaults[key](r)) for r in rows],
                             batch)
           for key in FIELDS}
    return {**out, "heads": heads, "batches": sorted(r["batch"] for r in rows)}


def _launches(row: dict) -> float:
    """A row's launches per layer on its torch path (its ops where the file predates the distinction)."""
    return row.get("launches_per_layer", row["ops_per_layer"])
