"""models/gpt_names.py: mmrun's GPT <-> megatron-core names, the fused QKV layout, TP/PP shards (numpy only).

The layout facts checked against megatron-core itself (names and shard shapes of a real GPTModel per rank)
are in test_megatron_checkpoints.py; here the conversions are checked for exactness and for meaning: the
attention computed from converted weights is the attention of the original ones.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from mmrun.models import gpt_names as cg

SHAPE = cg.GPTShape(num_layers=4, hidden_size=16, num_attention_heads=4)
VOCAB, POSITIONS, FFN = 64, 8, 64


def random_mmrun_state(shape: cg.GPTShape = SHAPE, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = cg.mmrun_parameter_shapes(shape, VOCAB, POSITIONS, FFN)
    return {name: rng.standard_normal(size).astype(np.float32) for name, size in shapes.items()}


def with_optimizer_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{n}{suffix}": a + i for n, a in state.items() for i, suffix in enumerate(cg.STATE_SUFFIXES)}


def test_mmrun_to_mcore_and_back_is_bit_exact():
    state = random_mmrun_state()
    back = cg.mcore_to_mmrun(cg.mmrun_to_mcore(state, SHAPE), SHAPE)
    assert sorted(back) == sorted(state)
    assert all(np.array_equal(back[k], state[k]) for k in state)


def test_every_mmrun_name_has_its_megatron_core_name():
    full = cg.mmrun_to_mcore(random_mmrun_state(), SHAPE)
    assert "embedding.word_embeddings.weight" in full and "output_layer.weight" not in full  # tied by default
    assert "decoder.layers.3.self_attention.linear_qkv.weight" in full
    assert "decoder.layers.0.mlp.linear_fc2.bias" in full and "decoder.final_layernorm.weight" in full
    untied = cg.GPTShape(2, 16, 4, tied=False)
    assert "output_layer.weight" in cg.mmrun_to_mcore(random_mmrun_state(untied), untied)


def _attention_mmrun(x, w, b, heads):
    """models/gpt.py: [Q | K | V] = x W^T + b, heads are consecutive head_dim columns of each."""
    q, k, v = np.split(x @ w.T + b, 3, axis=-1)
    split = lambda t: t.reshape(t.shape[0], heads, -1).transpose(1, 0, 2)
    return split(q), split(k), split(v)


def _attention_mcore(x, w, b, heads):
    """megatron-core's SelfAttention.get_query_key_value_tensors: [s, heads, 3 x head_dim] split per head."""
    mixed = (x @ w.T + b).reshape(x.shape[0], heads, -1)
    q, k, v = np.split(mixed, 3, axis=-1)
    return q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)


def test_converted_qkv_gives_the_same_queries_keys_and_values():
    state = random_mmrun_state()
    full = cg.mmrun_to_mcore(state, SHAPE)
    x = np.random.default_rng(1).standard_normal((5, SHAPE.hidden_size)).astype(np.float32)
    ours = _attention_mmrun(x, state["h.1.attn.c_attn.weight"], state["h.1.attn.c_attn.bias"], 4)
    theirs = _attention_mcore(x, full["decoder.layers.1.self_attention.linear_qkv.weight"],
                              full["decoder.layers.1.self_attention.linear_qkv.bias"], 4)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_tensor_parallel_rank_holds_whole_heads():
    full = cg.mmrun_to_mcore(random_mmrun_state(), SHAPE)
    x = np.random.default_rng(2).standard_normal((3, SHAPE.hidden_size)).astype(np.float32)
    whole = _attention_mcore(x, full["decoder.layers.0.self_attention.linear_qkv.weight"],
                             full["decoder.layers.0.self_attention.linear_qkv.bias"], 4)
    layout = cg.Layout(tp=2)
    for rank in range(2):
        part = cg.shard(full, SHAPE, layout, rank, 0)
        mine = _attention_mcore(x, part["decoder.layers.0.self_attention.linear_qkv.weight"],
                                part["decoder.layers.0.self_attention.linear_qkv.bias"], 2)
        for a, b in zip(whole, mine):
            np.testing.assert_allclose(a[2 * rank:2 * rank + 2], b, rtol=1e-6, atol=1e-6)


LAYOUTS = [cg.Layout(tp, pp, vpp) for tp, pp, vpp in itertools.product((1, 2, 4), (1, 2, 4), (1, 2))
           if not (vpp > 1 and pp == 1) and SHAPE.num_layers % (pp * vpp) == 0]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("tied", [True, False])
def test_split_and_join_round_trip_bit_exact_with_optimizer_state(layout, tied):
    shape = cg.GPTShape(4, 16, 4, tied=tied)
    full = cg.mmrun_to_mcore(with_optimizer_state(random_mmrun_state(shape)), shape)
    shards = cg.split(full, shape, layout)
    assert sorted(shards) == sorted(layout.ranks())
    joined = cg.join(shards, shape, layout)
    assert sorted(joined) == sorted(full)
    assert all(np.array_equal(joined[k], full[k]) for k in full)


