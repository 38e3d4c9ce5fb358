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
report = load("benchmarks/accuracy_report.py")
harness = load("benchmarks/harness/ruler_lm_eval.py")


def rows(task, fraction, correct_by_mode, path="engine", context=2048):
    return [bench.cell(path, task, mode, context, fraction, [c == "1" for c in bits])
            for mode, bits in correct_by_mode.items()]


def test_cells_carry_wilson_intervals_and_drops_are_paired_per_sequence():
    low, high = bench.wilson(8, 10)
    assert 0.49 < low < 0.5 and 0.94 < high < 0.95  # the textbook Wilson interval of 8/10
    assert bench.wilson(10, 10)[1] == 1.0 and bench.wilson(0, 10)[0] == 0.0
    # the same accuracy (50%) but on other sequences: a paired drop of 0 only where the same ones are right
    assert bench.paired_drop([True, True, False, False], [True, True, False, False]) == {"points": 0.0, "low": 0.0,
                                                                                       "high": 0.0}
    swapped = bench.paired_drop([True, True, False, False], [False, False, True, True])
    assert swapped["points"] == 0.0 and swapped["low"] < -50 and swapped["high"] > 50
    with pytest.raises(ValueError, match="paired"):
        bench.paired_drop([True], [True, False])


def test_the_checks_say_whether_the_suite_separates_the_modes_and_scout_keeps_up():
    table = rows("chain", 8, {"full": "1111", "quest": "1111", "infinigen": "1111", "hgca": "1111", "scout": "1111"})
    table += rows("chain", 16, {"full": "1111", "quest": "1110", "infinigen": "1111", "hgca": "1111", "scout": "1111"})
    table += [bench.cell("noise", "chain", "scout", 2048, 16, [True, False, True, True], prediction_cosine=0.8)]
    drops = bench.comparisons(table)
    quest = [d for d in drops if d["mode"] == "quest" and d["fraction"] == 16][0]
    assert quest["against"] == "full" and quest["points"] == 25.0
    noise = [d for d in drops if d["path"] == "noise"][0]
    assert noise["against"] == "quest" and noise["points"] == 0.0  # both miss one, not the same one
    verdict = bench.checks(drops)
    assert verdict["separates_at_1_16"] == [("quest", "chain")]
    assert verdict["scout_within_1_at_1_8"] and verdict["scout_within_3_at_1_16"]
    table += rows("common", 8, {"full": "1111", "scout": "1101"})
    assert not bench.checks(bench.comparisons(table))["scout_within_1_at_1_8"]


def test_the_report_tables_every_cell_drop_and_the_noise_sweep(tmp_path):
    table = rows("niah", 8, {"full": "1111", "quest": "1110", "infinigen": "1100", "hgca": "1111", "scout": "1111"})
    table[-1]["query_cosine"] = {"1": 0.9512, "2": 0.8871}
    table += [bench.cell("noise", "niah", "scout", 2048, 8, [True, True, False, True], prediction_cosine=0.6)]
    table += rows("niah", 8, {"full": "11", "scout": "10"}, path="server")
    drops = bench.comparisons(table)
    text = report.markdown(table, drops, bench.checks(drops), {"model": "m", "samples": 4, "device": "cpu"})
    assert "| niah | 2048 | 1/8 | 100.0 [51, 100] | 75.0 [30, 95] | 50.0 [15, 85] |" in text
    assert "| engine | niah | 2048 | 1/8 | +25.0 [" in text
    assert "| niah | 2048 | 1/8 | 0.951 | 0.887 | 0.919 |" in text
    assert "c = 0.6" in text and "## SGLang server" in text
    report.plot(table, drops, tmp_path / "accuracy.png")
    assert (tmp_path / "accuracy.png").stat().st_size > 10_000


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
