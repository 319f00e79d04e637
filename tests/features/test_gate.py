"""gate() and check_flags() decide exactly what each layer of the table says, for every entry x framework x device."""
from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from mmrun import features as ft
from mmrun.backend.vocabulary import device_kind

TABLES = ft.load_tables()
CASES = [
    pytest.param(layer, feature, trig, fw, dev, id=f"{layer}:{feature.name}:{trig.flag}:{fw}:{dev}")
    for layer in ft.LAYERS for feature in TABLES.features if TABLES.layer(layer).lists(feature.name)
    for trig in feature.triggers for fw in ft.FRAMEWORKS for dev in ft.DEVICES
]


def args_for(trig: ft.Trigger) -> dict:
    tokens = trig.example_tokens()
    values = tokens[1:]
    return {trig.dest: True if not values else (values if trig.takes == "+" else values[0])}


@pytest.mark.parametrize("layer, feature, trig, fw, dev", CASES)
def test_gate_follows_the_layer(layer, feature, trig, fw, dev):
    cell = TABLES.layer(layer).cell(feature.name, fw, dev)
    args = args_for(trig)
    stream = io.StringIO()
    for policy in ft.POLICIES:
        stops = cell.status == "unsupported" or (cell.status == "fallback" and not cell.has_substitute and policy == "error")
        if stops:
            with pytest.raises(ft.FeatureGateError) as info:
                ft.gate(args, fw, dev, policy, stream=stream, layers=(layer,))
            assert [(d.feature, d.layer) for d in info.value.decisions] == [(feature.name, layer)]
            assert len(info.value.lines) == 1 and info.value.lines[0].startswith(ft.table.LAYER_TAGS[layer])
            continue
        result = ft.gate(args, fw, dev, policy, stream=stream, layers=(layer,))
        if cell.status == "unknown":  # the gate says nothing about what no source states
            assert result.decisions == [] and result.overrides == {}
            continue
        (decision,) = result.decisions
        assert (decision.feature, decision.status, decision.layer) == (feature.name, cell.status, layer)
        if cell.status == "supported":
            assert result.overrides == {}
        elif cell.has_substitute:
            assert result.overrides == {trig.dest: cell.substitute}
            assert result.notices and not result.warnings
        else:  # fallback under warn: the feature is switched off
            assert result.overrides == {trig.dest: trig.off}
            assert result.warnings and not result.notices


@pytest.mark.parametrize("layer, feature, trig, fw, dev", CASES)
def test_check_flags_follows_the_layer(layer, feature, trig, fw, dev):
    tokens = ["--num-layers", "2", *trig.example_tokens(), "--lr", "1e-3"]
    (decision,) = ft.check_flags(tokens, fw, dev, layers=(layer,))
    assert (decision.feature, decision.status, decision.layer) == (feature.name, TABLES.layer(layer).cell(feature.name, fw, dev).status, layer)
    assert decision.span == (2, 2 + len(trig.example_tokens()))
    assert decision.received == " ".join(trig.example_tokens())


