"""The suite model's training pieces: each step's data (follow-up questions, resumed runs on fresh data), the
term against repeating a set answer's word, and the per-task weighting of the answer loss."""

import torch
from support import requires_cuda

from scout_sglang.retrieval import tasks, train_suite


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tasks.VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    return LlamaForCausalLM(config)


def test_a_resumed_run_goes_on_with_fresh_sequences_that_ask_every_question():
    first = train_suite.step_samples(3, 100, 4096, resumed=True)
    again = train_suite.step_samples(3, 100, 4096, resumed=True)
    later = train_suite.step_samples(3, 100, 4096, resumed=True, first_step=1500)
    assert [s.prompt for s in first] == [s.prompt for s in again]  # deterministic
    assert not {tuple(s.prompt) for s in first} & {tuple(s.prompt) for s in later}
    asking = [s for s in first + later if s.task != "common"]
    assert asking and all(any(s.extra_supervised) for s in asking)


def test_the_values_mix_gives_half_the_sequences_to_values_mostly_at_2048_tokens():
    steps = [train_suite.step_samples(step, 100, 8192, resumed=True, resume_mix="values") for step in range(40)]
    samples = [s for step in steps for s in step]
    assert abs(sum(s.task == "values" for s in samples) / len(samples) - 0.5) < 0.1
    assert {len(s.prompt) for s in samples} <= set(train_suite.RESUME_MIXES["values"][1])
    weak = [s for step in range(40) for s in train_suite.step_samples(step, 100, 8192, resumed=True)]
    assert sum(s.task == "values" for s in weak) / len(weak) < 0.35


def test_the_repeat_mask_holds_the_set_words_given_before_each_position():
    sample = tasks.make_batch("values", 1, 256, seed=4)[0]
    key, *found = sample.answer
    _, targets = tasks.training_tensors([sample])
    mask = train_suite.repeat_mask([sample], targets, len(tasks.VOCAB))
    for i, row in enumerate(mask[:len(sample.answer)]):
        assert row.nonzero().flatten().tolist() == sorted(found[:max(0, i - 1)])  # the key is not a set word


def test_each_task_weighs_the_same_in_the_answer_loss_however_many_questions_it_asks():
    model = tiny_model()
    niah = tasks.make_batch("niah", 1, 200, seed=1, all_questions=True)  # 31 supervised tokens
    common = tasks.make_batch("common", 1, 200, seed=1, all_questions=True)  # 3
    both, *_ = train_suite.losses(model, niah + common)
    alone = [train_suite.losses(model, batch)[0] for batch in (niah, common)]
    torch.testing.assert_close(both, sum(alone) / 2, rtol=1e-4, atol=1e-4)
    with_penalty, *_ = train_suite.losses(model, tasks.make_batch("values", 2, 200, seed=1), repeat_penalty=1.0)
    without, *_ = train_suite.losses(model, tasks.make_batch("values", 2, 200, seed=1))
    assert with_penalty > without


@requires_cuda
def test_a_step_on_the_gpu_gives_the_cpu_losses_and_accuracies():
    """--device cuda: every tensor of the loss follows the model (the last runs of the shipped model trained so)."""
    model, samples = tiny_model(), tasks.make_batch("values", 2, 200, seed=1, all_questions=True)
    on_cpu = train_suite.losses(model, samples, repeat_penalty=1.0)
    on_gpu = train_suite.losses(model.to("cuda"), samples, repeat_penalty=1.0)
    for cpu, gpu in zip(on_cpu[:2], on_gpu[:2]):
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-3, atol=1e-4)
    assert on_gpu[2] == on_cpu[2]
    assert train_suite.device_name("cuda") == torch.cuda.get_device_name() and train_suite.device_name("cpu") == "cpu"
