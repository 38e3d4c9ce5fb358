"""Growing a trained retrieval model: inserted layers leave its function unchanged, the length
ramp reaches the final context, and the two-stage training is deterministic."""

import json

import pytest
import torch

from scout_sglang.retrieval import data, grow, train


def small_model(seed=0):
    return train.build_model(seed, num_layers=2, hidden=32, num_heads=2, num_kv_heads=1, head_dim=16).eval()


@pytest.mark.parametrize("insert_at", [[0], [1], [2], [1, 3]])
def test_inserted_layers_leave_the_logits_unchanged(insert_at):
    model = small_model()
    assert all(layer.self_attn.o_proj.weight.any() for layer in model.model.layers)  # no layer silent already
    grown = grow.grow(model, insert_at, seed=1)
    ids = torch.tensor([data.make_batch(1, 96, 3, seed=5)[0].prompt])
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, grown(input_ids=ids).logits
    assert grown.config.num_hidden_layers == 2 + len(insert_at)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_old_layers_keep_their_weights_in_order_and_new_ones_start_silent():
    model = small_model()
    grown = grow.grow(model, [1], seed=1)
    old, new = model.model.layers, grown.model.layers
    assert torch.equal(new[0].self_attn.q_proj.weight, old[0].self_attn.q_proj.weight)
    assert torch.equal(new[2].self_attn.q_proj.weight, old[1].self_attn.q_proj.weight)
    assert torch.equal(new[2].mlp.down_proj.weight, old[1].mlp.down_proj.weight)
    assert not new[1].self_attn.o_proj.weight.any() and not new[1].mlp.down_proj.weight.any()
    assert new[1].self_attn.q_proj.weight.any()  # the new layer can learn: only its outputs start at zero


@pytest.mark.parametrize("insert_at", [[3], [-1], [1, 1]])
def test_impossible_insert_positions_are_refused(insert_at):
    with pytest.raises(ValueError, match="insert_at"):
        grow.grow(small_model(), insert_at)


def test_the_growth_ramp_starts_at_its_start_length_and_holds_the_final_length_for_the_last_40_percent():
    lengths = [grow.ramp(step, 100, 256, 2048) for step in range(100)]
    assert lengths[0] == 256 and lengths == sorted(lengths)
    assert set(lengths[60:]) == {2048} and lengths[59] < 2048
    assert all(length % 32 == 0 for length in lengths)


def test_two_stage_training_is_deterministic_and_reports_both_stages(tmp_path):
    from transformers import AutoModelForCausalLM

    kwargs = dict(steps=4, batch=4, max_length=64, eval_lengths=[64], lr=1e-3, seed=0, eval_every=2, eval_count=4,
                  insert_layers=(1,), grow_steps=4, grow_max_length=96)
    report = train.train(tmp_path / "a", **kwargs)
    train.train(tmp_path / "b", **kwargs)
    first = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    second = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    assert first.config.num_hidden_layers == 3
    for (name, x), (_, y) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(x, y), name
    saved = json.loads((tmp_path / "a" / "training_report.json").read_text())
    assert saved["model"]["num_layers"] == 3 and saved["grow"]["insert_layers"] == [1]
    assert [h["step"] for h in report["grow"]["history"]] == [2, 4]
    assert report["grow"]["history"][-1]["length"] == 96


def test_growing_a_saved_model_skips_the_first_stage(tmp_path):
    small_model().save_pretrained(tmp_path / "source")
    report = train.train(tmp_path / "grown", steps=99, batch=4, max_length=64, eval_lengths=[64], lr=1e-3, seed=0,
                         eval_every=2, eval_count=4, insert_layers=(2,), grow_steps=2, grow_max_length=64,
                         grow_from=tmp_path / "source")
    assert report["history"] == [] and report["model"] == dict(num_layers=3, hidden=32, num_heads=2, num_kv_heads=1,
                                                               head_dim=16)
