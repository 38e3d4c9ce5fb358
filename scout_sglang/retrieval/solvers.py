"""Independent solvers of the suite's tasks: each reads a prompt as words and answers it by parsing, without
the generators' internals, so a generator bug (a wrong answer, an ambiguous prompt) shows as a disagreement.

Each returns the answer's words and whether their order matters: (words, ordered_prefix), where
words[ordered_prefix:] is a set. Ambiguous prompts raise ValueError.
"""

from __future__ import annotations

from collections import Counter


def _statements(words: list[str], head: str, size: int) -> list[list[str]]:
    """Every `head a b ... .` statement of `size` words (head and terminator included)."""
    found = []
    for i, word in enumerate(words):
        if word == head and i + size <= len(words) and words[i + size - 1] == ".":
            found.append(words[i + 1:i + size - 1])
    return found


def solve_niah(words: list[str]) -> tuple[list[str], int]:
    if words[-2] != "query":
        raise ValueError("not a niah prompt")
    key = "K" + words[-1][1:]
    matches = [s for s in _statements(words, "needle", 5) if s[0] == key]
    if len(matches) != 1:
        raise ValueError(f"key {key} has {len(matches)} needles")
    return [key, matches[0][1], matches[0][2]], 3


def solve_values(words: list[str]) -> tuple[list[str], int]:
    if words[-2] != "values":
        raise ValueError("not a values prompt")
    key = "K" + words[-1][1:]
    found = [s[1] for s in _statements(words, "needle", 4) if s[0] == key]
    if len(set(found)) != len(found):
        raise ValueError(f"key {key} repeats a value")
    return [key] + found, 1


def solve_chain(words: list[str]) -> tuple[list[str], int]:
    if words[-2] != "track":
        raise ValueError("not a chain prompt")
    assigned = {}
    for source, target in _statements(words, "assign", 4):
        if source in assigned:
            raise ValueError(f"{source} is assigned twice")
        assigned[source] = target
    path, current = [], words[-1]
    while current in assigned:
        current = assigned[current]
        path.append(current)
        if len(path) > len(assigned):
            raise ValueError("the chain has a cycle")
    return path, len(path)


def solve_common(words: list[str], top: int = 3) -> tuple[list[str], int]:
    if words[-1] != "common":
        raise ValueError("not a common prompt")
    counts = Counter(w for w in words[:-1] if w != "<bos>").most_common()
    if len(counts) > top and counts[top - 1][1] == counts[top][1]:
        raise ValueError("a tie at the cut")
    return [w for w, _ in counts[:top]], 0


SOLVERS = {"niah": solve_niah, "values": solve_values, "chain": solve_chain, "common": solve_common}
