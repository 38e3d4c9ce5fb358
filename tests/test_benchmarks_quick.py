"""Every benchmark with a --quick mode runs it to the end: benchmarks that nothing runs rot (bench_decode_step
crashed on main for a while, its pool wrapper left behind by the engine). Each prints one JSON object as its
last stdout line; --quick writes no result file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICK = sorted(path.name for path in (ROOT / "benchmarks").glob("*.py") if 'add_argument("--quick"' in path.read_text())


def test_the_benchmarks_with_a_quick_mode_are_the_expected_ones():
    assert "bench_decode_step.py" in QUICK and "bench_host_overhead.py" in QUICK and len(QUICK) >= 6, QUICK


@pytest.mark.parametrize("script", QUICK)
def test_the_quick_run_finishes_and_reports_json(script, tmp_path):
    results = ROOT / "benchmarks" / "results"
    before = {path: path.stat().st_mtime for path in results.rglob("*") if path.is_file()}
    env = dict(os.environ, PYTHONSAFEPATH="1")
    done = subprocess.run([sys.executable, "-P", str(ROOT / "benchmarks" / script), "--quick"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)  # bench_accuracy: ~5 min on 2 cores
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-3000:]}"
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(last, dict)
    if script == "bench_decode_step.py":
        assert_worker_discipline(last)
    after = {path: path.stat().st_mtime for path in results.rglob("*") if path.is_file()}
    assert after == before, f"{script} --quick wrote result files"


def test_the_gpu_bench_runs_every_part_in_its_dry_run(tmp_path):
    """`make bench-gpu` runs where nothing can be fixed between calls: its dry run (tiny shapes, this device)
    goes through every part, and a part that fails would show as false."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    done = subprocess.run([sys.executable, "-P", str(ROOT / "benchmarks" / "bench_gpu.py"), "--dry-run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = json.loads(done.stdout.strip().splitlines()[-1])["parts"]
    assert set(parts) == {"headline", "resident", "equal_batch", "zero_copy", "estimate_cost", "host", "capture", "recall", "tests",
                          "kernels"} and \
        all(parts.values()), parts


def test_the_gpu_tests_part_keeps_what_ran_when_pytest_times_out(monkeypatch):
    """A lent machine's call cannot be repeated: a CUDA test run cut by its timeout still reports its progress
    and the failures seen so far."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    bench_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_gpu)
    partial = "....F..\nFAILED tests/test_x.py::test_y - ValueError: boom\n"

    def cut(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output=partial.encode())

    monkeypatch.setattr(bench_gpu.subprocess, "run", cut)
    report = bench_gpu.part_tests(SimpleNamespace(dry=True), SimpleNamespace(tests_timeout=7))
    assert report["returncode"] == "timed out after 7 s"
    assert report["failed"] == ["FAILED tests/test_x.py::test_y - ValueError: boom"] and "....F.." in report["failures"]


def assert_worker_discipline(summary: dict) -> None:
    """bench_decode_step --quick (the CPU as the device): in the modes with a CPU part, the worker's threads used at
    most 1.5x their attend time in CPU time over the timed steps (they spin only while a part is under way), and
    none of them was runnable 5 ms after a step's end (they park)."""
    for mode in ("hgca", "scout"):
        row = summary["modes"][mode]
        assert row["cpu_busy_ms"] > 0, (mode, row)
        assert row["cpu_over_busy"] is not None and row["cpu_over_busy"] <= 1.5, (mode, row)
    assert all(row["runnable_after_step"] == 0 for row in summary["modes"].values()), summary["modes"]
