"""Every mutation patch still applies to the code and names tests to run: a rewrite that leaves a patch behind
fails here in seconds, not after the whole suite when CI runs the mutants."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "run_mutants.py"), "--dry-run", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_mutant_applies_and_has_tests():
    checked = dry_run()
    assert checked.returncode == 0, checked.stdout + checked.stderr
    patches = sorted(p.stem for p in (ROOT / "tests" / "mutants").glob("*.patch"))
    listed = [line.split(":")[0].removeprefix("[mutants] ") for line in checked.stdout.splitlines()
              if line.startswith("[mutants] ") and " -> " in line]
    assert sorted(listed) == patches


def test_a_patch_that_no_longer_applies_is_reported(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("run_mutants", ROOT / "scripts" / "run_mutants.py")
    run_mutants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_mutants)
    (tmp_path / "stale.patch").write_text(
        "Mutant: a context line that is not in the file.\n\n"
        "--- a/scout_sglang/core/cpu_handoff.py\n+++ b/scout_sglang/core/cpu_handoff.py\n"
        "@@ -1,1 +1,1 @@\n-this line is not in the file\n+nor is this one\n")
    good = ROOT / "tests" / "mutants" / "cpu_part_not_merged.patch"
    (tmp_path / good.name).write_text(good.read_text())
    monkeypatch.setattr(run_mutants, "MUTANTS_DIR", tmp_path)
    assert run_mutants.main(["--dry-run", "--only", "cpu_part_not_merged"]) == 0
    assert run_mutants.main(["--dry-run"]) == 1
    assert "stale no longer applies" in capsys.readouterr().out
