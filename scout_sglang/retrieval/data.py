"""Synthetic long-context retrieval: needles (key -> two values) hidden in a haystack.

A sequence is filler words with needles `needle Kxx V1 V2 .` inserted at
random depths, every needle with its own key and values, then `query qxx`,
which names key Kxx by its query twin. The model continues with `Kxx V1 V2 .`
of the queried needle; the others are distractors. The first generated token
(the key, from the dense prefill) needs no retrieval, and both values come
from decode steps: the steps that sparse attention serves. Each token the
model must retrieve has exactly one earlier occurrence to look up.

Words map one-to-one to tokens (a word-level tokenizer), so text and ids
round-trip exactly through SGLang's OpenAI API.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SPECIALS = ["<pad>", "<bos>", "<eos>"]
MARKERS = ["needle", "query", "."]
FILLER = [f"{a}{b}" for a in ("ba", "de", "fi", "go", "hu", "ka", "le", "mo", "nu", "pi", "ro", "su", "ta", "vi", "wo", "zu")
          for b in ("n", "r", "l", "s", "m", "t", "k", "d")]  # 128 filler words
KEYS = [f"K{i:02d}" for i in range(64)]
QUERY_KEYS = [f"q{i:02d}" for i in range(64)]  # the query names key Kxx as qxx
VALUES = [f"V{i:02d}" for i in range(64)]
VOCAB = SPECIALS + MARKERS + FILLER + KEYS + QUERY_KEYS + VALUES
TOKEN_ID = {word: index for index, word in enumerate(VOCAB)}
NEEDLE_TOKENS = 5  # needle K V1 V2 .
QUERY_TOKENS = 2  # query K  (the prompt ends here)
ANSWER = ["Kxx", "V1", "V2", ".", "<eos>"]  # shape of the continuation


@dataclass
class Sample:
    prompt: list[int]  # token ids, ending with `query qxx`
    answer: list[int]  # `Kxx V1 V2 . <eos>`
    needle_depth: float  # where the queried needle starts, as a fraction of the prompt
    extra: list[int] = field(default_factory=list)  # training only: more `query K answer V1 V2 .` after the answer
    extra_supervised: list[bool] = field(default_factory=list)  # which extra tokens carry a loss (not `query K`)


def query_key(key: str) -> str:
    return "q" + key[1:]


def ids(words: list[str]) -> list[int]:
    return [TOKEN_ID[w] for w in words]


def words(token_ids: list[int]) -> list[str]:
    return [VOCAB[i] for i in token_ids]


def make_sample(length: int, num_needles: int, generator: torch.Generator, *, all_queries: bool = False) -> Sample:
    """One sequence of `length` prompt tokens with `num_needles` needles (one queried).

    all_queries: also ask for every other needle after the answer (`extra`), for a denser training signal."""
    if length < num_needles * NEEDLE_TOKENS + QUERY_TOKENS + 1:
        raise ValueError(f"length {length} cannot hold {num_needles} needles")
    if num_needles < 1 or 2 * num_needles > len(VALUES) or num_needles > len(KEYS):
        raise ValueError(f"num_needles must be in 1..{len(VALUES) // 2}, got {num_needles}")

    def pick(count, population):
        return [population[i] for i in torch.randperm(len(population), generator=generator)[:count].tolist()]

    keys = pick(num_needles, KEYS)
    values = pick(2 * num_needles, VALUES)
    haystack_len = length - 1 - num_needles * NEEDLE_TOKENS - QUERY_TOKENS  # 1: <bos>
    filler = [FILLER[i] for i in torch.randint(len(FILLER), (haystack_len,), generator=generator).tolist()]
    cuts = sorted(torch.randint(haystack_len + 1, (num_needles,), generator=generator).tolist())
    order = torch.randperm(num_needles, generator=generator).tolist()
    target = int(torch.randint(num_needles, (1,), generator=generator))
    text, start, target_at = ["<bos>"], 0, 0
    for cut, n in zip(cuts, order):
        text += filler[start:cut]
        if n == target:
            target_at = len(text)
        text += ["needle", keys[n], values[2 * n], values[2 * n + 1], "."]
        start = cut
    text += filler[start:] + ["query", query_key(keys[target])]
    answer = [keys[target], values[2 * target], values[2 * target + 1], ".", "<eos>"]
    sample = Sample(ids(text), ids(answer), target_at / length)
    if all_queries:
        for n in torch.randperm(num_needles, generator=generator).tolist():
            if n != target:
                sample.extra += ids(["query", query_key(keys[n]), keys[n], values[2 * n], values[2 * n + 1], "."])
                sample.extra_supervised += [False, False, True, True, True, True]  # `query qxx` is not predictable
    return sample


def make_batch(count: int, length: int, num_needles: int, seed: int, *, all_queries: bool = False) -> list[Sample]:
    generator = torch.Generator().manual_seed(seed)
    return [make_sample(length, num_needles, generator, all_queries=all_queries) for _ in range(count)]


def training_tensors(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for next-token training: loss on the answer tokens (and the supervised
    extra tokens) only, -100 elsewhere; rows are right-padded to the longest."""
    rows = [s.prompt + s.answer + s.extra for s in samples]
    width = max(map(len, rows)) - 1
    pad = TOKEN_ID["<pad>"]
    inputs = torch.tensor([r[:-1] + [pad] * (width - len(r) + 1) for r in rows])
    targets = torch.full_like(inputs, -100)
    for b, s in enumerate(samples):
        first = len(s.prompt) - 1  # position that predicts answer[0]
        targets[b, first:first + len(s.answer)] = torch.tensor(s.answer)
        for offset, (token, supervised) in enumerate(zip(s.extra, s.extra_supervised)):
            if supervised:
                targets[b, first + len(s.answer) + offset] = token
    return inputs, targets


def build_tokenizer(token_id: dict[str, int] | None = None):
    """The word-level tokenizer (one token per word) of `token_id` (default: this task's vocabulary), with a chat
    template that passes the text through."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab=token_id or TOKEN_ID, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<pad>")
    fast.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return fast
