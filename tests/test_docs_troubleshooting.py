"""docs/troubleshooting.md keeps step with the messages the code emits.

The scan reads every module of the package (scout_sglang/, kernels/,
cpu_worker/) and collects each message a user can meet: the text of
`raise SomeError("...")`, of the refusal reasons appended to a list
(`reasons` / `problems` / `out`), of the messages returned by the `*_problem(s)`
functions, and of `logger.warning/error/exception/critical("...")`. A message
built from an f-string or %-formatting is matched by its longest literal piece,
which must appear on the page (backticks and runs of whitespace ignored).
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = ("scout_sglang", "kernels", "cpu_worker")
LIST_NAMES = {"reasons", "problems", "out"}
LOG_METHODS = {"warning", "error", "exception", "critical"}
# Messages left off the page on purpose, each with its reason.
EXCLUDED = {
    "unreachable": "an internal assertion in plan/host_counts.py that no input can reach",
}


def _pieces(node):
    """Literal text pieces of a message expression (f-string fields and %-placeholders cut it)."""
    pieces = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            pieces += re.split(r"%[-#0-9.]*[sdfrgx]|\n", sub.value)
    return [p.strip().lstrip("-").strip() for p in pieces]


def _is_text(node) -> bool:
    return isinstance(node, (ast.JoinedStr, ast.BinOp)) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def messages(path: Path) -> list[tuple[int, ast.AST]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            if _is_text(node.exc.args[0]):
                found.append((node.lineno, node.exc.args[0]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and _is_text(node.args[0]):
            owner = node.func.value
            if node.func.attr == "append" and isinstance(owner, ast.Name) and owner.id in LIST_NAMES:
                found.append((node.lineno, node.args[0]))
            elif node.func.attr in LOG_METHODS and isinstance(owner, ast.Name) and owner.id == "logger":
                found.append((node.lineno, node.args[0]))
        elif isinstance(node, ast.FunctionDef) and node.name.endswith(("_problem", "_problems")):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Return) and sub.value is not None:
                    values = sub.value.elts if isinstance(sub.value, ast.List) else [sub.value]
                    found += [(sub.lineno, v) for v in values if _is_text(v)]
    return found


def distinctive_texts() -> dict[str, str]:
    """The longest literal piece of every message -> where it comes from."""
    out = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            for line, node in messages(path):
                piece = max(_pieces(node), key=len, default="")
                if piece:
                    out.setdefault(piece, f"{path.relative_to(ROOT)}:{line}")
    return out


def _normal(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_the_scan_finds_the_messages_it_should():
    """The collector itself: known refusals of each kind are found (a scan finding nothing would pass)."""
    texts = distinctive_texts()
    for expected in ("the scout attention backend cannot run this server:",  # raise, BinOp
                     "speculative decoding: run without --speculative-algorithm",  # reasons.append
                     "rebuilding its state",  # logger.warning with %d pieces
                     "scout-sglang's attention backend needs sglang==",  # returned by version_problem
                     "is not accepted; accepted values:"):  # raise, f-string
        assert any(expected in text for text in texts), expected
    assert len(texts) > 100


def test_every_message_is_on_the_troubleshooting_page():
    page = _normal(PAGE.read_text())
    missing = {text: where for text, where in distinctive_texts().items()
               if text not in EXCLUDED and _normal(text) not in page}
    assert not missing, "messages missing from docs/troubleshooting.md:\n" + "\n".join(
        f"  {where}: {text!r}" for text, where in sorted(missing.items(), key=lambda item: item[1]))