def test_pipeline_stages_hold_megatron_cores_layers_and_the_tied_copy():
    full = cg.mmrun_to_mcore(random_mmrun_state(), SHAPE)
    shards = cg.split(full, SHAPE, cg.Layout(tp=1, pp=2))
    first, last = shards[(0, 0)], shards[(0, 1)]
    assert "embedding.word_embeddings.weight" in first and "decoder.final_layernorm.weight" not in first
    assert {n.split(".")[2] for n in first if n.startswith("decoder.layers.")} == {"0", "1"}
    assert {n.split(".")[2] for n in last if n.startswith("decoder.layers.")} == {"0", "1"}  # numbered per stage
    np.testing.assert_array_equal(last["decoder.layers.0.mlp.linear_fc1.weight"],
                                  full["decoder.layers.2.mlp.linear_fc1.weight"])
    # tied embeddings: the last stage keeps a copy of the word embeddings as its output layer (Megatron)
    np.testing.assert_array_equal(last["output_layer.weight"], full["embedding.word_embeddings.weight"])


def test_virtual_stages_interleave_layers_and_prefix_names():
    full = cg.mmrun_to_mcore(random_mmrun_state(), SHAPE)
    shards = cg.split(full, SHAPE, cg.Layout(tp=1, pp=2, vpp=2))
    # pipeline rank 0 holds global layers 0 (virtual stage 0) and 2 (virtual stage 1): megatron-core's offsets
    np.testing.assert_array_equal(shards[(0, 0)]["model1.decoder.layers.0.mlp.linear_fc1.weight"],
                                  full["decoder.layers.2.mlp.linear_fc1.weight"])
    np.testing.assert_array_equal(shards[(0, 1)]["model0.decoder.layers.0.mlp.linear_fc1.weight"],
                                  full["decoder.layers.1.mlp.linear_fc1.weight"])
    assert "model0.embedding.word_embeddings.weight" in shards[(0, 0)]
    assert "model1.decoder.final_layernorm.weight" in shards[(0, 1)]


def test_initial_shard_is_the_shard_of_mmruns_initial_weights():
    shapes = cg.mmrun_parameter_shapes(SHAPE, VOCAB, POSITIONS, FFN)
    full = cg.mmrun_to_mcore(dict(cg.mmrun_initial_weights(shapes, 1234, 0.02, SHAPE.num_layers)), SHAPE)
    layout = cg.Layout(tp=2, pp=2)
    for t, p in layout.ranks():
        mine = cg.initial_shard(SHAPE, layout, t, p, vocab_size=VOCAB, max_position_embeddings=POSITIONS,
                                ffn_hidden_size=FFN, seed=1234, std=0.02)
        expected = cg.shard(full, SHAPE, layout, t, p)
        assert sorted(mine) == sorted(expected)
        assert all(np.array_equal(mine[k], expected[k]) for k in mine)


def test_initial_weights_follow_megatrons_init():
    shapes = cg.mmrun_parameter_shapes(cg.GPTShape(4, 64, 4), 512, 32, 256)
    state = dict(cg.mmrun_initial_weights(shapes, 7, 0.02, 4))
    assert state["wte.weight"].std() == pytest.approx(0.02, rel=0.05)
    assert state["h.1.mlp.c_proj.weight"].std() == pytest.approx(0.02 / np.sqrt(8), rel=0.05)
    assert not state["h.0.attn.c_attn.bias"].any() and (state["ln_f.weight"] == 1).all()


@pytest.mark.parametrize("call, message", [
    (lambda: cg.mmrun_name_to_mcore("h.0.attn.rotary.weight"), "is not a parameter of mmrun's GPT"),
    (lambda: cg.mcore_name_to_mmrun("decoder.layers.0.self_attention.q_layernorm.weight"), "is not a parameter"),
    (lambda: cg.Layout(tp=3).check(SHAPE), "cannot be split over tensor-parallel size 3"),
    (lambda: cg.Layout(pp=3).check(SHAPE), "cannot be split evenly into 3 pipeline stages"),
    (lambda: cg.join({(0, 0): {}}, SHAPE, cg.Layout(tp=2)), "shards of ranks [(1, 0)]"),
])
def test_errors_are_one_line_and_say_what_to_do(call, message):
    with pytest.raises(cg.ConversionError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_shape_of_reads_a_state_dict():
    state = random_mmrun_state()
    assert cg.GPTShape.of(state, 4) == SHAPE
    assert cg.GPTShape.of(cg.mmrun_to_mcore(state, SHAPE), 4) == SHAPE
