"""The distributed optimizer's shard math (backend/optimizer_shards.py) and, in one process, MindSpore's sharded
AdamW (backend/mindspore/parallel/zero.py): its step against the unsharded one, the bytes of state it holds (measured from
its tensors), and whole-tensor checkpoints that any data-parallel size reads. The 2-process run against the
unsharded optimizer is in tests/training/test_pretrain_e2e.py."""
from __future__ import annotations

import numpy as np
import pytest

from mmrun.backend.optimizer_shards import Segment, ShardLayout


def test_the_docstring_example():
    layout = ShardLayout.build([3, 5, 4], dp=2)
    assert (layout.total, layout.shard, layout.padded) == (12, 6, 12)
    assert layout.segments(0) == (Segment(0, 0, 3, 0), Segment(1, 0, 3, 3))
    assert layout.segments(1) == (Segment(1, 3, 5, 0), Segment(2, 0, 4, 2))


def test_sizes_that_do_not_divide_pad_the_end():
    # 13 elements over 4 ranks: shard 4, buffer 16; the last rank holds 1 element and 3 of padding
    layout = ShardLayout.build([6, 7], dp=4)
    assert (layout.shard, layout.padded) == (4, 16)
    assert layout.segments(1) == (Segment(0, 4, 6, 0), Segment(1, 0, 2, 2))
    assert layout.segments(3) == (Segment(1, 6, 7, 0),) and layout.used(3) == 1
    # more ranks than a shard can fill: the last ranks hold padding only
    tiny = ShardLayout.build([2, 1], dp=5)
    assert tiny.shard == 1 and tiny.padded == 5 and tiny.segments(4) == () and tiny.used(3) == 0


@pytest.mark.parametrize("sizes,dp", [([3, 5, 4], 3), ([1], 1), ([10, 1, 1, 33, 7], 4), ([64, 64, 16], 8),
                                      ([5, 0, 9], 2), ([17, 2, 8, 1], 7)])
def test_every_element_belongs_to_exactly_one_rank_in_order(sizes, dp):
    layout = ShardLayout.build(sizes, dp)
    assert layout.padded % dp == 0 and 0 <= layout.padded - layout.total < dp
    seen = []
    for rank in range(dp):
        begin, end = layout.owned(rank)
        at = 0
        for seg in layout.segments(rank):
            assert seg.offset == at and seg.size > 0  # the segments tile the shard from its start
            seen += [(seg.param, e) for e in range(seg.start, seg.stop)]
            assert begin + seg.offset == layout.offsets[seg.param] + seg.start
            at += seg.size
        assert at == layout.used(rank) <= layout.shard
    assert seen == [(i, e) for i, n in enumerate(sizes) for e in range(n)]


def test_bad_sizes_say_what_was_received():
    with pytest.raises(ValueError, match="Received: 0"):
        ShardLayout.build([3], 0)
    with pytest.raises(ValueError, match=r"Received: 2"):
        ShardLayout.build([3], 2).owned(2)


