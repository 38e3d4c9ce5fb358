"""Mutation check: every patch in tests/mutants breaks one thing that matters; the tests of the code it changes
must notice.

For each mutant: copy the tree to a temporary folder, apply the patch there (the checkout is never touched), and
run the tests that cover the files the patch changes, from TESTS_FOR (source path or folder -> tests: a Triton
kernel gets the Triton tests, a native header the native kernel's, the engine's Python files the fast engine
tests). A patch that changes a file no entry covers is an error, so a mutant never runs no test. Every list used
first passes on an unmutated copy, each test once, so a failure is the mutant's doing. A mutant starts as soon as
the unmutated runs of its tests have passed, and its run stops at its first failing test (-x): one is the proof,
and a killed mutant costs seconds. Exit status 1 when a mutant survives, no longer applies (after a rewrite,
update its patch) or changes a file no entry covers.

    python -P scripts/run_mutants.py [--jobs 2] [--only NAME ...] [--dry-run]

--dry-run also checks that every patch still applies and maps to tests: the suite runs it (test_mutant_patches.py),
so a rewrite that leaves a patch behind fails in seconds, not at the end of CI.

Each job slot makes its copies at the same path, so that they share the native kernel's build (torch's ninja
build compiles again when the source's path changes): SCOUT_NATIVE_BUILD_DIR names one build folder per slot and
per content of the kernel's sources. The unmutated kernel compiles once per slot, a mutated header once for its
mutant.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS_DIR = ROOT / "tests" / "mutants"

# The fast engine tests: between them they cover every decision of a decode step (torch path). The ops' own tests
# first: a run stops at its first failure, and they take seconds where the engine's take a minute.
FAST_TESTS = (
    "tests/test_stage_split.py",
    "tests/test_kernels_merge.py",
    "tests/test_kernels_estimate.py",
    "tests/test_kernels_selection.py",
    "tests/test_stage_append.py",
    "tests/test_recall_brake.py",
    "tests/test_stage_recall.py",
    "tests/test_shared_prefix.py",
    "tests/test_prefix_pages_glue.py",
    "tests/test_engine.py",
    "tests/test_engine_oracle.py",
    "tests/test_scout_policy_model.py",
    "tests/test_engine_chunked_prefill.py",
)
# Tests that run the Triton kernels (under the interpreter without a GPU) against the fp32 references, or against
# the torch path that is itself tested against them; quickest first, since a run stops at its first failure. Left
# out: test_layer_programs.py and test_step_capture.py, which count launches and compare a replayed step with an
# eager one (both Triton: a wrong kernel is wrong in both) and take 4-15 minutes here.
TRITON_TESTS = (
    "tests/test_kernels_lists.py",  # lists.py: the linear lookups and compaction against torch and all pairs
    "tests/test_kernels_cpu_part.py",  # handoff.py: the merge with the worker's part or the fallback's
    "tests/test_kernels_estimate.py",  # estimate.py: the estimate, merged with the device part and the CPU part
    "tests/test_stage_append.py",  # stage_append.py
    "tests/test_stage_split.py",  # stage_split.py
    "tests/test_kernels_triton_dispatch.py",  # the host wrappers' calls of decode, digest, selection, merge
    "tests/test_recall_brake.py",  # stage_recall.py's brake
    "tests/test_stage_recall.py",  # stage_recall.py
    "tests/test_triton_kernels.py",  # digest.py, selection.py, decode.py (the gated fallback too), merge.py
    "tests/test_stage_select.py",  # stage_select.py
    "tests/test_engine_triton_path.py",  # all of them in every mode, against the torch path (3 minutes)
)
# The native CPU kernel and the worker pool that runs it, against the reference; then the engine, which serves
# its CPU part with them. The AVX2 and scalar builds (two more compiles of a minute each) only for their headers.
ISA_BUILDS = "tests/test_cpu_worker_kernels.py::test_avx2_and_scalar_builds_match_reference"
NATIVE_TESTS = (
    "tests/test_cpu_worker_kernels.py",
    f"--deselect={ISA_BUILDS}",
    "tests/test_native_read_blocks.py",
    "tests/test_cpu_part_workers.py",
    "tests/test_cpu_worker_discipline.py",  # the pool's items, locks, spinning and parking
    "tests/test_engine.py",
)
# The Python CPU worker (dispatch, pools, fallback): its tests, then the engine's.
CPU_WORKER_TESTS = (*NATIVE_TESTS, "tests/test_cpu_fallback.py", "tests/test_cpu_health.py", *FAST_TESTS)

# Source path or folder prefix -> the pytest arguments (test files, node ids, --deselect=) of the tests that
# exercise it. The longest matching prefix wins; a patch that changes several files runs the union.
TESTS_FOR = {
    # resident-first serving: its own tests, then the oracle's run through the switch (seconds, not the engine's minutes)
    "scout_sglang/core/resident_pool.py": (
        "tests/test_resident_pool.py", "tests/test_resident_shared_prefix.py",
        "tests/test_engine_oracle.py::test_resident_first_quotas_exact_rows_and_their_switch_match_the_oracle"),
    # the pool's quotas and their changes: the resident-first tests (a prefill batch layer by layer first), then the
    # oracle's run through the switch
    "scout_sglang/core/pool_rebalance.py": (
        "tests/test_resident_pool.py::test_requests_prefilled_together_layer_by_layer_keep_their_quotas_and_exact_rows"
        "_are_exact", "tests/test_resident_pool.py", "tests/test_resident_shared_prefix.py",
        "tests/test_engine_oracle.py::test_resident_first_quotas_exact_rows_and_their_switch_match_the_oracle"),
    # a cached prefix's resident pages kept once: its tests, then the prefix cache's
    "scout_sglang/core/pool_sharing.py": ("tests/test_resident_shared_prefix.py", "tests/test_shared_prefix.py"),
    # the engine: with, first, the resident-first prefill of a batch layer by layer (the engine tests prefill alone)
    "scout_sglang/core/engine.py": (
        "tests/test_resident_pool.py::test_requests_prefilled_together_layer_by_layer_keep_their_quotas_and_exact_rows"
        "_are_exact", *FAST_TESTS),
    # the step plan's fields: the two ways of computing them against each other, then the engine's tests
    "scout_sglang/core/step_plan.py": ("tests/test_step_plan_rows.py", *FAST_TESTS),
    "scout_sglang/core/step_plan_rows.py": ("tests/test_step_plan_rows.py", *FAST_TESTS),
    # the layer stages: with, first, the layer loop's counts (no value read back; seconds) and the oracle's run
    # through resident-first's exact path and its switch
    "scout_sglang/core/layer_stages.py": (
        "tests/test_layer_programs.py::test_the_torch_path_is_flat_in_batch_and_heads_and_reads_nothing_back",
        "tests/test_engine_oracle.py::test_resident_first_quotas_exact_rows_and_their_switch_match_the_oracle",
        *FAST_TESTS),
    # planning's host copies of a batch in SGLang: their own tests, then the decode graphs' replays that use them
    "scout_sglang/sglang_adapter/host_batch.py": ("tests/test_sglang_host_batch.py",
                                                  "tests/test_sglang_decode_graphs.py"),
    "kernels/triton/": TRITON_TESTS,
    "kernels/": FAST_TESTS,
    "scout_sglang/": FAST_TESTS,
    "cpu_worker/native/simd_avx2.h": (*NATIVE_TESTS, ISA_BUILDS),
    "cpu_worker/native/simd_scalar.h": (*NATIVE_TESTS, ISA_BUILDS),
    "cpu_worker/native/": NATIVE_TESTS,
    "cpu_worker/": CPU_WORKER_TESTS,
}
# Folders that install as subpackages of scout_sglang (setup.py's PACKAGE_ROOTS).
SUBPACKAGES = {"kernels": "kernels", "cpu_worker": "cpu_worker", "configs": "configs"}
# What the native kernel's build depends on (a build folder per content of these).
NATIVE_SOURCES = ("cpu_worker/native", "cpu_worker/native_kernel.py")
# pytest exit codes that say nothing about the code under test: usage error, no tests collected.
RUNNER_ERRORS = (4, 5)


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def patched_files(patch: Path) -> list[str]:
    """The paths a patch changes (both sides of a rename)."""
    names = re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch.read_text(), re.M)
    return sorted({name for pair in names for name in pair})


def tests_for(files: list[str]) -> tuple[str, ...]:
    """The union, in order, of the tests TESTS_FOR gives each file; LookupError names a file no entry covers."""
    args: list[str] = []
    for name in files:
        prefixes = [prefix for prefix in TESTS_FOR if name.startswith(prefix)]
        if not prefixes:
            raise LookupError(f"no entry of TESTS_FOR covers {name}: add one to scripts/run_mutants.py")
        args += [arg for arg in TESTS_FOR[max(prefixes, key=len)] if arg not in args]
    # A test one entry names is not deselected by another's --deselect.
    selected = [arg for arg in args if not arg.startswith("-")]
    return tuple(arg for arg in args if not (arg.startswith("--deselect=")
                                             and any(s.startswith(arg.split("=", 1)[1]) for s in selected)))


def selections(args: tuple[str, ...]) -> set[str]:
    """The test files and node ids among pytest arguments."""
    return {arg for arg in args if not arg.startswith("-")}


def baseline_runs(lists: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """What the unmutated copy runs so that every list is shown to pass, each test once: the lists, longest first,
    each less the tests an earlier one runs whole (not cut by a --deselect)."""
    whole: set[str] = set()
    runs = []
    for args in sorted(lists, key=len, reverse=True):
        kept = tuple(arg for arg in args if arg.startswith("-") or arg not in whole)
        if selections(kept):
            runs.append(kept)
        cut = [arg.split("=", 1)[1] for arg in args if arg.startswith("--deselect=")]
        whole |= {arg for arg in selections(args) if not any(node.startswith(arg) for node in cut)}
    return runs


def test_files(args: tuple[str, ...]) -> str:
    """'test_engine.py test_stage_split.py ...' from pytest arguments (the deselected left out)."""
    return " ".join(Path(arg).name for arg in args if not arg.startswith("-"))


class Slots:
    """One folder per job, reused at the same path by every copy that job makes; a native build folder per slot
    and per content of the kernel's sources."""

    def __init__(self, base: Path, count: int):
        self.base = base
        self.running: set[subprocess.Popen] = set()  # the pytest runs in flight, each in a session of its own
        self.free: queue.Queue[int] = queue.Queue()
        for slot in range(count):
            self.free.put(slot)

    def copy_path(self, slot: int) -> Path:
        return self.base / f"slot{slot}" / "tree"

    def build_dir(self, slot: int, copy: Path) -> Path:
        digest = hashlib.sha1()
        for source in NATIVE_SOURCES:
            path = copy / source
            for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
                if file.is_file() and "__pycache__" not in file.parts:
                    digest.update(str(file.relative_to(copy)).encode() + b"\0" + file.read_bytes() + b"\0")
        return self.base / "native-builds" / f"slot{slot}-{digest.hexdigest()[:10]}"


