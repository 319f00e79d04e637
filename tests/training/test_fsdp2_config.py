"""The FSDP2 file (engines/fsdp2_config.py): keys and defaults, the pattern syntax, every one-line error,
the single-YAML launch form, and the launcher refusing a bad file before any worker starts. No torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mmrun.engines.fsdp2_config import (KEYS, FSDP2ConfigError, check_with_training_args,
                                         config_from_mapping, given_from_argv, match_pattern, parse_pattern,
                                         load_fsdp2_config, plan_modules)
from mmrun.training.yaml_launch import check_launch, read_yaml_launch, to_argv

# mmrun's GPT (2 layers) and a transformers Qwen2-VL's module paths, as named_modules() gives them.
GPT = ["", "wte", "wpe", "drop", "h", "h.0", "h.0.attn", "h.0.mlp", "h.1", "h.1.attn", "h.1.mlp", "ln_f"]
VLM = ["", "model", "model.visual", "model.visual.blocks", *[f"model.visual.blocks.{i}" for i in range(4)],
       "model.language_model", "model.language_model.layers",
       *[f"model.language_model.layers.{i}" for i in range(24)], "lm_head"]


def test_defaults_are_the_user_guides():
    config = config_from_mapping({})
    assert config.sharding_size == 1 and config.use_reentrant is True and config.offload_to_cpu is False
    assert config.pin_memory is False and config.num_to_backward_prefetch == 1 and config.cast_forward_inputs
    assert config.reshard_after_forward is None and config.param_dtype is None
    assert set(KEYS) == {f for f in config.__dataclass_fields__
                         if f not in ("source", "moe_modules", "expert_parallel_size", "reshard_local_experts")}


def test_the_user_guides_example_file_parses():
    config = config_from_mapping({
        "sharding_size": "auto", "param_dtype": "bf16", "reduce_dtype": "fp32", "cast_forward_inputs": True,
        "sub_modules_to_wrap": ["model.language_model.layers.{*}"], "ignored_modules": ["model.visual"],
        "recompute_modules": ["model.language_model.layers.{*}"], "num_to_forward_prefetch": 2,
        "num_to_backward_prefetch": 2, "offload_to_cpu": False})
    assert config.shard_size(8) == 8 and config.summary(8).startswith("full shard, ZeRO-3, param bf16")
    plan = plan_modules(config, VLM)
    assert plan.wrap == [f"model.language_model.layers.{i}" for i in range(24)] and plan.ignore == ["model.visual"]
    assert config_from_mapping({"sharding_size": 2}).summary(8).startswith("hybrid shard (4 replicas x 2 shards)")


@pytest.mark.parametrize("pattern, expected", [
    ("model.language_model.layers.{*}", list(range(24))),
    ("model.language_model.layers.{0-3}", [0, 1, 2, 3]),
    ("model.language_model.layers.{1,3,5}", [1, 3, 5]),
    ("model.language_model.layers.{0-1,22-23}", [0, 1, 22, 23]),
    ("model.language_model.layers.7", [7]),
])
def test_pattern_syntax(pattern, expected):
    hits = match_pattern(parse_pattern(pattern), VLM)
    assert hits == [f"model.language_model.layers.{i}" for i in expected]


def test_class_names_match_every_module_of_that_class():
    classes = {name: "transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer"
               for name in VLM if name.startswith("model.language_model.layers.")}
    config = config_from_mapping({"sub_modules_to_wrap": [
        "transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer",
        "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeDecoderLayer"]})  # absent: fine, as MindSpeed-MM lists both
    assert len(plan_modules(config, VLM, classes).wrap) == 24
    only_absent = config_from_mapping({"sub_modules_to_wrap": ["transformers.models.x.modeling_x.XLayer"]}, "f.yaml")
    with pytest.raises(FSDP2ConfigError, match="none of transformers.models.x.modeling_x.XLayer matches a module class"):
        plan_modules(only_absent, VLM, classes)


# Every error: one line that names the key or the pattern, what was received and what to do.
@pytest.mark.parametrize("data, names, message", [
    ({"shardng_size": 2}, GPT, "f.yaml: unknown key 'shardng_size'; did you mean sharding_size?"),
    ({"recompute_module": ["h.{*}"]}, GPT, "f.yaml: unknown key 'recompute_module'; did you mean recompute_modules?"),
    ({"sub_modules_to_wrap": ["layers.{*}"]}, GPT,
     "f.yaml: sub_modules_to_wrap: 'layers.{*}' matches no module of the model (at the model's top level the "
     "modules are: drop, h, ln_f, wpe, wte)"),
    ({"ignored_modules": ["model.language_model.layers.{30-31}"]}, VLM,
     "f.yaml: ignored_modules: 'model.language_model.layers.{30-31}' matches no module of the model (at "
     "model.language_model.layers the modules are: {0-23})"),
    ({"sub_modules_to_wrap": ["h.{*}"], "ignored_modules": ["h"]}, GPT,
     "f.yaml: sub_modules_to_wrap and ignored_modules overlap at 'h.0' (ignored: 'h'); a module is either sharded "
     "or ignored, remove it from one list"),
    ({"sub_modules_to_wrap": ["h.{*}"], "ignored_modules": ["h.{*}"]}, GPT,
     "f.yaml: 'h.{*}' is in both sub_modules_to_wrap and ignored_modules; a module is either sharded or ignored, "
     "remove it from one list"),
    ({"sub_modules_to_wrap": ["h.{a-b}"]}, GPT,
     "f.yaml: sub_modules_to_wrap: pattern 'h.{a-b}': bad index set {a-b}; use {*}, {0-23} or {1,3,5}"),
    ({"param_dtype": "int8"}, GPT, "f.yaml: param_dtype: 'int8' is not valid; use one of bf16, fp16, fp32"),
    ({"sharding_size": 0}, GPT, "f.yaml: sharding_size: 0 is not valid; use auto or a positive integer"),
    ({"reshard_after_forward": "maybe"}, GPT, "f.yaml: reshard_after_forward: 'maybe' is not valid; use true or false"),
    ({"pin_memory": True}, GPT, "f.yaml: pin_memory: true applies only with offload_to_cpu: true"),
])
def test_one_line_errors(data, names, message):
    with pytest.raises(FSDP2ConfigError) as err:
        plan_modules(config_from_mapping(data, "f.yaml"), names)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_sharding_size_must_divide_the_world():
    with pytest.raises(FSDP2ConfigError, match=r"sharding_size 3 must divide the world size 8; use auto or one of 1, 2, 4, 8"):
        config_from_mapping({"sharding_size": 3}, "f.yaml").shard_size(8)


def test_conflicts_with_megatron_arguments():
    recompute = config_from_mapping({"recompute_modules": ["h.{*}"]}, "f.yaml")
    with pytest.raises(FSDP2ConfigError, match=r"recompute_modules conflicts with Megatron's --recompute-granularity, "
                                               r"--recompute-method"):
        check_with_training_args(recompute, {"recompute_granularity": "full", "recompute_method": "uniform"})
    check_with_training_args(recompute, {})
    offload = config_from_mapping({"offload_to_cpu": True}, "f.yaml")
    with pytest.raises(FSDP2ConfigError, match=r"offload_to_cpu: true needs a CPU backend in --distributed-backend. "
                                               r"Received: --distributed-backend hccl; pass e.g. "
                                               r"--distributed-backend npu:hccl,cpu:gloo"):
        check_with_training_args(offload, {"distributed_backend": "hccl"})
    for ok in ("npu:hccl,cpu:gloo", "cpu:gloo,cuda:nccl", "gloo"):
        check_with_training_args(offload, {"distributed_backend": ok})


def test_launch_arguments_in_both_spellings():
    given = given_from_argv(["--use_torch_fsdp2", "--fsdp2-config-path=f.yaml", "--recompute-granularity", "full"])
    assert given == {"use_torch_fsdp2": True, "fsdp2_config_path": "f.yaml", "recompute_granularity": "full"}


def test_single_yaml_launch_with_anchors(tmp_path):
    (tmp_path / "fsdp2.yaml").write_text("sharding_size: auto\nsub_modules_to_wrap: ['model.layers.{*}']\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"FSDP2: &FSDP2 {tmp_path / 'fsdp2.yaml'}\nHF: &HF ./hf\n"
                   "gpt_args:\n  use_torch_fsdp2: true\n  fsdp2_config_path: *FSDP2\n  micro_batch_size: 1\n"
                   "  no_load_optim: true\n  no_save_rng: false\n  metrics_file: m.jsonl\n"
                   "data:\n  dataset_param: {dataset_type: mock}\nmodel:\n  init_from_hf_path: *HF\n")
    launch = read_yaml_launch(job)
    assert launch.argv == ["--use-torch-fsdp2", "--fsdp2-config-path", str(tmp_path / "fsdp2.yaml"),
                           "--micro-batch-size", "1", "--no-load-optim", "--metrics-file", "m.jsonl"]
    assert launch.model == {"init_from_hf_path": "./hf"} and launch.data["dataset_param"]["dataset_type"] == "mock"
    assert check_launch([str(job)]).sharding_size == "auto"
    assert to_argv({"data_path": ["1", "a"]}) == ["--data-path", "1", "a"]


def test_the_launcher_refuses_a_bad_file_before_any_worker_starts(tmp_path):
    marker = tmp_path / "worker-started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('started')\n")
    (tmp_path / "bad.yaml").write_text("sharding_size: auto\nsub_modules_to_wrapp: ['h.{*}']\n")
    (tmp_path / "off.yaml").write_text("offload_to_cpu: true\n")
    (tmp_path / "rc.yaml").write_text("recompute_modules: ['h.{*}']\n")
    cases = [
        (["--use-torch-fsdp2", "--fsdp2-config-path", "bad.yaml"],
         "bad.yaml: unknown key 'sub_modules_to_wrapp'; did you mean sub_modules_to_wrap?"),
        (["--use_torch_fsdp2", "--fsdp2_config_path", "off.yaml", "--distributed-backend", "nccl"],
         "off.yaml: offload_to_cpu: true needs a CPU backend in --distributed-backend. Received: --distributed-backend nccl"),
        (["--use-torch-fsdp2", "--fsdp2-config-path", "rc.yaml", "--recompute-activations"],
         "rc.yaml: recompute_modules conflicts with Megatron's --recompute-activations"),
    ]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "--nproc-per-node", "2", str(script), *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == f"mmrun: error: {message}" or proc.stderr.strip().startswith(f"mmrun: error: {message}")
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not marker.exists()


def test_a_model_file_entry_passes_fsdp2_through_and_says_why_the_distributed_optimizer_is_off(capsys, monkeypatch):
    # models/pretrain_vlm.py's ModelSource: data-parallel only, so --use-distributed-optimizer is turned off;
    # under FSDP2 the reason is that FSDP2 shards the optimizer state already, not "each rank keeps it whole".
    from mmrun.training.arguments import ArgumentsError, ModelSource, parse_args

    for var in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE"):
        monkeypatch.delenv(var, raising=False)
    source = ModelSource(flag="--mm-model", sizes={"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4},
                         data_flag="--mm-data")
    common = ["--micro-batch-size", "1", "--seq-length", "64", "--train-iters", "2", "--lr", "1e-4",
              "--use-distributed-optimizer", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--mm-data", "d.json"]
    args = parse_args([*common, "--use-torch-fsdp2", "--fsdp2-config-path", "f.yaml"], model_source=source)
    assert args.use_torch_fsdp2 and args.fsdp2_config_path == "f.yaml" and not args.use_distributed_optimizer
    assert "ignoring --use-distributed-optimizer: --use-torch-fsdp2 already shards" in capsys.readouterr().err
    parse_args(common, model_source=source)
    assert "each data-parallel rank keeps the whole optimizer state" in capsys.readouterr().err
    with pytest.raises(ArgumentsError, match=r"Received: --tensor-model-parallel-size 2; .*\(FSDP2 shards the model"):
        parse_args([*common, "--use-torch-fsdp2", "--tensor-model-parallel-size", "2"], model_source=source, world_size=2)


def test_mm_token_type_ids_are_transformers_token_types():
    import numpy as np

    from mmrun.data.multimodal.rope_index import token_types

    ids = np.array([[1, 3, 5, 5, 4, 9, 3, 6, 6, 4, 0]])
    assert token_types(ids, image_token_id=5, video_token_id=6).tolist() == [[0, 0, 1, 1, 0, 0, 0, 2, 2, 0, 0]]


@pytest.mark.slow
def test_fp16_is_refused_by_the_torch_engines(tmp_path):
    """FSDP2 and pretrain_transformers.py's DDP have no loss scaler and no fp32 main params: --fp16 would train
    something else than asked, so it stops at startup, one line, exit 2 (bf16 and fp32 train)."""
    (tmp_path / "f.yaml").write_text("sharding_size: auto\n")
    entry = Path(__file__).resolve().parents[2] / "models" / "pretrain_gpt.py"
    run = subprocess.run([sys.executable, str(entry), "--ai-framework", "pytorch", "--mock-data", "--train-iters", "1", "--use-torch-fsdp2",
                          "--fsdp2-config-path", str(tmp_path / "f.yaml"), "--fp16"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and errors == [
        "error: --fp16 is not supported by the torch-fsdp2 engine (no loss scaling, no fp32 main params). Received: "
        "--fp16; use --bf16 (MindSpeed-MM's FSDP2 configs train in bf16) or fp32"], run.stderr[-2000:]


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm"


def test_mindspeed_mms_real_files_load_and_their_moe_keys_name_the_experts():
    """examples/qwen3vl/fsdp2_config.yaml (57069cd5) as it is: align_fsdp_param_groups (communication only),
    expert_parallel_size 1 and reshard_local_experts as MindSpeed-MM takes them (no expert parallelism: the experts
    shard in their FSDP unit), moe_modules naming the MoE model's experts and nothing of the dense Qwen3-VL 8B;
    expert_parallel_size above 1 is read (engines/torch/fsdp2/experts.py builds it), a bad value stops in one line."""
    from mmrun.engines.fsdp2_config import load_fsdp2_config

    config = load_fsdp2_config(FIXTURES / "qwen3vl" / "fsdp2_config.yaml")
    assert config.summary(8) == "full shard, ZeRO-3, param bf16, reduce fp32, prefetch fwd 1 bwd 1"
    assert plan_modules(config, VLM).wrap == []  # the dense model: no experts, nothing refused
    moe = [*VLM, "model.language_model.layers.0.mlp", "model.language_model.layers.0.mlp.experts"]
    assert plan_modules(config, moe).moe == ["model.language_model.layers.0.mlp.experts"]
    assert plan_modules(config, moe).wrap == []  # sharded with the root unit, as MindSpeed-MM does at EP 1
    assert (config.expert_parallel_size, config.reshard_local_experts) == (1, True)
    config = config_from_mapping({"expert_parallel_size": 2, "reshard_local_experts": False}, "f.yaml")
    assert (config.expert_parallel_size, config.reshard_local_experts) == (2, False)
    for bad in (0, "2", True):
        with pytest.raises(FSDP2ConfigError, match=rf"^f.yaml: expert_parallel_size: {bad!r} is not valid; use a "
                                                   "positive integer"):
            config_from_mapping({"expert_parallel_size": bad}, "f.yaml")
    assert load_fsdp2_config(FIXTURES / "qwen2.5vl" / "fsdp2_config.yaml").ignored_modules == ("image_encoder",)


def test_mindspeed_mms_qwen2_5_vl_file_names_our_modules_through_the_models_table():
    """examples/qwen2.5vl/fsdp2_config.yaml names MindSpeed-MM's modules (text_decoder.decoder.layers.{*},
    text_decoder.output_layer, image_encoder); the Qwen2-VL model's mindspeed_mm_modules maps them onto its own."""
    from mmrun.models.qwen2_vl.mm_layout import MINDSPEED_MM_MODULES

    config = load_fsdp2_config(Path(__file__).parents[1] / "fixtures" / "mindspeed_mm" / "qwen2.5vl" / "fsdp2_config.yaml")
    names = ["visual", "visual.blocks", "visual.blocks.0", "visual.merger", "model", "model.embed_tokens",
             "model.layers", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
    plan = plan_modules(config, names, aliases=MINDSPEED_MM_MODULES)
    assert plan.wrap == ["model.embed_tokens", "model.layers.0", "model.layers.1", "lm_head"]  # rotary: no module
    assert plan.ignore == ["visual"] and plan.recompute == ["model.layers.0", "model.layers.1"]
    with pytest.raises(FSDP2ConfigError, match="'text_decoder.output_layer' matches no module"):
        plan_modules(config, names)


def test_expert_parallel_size_that_does_not_divide_is_refused_in_one_line():
    """EP must divide the world and every moe_modules module's experts (transformers' fused experts, 4 of them):
    one line naming the file, before any collective."""
    transformers = pytest.importorskip("transformers")
    from mmrun.backend.errors import UsageError
    from mmrun.engines.torch.fsdp2.experts import ExpertParallel
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts

    import torch

    model = torch.nn.ModuleDict({"experts": Qwen3VLMoeTextExperts(transformers.Qwen3VLMoeTextConfig(
        hidden_size=8, num_experts=4, moe_intermediate_size=4))})
    with pytest.raises(UsageError, match=r"^f.yaml: expert_parallel_size 2 does not divide the world size 3; "):
        ExpertParallel(model, ["experts"], "cpu", world=3, size=2, source="f.yaml")
    with pytest.raises(UsageError, match=r"^f.yaml: expert_parallel_size 3 does not divide the 4 experts of experts; "
                                         r"use a divisor of the experts"):
        ExpertParallel(model, ["experts"], "cpu", world=3, size=3, source="f.yaml")
