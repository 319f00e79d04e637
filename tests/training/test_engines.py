"""The engine seam without a framework: which engine a run gets, Megatron's parallel-size rules, and the
pipeline/context-parallel helpers an entry's get_batch uses."""
from __future__ import annotations

import numpy as np
import pytest

from mmrun import engines
from mmrun.training import parallel
from mmrun.training.arguments import ArgumentsError, parse_args
from mmrun.engines.base import Engine, ParallelLayout

BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--mock-data"]


def args_of(*extra: str, world_size: int = 1):
    return parse_args([*BASE, *extra], world_size=world_size)


@pytest.mark.parametrize("extra, framework, engine", [
    ([], "pytorch", "mmrun"),
    ([], "mindspore", "mmrun"),
    (["--use-mcore-models"], "pytorch", "megatron-core"),
    (["--tensor-model-parallel-size", "2"], "pytorch", "megatron-core"),
    (["--pipeline-model-parallel-size", "2"], "pytorch", "megatron-core"),
    (["--context-parallel-size", "2"], "pytorch", "megatron-core"),
    (["--use-distributed-optimizer"], "pytorch", "megatron-core"),
    (["--transformer-impl", "transformer_engine"], "pytorch", "megatron-core"),
    (["--use-mcore-models"], "mindspore", "mindspore-parallel"),
    (["--tensor-model-parallel-size", "2"], "mindspore", "mindspore-parallel"),
    (["--pipeline-model-parallel-size", "2"], "mindspore", "mindspore-parallel"),
    (["--context-parallel-size", "2"], "mindspore", "mindspore-parallel"),  # which refuses it (test below)
    # mmrun's data-parallel engine shards the optimizer on MindSpore (backend/mindspore/parallel/zero.py)
    (["--use-distributed-optimizer"], "mindspore", "mmrun"),
    (["--use-mcore-models", "--use-distributed-optimizer"], "mindspore", "mindspore-parallel"),
])
def test_the_engine_a_run_gets(extra, framework, engine):
    assert engines.choose(args_of(*extra, world_size=2), framework).name == engine


def test_a_parallel_flag_without_use_mcore_models_says_what_happens():
    """No silent surprise: megatron-core's GPTModel (same network, same initial weights) with one notice."""
    args = args_of("--tensor-model-parallel-size", "2", world_size=2)
    assert engines.parallel_flags(args) == ["--tensor-model-parallel-size 2"]
    said: list[str] = []
    engine = engines.create(args, "pytorch", said.append)  # built, not initialised: nothing starts
    assert engine.name == "megatron-core" and args.use_mcore_models
    assert len(said) == 1 and said[0].startswith(
        "notice: --tensor-model-parallel-size 2: mmrun's GPT implements none of this, so this run trains "
        "megatron-core's GPTModel")