# Facts the table must keep whatever else changes (cited in stack.yaml, measured here, or stated by the brief).
@pytest.mark.parametrize("tokens, fw, dev, layer, status", [
    # the stack: what MindSpeed runs on the MindSpore backend (MindSpeed-LLM / MindSpeed-MM MindSpore docs and examples)
    (["--tensor-model-parallel-size", "8"], "mindspore", "npu", "stack", "supported"),
    (["--pipeline-model-parallel-size", "8"], "mindspore", "npu", "stack", "supported"),
    (["--num-layers-per-virtual-pipeline-stage", "4"], "mindspore", "npu", "stack", "supported"),
    (["--context-parallel-size", "2"], "mindspore", "npu", "stack", "supported"),
    (["--expert-model-parallel-size", "8"], "mindspore", "npu", "stack", "supported"),
    (["--use-distributed-optimizer"], "mindspore", "npu", "stack", "supported"),
    (["--use-flash-attn"], "mindspore", "npu", "stack", "supported"),
    (["--use-fused-rmsnorm"], "mindspore", "npu", "stack", "supported"),
    (["--use-fused-swiglu"], "mindspore", "npu", "stack", "supported"),
    (["--recompute-granularity", "full"], "mindspore", "npu", "stack", "supported"),
    (["--lora-target-modules", "linear_qkv"], "mindspore", "npu", "stack", "supported"),
    (["--qlora"], "mindspore", "npu", "stack", "supported"),
    (["--distributed-backend", "nccl"], "mindspore", "npu", "stack", "supported"),  # the migration guide keeps it
    (["--no-masked-softmax-fusion"], "mindspore", "npu", "stack", "supported"),  # kept in the maintainers' msrun scripts
    (["--log-tps"], "mindspore", "npu", "stack", "supported"),  # kept in the maintainers' msrun Omni script
    (["--moe-token-dispatcher-type", "allgather"], "mindspore", "npu", "stack", "fallback"),  # only alltoall
    (["--use-torch-fsdp2"], "mindspore", "npu", "stack", "unsupported"),  # MSAdapter: no DTensor/FSDP2
    (["--bf16"], "mindspore", "cpu", "stack", "unsupported"),  # no bf16 MatMul kernel on MindSpore CPU
    (["--bf16"], "mindspore", "cuda", "stack", "unknown"),
    (["--use-flash-attn"], "mindspore", "cpu", "stack", "fallback"),  # flash_attention_score: Ascend only
    (["--tensor-model-parallel-size", "2"], "mindspore", "cpu", "stack", "unknown"),
    # mmrun's trainer
    (["--bf16"], "mindspore", "cpu", "trainer", "unsupported"),
    (["--bf16"], "mindspore", "cuda", "trainer", "unsupported"),
    (["--bf16"], "pytorch", "cpu", "trainer", "supported"),
    (["--bf16"], "pytorch", "npu", "trainer", "supported"),
    (["--fp16"], "mindspore", "cpu", "trainer", "supported"),
    (["--fp16"], "pytorch", "cuda", "trainer", "supported"),
    (["--use-flash-attn"], "mindspore", "cpu", "trainer", "fallback"),
    (["--tensor-model-parallel-size", "2"], "pytorch", "cuda", "trainer", "supported"),  # megatron-core's engine
    (["--tensor-model-parallel-size", "2"], "mindspore", "cpu", "trainer", "supported"),  # MindSpore parallel engine
    (["--pipeline-model-parallel-size", "4"], "mindspore", "npu", "trainer", "supported"),
    (["--sequence-parallel"], "mindspore", "cpu", "trainer", "supported"),
    (["--virtual-pipeline-model-parallel-size", "2"], "mindspore", "cpu", "trainer", "unsupported"),
    (["--context-parallel-size", "2"], "pytorch", "cpu", "trainer", "supported"),  # measured: losses within 1e-5
    (["--context-parallel-size", "2"], "mindspore", "cpu", "trainer", "unsupported"),
    (["--use-distributed-optimizer"], "pytorch", "cpu", "trainer", "supported"),
    (["--use-distributed-optimizer"], "mindspore", "cpu", "trainer", "supported"),  # backend/mindspore/parallel/zero.py
    (["--use-distributed-optimizer"], "mindspore", "npu", "trainer", "supported"),
    (["--use-mcore-models"], "mindspore", "cpu", "trainer", "supported"),  # its architecture rebuilt on MindSpore
    (["--expert-model-parallel-size", "8"], "mindspore", "cpu", "trainer", "unsupported"),
    (["--lora-target-modules", "linear_qkv"], "pytorch", "npu", "trainer", "unsupported"),
    (["--recompute-granularity", "full"], "mindspore", "cpu", "trainer", "supported"),
    (["--transformer-impl", "local"], "mindspore", "cpu", "trainer", "supported"),
    (["--transformer-impl", "transformer_engine"], "pytorch", "cpu", "trainer", "fallback"),
    (["--ckpt-format", "safetensors"], "pytorch", "cpu", "trainer", "supported"),
    (["--ms-jit"], "mindspore", "cpu", "trainer", "supported"),
    (["--use-cpu-initialization"], "mindspore", "cpu", "trainer", "supported"),
    (["--distributed-backend", "gloo"], "pytorch", "cpu", "trainer", "supported"),
])
def test_known_facts(tokens, fw, dev, layer, status):
    (decision,) = ft.check_flags(tokens, fw, dev, layers=(layer,))
    assert decision.status == status


@pytest.mark.parametrize("tokens, fw, dev, layer, replacement", [
    (["--distributed-backend", "nccl"], "pytorch", "cpu", "trainer", ["--distributed-backend", "gloo"]),
    (["--distributed-backend", "nccl"], "pytorch", "cpu", "stack", ["--distributed-backend", "gloo"]),
    (["--distributed-backend", "nccl"], "pytorch", "npu", "trainer", ["--distributed-backend", "hccl"]),
    (["--distributed-backend", "nccl"], "mindspore", "cpu", "trainer", ["--distributed-backend", "mccl"]),
    (["--distributed-backend", "gloo"], "mindspore", "npu", "trainer", ["--distributed-backend", "hccl"]),
    (["--distributed-backend", "npu:hccl,cpu:gloo"], "pytorch", "cpu", "trainer", ["--distributed-backend", "gloo"]),
    (["--ckpt-format", "torch"], "mindspore", "cpu", "trainer", ["--ckpt-format", "safetensors"]),
    (["--ckpt-format", "torch_dcp"], "mindspore", "cpu", "trainer", ["--ckpt-format", "safetensors"]),
    (["--ms-jit"], "pytorch", "cpu", "trainer", []),
])
def test_substitutions_carry_their_replacement(tokens, fw, dev, layer, replacement):
    (decision,) = ft.check_flags(tokens, fw, dev, layers=(layer,))
    assert decision.automatic
    assert decision.replacement_tokens() == replacement


