"""Every document a file of the repository names exists in the repository.

Scans the tracked text files (.py, .md, .yaml, .toml, .sh, .cfg, .txt,
Makefile, Dockerfile). A relative `*.md` path or link must resolve from the
naming file's folder or from the repository root; a bare file name may also be
any tracked file of that name (benchmarks name their own result files). Paths
built from a template (`{out_dir}/prediction.md`) and files the code writes
through a pathlib join (`RESULTS / "kernels.md"`) are not references. Documents
kept outside the repository (the team's notes) must never be named, and no file
may name a path of the machine it was written on. The README links every page
in docs/.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yaml", ".toml", ".sh", ".cfg", ".txt"}
NAMES = {"Makefile", "Dockerfile"}
# Built from parts so that this file does not name them itself.
OUTSIDE_DOCUMENTS = ("DESIGN" + ".md", "STYLE" + ".md")
MACHINE_PATHS = re.compile("/" + "work/|/" + "tmp/wt-")
# A relative .md path: not preceded by a path or template character (so neither URLs nor "{dir}/x.md").
MD_REFERENCE = re.compile(r"(?<![\w}/.-])([\w.-][\w./-]*\.md)\b")


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        paths = [ROOT / line for line in listed.splitlines()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the usual outputs
        skip = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache"}
        paths = [p for p in ROOT.rglob("*") if not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in paths if p.is_file() and (p.suffix in SUFFIXES or p.name in NAMES)]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def broken_references(files: list[Path]) -> list[str]:
    names = {p.name for p in files}
    problems = []
    for path in files:
        text = path.read_text(errors="replace")
        for document in OUTSIDE_DOCUMENTS:
            if document in text:
                problems.append(f"{_shown(path)} names {document}, which is not part of the repository")
        if MACHINE_PATHS.search(text):
            problems.append(f"{_shown(path)} names a path of a development machine")
        for match in MD_REFERENCE.finditer(text):
            reference = match.group(1)
            if reference in OUTSIDE_DOCUMENTS:
                continue  # reported above
            if re.search(r"/ ?[\"']$", text[max(0, match.start() - 3):match.start()]):
                continue  # a pathlib join (RESULTS / "kernels.md"): a file the code writes, not a reference
            if (path.parent / reference).exists() or (ROOT / reference).exists():
                continue
            if "/" not in reference and reference in names:
                continue
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{_shown(path)}:{line} names {reference}, which does not exist in the repository")
    return problems


def test_every_named_document_exists():
    this_file = Path(__file__).resolve()  # its examples of broken references are deliberate
    problems = broken_references([p for p in tracked_files() if p.resolve() != this_file])
    assert not problems, "\n".join(problems)


def test_the_check_reports_what_it_should(tmp_path):
    """Feed the check files that name missing documents; it must report each one."""
    docs = ROOT / "docs"
    bad = tmp_path / "bad.md"
    bad.write_text("See [the notes](../" + OUTSIDE_DOCUMENTS[0] + "), docs/no_such_page.md and "
                   "[here](missing.md). Fine: https://example.com/x.md, {out}/report.md, README.md.\n"
                   'out = RESULTS / "written.md"\n'
                   "Written on /" + "work/main/notes.txt.\n")
    bad_py = tmp_path / "bad.py"
    bad_py.write_text('"""Rules: ' + OUTSIDE_DOCUMENTS[1] + '."""\n')
    problems = broken_references([bad, bad_py, ROOT / "README.md", docs / "deployment.md"])
    text = "\n".join(problems)
    assert "names " + OUTSIDE_DOCUMENTS[0] in text and "names " + OUTSIDE_DOCUMENTS[1] in text
    assert "docs/no_such_page.md" in text and "missing.md" in text
    assert "path of a development machine" in text
    assert "example.com" not in text and "report.md" not in text and "names README.md" not in text
    assert "written.md" not in text


def test_the_readme_links_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not missing, f"README.md does not link {missing}"
