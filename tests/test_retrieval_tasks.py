"""The suite's four task generators: their answers agree with independent solvers, prompts have the asked
length and shape, the scoring accepts exactly the right continuations, and bad requests are refused."""

import pytest
import torch

from scout_sglang.retrieval import data, solvers, tasks


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("length", [256, 2048])
def test_every_generated_answer_is_what_an_independent_solver_finds(task, length):
    for sample in tasks.make_batch(task, 40, length, seed=length):
        text = tasks.words(sample.prompt)
        assert len(sample.prompt) == length and text[0] == "<bos>" and sample.task == task
        answer, ordered = solvers.SOLVERS[task](text)
        assert ordered == sample.unordered_from
        assert answer[:ordered] == tasks.words(sample.answer)[:ordered]
        assert sorted(answer[ordered:]) == sorted(tasks.words(sample.answer)[ordered:])


@pytest.mark.parametrize("task", tasks.TASKS)
def test_every_training_follow_up_question_is_answered_as_the_solver_answers_it(task):
    asked = 0
    plain = tasks.make_batch(task, 1, 512, seed=9)[0]
    for n, sample in enumerate(tasks.make_batch(task, 10, 512, seed=9, all_questions=True)):
        if n == 0:  # the first sample is the one a plain batch makes: follow-ups are only appended
            assert (plain.prompt, plain.answer) == (sample.prompt, sample.answer)
        text = tasks.words(sample.prompt + sample.answer + sample.extra)
        start, supervised = len(sample.prompt) + len(sample.answer), sample.extra_supervised + [False]
        for i in range(len(sample.extra)):
            if supervised[i] and not supervised[i - 1]:  # an answer starts: the text before it asks the question
                end = i + supervised[i:].index(False)
                answer, ordered = solvers.SOLVERS[task](text[:start + i])
                given = text[start + i:start + end][:len(answer)]
                assert given[:ordered] == answer[:ordered] and sorted(given[ordered:]) == sorted(answer[ordered:])
                assert given[ordered:] == sorted(given[ordered:])  # sets are taught in ascending id
                asked += 1
    assert asked == {"niah": 70, "values": 40, "chain": 20, "common": 0}[task]


def test_the_solvers_answer_hand_written_prompts_and_refuse_ambiguous_ones():
    niah = "<bos> ban needle K01 V01 V02 . der needle K02 V03 V04 . fil query q02".split()
    assert solvers.solve_niah(niah) == (["K02", "V03", "V04"], 3)
    values = "<bos> needle K05 V09 . ban needle K06 V01 . needle K05 V07 . values q05".split()
    assert solvers.solve_values(values) == (["K05", "V09", "V07"], 1)
    chain = "<bos> assign V03 V11 . ban assign V04 V19 . assign V11 V12 . der assign V12 V15 . track V03".split()
    assert solvers.solve_chain(chain) == (["V11", "V12", "V15"], 3)
    common = "<bos> ban der ban fil ban der gon der fil ban common".split()
    assert solvers.solve_common(common, top=2) == (["ban", "der"], 0)
    with pytest.raises(ValueError, match="tie"):
        solvers.solve_common(common[:-1] + ["gon", "common"], top=3)  # fil and gon both twice
    with pytest.raises(ValueError, match="2 needles"):
        solvers.solve_niah(niah[:-1] + ["needle", "K02", "V05", "V06", ".", "query", "q02"])
    with pytest.raises(ValueError, match="repeats"):
        solvers.solve_values(values[:-2] + ["needle", "K05", "V09", ".", "values", "q05"])
    with pytest.raises(ValueError, match="twice"):
        solvers.solve_chain(chain[:-2] + ["assign", "V11", "V17", ".", "track", "V03"])
    with pytest.raises(ValueError, match="not a"):
        solvers.solve_niah(common)


def test_values_and_chain_spread_what_must_be_read_over_the_context():
    for sample in tasks.make_batch("values", 20, 2048, seed=3):
        text = tasks.words(sample.prompt)
        key = tasks.words(sample.answer)[0]
        at = [i for i in range(len(text) - 1) if text[i] == "needle" and text[i + 1] == key]
        assert len(at) == tasks.VALUES_PER_KEY and len({i // 16 for i in at}) >= 2  # not one block
    for sample in tasks.make_batch("chain", 20, 2048, seed=4):
        text = tasks.words(sample.prompt)
        assert text.count("assign") == 3 * tasks.HOPS and text[-2] == "track"


def test_common_words_stand_out_and_land_everywhere():
    for length in (256, 2048):
        sample = tasks.make_batch("common", 10, length, seed=5)[0]
        text = tasks.words(sample.prompt)[1:-1]
        counts = sorted((text.count(w) for w in set(text)), reverse=True)
        assert counts[2] >= counts[3] + 2
        frequent = set(tasks.words(sample.answer))
        places = [i for i, w in enumerate(text) if w in frequent]
        assert places[0] < len(text) // 10 and places[-1] > len(text) * 9 // 10


def test_scoring_takes_any_order_only_where_the_task_allows_it():
    values = tasks.make_batch("values", 1, 256, seed=6)[0]
    key, *found = values.answer
    assert values.is_correct([key] + found[::-1]) and not values.is_correct(found[::-1] + [key])
    assert not values.is_correct([key] + found[:-1] + [found[0]])
    chain = tasks.make_batch("chain", 1, 256, seed=6)[0]
    assert chain.is_correct(chain.answer) and not chain.is_correct(chain.answer[::-1])
    assert found == sorted(found) and values.allowed() == [[token] for token in values.answer]  # taught sorted
    common = tasks.make_batch("common", 1, 512, seed=6)[0]
    assert common.answer == sorted(common.answer) and common.is_correct(common.answer[::-1])


def test_the_vocabulary_extends_the_needle_vocabulary_id_for_id():
    assert tasks.VOCAB[:len(data.VOCAB)] == data.VOCAB and len(set(tasks.VOCAB)) == len(tasks.VOCAB)
    tokenizer = tasks.build_tokenizer()
    sample = tasks.make_batch("chain", 1, 128, seed=7)[0]
    assert tokenizer(" ".join(tasks.words(sample.prompt)), add_special_tokens=False)["input_ids"] == sample.prompt


def test_training_tensors_supervise_the_answer_positions_with_their_allowed_tokens():
    samples = [tasks.make_batch("values", 1, 200, seed=8)[0], tasks.make_batch("niah", 1, 200, seed=8)[0]]
    inputs, targets = tasks.training_tensors(samples)
    assert inputs.shape == (2, 204)
    assert [(b, p) for b, p, _ in targets] == [(0, 199 + i) for i in range(5)] + [(1, 199 + i) for i in range(3)]
    assert inputs[0, 200:204].tolist() == samples[0].answer[:4]


def test_impossible_requests_are_refused():
    with pytest.raises(ValueError, match="unknown task"):
        tasks.make_batch("sum", 1, 256, seed=0)
    with pytest.raises(ValueError, match="shorter"):
        tasks.make_batch("common", 1, 64, seed=0)
    with pytest.raises(ValueError, match="shorter"):
        tasks.make_chain(20, torch.Generator().manual_seed(0))
