"""The accuracy benchmark's report and the lm-evaluation-harness driver, on
made-up numbers (the real runs need the model or a GPU; see benchmarks/)."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(relative):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load("benchmarks/bench_accuracy.py")
harness = load("benchmarks/harness/ruler_lm_eval.py")


def rows_for(accuracies, context=2048, budget=256, path="engine"):
    return [{"path": path, "mode": mode, "context": context, "budget": budget, "accuracy": value, "samples": 10}
            for mode, value in accuracies.items()]


def test_scouts_drop_is_measured_against_full_and_quest_of_the_same_cell():
    rows = rows_for({"full": 1.0, "quest": 0.9, "infinigen": 0.5, "hgca": 0.9, "scout": 0.85})
    rows += rows_for({"full": 1.0, "quest": 1.0, "infinigen": 1.0, "hgca": 1.0, "scout": 1.0}, budget=1024)
    drops = bench.scout_drops(rows)
    assert drops == [
        {"path": "engine", "context": 2048, "budget": 256, "scout": 0.85, "drop_vs_full_points": 15.0,
         "drop_vs_quest_points": 5.0},
        {"path": "engine", "context": 2048, "budget": 1024, "scout": 1.0, "drop_vs_full_points": 0.0,
         "drop_vs_quest_points": 0.0}]
    text = bench.markdown(rows, drops, {"model": "m", "samples": 10, "device": "cpu"})
    assert "| engine | 2048 | 256 | 100.0 | 90.0 | 50.0 | 90.0 | 85.0 |" in text
    assert "| engine | 2048 | 256 | 15.0 | 5.0 |" in text


def test_scouts_predicted_query_cosine_is_tabled_per_layer_for_engine_cells_only():
    rows = rows_for({"full": 1.0, "quest": 1.0, "scout": 0.9})
    rows[-1]["query_cosine"] = {"1": 0.3214, "2": 0.9987}
    rows += rows_for({"full": 1.0, "quest": 1.0, "scout": 0.9}, path="server")
    text = bench.markdown(rows, bench.scout_drops(rows), {"model": "m", "samples": 10, "device": "cpu"})
    assert "| context | budget | layer 1 | layer 2 |" in text
    assert "| 2048 | 256 | 0.321 | 0.999 |" in text
    assert bench.cosine_lines(rows_for({"full": 1.0, "scout": 0.9})) == []  # nothing measured: no table


def test_the_harness_runs_lm_eval_against_the_servers_completions_endpoint(tmp_path):
    args = SimpleNamespace(served_name="model", tokenizer=None, model=Path("/m"), concurrency=4, max_length=4096,
                           tasks=["niah_single_1"], lengths=[4096], limit=5)
    command = harness.lm_eval_command(Path("/py"), "http://127.0.0.1:1", args, tmp_path)
    assert command[:5] == ["/py", "-m", "lm_eval", "run", "--model"]
    assert "base_url=http://127.0.0.1:1/v1/completions" in command[command.index("--model_args") + 1]
    assert json.loads(command[command.index("--metadata") + 1])["max_seq_lengths"] == [4096]
    (tmp_path / "stock" / "m").mkdir(parents=True)
    (tmp_path / "stock" / "m" / "results_1.json").write_text(json.dumps(
        {"results": {"niah_single_1": {"alias": "x", "4096,none": 0.5, "4096_stderr,none": 0.1}}}))
    assert harness.scores(tmp_path / "stock") == {"niah_single_1": {"4096,none": 0.5}}
    with pytest.raises(RuntimeError, match="no results"):
        harness.scores(tmp_path / "empty")
    text = harness.table({"stock": {"t": {"m": 0.5}}, "scout": {"t": {"m": 0.25}}})
    assert "| t | m | 0.5 | 0.25 |" in text


def test_the_harness_keeps_this_machines_paths_out_of_the_results_it_writes(tmp_path):
    results = tmp_path / "results_1.json"
    results.write_text(json.dumps({"config_source": f"{harness.REPO}/.venv-harness/lm_eval/tasks/x.yaml"}))
    harness.strip_machine_paths(results)
    assert json.loads(results.read_text()) == {"config_source": "<repo>/.venv-harness/lm_eval/tasks/x.yaml"}
