"""The long-context suite: four RULER-style tasks over one word-level vocabulary.

  niah     multi-key needle with distractors (data.py's task): `needle K V1 V2 .` x 8, `query qK` -> `K V1 V2`
  values   multi-value: one key holds four values in four needles `needle K V .` spread over the context,
           among distractor needles of other keys; `values qK` -> `K` then the four values, in any order
  chain    variable tracking: `assign V1 V2 .`, `assign V2 V3 .`, `assign V3 V4 .` scattered in order, with
           two distractor chains; `track V1` -> `V2 V3 V4` (names are value tokens)
  common   frequent-word aggregation: a haystack of the 64 value words where three take 6% each and the
           other 61 share the rest (1.3% each); `common` -> those three, in any order

Set answers are scored in any order and taught in one: ascending token id (V03 before V11). Then what a
step must leave out is what the input token already rules out (every id up to it), where a set taught in
any order needs each step to remember every word given so far (a small model keeps repeating one).

Every answer token after the first comes from a decode step (the steps sparse attention serves). In
`values` the needed tokens sit in four places, in `chain` each hop looks up a different statement, and in
`common` the answer is spread over the whole context. The vocabulary extends data.VOCAB (same ids first), so
the needle model's embeddings carry over. Answers are checked by the independent solvers of solvers.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from scout_sglang.retrieval import data

TASKS = ("niah", "values", "chain", "common")
VOCAB = data.VOCAB + ["values", "track", "assign", "common"]
TOKEN_ID = {word: index for index, word in enumerate(VOCAB)}
VALUES_PER_KEY = 4
HOPS = 3
COMMON_WORDS = 3
COMMON_SHARES = (0.06, 0.06, 0.06)  # of the haystack, for the three frequent words (as frequent as each other)


@dataclass
class TaskSample:
    task: str
    prompt: list[int]
    answer: list[int]  # the scored continuation (no terminator)
    unordered_from: int  # answer[unordered_from:] may come in any order
    extra: list[int] = field(default_factory=list)  # training only: more questions and answers after the answer
    extra_supervised: list[bool] = field(default_factory=list)  # which extra tokens carry a loss (not the questions)

    def ask(self, question: list[str], answer: list[int]) -> None:
        """Append a training-only question about the same context and its answer (the answer supervised)."""
        self.extra += ids(question) + answer
        self.extra_supervised += [False] * len(question) + [True] * len(answer)

    def allowed(self) -> list[list[int]]:
        """Per answer position under teacher forcing, the tokens taught as right: the answer's own, in its order (a
        set comes in ascending id, see the module's note)."""
        return [[token] for token in self.answer]

    def is_correct(self, generated: list[int]) -> bool:
        n, head = len(self.answer), self.unordered_from
        got = list(generated[:n])
        return got[:head] == self.answer[:head] and sorted(got[head:]) == sorted(self.answer[head:])

    def partial_credit(self, generated: list[int]) -> float:
        """RULER's partial credit (string_match_all): the share of the answer's words found among the words
        generated in its place, in any order."""
        got = set(generated[:len(self.answer)])
        return sum(token in got for token in self.answer) / len(self.answer)


def ids(words: list[str]) -> list[int]:
    return [TOKEN_ID[w] for w in words]


def words(token_ids: list[int]) -> list[str]:
    return [VOCAB[i] for i in token_ids]


def _pick(count: int, population: list[str], generator: torch.Generator) -> list[str]:
    return [population[i] for i in torch.randperm(len(population), generator=generator)[:count].tolist()]


def _filler(count: int, generator: torch.Generator) -> list[str]:
    return [data.FILLER[i] for i in torch.randint(len(data.FILLER), (count,), generator=generator).tolist()]


def _scatter(haystack: list[str], pieces: list[list[str]], generator: torch.Generator) -> list[str]:
    """The pieces, in their order, inserted into the haystack at sorted random cut points."""
    cuts = sorted(torch.randint(len(haystack) + 1, (len(pieces),), generator=generator).tolist())
    text, start = [], 0
    for cut, piece in zip(cuts, pieces):
        text += haystack[start:cut] + piece
        start = cut
    return text + haystack[start:]


def _check_length(length: int, needed: int, task: str) -> None:
    if length < needed:
        raise ValueError(f"{task}: length {length} is shorter than the {needed} tokens its statements need")


def make_niah(length: int, generator: torch.Generator, all_questions: bool = False) -> TaskSample:
    sample = data.make_sample(length, 8, generator, all_queries=all_questions)
    task = TaskSample("niah", sample.prompt, sample.answer[:3], 3)
    if all_questions:  # the needle task's own follow-ups, after the answer's `. <eos>`
        task.extra = sample.answer[3:] + sample.extra
        task.extra_supervised = [False] * len(sample.answer[3:]) + sample.extra_supervised
    return task