def test_a_choice_among_values_falls_back_to_the_working_value():
    (decision,) = ft.check_flags(["--moe-token-dispatcher-type", "allgather"], "mindspore", "npu")
    assert not decision.automatic and decision.replacement_tokens() == ["--moe-token-dispatcher-type", "alltoall"]


def test_error_policy_lists_every_stopping_flag_and_layer_with_reason_hint_and_source():
    args = {"use_flash_attn": True, "context_parallel_size": 2, "transformer_impl": "local", "distributed_backend": "nccl"}
    with pytest.raises(ft.FeatureGateError) as info:
        ft.gate(args, "mindspore", "CPU", stream=io.StringIO())
    err = info.value
    assert err.exit_code == 2
    # flash attention: both layers fall back; context parallelism: the trainer refuses (the stack does not know, so says
    # nothing); local layers are supported and nccl is substituted: neither stops the job
    assert [(d.layer, d.feature) for d in err.decisions] == [
        ("stack", "flash-attention"), ("trainer", "flash-attention"), ("trainer", "context-parallel")]
    stack_flash = TABLES.layer("stack").cell("flash-attention", "mindspore", "cpu")
    source = stack_flash.sources[0]
    assert err.lines[0] == (
        f"[stack] --use-flash-attn (flash attention) is not supported with the mindspore backend on cpu: {stack_flash.reason}. "
        f"Hint: {stack_flash.hint}. To run with it off, pass --on-unsupported warn. Source: {source.title} <{source.url}>.")
    flash = TABLES.layer("trainer").cell("flash-attention", "mindspore", "cpu")
    assert err.lines[1] == (
        f"[mmrun trainer] --use-flash-attn (flash attention) is not supported with the mindspore backend on cpu: {flash.reason}. "
        f"Hint: {flash.hint}. To run with it off, pass --on-unsupported warn.")
    cp = TABLES.layer("trainer").cell("context-parallel", "mindspore", "cpu")
    assert err.lines[2] == (
        f"[mmrun trainer] --context-parallel-size 2 (context parallelism) is not supported with the mindspore backend "
        f"on cpu: {cp.reason}. Hint: {cp.hint}.")
    assert str(err) == "\n".join(err.lines)


def test_warn_runs_fallbacks_off_prints_each_line_once_and_still_stops_on_unsupported():
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-flash-attn", action="store_true")
    parser.add_argument("--recompute-activation-function", action="store_true")
    parser.add_argument("--context-parallel-size", type=int, default=1)
    parser.add_argument("--distributed-backend", default=None)
    ft.add_gate_arguments(parser)
    args = parser.parse_args(["--use-flash-attn", "--recompute-activation-function", "--distributed-backend", "nccl",
                              "--on_unsupported", "warn"])
    stream = io.StringIO()
    for _ in range(3):  # the training entry may call it on every rank restart; the user reads it once
        result = ft.gate(args, "pytorch", "cpu", args.on_unsupported, stream=stream)
    printed = stream.getvalue().splitlines()
    assert [line.split(" (")[0] for line in printed] == [
        # mmrun's trainer computes attention the same way with or without the flag: a notice, not a warning
        "notice: [mmrun trainer] --use-flash-attn",
        # both layers substitute gloo for nccl: one line, the stack's, which cites its source
        "notice: [stack] --distributed-backend nccl",
        "warning: [stack] --use-flash-attn",
        "warning: [mmrun trainer] --recompute-activation-function",  # the stack says nothing: no source for torch on CPU
    ]
    assert "using --distributed-backend gloo instead" in printed[1] and "Source: PyTorch documentation" in printed[1]
    assert sum("--distributed-backend nccl" in line for line in printed) == 1
    assert [d.layer for d in result.changed if d.dest == "distributed_backend"] == ["stack", "trainer"]
    assert "is not supported with the pytorch backend on cpu; running with it off" in printed[3]
    result.apply(args)
    assert (args.use_flash_attn, args.recompute_activation_function, args.distributed_backend) == (False, False, "gloo")
    args.context_parallel_size = 2  # megatron-core runs it on PyTorch; mmrun's MindSpore engines cannot
    with pytest.raises(ft.FeatureGateError, match="--context-parallel-size 2"):
        ft.gate(args, "mindspore", "cpu", "warn", stream=stream)


