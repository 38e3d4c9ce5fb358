"""The synthetic retrieval task and its training/evaluation plumbing at tiny sizes."""

import json

import pytest
import torch

from scout_sglang.retrieval import data


def test_a_sample_has_its_length_needles_and_the_queried_needles_values_as_answer():
    generator = torch.Generator().manual_seed(0)
    for length, needles in ((64, 1), (300, 8), (41, 3)):
        sample = data.make_sample(length, needles, generator)
        text = data.words(sample.prompt)
        assert len(sample.prompt) == length and text[0] == "<bos>" and text[-2] == "query"
        starts = [i for i, w in enumerate(text) if w == "needle"]
        assert len(starts) == needles
        keys = [text[i + 1] for i in starts]
        assert len(set(keys)) == needles  # every needle has its own key
        key = "K" + text[-1][1:]  # the query names Kxx as qxx
        assert text[-1] == data.query_key(key) and text.count(key) == 1
        at = starts[keys.index(key)]
        assert data.words(sample.answer) == [key, text[at + 2], text[at + 3], ".", "<eos>"]
        assert sample.needle_depth == pytest.approx(at / length)


def test_needles_land_at_every_depth():
    depths = [s.needle_depth for s in data.make_batch(200, 512, 4, seed=1)]
    assert min(depths) < 0.1 and max(depths) > 0.9


def test_impossible_requests_are_refused():
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="cannot hold"):
        data.make_sample(20, 4, generator)
    with pytest.raises(ValueError, match="num_needles"):
        data.make_sample(2000, 40, generator)


def test_training_targets_cover_the_answers_and_the_extra_queries_only():
    samples = data.make_batch(3, 80, 3, seed=2, all_queries=True)
    inputs, targets = data.training_tensors(samples)
    for b, sample in enumerate(samples):
        first = len(sample.prompt) - 1
        assert targets[b, :first].eq(-100).all()
        assert targets[b, first:first + 5].tolist() == sample.answer
        assert int(targets[b].ne(-100).sum()) == 5 + sum(sample.extra_supervised) == 5 + 4 * 2
        row = sample.prompt + sample.answer + sample.extra
        assert inputs[b, :len(row) - 1].tolist() == row[:-1]


def test_the_tokenizer_maps_each_word_to_its_token_both_ways():
    tokenizer = data.build_tokenizer()
    sample = data.make_batch(1, 200, 5, seed=3)[0]
    text = " ".join(data.words(sample.prompt))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == sample.prompt
    assert tokenizer.decode(sample.answer[:3]).split() == data.words(sample.answer[:3])
    assert len(tokenizer) == len(data.VOCAB)


def test_training_is_deterministic_and_saves_a_loadable_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scout_sglang.retrieval import train

    kwargs = dict(steps=6, batch=4, max_length=64, eval_lengths=[64], lr=1e-3, seed=0, eval_every=3, eval_count=4)
    report = train.train(tmp_path / "a", **kwargs)
    train.train(tmp_path / "b", **kwargs)
    first = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    second = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    for (name, x), (_, y) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(x, y), name
    assert len(report["history"]) == 2 and set(report["final_accuracy"]) == {64}
    saved = json.loads((tmp_path / "a" / "training_report.json").read_text())
    assert saved["steps"] == 6
    assert AutoTokenizer.from_pretrained(tmp_path / "a").convert_tokens_to_ids("needle") == data.TOKEN_ID["needle"]


def test_the_curriculum_starts_short_with_two_needles_and_ends_at_full_length():
    from scout_sglang.retrieval.train import curriculum

    assert curriculum(0, 1000, 1024) == (64, 2)
    assert curriculum(549, 1000, 1024) == (64, 2)
    assert curriculum(900, 1000, 1024) == (1024, 8)
    lengths = [curriculum(step, 1000, 1024)[0] for step in range(1000)]
    assert lengths == sorted(lengths)