def make_copy(snapshot: Path, copy: Path, patch: Path | None) -> None:
    """A copy of the snapshot at `copy` with the patch applied, importable as scout_sglang from <copy>/.site.
    copytree keeps the files' times, so a shared native build sees its sources unchanged."""
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(snapshot, copy, symlinks=True)
    if patch is not None:
        why = git_apply(patch, copy)
        if why:
            raise RuntimeError(f"{patch.name} no longer applies: {why}")
    site = copy / ".site"
    site.mkdir()
    (site / "scout_sglang").symlink_to(copy / "scout_sglang")
    for package, folder in SUBPACKAGES.items():
        (copy / "scout_sglang" / package).symlink_to(copy / folder)


def git_apply(patch: Path, tree: Path, *, check: bool = False) -> str:
    """Apply the patch to `tree` (check: only see whether it applies) -> "" or why it does not."""
    applied = subprocess.run(["git", "apply", *(["--check"] if check else []), str(patch)], cwd=tree,
                             capture_output=True, text=True)
    return applied.stderr.strip() if applied.returncode else ""


def applies(patch: Path) -> bool:
    """Whether the patch still applies to this checkout (checked, never applied); prints why not."""
    why = git_apply(patch, ROOT, check=True)
    if why:
        print(f"[mutants] {patch.stem} no longer applies (update its patch): {why}", flush=True)
    return not why


