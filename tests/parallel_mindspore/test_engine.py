"""The engine's entry points in one process (tensor and pipeline size 1): built from Megatron's arguments, one
step over micro-batches, evaluation, the per-rank state dict with megatron-core's names, and one-line errors."""
from __future__ import annotations

import numpy as np
import pytest

from mmrun.models.mcore_layout import LayoutError

ARGV = ["--mock-data", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3",
        "--lr", "1e-3", "--hidden-dropout", "0", "--attention-dropout", "0"]
VOCAB = 64


def _args(extra=()):
    from mmrun.training.arguments import parse_args

    args = parse_args([*ARGV, *extra], world_size=1)
    args.padded_vocab_size = VOCAB  # the trainer sets it from the tokenizer
    return args


def _batches(seed: int, count: int = 2):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        tokens = rng.integers(0, VOCAB, (2, 17))
        out.append((tokens[:, :-1], np.broadcast_to(np.arange(16), (2, 16)).copy(), tokens[:, 1:],
                    np.ones((2, 16), np.float32)))
    return out


@pytest.fixture(scope="module")
def engine():
    from mmrun.engines.mindspore.parallel.gpt import build_engine

    return build_engine(_args(), jit=False)


def test_build_engine_reads_megatrons_arguments(engine):
    from mmrun.models.mcore_layout import GPTLayout

    state = engine.model.rank_state_dict()
    layout = GPTLayout(2, 32, 4, 128, VOCAB, 16)
    assert {n: v.shape for n, v in state.items()} == layout.full_shapes()
    init = layout.init_full(1234, 0.02)  # --seed 1234 and --init-method-std 0.02, Megatron's defaults
    assert all(np.array_equal(state[n], init[n]) for n in init)
    assert engine.clip_grad == 1.0 and engine.optimizer.lr == 1e-3
    assert engine.optimizer.names == list(state)  # optimizer state is named as megatron-core's parameters


def test_steps_train_and_evaluate_matches_the_loss(engine):
    batches = _batches(0)
    before = engine.evaluate(batches)
    result = engine(batches)
    assert abs(result.loss - before) < 1e-6  # the step's loss is the loss before its update
    assert result.grad_norm > 0 and result.lr == 1e-3
    after = engine.evaluate(batches)
    assert after < before


def test_state_dict_round_trip_gives_the_same_step():
    from mmrun.backend.mindspore import optim
    from mmrun.backend.mindspore.parallel.engine import ParallelTrainStep
    from mmrun.engines.mindspore.parallel.gpt import build_engine

    first = build_engine(_args(), jit=False)
    first(_batches(1))
    saved, saved_optimizer = first.model.rank_state_dict(), first.optimizer.state_dict()
    expected = first(_batches(2))

    second = build_engine(_args(["--seed", "7"]), jit=False)
    second.model.load_rank_state_dict(saved)
    second.optimizer.load_state_dict(saved_optimizer)
    resumed = second(_batches(2))
    assert resumed.loss == expected.loss and resumed.grad_norm == expected.grad_norm
    assert sorted(saved_optimizer["tensors"]) == sorted(f"{n}.{k}" for n in saved for k in optim.STATE_KEYS)
    assert isinstance(second, ParallelTrainStep)


def test_a_state_of_another_layout_is_a_one_line_error(engine):
    state = engine.model.rank_state_dict()
    state["decoder.layers.0.mlp.linear_fc1.weight"] = np.zeros((64, 32), np.float32)
    del state["decoder.final_layernorm.bias"]
    with pytest.raises(LayoutError) as err:
        engine.model.load_rank_state_dict(state)
    message = str(err.value)
    assert "\n" not in message and "decoder.final_layernorm.bias" in message and "(64, 32)" in message


def test_a_micro_batch_of_the_wrong_shape_is_refused(engine):
    with pytest.raises(ValueError, match=r"\(tokens, position_ids, labels, loss_mask\)\. Received 2 values"):
        engine([_batches(0)[0][:2]])
    with pytest.raises(ValueError, match="no micro-batches"):
        engine([])
