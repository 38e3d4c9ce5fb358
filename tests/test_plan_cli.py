"""python -m scout_sglang.plan end to end: the table, --json, --plot, and clear errors on bad input."""

import json
import subprocess
import sys

import pytest

from scout_sglang.plan.__main__ import main
from scout_sglang.plan.figures import HOW
from scout_sglang.plan.models import bundled_config_path

ARGS = ["--model", "Qwen3-14B", "--gpu", "H100", "--context", "65536", "--output-len", "1024", "--host-mem-gib", "512"]


def test_json_has_every_mode_and_labels_every_input(capsys):
    assert main([*ARGS, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["token_bytes"] == 160 * 1024
    assert set(report["modes"]) == {"full", "quest", "infinigen", "hgca", "scout"}
    assert all(figure["how"] in HOW for figure in report["inputs"].values())
    assert report["inputs"]["hbm_bandwidth"] == {"value": 3350, "unit": "GB/s", "how": "looked up",
                                                 "source": "H100: NVIDIA H100 SXM5 datasheet, PCIe Gen5 x16"}
    assert report["inputs"]["host_memory"]["how"] == "given"
    full, scout = report["modes"]["full"], report["modes"]["scout"]
    assert scout["capacity"]["max_batch"] > full["capacity"]["max_batch"] >= 1
    assert report["recommendation"]["token_budget"] in (1024, 2048, 4096)
    # resident-first at scout's max batch: the stock KV budget less scout's other stores, in pages
    pool, budget = scout["resident_pool"], report["budgets"]["device_kv"]
    assert pool["limit"] == "the stock KV budget" and pool["floor"] < pool["pages"] < pool["ceiling"]
    assert pool["bytes"] + pool["other_device_bytes"] <= pool["stock_kv_bytes"] < budget
    assert pool["exact_requests"] == pool["pages"] // pool["request_pages"] >= 1
    assert full["resident_pool"] is None


def test_the_table_names_modes_bounds_and_the_recommendation(capsys):
    assert main([*ARGS, "--budget", "1024"]) == 0
    out = capsys.readouterr().out
    assert "full (stock)" in out and "bound" in out and "GPU idle" in out and "budget 1024 tokens" in out
    assert "recommended: SCOUT_CONFIG=default SCOUT_TOKEN_BUDGET=" in out
    assert "(looked up: H100" in out and "(given: on the command line)" in out
    assert "with SCOUT_RESIDENT_FIRST=on at scout's max batch: resident-first pool: " in out


def test_a_config_json_and_a_plot(tmp_path, capsys):
    png = tmp_path / "plan.png"
    assert main(["--model", str(bundled_config_path()), "--gpu", "rtx-4090", "--context", "4096", "--output-len", "64",
                 "--scout-config", "tiny", "--dtype", "float32", "--json", "--plot", str(png)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["token_bytes"] == 3 * 2 * 2 * 32 * 4  # layers x (K, V) x KV heads x head dim x fp32
    assert png.stat().st_size > 1000


def test_the_cpu_split_is_reported_and_speeds_up_a_cpu_bound_scout(capsys):
    args = ["--model", "Qwen3-8B", "--gpu", "H100", "--context", "65536", "--host-mem-gib", "128", "--cpu-gbs", "50",
            "--change-rate", "0.11", "--modes", "full,scout", "--json"]
    steps = {}
    for split in ("off", "auto"):
        assert main([*args, "--cpu-split", split]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["cpu_split"] == split
        steps[split] = report["modes"]["scout"]["step"]
    assert steps["off"]["cpu_share"] == 1.0 and 0 < steps["auto"]["cpu_share"] < 1
    assert steps["auto"]["tokens_per_s"] > steps["off"]["tokens_per_s"]
    assert main([*args[:-1], "--cpu-split", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "CPU split CPU share 0.5" in out and "scout's CPU list, split (CPU share 0.5): 50% on the CPU" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "Qwen3-14B", "--gpu", "B300"], "unknown GPU 'B300'; known: H100, H200, A100, L40S, RTX4090"),
    (["--model", "/no/such/config.json"], "neither a preset"),
    (["--model", "Qwen3-14B", "--context", "0"], "--context must be > 0, got 0"),
    (["--model", "Qwen3-14B", "--gpu", "custom", "--hbm-gbs", "1000"], "--gpu custom needs --gpu-mem-gib, --pcie-gbs, --tflops"),
    (["--model", "Qwen3-14B", "--host-mem-gib", "-1"], "--host-mem-gib must be > 0, got -1.0"),
    (["--model", "Qwen3-14B", "--budget", "1000"], "token_budget (1000) must be a multiple of block_size (32)"),
    (["--model", "Qwen3-32B", "--gpu", "RTX4090"], "weights (61.0 GiB) do not fit"),
    (["--model", "Qwen3-14B", "--cpu-split", "half"], "--cpu-split must be off, auto or a CPU share in [0, 1], got"),
])
def test_bad_input_is_refused_with_a_reason(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_runs_as_a_module():
    completed = subprocess.run([sys.executable, "-P", "-m", "scout_sglang.plan", *ARGS, "--json"],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["modes"]["scout"]["step"]["bound"] in ("HBM", "compute", "CPU", "PCIe", "host")


@pytest.mark.parametrize("context", [65536, 16384])
def test_resident_first_at_full_attentions_batch_is_priced_on_the_exact_path(capsys, context):
    """Up to full attention's largest batch: how many the pool of a server at scout's largest batch keeps exact, the
    most request slots that keep all of them exact (its pool checked at those slots and one more; at 16k none
    does), and the exact path's step against full attention's at the batch held exact and every batch below it."""
    from scout_sglang.plan.models import load_model
    from scout_sglang.plan.planner import PlanRequest, hardware, plan, pool_at, quota
    from scout_sglang.plan.step_model import Workload, step_time

    args = [*ARGS[:4], "--context", str(context), *ARGS[6:]]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    low, full, scout = report["low_load"], report["modes"]["full"], report["modes"]["scout"]
    assert low["full_batch"] == full["capacity"]["max_batch"]
    assert low["exact_batch"] == min(low["full_batch"], scout["resident_pool"]["exact_requests"]) >= 1
    assert low["scout_exact"]["batch_size"] == low["full"]["batch_size"] == low["exact_batch"]
    assert low["scout_exact"]["cpu_ratio"] == 0 and low["scout_exact"]["pcie_bytes"] == 0
    request = PlanRequest(model=load_model("Qwen3-14B"), gpu="H100", context=context, output_len=1024,
                          overrides={"host_memory": 512})
    planned = plan(request)
    assert low["ratio"] == pytest.approx(low["scout_exact"]["tokens_per_s"] / low["full"]["tokens_per_s"], abs=1e-4)
    # the same bytes, and the engine's plan beside the previous step (SGLang's overlap scheduler)
    assert low["ratio"] == pytest.approx(1.0) and "overlap" in low["scout_exact"]["host_counts_source"]
    # every batch up to it, by doubling; the plan weighs most at one request
    ratios = {int(size): ratio for size, ratio in low["ratios"].items()}
    assert list(ratios) == sorted({*(2**i for i in range(8) if 2**i < low["exact_batch"]), low["exact_batch"]})
    assert ratios[low["exact_batch"]] == pytest.approx(low["ratio"], abs=1e-4)
    assert min(ratios.values()) == ratios[1] <= low["ratio"] + 1e-4
    # a server started with --disable-overlap-schedule: the plan in series, weighing most at one request
    serial = {int(size): ratio for size, ratio in low["ratios_plan_in_series"].items()}
    assert serial.keys() == ratios.keys() and min(serial.values()) == serial[1] < ratios[1]
    # past the exact batch, up to full attention's largest: the sparse step, by doubling, each request's resident
    # row its even share of the pool (attended whole)
    sparse = {int(size): ratio for size, ratio in low["ratios_sparse"].items()}
    if low["exact_batch"] < low["full_batch"]:
        first, last = low["exact_batch"] + 1, low["full_batch"]
        assert list(sparse) == sorted({first, last, *(2**i for i in range(8) if first < 2**i < last)})
        pool = scout["resident_pool"]
        for size, ratio in sparse.items():
            row = min(pool["request_pages"], max(planned["config"].resident_capacity, pool["pages"] // size))
            assert quota(planned["config"], pool, size) == row
            work = Workload(batch_size=size, context=context + 512, itemsize=2, change_rate=0.15, output_len=1024,
                            resident_row_blocks=row)
            steps = [step_time(mode, planned["config"], request.model, hardware(planned["figures"]), work,
                               exact=False, host_overhead_path=request.host_overhead_path) for mode in ("scout", "full")]
            assert ratio == pytest.approx(steps[0].tokens_per_s / steps[1].tokens_per_s, abs=1e-4)
    else:
        assert sparse == {}
    every = {**ratios, **sparse}
    assert low["lowest_ratio"] == {"batch": min(every, key=every.get), "ratio": min(every.values())}

    def keeps(slots: int) -> bool:
        pool = pool_at(request, planned["config"], planned["budgets"], slots)
        return slots > 0 and pool["exact_requests"] >= low["full_batch"]

    slots = low["exact_slots"]
    if slots:
        assert keeps(slots) and (slots == scout["capacity"]["max_batch"] or not keeps(slots + 1))
    else:
        assert not keeps(low["full_batch"])  # not even as many slots as requests
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"up to full attention's max batch ({low['full_batch']} requests): " in out
    assert f"least of every batch full attention fits, plan overlapped: {low['lowest_ratio']['ratio']:.3f}x" in out