def run_tests(copy: Path, build_dir: Path, args: tuple[str, ...], *, first_failure: bool, timeout: float | None,
              running: set[subprocess.Popen]) -> dict:
    """pytest over `args` in the copy -> {code, failed (test ids), summary (last line), seconds, timed_out}."""
    env = dict(os.environ, PYTHONPATH=str(copy / ".site"), PYTHONSAFEPATH="1", SCOUT_NATIVE_BUILD_DIR=str(build_dir),
               TORCH_EXTENSIONS_DIR=str(build_dir))  # the ISA fallback builds go through torch's own cache
    check = subprocess.run([sys.executable, "-P", "-c", "import scout_sglang.kernels as k; print(k.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True)
    if not check.stdout.strip().startswith(str(copy)):
        raise RuntimeError(f"the copy is not the code under test (imported {check.stdout.strip() or check.stderr})")
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
               *(["-x"] if first_failure else []), *args]
    start = time.perf_counter()
    # A session of its own, so that a run past its timeout is ended with whatever it started.
    process = subprocess.Popen(command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    running.add(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_session(process)
        stdout, stderr = process.communicate()
        timed_out = True
    finally:
        running.discard(process)
        for lock in build_dir.rglob("lock"):  # torch's build lock, left behind by a killed build, would block the slot
            lock.unlink(missing_ok=True)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", stdout, re.M)))
    lines = [line for line in stdout.splitlines() if line.strip()]
    return {"code": process.returncode, "failed": failed, "timed_out": timed_out,
            "summary": lines[-1] if lines else stderr.strip()[-500:], "seconds": time.perf_counter() - start}


def kill_session(process: subprocess.Popen) -> None:
    """End a run with whatever it started (a compiler, say)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def in_slot(slots: Slots, snapshot: Path, patch: Path | None, args: tuple[str, ...], **run) -> dict:
    slot = slots.free.get()
    copy = slots.copy_path(slot)
    try:
        make_copy(snapshot, copy, patch)
        return run_tests(copy, slots.build_dir(slot, copy), args, running=slots.running, **run)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        slots.free.put(slot)


def describe(patch: Path) -> str:
    return patch.read_text().splitlines()[0].removeprefix("Mutant: ")


def check_mutant(slots: Slots, snapshot: Path, patch: Path, args: tuple[str, ...], timeout: float) -> dict:
    start = time.perf_counter()
    result = {"name": patch.stem, "tests": args, "failed": []}
    try:
        run = in_slot(slots, snapshot, patch, args, first_failure=True, timeout=timeout)
    except RuntimeError as error:
        return result | {"status": "does not apply", "detail": str(error), "seconds": 0.0}
    if run["timed_out"]:
        status, detail = "killed", f"timed out after {timeout:.0f} s (a hang is noticed too)"
    elif run["code"] in RUNNER_ERRORS:
        status, detail = "error", f"pytest exit status {run['code']}: {run['summary']}"
    else:
        status, detail = ("killed" if run["code"] else "SURVIVED"), run["summary"]
    return result | {"status": status, "failed": run["failed"], "detail": detail,
                     "seconds": round(time.perf_counter() - start, 1)}


def take_snapshot(base: Path) -> Path:
    """The tree once, for every copy of the run: the baseline and every mutant test the same code, even while
    someone edits the checkout."""
    snapshot = base / "snapshot"
    for name in tracked_files():
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(ROOT / name, target)
        except FileNotFoundError:  # deleted since it was listed
            pass
    return snapshot


def report_baseline(tests: tuple[str, ...], run: dict) -> None:
    print(f"[mutants] baseline {'passes' if run['code'] == 0 else 'FAILS'} in {run['seconds']:.0f} s: "
          f"{test_files(tests)}: {run['summary']}", flush=True)


def report_mutant(result: dict) -> None:
    outcome = f"first failure {result['failed'][0]}" if result["failed"] else result["detail"]
    print(f"[mutants] {result['name']}: {result['status']} in {result['seconds']} s; ran "
          f"{test_files(result['tests'])}; {outcome}", flush=True)


def check_all(plan: dict[Path, tuple[str, ...]], runs: list[tuple[str, ...]], jobs: int,
              trusted_s: float | None = None) -> tuple[list, list]:
    """The baseline runs, and each mutant as soon as the unmutated runs of its tests have passed, while the other
    baseline runs go on -> (the mutants' results, the failures of the unmutated copy).

    trusted_s: the whole suite has just passed on the unmutated tree (CI runs it first), so no baseline runs; each
    run a mutant needs counts as having taken trusted_s seconds, which bounds the mutant's run as below."""
    results, broken = [], []
    with tempfile.TemporaryDirectory(prefix="scout-mutants-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        snapshot, slots = take_snapshot(Path(tmp)), Slots(Path(tmp), jobs)
        baseline = {} if trusted_s is not None else {
            pool.submit(in_slot, slots, snapshot, None, run, first_failure=False, timeout=None): run for run in runs}
        # baseline run -> its seconds
        passed: dict[tuple[str, ...], float] = dict.fromkeys(runs, trusted_s) if trusted_s is not None else {}
        waiting, mutants = dict(plan), set()

        def start_ready() -> None:
            for patch, tests in list(waiting.items()):
                needed = [run for run in runs if selections(run) & selections(tests)]
                if all(run in passed for run in needed):
                    # Well past what the unmutated runs took: a mutant that hangs is stopped there.
                    timeout = 120 + 2 * sum(passed[run] for run in needed)
                    mutants.add(pool.submit(check_mutant, slots, snapshot, patch, tests, timeout))
                    del waiting[patch]

        try:
            start_ready()
            while (baseline or mutants) and not broken:
                done, _ = concurrent.futures.wait([*baseline, *mutants],
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    if future in baseline:
                        tests, run = baseline.pop(future), future.result()
                        report_baseline(tests, run)
                        broken += (run["failed"] or [run["summary"]]) if run["code"] else []
                        passed[tests] = run["seconds"]
                    else:
                        mutants.discard(future)
                        results.append(future.result())
                        report_mutant(results[-1])
                start_ready()
        finally:  # done, the unmutated copy failed, or ^C (which does not reach runs in sessions of their own)
            for future in [*baseline, *mutants]:
                future.cancel()
            for process in list(slots.running):
                kill_session(process)
    return results, broken


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="copies tested at once (default 2)")
    parser.add_argument("--only", nargs="*", help="mutant names (file stems in tests/mutants)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each mutant's files and tests, check that every patch applies; run no test")
    parser.add_argument("--after-suite", action="store_true",
                        help="the whole test suite has just passed on this tree (CI runs it first): skip the runs "
                             "on unmutated copies; each mutant's run is bounded as if each of its lists took 600 s")
    args = parser.parse_args(argv)
    patches = sorted(MUTANTS_DIR.glob("*.patch"))
    if args.only:
        unknown = set(args.only) - {p.stem for p in patches}
        if unknown:
            parser.error(f"unknown mutants {sorted(unknown)}; known: {[p.stem for p in patches]}")
        patches = [p for p in patches if p.stem in args.only]
    plan, unmapped = {}, []
    for patch in patches:
        try:
            plan[patch] = tests_for(patched_files(patch))
        except LookupError as error:
            unmapped.append(patch.stem)
            print(f"[mutants] {patch.stem}: {error}", flush=True)
    runs = baseline_runs(list(dict.fromkeys(plan.values())))
    stale = []
    if args.dry_run:
        for patch, tests in plan.items():
            print(f"[mutants] {patch.stem}: {' '.join(patched_files(patch))} -> {test_files(tests)}")
        for run in runs:
            print(f"[mutants] baseline run: {test_files(run)}")
        stale = [patch.stem for patch in patches if not applies(patch)]
    if args.dry_run or unmapped:
        return 1 if unmapped or stale else 0
    started = time.perf_counter()
    if args.after_suite:
        print("[mutants] no baseline: the whole suite has just passed on the unmutated tree", flush=True)
    else:
        print(f"[mutants] baseline: {len(runs)} runs on unmutated copies, each test of every list once", flush=True)
    results, broken = check_all(plan, runs, max(1, args.jobs), trusted_s=600.0 if args.after_suite else None)
    if broken:
        print(f"[mutants] the unmutated copy fails: {sorted(set(broken))}")
        return 1
    print("\n| mutant | what it breaks | result | first failing test | s |\n|---|---|---|---|---|")
    for result in sorted(results, key=lambda r: r["name"]):
        shown = ", ".join(f"`{test}`" for test in result["failed"]) or result["detail"]
        print(f"| {result['name']} | {describe(MUTANTS_DIR / (result['name'] + '.patch'))} | {result['status']} | "
              f"{shown} | {result['seconds']} |")
    bad = [r["name"] for r in results if r["status"] != "killed"]
    print(f"\n{len(results) - len(bad)} of {len(results)} mutants killed" + (f"; not killed: {bad}" if bad else "")
          + f" ({time.perf_counter() - started:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