def test_the_stack_alone_can_stop_the_trainer():
    with pytest.raises(ft.FeatureGateError) as info:
        ft.gate({"bf16": True}, "mindspore", "cpu", "warn", stream=io.StringIO())
    assert [d.layer for d in info.value.decisions] == ["stack", "trainer"]
    assert "MindSpore has no bf16 MatMul kernel on the CPU" in info.value.lines[0]


def test_notices_appear_under_the_default_policy_too():
    stream = io.StringIO()
    result = ft.gate({"ckpt_format": "torch"}, "pytorch", "cpu", stream=stream)
    assert result.overrides == {"ckpt_format": "safetensors"}
    assert stream.getvalue().startswith("notice: [mmrun trainer] --ckpt-format torch (pickled torch checkpoints)")


def test_nothing_triggered_means_nothing_said():
    stream = io.StringIO()
    args = {"tensor_model_parallel_size": 1, "fp16": False, "bf16": False, "use_flash_attn": False,
            "lora_target_modules": None, "recompute_granularity": None, "num_layers": 2}
    result = ft.gate(argparse.Namespace(**args), "mindspore", "cpu", stream=stream)
    assert result.decisions == [] and stream.getvalue() == ""


def test_bad_policy_framework_or_device_is_a_clear_error():
    with pytest.raises(ValueError, match="on_unsupported must be one of error, warn. Received: 'ignore'"):
        ft.gate({}, "pytorch", "cpu", "ignore")
    with pytest.raises(ValueError, match="Unknown AI framework 'jax'"):
        ft.gate({}, "jax", "cpu")
    with pytest.raises(ValueError, match="Unknown device 'tpu'"):
        ft.gate({}, "pytorch", "tpu")


@pytest.mark.parametrize("device, expected", [("Ascend", "npu"), ("GPU", "cuda"), ("npu:3", "npu"), ("CPU", "cpu")])
def test_mindspore_device_names_are_understood(device, expected):
    assert device_kind(device) == expected


@pytest.mark.parametrize("version, status", [("2.5.0", "unsupported"), ("2.6.0", "supported"), ("2.10.0", "supported"),
                                             ("2.6.0rc1", "supported"), (None, "supported")])
def test_version_conditions(version, status):
    (decision,) = ft.decide_args({"ms_jit": True}, "mindspore", "cpu", framework_version=version, layers=("trainer",))
    assert decision.status == status
    if status == "unsupported":
        assert "needs mindspore >= 2.6, found 2.5.0" in decision.line()
        assert "upgrade mindspore to 2.6 or newer" in decision.line()


def test_a_stack_version_condition_applies_too():
    """MSAdapter writes torch-format checkpoints only from MindSpore 2.7.1 on."""
    (old,) = ft.check_flags(["--ckpt-format", "torch"], "mindspore", "npu", framework_version="2.6.0")
    (new,) = ft.check_flags(["--ckpt-format", "torch"], "mindspore", "npu", framework_version="2.7.2")
    assert (old.status, new.status) == ("unsupported", "supported")


def test_an_old_version_turns_a_supported_cell_into_a_stop():
    with pytest.raises(ft.FeatureGateError, match="needs mindspore >= 2.6, found 2.5.0"):
        ft.gate({"ms_jit": True}, "mindspore", "Ascend", framework_version="2.5.0", stream=io.StringIO())


# ------------------------------------------------------------------------- check_flags on scripts

def test_check_flags_spans_equals_form_underscores_and_companions():
    tokens = ["--bf16", "--tensor_model_parallel_size=2", "--use-torch-fsdp2", "--lr", "-1e-4",
              "--fsdp2-config-path", "./fsdp2.yaml", "--lora-target-modules", "linear_qkv", "linear_proj",
              "--lora-r", "16", "--seq-length", "32"]
    decisions = {(d.layer, d.feature): d for d in ft.check_flags(tokens, "mindspore", "cpu", layers=ft.LAYERS)}
    assert set(decisions) == {(layer, f) for layer in ft.LAYERS for f in ("bf16", "tensor-parallel", "torch-fsdp2", "lora")}
    trainer = {f: d for (layer, f), d in decisions.items() if layer == "trainer"}
    assert trainer["bf16"].span == (0, 1)
    assert trainer["tensor-parallel"].span == (1, 2)
    assert trainer["tensor-parallel"].received == "--tensor_model_parallel_size=2"
    assert trainer["torch-fsdp2"].companion_spans == ((5, 7),)
    assert trainer["lora"].span == (7, 10)
    assert trainer["lora"].value == ["linear_qkv", "linear_proj"]
    assert trainer["lora"].companion_spans == ((10, 12),)
    assert decisions[("stack", "lora")].companion_spans == ((10, 12),)


