"""docs/deployment.md explains every scout_* series and every field of the
statistics in /server_info, so a new metric cannot ship without its meaning."""

import ast
from pathlib import Path

from scout_sglang.sglang_adapter.metrics import COUNTERS, GAUGES
from scout_sglang.sglang_adapter.serving_stats import ServingStats

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "deployment.md"


def returned_dict_keys(path: Path, function: str) -> set[str]:
    """String keys of the dict literal a function returns."""
    tree = ast.parse(path.read_text())
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    returned = next(n.value for n in ast.walk(func) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict))
    return {k.value for k in returned.keys if isinstance(k, ast.Constant)}


def series() -> list[str]:
    return sorted(GAUGES) + [f"{name}_total" for name in COUNTERS]  # prometheus_client adds _total to counters


def fields() -> set[str]:
    adapter = ROOT / "scout_sglang" / "sglang_adapter"
    return (set(ServingStats().report({})) | returned_dict_keys(adapter / "memory_report.py", "usage")
            | returned_dict_keys(ROOT / "scout_sglang" / "core" / "engine.py", "usage")
            | returned_dict_keys(ROOT / "scout_sglang" / "core" / "engine.py", "cpu_worker_state")
            | returned_dict_keys(ROOT / "cpu_worker" / "core_plan.py", "as_report")
            | returned_dict_keys(ROOT / "scout_sglang" / "core" / "resident_pool.py", "usage")
            | {"resident_pool", "recent_exact_share", "resident_pool_pages"}
            | returned_dict_keys(ROOT / "cpu_worker" / "host_memory.py", "page_report")
            | {"tp_rank", "tp_size", "cpu_worker", "cores", "scout_ranks", "host_store_pages"}
            | {"digest_bytes_allocated", "window_and_resident_bytes_allocated", "dense_layer_bytes_allocated"})


def test_every_series_has_its_row():
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `scout_")]
    missing = [name for name in series() if not any(row.startswith(f"| `{name}") for row in rows)]
    assert not missing, f"docs/deployment.md has no row for {missing}"


def test_every_statistics_field_is_explained():
    page = PAGE.read_text()
    missing = sorted(name for name in fields() if f"`{name}`" not in page)
    assert len(fields()) > 30 and not missing, f"docs/deployment.md does not explain {missing}"
