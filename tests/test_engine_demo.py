"""The engine demo (scout_sglang.engine_demo, no server) runs and reports what it claims."""

import json

from scout_sglang import engine_demo as demo


def test_demo_matches_dense_with_a_covering_budget_and_reports_statistics(capsys):
    assert demo.main(["--prompt-tokens", "192", "--new-tokens", "8", "--budget", "128"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    equal, total = map(int, report["covering"]["tokens_equal_to_dense"].split("/"))
    assert equal == total == 16
    assert report["covering"]["cpu_ratio"] == 0.0  # everything fits on the device
    assert report["sparse"]["budget"] == 128 and report["sparse"]["cpu_ratio"] > 0.0
