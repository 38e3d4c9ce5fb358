"""Mutation check: every patch in tests/mutants breaks one thing that matters; the fast tests must notice.

For each mutant: copy the tracked tree to a temporary folder, apply the patch
there (the checkout is never touched), run the fast engine tests against the
copy, and list the tests that failed. The unmutated copy runs first and must
pass, so a failure is the mutant's doing. Exit status 1 when a mutant
survives or no longer applies (after a rewrite, update its patch).

    python -P scripts/run_mutants.py [--jobs 2] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS_DIR = ROOT / "tests" / "mutants"
# The engine-level tests: quick, and between them they cover every decision of a decode step.
FAST_TESTS = [
    "tests/test_engine.py",
    "tests/test_engine_oracle.py",
    "tests/test_scout_policy_model.py",
    "tests/test_kernels_merge.py",
    "tests/test_kernels_selection.py",
    "tests/test_engine_chunked_prefill.py",
    "tests/test_stage_split.py",
    "tests/test_stage_recall.py",
    "tests/test_recall_brake.py",
    "tests/test_stage_append.py",
    "tests/test_shared_prefix.py",
    "tests/test_prefix_pages_glue.py",
]
# Folders that install as subpackages of scout_sglang (setup.py's PACKAGE_ROOTS).
SUBPACKAGES = {"kernels": "kernels", "cpu_worker": "cpu_worker", "configs": "configs"}


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def make_copy(files: list[str], patch: Path | None) -> Path:
    """A temporary tree with the patch applied, importable as scout_sglang from <copy>/.site."""
    copy = Path(tempfile.mkdtemp(prefix="scout-mutant-"))
    for name in files:
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    if patch is not None:
        applied = subprocess.run(["git", "apply", str(patch)], cwd=copy, capture_output=True, text=True)
        if applied.returncode:
            shutil.rmtree(copy)
            raise RuntimeError(f"{patch.name} no longer applies: {applied.stderr.strip()}")
    site = copy / ".site"
    site.mkdir()
    (site / "scout_sglang").symlink_to(copy / "scout_sglang")
    for package, folder in SUBPACKAGES.items():
        (copy / "scout_sglang" / package).symlink_to(copy / folder)
    return copy


def run_tests(copy: Path) -> tuple[int, list[str], str]:
    """pytest over the fast tests in the copy -> (exit status, failed test ids, last output line)."""
    env = dict(os.environ, PYTHONPATH=str(copy / ".site"), PYTHONSAFEPATH="1")
    check = subprocess.run([sys.executable, "-P", "-c", "import scout_sglang.kernels as k; print(k.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True)
    if not check.stdout.strip().startswith(str(copy)):
        raise RuntimeError(f"the copy is not the code under test (imported {check.stdout.strip() or check.stderr})")
    result = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *FAST_TESTS],
                            cwd=copy, env=env, capture_output=True, text=True)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.M)))
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode, failed, lines[-1] if lines else result.stderr[-500:]


def describe(patch: Path) -> str:
    return patch.read_text().splitlines()[0].removeprefix("Mutant: ")


def check_mutant(files: list[str], patch: Path) -> dict:
    start = time.perf_counter()
    try:
        copy = make_copy(files, patch)
    except RuntimeError as error:
        return {"name": patch.stem, "status": "does not apply", "detail": str(error), "killed_by": []}
    try:
        code, failed, summary = run_tests(copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    status = "killed" if code != 0 else "SURVIVED"
    return {"name": patch.stem, "status": status, "killed_by": failed, "detail": summary,
            "seconds": round(time.perf_counter() - start, 1)}


def killers(result: dict) -> str:
    """'test_engine_oracle.py: 8 (test_x[scout-llama]), ...' from the failing test ids."""
    per_file: dict[str, list[str]] = {}
    for test_id in result["killed_by"]:
        path, _, name = test_id.partition("::")
        per_file.setdefault(Path(path).name, []).append(name)
    return ", ".join(f"{name}: {len(tests)} (`{tests[0]}`)" for name, tests in sorted(per_file.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--only", nargs="*", help="mutant names (file stems in tests/mutants)")
    args = parser.parse_args(argv)
    patches = sorted(MUTANTS_DIR.glob("*.patch"))
    if args.only:
        unknown = set(args.only) - {p.stem for p in patches}
        if unknown:
            parser.error(f"unknown mutants {sorted(unknown)}; known: {[p.stem for p in patches]}")
        patches = [p for p in patches if p.stem in args.only]
    files = tracked_files()
    print(f"[mutants] baseline: the fast tests on an unmutated copy ({len(FAST_TESTS)} files)", flush=True)
    copy = make_copy(files, None)
    try:
        code, failed, summary = run_tests(copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    if code != 0:
        print(f"[mutants] the unmutated copy fails ({summary}): {failed}")
        return 1
    print(f"[mutants] baseline passes: {summary}", flush=True)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(check_mutant, files, patch): patch for patch in patches}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results.append(result)
            print(f"[mutants] {result['name']}: {result['status']} ({len(result['killed_by'])} tests, "
                  f"{result.get('seconds', 0)} s)", flush=True)
    print("\n| mutant | what it breaks | result | failing tests per file (one of them) |\n|---|---|---|---|")
    for result in sorted(results, key=lambda r: r["name"]):
        patch = MUTANTS_DIR / f"{result['name']}.patch"
        print(f"| {result['name']} | {describe(patch)} | {result['status']} | {killers(result) or result['detail']} |")
    bad = [r["name"] for r in results if r["status"] != "killed"]
    print(f"\n{len(results) - len(bad)} of {len(results)} mutants killed" + (f"; not killed: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