# ---------------------------------------------------------------------------------------- MindSpore, one process
def _model(ms, dtype=None):
    rng = np.random.default_rng(0)
    dtype = dtype or ms.float32

    class Tiny(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(ms.Tensor(rng.standard_normal((7, 3)), dtype), name="weight")
            self.bias = ms.Parameter(ms.Tensor(rng.standard_normal((3,)), dtype), name="bias")
            self.norm = ms.Parameter(ms.Tensor(np.ones(5), dtype), name="norm")  # 29 elements: odd over 2

        def construct(self, x, y):
            out = ms.ops.matmul(x, self.weight.astype(x.dtype)) + self.bias.astype(x.dtype)
            return ((out.astype(ms.float32) - y) ** 2).mean() + (self.norm * self.norm).sum() * 1e-2

    return Tiny()


def _train(ms, sharded, steps=3, **adam):
    from mmrun.backend.mindspore import optim, train_step
    from mmrun.backend.mindspore.parallel import zero

    model = _model(ms)
    kwargs = dict(lr=5e-2, weight_decay=0.1, no_decay=optim.megatron_no_decay)
    if sharded:
        opt = zero.ShardedAdamW(model.parameters_and_names(), **kwargs)
        step = zero.ShardedTrainStep(model, opt, clip_grad=0.5)
    else:
        opt = optim.AdamW(model.parameters_and_names(), **kwargs, **adam)
        step = train_step.TrainStep(model, opt, clip_grad=0.5)
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(steps):
        batch = (ms.Tensor(rng.standard_normal((4, 7)).astype(np.float32)),
                 ms.Tensor(rng.standard_normal((4, 3)).astype(np.float32)))
        losses.append(step([batch]).loss)
    return losses, [p.asnumpy() for p in opt.params], opt


def test_one_rank_of_the_sharded_step_is_the_unsharded_step(bm):
    import mindspore as ms

    from mmrun.backend.mindspore.parallel import zero

    sharded, params, opt = _train(ms, True)
    exact, exact_params, _ = _train(ms, False, fused=False)  # torch's op order, as the sharded update
    fused, fused_params, plain = _train(ms, False)  # the default kernel
    diff = max(float(np.abs(a - b).max()) for a, b in zip(params, exact_params))
    fused_diff = max(float(np.abs(a - b).max()) for a, b in zip(params, fused_params))
    print(f"sharded (1 rank) vs AdamW(fused=False): {diff:.1e}, vs the fused kernel: {fused_diff:.1e}; "
          f"losses {sharded} / {fused}")
    assert diff <= 1e-6 and fused_diff <= 1e-5
    assert np.allclose(sharded, fused, rtol=0, atol=1e-6)
    # the same state as the unsharded optimizer, measured from the tensors each holds: 2 moments x 29 floats
    assert zero.state_bytes(opt) == zero.state_bytes(plain) == 2 * 29 * 4


def test_each_rank_holds_its_shard_of_the_state_and_reads_whole_tensor_checkpoints(bm):
    import mindspore as ms

    from mmrun.backend.mindspore import optim
    from mmrun.backend.mindspore.parallel import zero

    _, _, trained = _train(ms, True)
    state = trained.state_dict()  # one rank: whole tensors, optim.AdamW's keys
    plain = optim.AdamW(_model(ms).parameters_and_names())
    assert set(state["tensors"]) == set(plain.state_dict()["tensors"]) and state["step"] == 3
    ranks = [zero.ShardedAdamW(_model(ms).parameters_and_names(), dp=2, rank=r) for r in range(2)]
    held = [zero.state_bytes(r) for r in ranks]
    print(f"optimizer state bytes per rank over 2 ranks: {held} (one rank alone: {zero.state_bytes(trained)})")
    assert held == [2 * 15 * 4, 2 * 14 * 4]  # 29 elements: shard 15, the last rank 14 and one of padding
    for rank in ranks:
        rank.load_state_dict(state)
        assert rank.step_count == 3
        for seg, m, v in zip(rank.segments, rank.exp_avg, rank.exp_avg_sq):
            name = rank.names[seg.param]
            for slot, key in ((m, "exp_avg"), (v, "exp_avg_sq")):
                whole = np.asarray(state["tensors"][f"{name}.{key}"]).reshape(-1)
                assert np.array_equal(slot.asnumpy(), whole[seg.start:seg.stop])


def test_bf16_parameters_keep_fp32_main_copies_of_the_shard_only(bm):
    import mindspore as ms

    from mmrun.backend.mindspore.parallel import zero

    ranks = [zero.ShardedAdamW(_model(ms, ms.bfloat16).parameters_and_names(), dp=2, rank=r) for r in range(2)]
    assert [zero.state_bytes(r) for r in ranks] == [3 * 15 * 4, 3 * 14 * 4]  # moments and main copy, fp32
    whole = np.concatenate([p.asnumpy().astype(np.float32).reshape(-1) for p in ranks[0].params])
    mains = np.concatenate([m.asnumpy() for r in ranks for m in r.main_params])
    assert np.array_equal(mains, whole)


def test_a_flat_buffer_of_many_tensors_splits_inside_a_graph():
    """More pieces than one graph split takes (MindSpore's call-depth limit: see BUCKET_TENSORS) come back whole."""
    ms = pytest.importorskip("mindspore")
    from mmrun.backend.mindspore.train_step import _split_flat

    sizes = [1 + i % 3 for i in range(70)]
    flat = np.arange(sum(sizes), dtype=np.float32)

    def split(x):
        return tuple(_split_flat(x, sizes, most=32))

    pieces = ms.jit(split)(ms.Tensor(flat))
    expected = np.split(flat, np.cumsum(sizes)[:-1])
    assert len(pieces) == 70 and all(np.array_equal(p.asnumpy(), e) for p, e in zip(pieces, expected))


def test_with_expert_parallelism_the_experts_state_is_sharded_over_their_own_group(bm):
    """ExpertShardedAdamW (--use-distributed-optimizer with EP > 1): the experts' state over their expert-data-parallel
    group (here 2 ranks), the rest over the data-parallel group (4), in the model's order; each rank reads its pieces
    of a whole-tensor checkpoint. (Both split engines' multi-process runs: tests/training/test_qwen3_vl_moe_pretrain.py
    and docs/qwen3-vl.md.)"""
    import mindspore as ms

    from mmrun.backend.mindspore.parallel import zero
    from mmrun.backend.mindspore.parallel.groups import Group

    state = _train(ms, True)[2].state_dict()  # whole tensors after 3 steps
    ranks = [zero.ExpertShardedAdamW(_model(ms).parameters_and_names(), frozenset({"weight"}),
                                     Group(tuple(range(4)), r, None), Group((r % 2, r % 2 + 2), r // 2, None))
             for r in range(4)]
    assert ranks[0].names == ["weight", "bias", "norm"] and ranks[0].expert_index == (0,)
    # the experts' 21 elements over 2 ranks (11 and 10), the other 8 over 4 (2 each): 2 fp32 moments each
    assert [zero.state_bytes(r.experts) for r in ranks] == [2 * 11 * 4, 2 * 11 * 4, 2 * 10 * 4, 2 * 10 * 4]
    assert [zero.state_bytes(r.dense) for r in ranks] == [2 * 2 * 4] * 4
    for rank in ranks:
        rank.load_state_dict(state)
        assert rank.step_count == 3
        for part in (rank.dense, rank.experts):
            for seg, m in zip(part.segments, part.exp_avg):
                whole = np.asarray(state["tensors"][f"{part.names[seg.param]}.exp_avg"]).reshape(-1)
                assert np.array_equal(m.asnumpy(), whole[seg.start:seg.stop])
