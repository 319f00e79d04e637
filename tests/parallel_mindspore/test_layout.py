"""models/mcore_layout.py: megatron-core GPTModel's names and shapes, tensor-parallel shards and pipeline stages,
and the numpy initial weights; backend/mindspore/parallel/groups.py: megatron-core's rank groups."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mmrun.common import ports
from mmrun.models.mcore_layout import OUTPUT_LAYER, WORD_EMBEDDINGS, GPTLayout, LayoutError

SIZES = dict(num_layers=4, hidden_size=32, num_attention_heads=4, ffn_hidden_size=96, vocab_size=64,
             max_position_embeddings=16)


@pytest.mark.parametrize("untie", [False, True])
def test_full_shapes_are_megatron_core_state_dict(jobs, untie):
    layout = GPTLayout(**SIZES, untie_embeddings_and_output_weights=untie)
    run = subprocess.run([sys.executable, str(jobs.workers / "mcore_names.py"),
                          json.dumps({**SIZES, "untie_embeddings_and_output_weights": untie}), str(ports.free_port())],
                         capture_output=True, text=True, env=jobs.env(), timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    megatron = json.loads(run.stdout.strip().splitlines()[-1])
    assert {n: tuple(s) for n, s in megatron.items()} == layout.full_shapes()
    assert list(megatron) == list(layout.full_shapes())  # the same order as megatron-core's state_dict()


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 4)])
@pytest.mark.parametrize("untie", [False, True])
def test_shard_and_join_round_trip(tp, pp, untie):
    layout = GPTLayout(**SIZES, untie_embeddings_and_output_weights=untie)
    full = layout.init_full(seed=3)
    shards = {(t, p): layout.shard(full, tp, pp, t, p) for t in range(tp) for p in range(pp)}
    joined = layout.join(shards, tp, pp)
    assert list(joined) == list(full)
    assert all(np.array_equal(joined[name], full[name]) for name in full)
    for (t, p), shard in shards.items():
        assert {n: v.shape for n, v in shard.items()} == layout.rank_shapes(tp, pp, p)
        # the memory-light initialisation draws the same shard
        drawn = layout.init_rank(3, 0.02, tp, pp, t, p)
        assert list(drawn) == list(shard) and all(np.array_equal(drawn[n], shard[n]) for n in shard)


def test_tensor_parallel_split_follows_megatron_core():
    layout = GPTLayout(**SIZES)
    full = layout.init_full(seed=5)
    rank1 = layout.shard(full, 2, 1, 1, 0)
    qkv = full["decoder.layers.0.self_attention.linear_qkv.weight"]
    # fused per-head [q_h k_h v_h] rows: rank 1 holds heads 2 and 3 whole
    head = 3 * SIZES["hidden_size"] // SIZES["num_attention_heads"]
    assert np.array_equal(rank1["decoder.layers.0.self_attention.linear_qkv.weight"], qkv[2 * head:])
    assert np.array_equal(rank1["decoder.layers.0.self_attention.linear_proj.weight"],
                          full["decoder.layers.0.self_attention.linear_proj.weight"][:, 16:])
    assert np.array_equal(rank1["decoder.layers.0.mlp.linear_fc2.bias"], full["decoder.layers.0.mlp.linear_fc2.bias"])
    assert np.array_equal(rank1[WORD_EMBEDDINGS], full[WORD_EMBEDDINGS][32:])


def test_pipeline_stages_number_their_layers_from_zero():
    layout = GPTLayout(**SIZES)
    full = layout.init_full(seed=5)
    last = layout.shard(full, 1, 2, 0, 1)
    assert np.array_equal(last["decoder.layers.0.mlp.linear_fc1.weight"], full["decoder.layers.2.mlp.linear_fc1.weight"])
    assert "decoder.layers.2.mlp.linear_fc1.weight" not in last and "decoder.final_layernorm.weight" in last
    # tied embeddings over two stages: the last stage starts its output layer from the word embeddings
    assert np.array_equal(last[OUTPUT_LAYER], full[WORD_EMBEDDINGS]) and WORD_EMBEDDINGS not in last
    assert layout.global_layer_name("decoder.layers.1.input_layernorm.bias", 2, 1) == \
        "decoder.layers.3.input_layernorm.bias"
    assert OUTPUT_LAYER not in layout.shard(full, 1, 1, 0, 0)  # one stage: the output layer reads the embeddings


def test_initial_weights_are_megatrons():
    layout = GPTLayout(**SIZES)
    full = layout.init_full(seed=1, init_method_std=0.02)
    assert np.all(full["decoder.final_layernorm.weight"] == 1) and np.all(full["decoder.layers.1.mlp.linear_fc1.bias"] == 0)
    assert abs(full[WORD_EMBEDDINGS].std() - 0.02) < 0.002
    assert abs(full["decoder.layers.0.mlp.linear_fc2.weight"].std() - 0.02 / np.sqrt(8)) < 0.001


@pytest.mark.parametrize("sizes, tp, pp, what", [
    ({"num_attention_heads": 3, "hidden_size": 33}, 2, 1, "--num-attention-heads (3)"),
    ({}, 1, 3, "--num-layers (4)"),
    ({"vocab_size": 63}, 2, 1, "the padded vocabulary size (63)"),
])
def test_sizes_megatron_cannot_split_are_one_line_errors(sizes, tp, pp, what):
    layout = GPTLayout(**{**SIZES, **sizes})
    with pytest.raises(LayoutError) as err:
        layout.rank_shapes(tp, pp, 0)
    assert what in str(err.value) and "\n" not in str(err.value)


def test_join_names_what_is_missing():
    layout = GPTLayout(**SIZES)
    with pytest.raises(LayoutError, match=r"missing \[\(1, 0\)\]"):
        layout.join({(0, 0): layout.shard(layout.init_full(0), 2, 1, 0, 0)}, 2, 1)


@pytest.mark.parametrize("world, tp, pp", [(1, 1, 1), (2, 2, 1), (2, 1, 2), (4, 2, 2), (8, 2, 2), (8, 2, 1), (8, 1, 4),
                                           (16, 4, 2)])
def test_rank_groups_are_megatron_cores(world, tp, pp):
    from megatron.core.parallel_state import RankGenerator

    from mmrun.backend.mindspore.parallel.groups import build_state, rank_groups

    dp = world // (tp * pp)
    megatron = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    ours = rank_groups(world, tp, pp)
    for kind, token in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("mp", "tp-pp")):
        assert sorted(ours[kind]) == sorted(megatron.get_ranks(token)), kind
    # megatron-core's embedding group: the first and last rank of every pipeline group
    assert sorted(ours["embd"]) == sorted(sorted({g[0], g[-1]}) for g in megatron.get_ranks("pp"))
    for rank in range(world):
        state = build_state(rank, world, tp, pp)
        assert rank in state.group("tp").ranks and state.group("tp").ranks[state.tp_rank] == rank
        assert state.group("pp").ranks[state.pp_rank] == rank
        assert state.is_first_stage == (state.pp_rank == 0) and state.is_last_stage == (state.pp_rank == pp - 1)


def test_world_that_tp_times_pp_does_not_divide_is_a_usage_error():
    from mmrun.backend.errors import UsageError
    from mmrun.backend.mindspore.parallel.groups import rank_groups

    with pytest.raises(UsageError, match=r"world size \(6\) must be a multiple of .*\(4\) x .*\(1\)"):
        rank_groups(6, 4, 1)
