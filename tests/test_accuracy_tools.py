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


def test_the_checks_report_issue_47s_targets():
    table = rows("chain", 8, {"full": "1111", "quest": "1111", "infinigen": "1111", "hgca": "1111", "scout": "1111",
                              "scout+est": "1111"})
    table += rows("chain", 16, {"full": "1111", "quest": "1110", "infinigen": "1111", "hgca": "1111", "scout": "1111",
                                "scout+est": "1111"})
    table += rows("common", 8, {"full": "1" * 10, "quest": "1" * 8 + "00", "scout": "1" * 8 + "00",
                                "scout+est": "1" * 9 + "0"})
    table += rows("common", 16, {"full": "1" * 10, "quest": "1" * 6 + "0000", "scout": "1" * 5 + "0" * 5,
                                 "scout+est": "1" * 8 + "00"})
    table += [bench.cell("noise", "chain", "scout", 2048, 16, [True, False, True, True], prediction_cosine=0.8)]
    drops = bench.comparisons(table)
    quest = [d for d in drops if d["mode"] == "quest" and d["fraction"] == 16 and d["task"] == "chain"][0]
    assert quest["against"] == "full" and quest["points"] == 25.0
    noise = [d for d in drops if d["path"] == "noise"][0]
    assert noise["against"] == "quest" and noise["points"] == 0.0  # both miss one, not the same one
    gain = [d for d in drops if d["mode"] == "scout+est" and d["against"] == "scout" and d["task"] == "common"]
    assert sorted(d["points"] for d in gain) == [-30.0, -10.0]  # negative: the estimate gains
    verdict = bench.checks(drops, table)
    assert verdict["separates_at_1_16"] == [("quest", "chain"), ("quest", "common")]
    assert verdict["scout_est_within_2_at_1_8"] and verdict["scout_est_within_4_at_1_16"]
    assert verdict["common_scout_est"] == {8: 90.0, 16: 80.0}
    assert verdict["common_at_least_90_at_1_8"] and verdict["common_at_least_80_at_1_16"]
    assert verdict["estimate_never_costs_more_than_1_in_64"]
    assert verdict["scout_within_2_of_quest"] is False
    assert verdict["scout_worst_against_quest"] == (10.0, "common", 16)
    table += rows("values", 8, {"full": "1111", "scout": "1111", "scout+est": "1101"})
    verdict = bench.checks(bench.comparisons(table), table)
    assert verdict["scout_est_within_2_at_1_8"] is False
    assert verdict["estimate_never_costs_more_than_1_in_64"] is False


def test_a_target_whose_cells_did_not_run_is_not_measured_rather_than_missed():
    table = rows("common", 8, {"full": "1111", "scout": "1100", "scout+est": "1110"})  # no quest, no 1/16
    verdict = bench.checks(bench.comparisons(table), table)
    assert verdict["scout_within_2_of_quest"] is None and verdict["common_at_least_80_at_1_16"] is None
    assert verdict["common_at_least_90_at_1_8"] is False and verdict["estimate_never_costs_more_than_1_in_64"]
    assert verdict["scout_est_within_2_at_1_8"] is None  # only common ran: the target is on the other tasks
    assert verdict["separates_at_1_16"] is None  # no other sparse mode ran at 1/16
    lines = report.target_lines(verdict)
    assert any("Quest in every cell: not measured" in line for line in lines)
    assert any("separates the modes" in line and line.endswith(": not measured") for line in lines)


def test_partial_credit_is_the_share_of_the_answers_words_found():
    from scout_sglang.retrieval import tasks

    sample = tasks.TaskSample("values", prompt=[1, 2], answer=[10, 11, 12, 13, 14], unordered_from=1)
    assert sample.partial_credit([10, 12, 11, 14, 13]) == 1.0 and sample.is_correct([10, 12, 11, 14, 13])
    assert sample.partial_credit([10, 11, 11, 11, 99]) == 0.4 and not sample.is_correct([10, 11, 11, 11, 99])
    cell = bench.cell("engine", "values", "scout", 2048, 8, [True, False], credits=[1.0, 0.4])
    assert cell["partial"] == 0.7 and cell["partial_low"] < 0.7 < cell["partial_high"]
    assert bench.split_variant("scout+est") == ("scout", True) and bench.split_variant("oracle") == ("oracle", False)
    assert bench.engine_config("oracle", 256, estimate=True).mode == "quest"
    assert bench.server_env("hgca", 256, estimate=True)["SCOUT_ESTIMATE"] == "on"


def test_the_oracle_selection_scores_each_block_by_its_share_of_the_attention():
    import torch

    oracle = load("benchmarks/oracle_selection.py")
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(9, 2, 4, 8, generator=gen)  # [P, Hkv, S, D]
    q = torch.randn(2, 4, 8, generator=gen)  # 2 rows, group of 2
    table = torch.tensor([[3, 0, 7, 5], [1, 2, -1, -1]], dtype=torch.int32)
    num_full = torch.tensor([4, 2], dtype=torch.int32)
    mass = oracle.attention_mass(q, k_cache, table, num_full, scale=0.5)
    for b, n in enumerate(num_full.tolist()):
        for h in range(2):
            keys = k_cache[table[b, :n].long(), h]  # [n, S, D]
            weights = torch.softmax((0.5 * q[b, 2 * h: 2 * h + 2] @ keys.reshape(-1, 8).T), dim=-1)  # [G, n * S]
            expected = weights.view(2, n, 4).sum(dim=-1).sum(dim=0)  # each block's share, summed over the group
            torch.testing.assert_close(mass[b, h, :n], expected)
            assert torch.isinf(mass[b, h, n:]).all()


def test_the_report_tables_every_cell_drop_and_the_noise_sweep(tmp_path):
    table = rows("niah", 8, {"full": "1111", "quest": "1110", "quest+est": "1111", "infinigen": "1100",
                             "hgca": "1111", "scout+est": "1111", "scout": "1111", "oracle": "1111"})
    table[-2]["query_cosine"] = {"1": 0.9512, "2": 0.8871}
    table += [bench.cell("noise", "niah", "scout", 2048, 8, [True, True, False, True], prediction_cosine=0.6)]
    table += rows("niah", 8, {"full": "11", "scout": "10"}, path="server")
    table[-1]["same_as_engine"] = 2
    drops = bench.comparisons(table)
    text = report.markdown(table, drops, bench.checks(drops, table), {"model": "m", "samples": 4, "device": "cpu"})
    assert "| task | context | budget | full | quest | quest+est | infinigen | hgca | scout | scout+est | oracle |" in text
    assert "| niah | 2048 | 1/8 | 100.0 [51, 100] | 75.0 [30, 95] | 100.0 [51, 100] | 50.0 [15, 85] |" in text
    assert "| niah | 2048 | 1/8 | +25.0 [" in text  # quest against full
    assert "| niah | 2048 | 1/8 | -25.0 [" in text  # quest with the estimate against quest without
    assert "| niah | 2048 | 1/8 | 0.951 | 0.887 | 0.919 |" in text
    assert "c = 0.6" in text and "## SGLang server" in text and "50.0 [9, 91] (2/2)" in text
    assert "- plain Scout within 2 points of Quest in every cell: met" in text
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


def test_an_unknown_variant_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--variants", "scout", "scout+guess"])
    assert "invalid choice: 'scout+guess'" in capsys.readouterr().err