def make_values(length: int, generator: torch.Generator, distractor_keys: int = 4,
                all_questions: bool = False) -> TaskSample:
    keys = _pick(1 + distractor_keys, data.KEYS, generator)
    counts = [VALUES_PER_KEY] + [1 + int(torch.randint(VALUES_PER_KEY, (1,), generator=generator))
                                 for _ in range(distractor_keys)]
    values = _pick(sum(counts), data.VALUES, generator)
    needles, used = [], 0
    for key, count in zip(keys, counts):
        needles += [["needle", key, value, "."] for value in values[used:used + count]]
        used += count
    order = torch.randperm(len(needles), generator=generator).tolist()
    tail = ["values", data.query_key(keys[0])]
    haystack_len = length - 1 - 4 * len(needles) - len(tail)
    _check_length(haystack_len, 0, "values")
    text = ["<bos>"] + _scatter(_filler(haystack_len, generator), [needles[i] for i in order], generator) + tail
    sample = TaskSample("values", ids(text), ids([keys[0]]) + sorted(ids(values[:VALUES_PER_KEY])), 1)
    if all_questions:
        starts = [sum(counts[:k]) for k in range(len(keys))]
        for k in torch.randperm(distractor_keys, generator=generator).add(1).tolist():
            sample.ask(["values", data.query_key(keys[k])],
                       ids([keys[k]]) + sorted(ids(values[starts[k]:starts[k] + counts[k]])))
    return sample


def make_chain(length: int, generator: torch.Generator, chains: int = 3, all_questions: bool = False) -> TaskSample:
    names = _pick(chains * (HOPS + 1), data.VALUES, generator)  # value tokens: the ones the needle model copies
    starts, variables = names[:chains], names[chains:]
    statements = []  # (chain, hop, words): each chain's statements keep their order
    for c, start in enumerate(starts):
        names = [start] + variables[c * HOPS:(c + 1) * HOPS]
        statements.append([["assign", names[h], names[h + 1], "."] for h in range(HOPS)])
    interleaved = []  # a random interleaving of the chains, each in its own order
    remaining = [list(s) for s in statements]
    while any(remaining):
        live = [c for c, s in enumerate(remaining) if s]
        interleaved.append(remaining[live[int(torch.randint(len(live), (1,), generator=generator))]].pop(0))
    tail = ["track", starts[0]]
    haystack_len = length - 1 - 4 * len(interleaved) - len(tail)
    _check_length(haystack_len, 0, "chain")
    text = ["<bos>"] + _scatter(_filler(haystack_len, generator), interleaved, generator) + tail
    sample = TaskSample("chain", ids(text), ids(variables[:HOPS]), HOPS)
    if all_questions:
        for c in torch.randperm(chains - 1, generator=generator).add(1).tolist():
            sample.ask(["track", starts[c]], ids(variables[c * HOPS:(c + 1) * HOPS]))
    return sample


def make_common(length: int, generator: torch.Generator, all_questions: bool = False) -> TaskSample:
    """Three value words at COMMON_SHARES of the haystack, the other value words drawn uniformly; redrawn until the least
    frequent of the three beats every other word by at least 2 (so the answer is unambiguous)."""
    tail = ["common"]
    haystack_len = length - 1 - len(tail)
    _check_length(haystack_len, 128, "common")
    frequent = _pick(COMMON_WORDS, data.VALUES, generator)
    others = [w for w in data.VALUES if w not in frequent]
    counts = [max(1, round(share * haystack_len)) for share in COMMON_SHARES]
    while True:
        rest = [others[i] for i in torch.randint(len(others), (haystack_len - sum(counts),), generator=generator)]
        busiest = max(Counter(rest).values())
        if busiest + 2 <= min(counts):
            break
        counts = [c + 1 for c in counts]  # short haystacks: lift the frequent words until they stand out
    haystack = rest + [w for w, c in zip(frequent, counts) for _ in range(c)]
    shuffled = [haystack[i] for i in torch.randperm(len(haystack), generator=generator).tolist()]
    return TaskSample("common", ids(["<bos>"] + shuffled + tail), sorted(ids(frequent)), 0)


MAKERS = {"niah": make_niah, "values": make_values, "chain": make_chain, "common": make_common}


def make_batch(task: str, count: int, length: int, seed: int, *, all_questions: bool = False) -> list[TaskSample]:
    """`count` samples of `task`. all_questions (training): after the answer, ask about every other key or chain
    of the same context too (`extra`), for more supervised tokens per sequence (`common` has one question)."""
    if task not in MAKERS:
        raise ValueError(f"unknown task {task!r}: one of {', '.join(TASKS)}")
    generator = torch.Generator().manual_seed(seed)
    return [MAKERS[task](length, generator, all_questions=all_questions) for _ in range(count)]


def training_tensors(samples: list[TaskSample]) -> tuple[torch.Tensor, list[tuple[int, int, list[int]]]]:
    """Right-padded inputs (prompt + answer, minus the last token) and the supervised positions as
    (row, position, allowed tokens)."""
    rows = [s.prompt + s.answer + s.extra for s in samples]
    width = max(map(len, rows)) - 1
    pad = TOKEN_ID["<pad>"]
    inputs = torch.tensor([r[:-1] + [pad] * (width - len(r) + 1) for r in rows])
    targets = [(b, len(s.prompt) - 1 + i, allowed) for b, s in enumerate(samples) for i, allowed in enumerate(s.allowed())]
    for b, s in enumerate(samples):
        first = len(s.prompt) - 1 + len(s.answer)  # the position that predicts extra[0]
        targets += [(b, first + i, [token]) for i, (token, on) in enumerate(zip(s.extra, s.extra_supervised)) if on]
    return inputs, targets


def build_tokenizer():
    """The word-level tokenizer of the suite's vocabulary (one token per word)."""
    return data.build_tokenizer(TOKEN_ID)
