"""Tensor parallelism through the real SGLang server: `--tp-size 2 --attention-backend scout` (two scheduler
processes, gloo all-reduce on the CPU) decodes token-identically to `--tp-size 1` at a covering budget and
equal to the reference decoder at a sparse one; each rank holds its share of the heads, its CPU worker runs on
its own CPUs, and /server_info and /metrics report both ranks."""

import re
import urllib.request

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.cpu_worker.cpu_sets import cpu_list_text, process_cpus, rank_share
from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, get_json
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow,
              pytest.mark.skipif(len(process_cpus()) < 2, reason="two ranks need two CPUs")]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny"}
COMMON = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "8192",
          "--max-running-requests", "8", "--disable-radix-cache", "--enable-metrics")
VOCAB = 263
NEW_TOKENS = 20


def tp_env(extra: dict) -> dict:
    """The CPU device binds each rank's threads where SGLANG_CPU_OMP_THREADS_BIND says (one list per rank): half
    of the CPUs each, whatever cores they sit on (no topology: two hardware threads of one core still split)."""
    cpus = process_cpus()
    bind = "|".join(cpu_list_text(rank_share(cpus, rank, 2, topology={})) for rank in range(2))
    return {**SCOUT_ENV, **extra, "SGLANG_CPU_OMP_THREADS_BIND": bind}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen3"), "qwen3", num_layers=4, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts((260, 700, 450), vocab=VOCAB, seed=11)


def serve(model_dir, prompts, tp: int, env: dict, log_path):
    """Greedy tokens of each prompt, every rank's statistics and the Prometheus text, from one server."""
    with launched_server(model_dir, *COMMON, "--tp-size", str(tp), env=env, log_path=log_path) as base:
        outputs = [generate(base, prompt, NEW_TOKENS)["output_ids"] for prompt in prompts]
        ranks = get_json(base + "/server_info")["internal_states"][0]["scout_ranks"]
        with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
            metrics = response.read().decode()
    return outputs, ranks, metrics


def test_two_resident_first_ranks_decode_like_one_at_a_covering_budget_and_report_each_rank(qwen3_dir, prompts,
                                                                                            tmp_path):
    """Two ranks with resident-first at the sparse budget, each pool sized from its rank's stock KV budget (capped
    here by the logical capacity), attend every request exactly: the tokens of one rank at a covering budget."""
    covering = {"SCOUT_TOKEN_BUDGET": "2048"}
    two, ranks, metrics = serve(qwen3_dir, prompts, 2, tp_env({"SCOUT_RESIDENT_FIRST": "on"}), tmp_path / "tp2.log")
    one, [single], _ = serve(qwen3_dir, prompts, 1, {**SCOUT_ENV, **covering}, tmp_path / "tp1.log")
    assert two == one
    for rank in ranks:
        pool = rank["resident_pool"]
        assert pool["sized_by"] == "the logical capacity" and pool["recent_exact_share"] == 1.0
        assert rank["cpu_blocks"] == 0 and pool["used"] == 0 and pool["pages"] > 0
    assert [r["tp_rank"] for r in ranks] == [0, 1] and {r["tp_size"] for r in ranks} == {2}
    assert single["tp_rank"] == 0 and single["tp_size"] == 1
    # each rank holds one of the model's two KV heads: half a token's bytes, the same tokens
    for rank in ranks:
        assert 2 * rank["memory"]["token_bytes"] == single["memory"]["token_bytes"]
        assert rank["memory"]["token_slots"] == single["memory"]["token_slots"]
        assert rank["decode_steps"] == single["decode_steps"] > 0
        assert rank["planning_device_reads"] == 0  # each rank planned from the scheduler's host copies
    # each rank's CPU worker threads run on CPUs of their own (read back from the OS)
    cpus = [set(rank["cpu_worker"]["cpus"]) for rank in ranks]
    assert all(cpus) and not cpus[0] & cpus[1]
    # one rank alone: its worker thread (SCOUT_CPU_GROUPS=1) pinned to one core of the process's, as the plan says
    assert len(single["cpu_worker"]["cpus"]) == 1 and set(single["cpu_worker"]["cpus"]) <= set(process_cpus())
    # the core plan says what it did: each rank's bound CPUs are all it has here, so its workers share them
    assert all(r["cores"]["shared"] and r["cores"]["worker_cpus"] == r["cores"]["host_cpus"] for r in ranks)
    assert single["cores"]["shared"] and "not bound" in single["cores"]["why"]
    for rank in ranks:
        steps = re.search(rf'^scout_decode_steps\{{tp_rank="{rank["tp_rank"]}"\}} (\S+)', metrics, re.M)
        assert steps and float(steps.group(1)) == rank["decode_steps"]
    text = (tmp_path / "tp2.log").read_text()
    for rank in range(2):
        said = f"scout: tensor-parallel rank {rank} of 2 (process {rank} of 2 on this host): 2 query and 1 KV heads"
        assert said in text


def test_two_ranks_at_a_sparse_budget_match_the_reference_decoder(qwen3_dir, prompts, tmp_path):
    two, ranks, _ = serve(qwen3_dir, prompts, 2, tp_env({}), tmp_path / "sparse.log")
    expected, _, _ = reference_outputs(qwen3_dir, SCOUT_ENV, prompts, NEW_TOKENS)
    assert two == expected
    for rank in ranks:  # both ranks attended part of the context on the CPU, and freed everything
        assert rank["cpu_blocks"] > 0 and rank["cpu_launched_ahead_fraction"] == 1.0
        assert rank["usage"] == {"requests": 0, "device_full_pages": 0, "host_pages": 0, "device_window_pages": 0}