def test_a_model_file_entry_gets_its_own_model_without_the_gpt_notice():
    """models/pretrain_vlm.py (--mm-model): a split trains the entry's own model on megatron-core, so the GPT's
    notice would be wrong; use_mcore_models tells its model_provider to build the megatron-core stages."""
    from mmrun.training.arguments import ModelSource

    source = ModelSource(flag="--mm-model", sizes={"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4},
                         data_parallel_only=False)
    args = parse_args([*BASE, "--tensor-model-parallel-size", "2"], world_size=2, model_source=source)
    said: list[str] = []
    engine = engines.create(args, "pytorch", said.append)
    assert engine.name == "megatron-core" and args.use_mcore_models and said == []


def test_on_mindspore_the_notice_names_the_mindspore_model():
    args = args_of("--pipeline-model-parallel-size", "2", world_size=2)
    said: list[str] = []
    engine = engines.create(args, "mindspore", said.append)
    assert engine.name == "mindspore-parallel" and args.use_mcore_models
    assert len(said) == 1 and "megatron-core's GPTModel rebuilt on MindSpore (engines/mindspore/parallel/gpt.py)" in said[0]


@pytest.mark.parametrize("extra, flag", [
    (["--tensor-model-parallel-size", "2", "--fp16"], "--fp16"),
    (["--pipeline-model-parallel-size", "2", "--bf16"], "--bf16"),
    (["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2", "--global-batch-size",
      "4"], "--virtual-pipeline-model-parallel-size 2"),
    (["--context-parallel-size", "2"], "--context-parallel-size 2"),
    (["--use-mcore-models", "--transformer-impl", "transformer_engine"], "--transformer-impl transformer_engine"),
])
def test_the_mindspore_parallel_engine_refuses_in_one_line(extra, flag):
    """Refused in initialize() before any group is made (the end-to-end refusals: test_mindspore_parallel_e2e.py)."""
    pytest.importorskip("mindspore")
    from mmrun.backend.errors import UsageError

    args = args_of(*extra, world_size=2)
    engine = engines.create(args, "mindspore", lambda line: None)
    with pytest.raises(UsageError) as info:
        engine.initialize(args)
    message = str(info.value)
    assert message.startswith(f"the MindSpore tensor/pipeline-parallel engine cannot run {flag}: ")
    assert f"Received: {flag} with --ai-framework mindspore" in message and "\n" not in message


def test_both_engines_implement_the_seam():
    from mmrun.engines.portable import PortableEngine

    assert isinstance(PortableEngine(args_of(), "pytorch", print), Engine)
    methods = {name for name in dir(Engine) if not name.startswith("_")}
    assert {"initialize", "build", "train_step", "evaluate", "checkpoint_state", "load_checkpoint_state"} <= methods


@pytest.mark.parametrize("extra, world, message", [
    (["--tensor-model-parallel-size", "2"], 3, "the world size (3) must be a multiple of --tensor-model-parallel-size"),
    (["--pipeline-model-parallel-size", "3"], 3, "--num-layers (4) must be divisible by --pipeline-model-parallel-size (3)"),
    (["--tensor-model-parallel-size", "8"], 8, "--num-attention-heads (4) must be divisible by --tensor-model-parallel-size (8)"),
    (["--virtual-pipeline-model-parallel-size", "2"], 1, "virtual pipeline stages need --pipeline-model-parallel-size above 1"),
    (["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "4"], 2,
     "--num-layers (4) must be divisible by pipeline stages x virtual stages (2 x 4)"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
      "--virtual-pipeline-model-parallel-size", "2"], 2, "cannot both be given"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"], 2,
     "cannot be split into virtual stages of 3"),
    (["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2",
      "--global-batch-size", "2"], 2, "needs a multiple of --pipeline-model-parallel-size (2) micro-batches per step"),
    (["--context-parallel-size", "2", "--seq-length", "30"], 2, "must be a multiple of 2 x --context-parallel-size"),
    (["--tensor-model-parallel-size", "0"], 1, "--tensor-model-parallel-size must be positive"),
])
def test_megatrons_parallel_size_rules(extra, world, message):
    with pytest.raises(ArgumentsError) as info:
        args_of(*extra, world_size=world)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sizes_fill_data_parallel_and_virtual_stages():
    args = args_of("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                   "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "8", world_size=8)
    assert (args.data_parallel_size, args.virtual_pipeline_model_parallel_size, args.num_micro_batches) == (2, 2, 2)
    assert args.ffn_hidden_size == 256  # Megatron's default, made explicit


def test_sequence_parallel_is_off_without_tensor_parallelism(capsys):
    args = args_of("--sequence-parallel")
    assert args.sequence_parallel is False
    assert "--sequence-parallel is off" in capsys.readouterr().err


def test_pipeline_stage_questions_follow_the_layout():
    try:
        parallel.set_layout(ParallelLayout(world_size=4, pp=2, vpp=2, pp_rank=1, dp=2))
        assert not parallel.is_pipeline_first_stage() and parallel.is_pipeline_last_stage()
        assert parallel.is_first_or_last_pipeline_stage(vp_stage=1)
        assert not parallel.is_first_or_last_pipeline_stage(vp_stage=0)  # rank 1's first chunk sits in the middle
        parallel.set_layout(ParallelLayout(world_size=4, pp=2, vpp=2, pp_rank=0, dp=2))
        assert parallel.is_first_or_last_pipeline_stage(vp_stage=0)
        assert not parallel.is_first_or_last_pipeline_stage(vp_stage=1)
    finally:
        parallel.set_layout(ParallelLayout())
    assert parallel.is_first_or_last_pipeline_stage(None)


def test_model_vp_stage_looks_through_wrappers():
    class Chunk:
        vp_stage = 1

    class Wrapper:
        def __init__(self, module):
            self.module = module

    assert parallel.model_vp_stage(Wrapper(Wrapper(Chunk()))) == 1
    assert parallel.model_vp_stage(object()) is None


def test_the_context_parallel_split_is_megatrons_load_balanced_one():
    batch = {"tokens": np.arange(16).reshape(1, 16), "loss_mask": np.ones((1, 16)), "attention_mask": None}
    try:
        parallel.set_layout(ParallelLayout(world_size=2, cp=2, cp_rank=0))
        assert parallel.get_batch_on_this_cp_rank(batch)["tokens"].tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
        parallel.set_layout(ParallelLayout(world_size=2, cp=2, cp_rank=1))
        assert parallel.get_batch_on_this_cp_rank(batch)["tokens"].tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    finally:
        parallel.set_layout(ParallelLayout())
    assert parallel.get_batch_on_this_cp_rank(batch)["tokens"].shape == (1, 16)


def test_the_layout_names_its_checkpoint_directory():
    assert ParallelLayout().rank_dir == "mp_rank_00"
    assert ParallelLayout(world_size=4, tp=2, pp=2, tp_rank=1, pp_rank=1).rank_dir == "mp_rank_01_001"
    assert not ParallelLayout(world_size=2, dp=2, dp_rank=1).writes_checkpoint


@pytest.mark.parametrize("extra, engine, notice", [
    (["--overlap-grad-reduce", "--overlap-param-gather"], "mmrun",
     "notice: --overlap-grad-reduce, --overlap-param-gather: mmrun's data-parallel engine all-reduces the gradients "
     "after backward, and parameters are never sharded (results identical)"),
    (["--use-mcore-models", "--overlap-grad-reduce"], "megatron-core", None),  # megatron-core's DDP config takes it
])
def test_overlap_flags_go_to_megatron_core_or_say_why_nothing_overlaps(extra, engine, notice):
    args = args_of(*extra)
    said: list[str] = []
    assert engines.create(args, "pytorch", said.append).name == engine
    assert said == ([notice] if notice else [])
