"""The plugin's own ops per decode layer around the engine (sglang_adapter/adapter_ops.py), counted on the real
wrapper and prediction code, as the planner prices them: the same at every batch and head count (and so are its
Python lines), and the planner's figures equal to the count."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang")

from scout_sglang.plan.planner import ADAPTER_PREDICTION_LAUNCHES, ADAPTER_WRAPPER_LAUNCHES  # noqa: E402

COUNT = """
import json
from scout_sglang.core.shape import ModelShape
from scout_sglang.sglang_adapter.adapter_ops import adapter_decode_counts
out = []
for heads, kv_heads, dim, hidden in ((4, 2, 16, 64), (32, 8, 128, 4096)):
    shape = ModelShape(num_layers=4, num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=dim)
    for batch in (1, 8):
        for q_norm in (False, True):
            c = adapter_decode_counts(shape, hidden, batch=batch, q_norm=q_norm)
            out.append([heads, batch, q_norm, c.wrapper_ops, c.wrapper_launches, c.prediction_ops,
                        c.prediction_launches, c.wrapper_lines, c.prediction_lines])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def counts():
    # SGLang builds its CPU rotary embedding only in a process that starts with the CPU engine switch on
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1")
    run = subprocess.run([sys.executable, "-c", COUNT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_counts_do_not_depend_on_the_batch_or_the_heads(counts):
    """Ops, launches and Python lines: nothing in the plugin's layer path loops over requests or heads."""
    for q_norm in (False, True):
        rows = {tuple(row[3:]) for row in counts if row[2] == q_norm}
        assert len(rows) == 1, rows
    wrapper_ops, wrapper_launches, prediction_ops, prediction_launches, wrapper_lines, prediction_lines = counts[0][3:]
    assert 0 < wrapper_launches <= wrapper_ops and 0 < prediction_launches <= prediction_ops
    assert wrapper_lines > 0 and prediction_lines > 0


def test_the_planner_prices_what_is_counted(counts):
    for _, _, q_norm, _, wrapper_launches, _, prediction_launches, _, _ in counts:
        assert wrapper_launches == ADAPTER_WRAPPER_LAUNCHES
        assert prediction_launches == ADAPTER_PREDICTION_LAUNCHES[q_norm]
    with_norm = next(row for row in counts if row[2])
    without = next(row for row in counts if not row[2])
    assert with_norm[6] > without[6]  # the per-head q_norm adds its ops


def test_the_count_needs_the_cpu_engine_switch_or_cuda():
    run = subprocess.run([sys.executable, "-c", COUNT], env={k: v for k, v in os.environ.items()
                                                             if k != "SGLANG_USE_CPU_ENGINE"},
                         capture_output=True, text=True, timeout=300)
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA builds SGLang's rotary embedding without the switch")
    assert run.returncode != 0 and "SGLANG_USE_CPU_ENGINE=1" in run.stderr