def test_check_flags_judges_by_the_stack_unless_asked():
    tokens = ["--tensor-model-parallel-size", "2", "--lora-target-modules", "linear_qkv"]
    assert {d.layer for d in ft.check_flags(tokens, "mindspore", "npu")} == {"stack"}
    assert [d.status for d in ft.check_flags(tokens, "mindspore", "npu")] == ["supported", "supported"]


def test_values_that_do_not_trigger_are_left_alone():
    tokens = ["--tensor-model-parallel-size", "1", "--context-parallel-size", "1", "--recompute-method", "uniform"]
    assert ft.check_flags(tokens, "pytorch", "npu", layers=ft.LAYERS) == []


def test_shell_variables_are_flagged_as_unknown_values():
    tokens = ["--tensor-model-parallel-size", "$TP", "--ckpt-format", "${FMT}", "--fp16"]
    tp, fp16 = ft.check_flags(tokens, "mindspore", "npu", layers=("trainer",))
    assert (tp.feature, tp.value_known, tp.span) == ("tensor-parallel", False, (0, 2))
    assert (fp16.feature, fp16.value_known, fp16.span) == ("fp16", True, (4, 5))  # a choice among values ($FMT) cannot be judged


def test_a_flag_at_the_end_without_its_value_does_not_crash():
    assert ft.check_flags(["--fp16", "--tensor-model-parallel-size"], "pytorch", "cpu")[0].feature == "fp16"


def test_importing_the_feature_table_imports_no_framework():
    code = ("import sys, mmrun.features as f, mmrun.features.cli; f.load_tables(); "
            "f.check_flags(['--bf16'], 'mindspore', 'cpu', layers=f.LAYERS); f.gate({'bf16': False}, 'pytorch', 'cpu'); "
            "print(sorted(m for m in ('torch', 'mindspore', 'torch_npu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_distributed_optimizer_on_mindspore_runs_without_a_notice_under_both_policies():
    """MindSpeed-MM's msrun twins pass --use-distributed-optimizer; mmrun's MindSpore data-parallel engine shards
    the optimizer (backend/mindspore/parallel/zero.py): the gate keeps the flag and says nothing."""
    for policy in ft.POLICIES:
        stream = io.StringIO()
        result = ft.gate({"use_distributed_optimizer": True}, "mindspore", "cpu", policy, stream=stream)
        assert result.overrides == {} and not result.warnings and stream.getvalue() == ""


# What MindSpeed-MM's real training scripts pass that changes only speed or memory (examples/qwen2.5vl,
# examples/wan2.1, and their msrun twins): never a stop, under the default policy, on any framework and device.
SPEED_ONLY = {"use_fused_rmsnorm": True, "use_fused_swiglu": True, "use_fused_rotary_pos_emb": True,
              "overlap_grad_reduce": True, "overlap_param_gather": True, "swap_attention": True}


@pytest.mark.parametrize("fw", ft.FRAMEWORKS)
@pytest.mark.parametrize("dev", ft.DEVICES)
def test_flags_that_change_only_speed_never_stop_a_job(fw, dev):
    stream = io.StringIO()
    result = ft.gate(dict(SPEED_ONLY), fw, dev, stream=stream)
    assert not result.warnings
    said = stream.getvalue().splitlines()
    assert all(line.startswith("notice: ") for line in said)
    # the trainer layer speaks for the models that run, never for "mmrun's GPT" alone
    assert not any("mmrun's GPT" in d.reason for d in result.decisions)
    trainer = {d.feature: d for d in result.decisions if d.layer == "trainer"}
    for kernel in ("fused-rmsnorm", "fused-swiglu", "fused-rotary-pos-emb"):
        # on an NPU the models call the fused kernel (the flag stays on); elsewhere the unfused math, one notice
        assert trainer[kernel].status == ("supported" if dev == "npu" else "fallback")
        assert (dev == "npu") == (kernel.replace("fused-", "use_fused_").replace("-", "_") not in result.overrides)
    if fw == "pytorch":  # megatron-core's DDP config takes them; the other engines say why nothing overlaps
        assert trainer["overlap-grad-reduce"].status == trainer["overlap-param-gather"].status == "supported"
