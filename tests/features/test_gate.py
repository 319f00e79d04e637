"""gate() and check_flags() decide exactly what the table says, for every entry x framework x device."""
from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from mmrun.backend import features as ft

TABLE = ft.load_table()
CASES = [
    pytest.param(entry, trig, fw, dev, id=f"{entry.name}:{trig.flag}:{fw}:{dev}")
    for entry in TABLE.entries for trig in entry.triggers for fw in ft.FRAMEWORKS for dev in ft.DEVICES
]


def args_for(trig: ft.Trigger) -> dict:
    tokens = trig.example_tokens()
    values = tokens[1:]
    return {trig.dest: True if not values else (values if trig.takes == "+" else values[0])}


@pytest.mark.parametrize("entry, trig, fw, dev", CASES)
def test_gate_follows_the_table(entry, trig, fw, dev):
    cell = entry.cells[(fw, dev)]
    args = args_for(trig)
    stream = io.StringIO()
    for policy in ft.POLICIES:
        stops = cell.status == "unsupported" or (cell.status == "fallback" and not cell.has_substitute and policy == "error")
        if stops:
            with pytest.raises(ft.FeatureGateError) as info:
                ft.gate(args, fw, dev, policy, stream=stream)
            assert [d.feature for d in info.value.decisions] == [entry.name]
            assert len(info.value.lines) == 1
            continue
        result = ft.gate(args, fw, dev, policy, stream=stream)
        (decision,) = result.decisions
        assert (decision.feature, decision.status) == (entry.name, cell.status)
        if cell.status == "supported":
            assert result.overrides == {}
        elif cell.has_substitute:
            assert result.overrides == {trig.dest: cell.substitute}
            assert result.notices and not result.warnings
        else:  # fallback under warn: the feature is switched off
            assert result.overrides == {trig.dest: trig.off}
            assert result.warnings and not result.notices


@pytest.mark.parametrize("entry, trig, fw, dev", CASES)
def test_check_flags_follows_the_table(entry, trig, fw, dev):
    tokens = ["--num-layers", "2", *trig.example_tokens(), "--lr", "1e-3"]
    (decision,) = ft.check_flags(tokens, fw, dev)
    assert (decision.feature, decision.status) == (entry.name, entry.cells[(fw, dev)].status)
    assert decision.span == (2, 2 + len(trig.example_tokens()))
    assert decision.received == " ".join(trig.example_tokens())


# Facts the table must keep whatever else changes (measured on this machine or stated by the brief).
@pytest.mark.parametrize("tokens, fw, dev, status", [
    (["--bf16"], "mindspore", "cpu", "unsupported"),       # no bf16 MatMul kernel on MindSpore CPU
    (["--bf16"], "mindspore", "cuda", "unsupported"),      # MindSpore's bf16 kernels are Ascend-only
    (["--bf16"], "pytorch", "cpu", "supported"),           # fp32 main params, measured in tests/backend_api
    (["--bf16"], "pytorch", "npu", "supported"),
    (["--fp16"], "mindspore", "cpu", "supported"),         # fp16 kernels exist, dynamic loss scaling
    (["--fp16"], "pytorch", "cuda", "supported"),
    (["--use-flash-attn"], "mindspore", "cpu", "fallback"),
    (["--tensor-model-parallel-size", "2"], "pytorch", "cuda", "unsupported"),
    (["--pipeline-model-parallel-size", "4"], "mindspore", "npu", "unsupported"),
    (["--context-parallel-size", "2"], "pytorch", "cpu", "unsupported"),
    (["--expert-model-parallel-size", "8"], "mindspore", "cpu", "unsupported"),
    (["--lora-target-modules", "linear_qkv"], "pytorch", "npu", "unsupported"),
    (["--recompute-granularity", "full"], "mindspore", "cpu", "fallback"),
    (["--transformer-impl", "local"], "mindspore", "cpu", "supported"),
    (["--transformer-impl", "transformer_engine"], "pytorch", "cpu", "fallback"),
    (["--ckpt-format", "safetensors"], "pytorch", "cpu", "supported"),
    (["--ms-jit"], "mindspore", "cpu", "supported"),
    (["--use-cpu-initialization"], "mindspore", "cpu", "supported"),
    (["--distributed-backend", "gloo"], "pytorch", "cpu", "supported"),
])
def test_known_facts(tokens, fw, dev, status):
    (decision,) = ft.check_flags(tokens, fw, dev)
    assert decision.status == status


@pytest.mark.parametrize("tokens, fw, dev, replacement", [
    (["--distributed-backend", "nccl"], "pytorch", "cpu", ["--distributed-backend", "gloo"]),
    (["--distributed-backend", "nccl"], "pytorch", "npu", ["--distributed-backend", "hccl"]),
    (["--distributed-backend", "nccl"], "mindspore", "cpu", ["--distributed-backend", "mccl"]),
    (["--distributed-backend", "gloo"], "mindspore", "npu", ["--distributed-backend", "hccl"]),
    (["--distributed-backend", "npu:hccl,cpu:gloo"], "pytorch", "cpu", ["--distributed-backend", "gloo"]),
    (["--ckpt-format", "torch"], "mindspore", "cpu", ["--ckpt-format", "safetensors"]),
    (["--ckpt-format", "torch_dcp"], "pytorch", "cuda", ["--ckpt-format", "safetensors"]),
    (["--ms-jit"], "pytorch", "cpu", []),
    (["--sequence-parallel"], "mindspore", "npu", []),
])
def test_substitutions_carry_their_replacement(tokens, fw, dev, replacement):
    (decision,) = ft.check_flags(tokens, fw, dev)
    assert decision.automatic
    assert decision.replacement_tokens() == replacement


def test_error_policy_lists_every_stopping_flag_with_framework_device_reason_hint():
    args = {"use_flash_attn": True, "tensor_model_parallel_size": 2, "transformer_impl": "local", "distributed_backend": "nccl"}
    with pytest.raises(ft.FeatureGateError) as info:
        ft.gate(args, "mindspore", "CPU", stream=io.StringIO())
    err = info.value
    assert err.exit_code == 2
    assert len(err.lines) == 2  # local layers are supported, nccl is substituted: neither stops the job
    flash = ft.load_table().get("flash-attention").cell("mindspore", "cpu")
    assert err.lines[0] == (
        f"--use-flash-attn (flash attention) is not supported with the mindspore backend on cpu: {flash.reason}. "
        f"Hint: {flash.hint}. To run with it off, pass --on-unsupported warn.")
    tp = ft.load_table().get("tensor-parallel").cell("mindspore", "cpu")
    assert err.lines[1] == (
        f"--tensor-model-parallel-size 2 (tensor parallelism) is not supported with the mindspore backend on cpu: "
        f"{tp.reason}. Hint: {tp.hint}.")
    assert str(err) == "\n".join(err.lines)


def test_warn_runs_fallbacks_off_prints_each_warning_once_and_still_stops_on_unsupported():
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-flash-attn", action="store_true")
    parser.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--distributed-backend", default=None)
    ft.add_gate_arguments(parser)
    args = parser.parse_args(["--use-flash-attn", "--recompute-granularity", "full", "--distributed-backend", "nccl",
                              "--on_unsupported", "warn"])
    stream = io.StringIO()
    for _ in range(3):  # the training entry may call it on every rank restart; the user reads it once
        result = ft.gate(args, "pytorch", "cpu", args.on_unsupported, stream=stream)
    printed = stream.getvalue().splitlines()
    assert len(printed) == 3
    assert printed[0].startswith("notice: --distributed-backend nccl (NCCL communication) is not available with the "
                                 "pytorch backend on cpu; using --distributed-backend gloo instead")
    assert printed[1].startswith("warning: --use-flash-attn (flash attention) is not supported with the pytorch "
                                 "backend on cpu; running with it off")
    assert printed[2].startswith("warning: --recompute-granularity full (activation recomputation)")
    result.apply(args)
    assert (args.use_flash_attn, args.recompute_granularity, args.distributed_backend) == (False, None, "gloo")
    args.tensor_model_parallel_size = 2
    with pytest.raises(ft.FeatureGateError, match="--tensor-model-parallel-size 2"):
        ft.gate(args, "pytorch", "cpu", "warn", stream=stream)


def test_notices_appear_under_the_default_policy_too():
    stream = io.StringIO()
    result = ft.gate({"ckpt_format": "torch"}, "pytorch", "cpu", stream=stream)
    assert result.overrides == {"ckpt_format": "safetensors"}
    assert stream.getvalue().startswith("notice: --ckpt-format torch (pickled torch checkpoints)")


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
    assert ft.normalise_device(device) == expected


@pytest.mark.parametrize("version, status", [("2.5.0", "unsupported"), ("2.6.0", "supported"), ("2.10.0", "supported"),
                                             ("2.6.0rc1", "supported"), (None, "supported")])
def test_version_conditions(version, status):
    (decision,) = ft.decide_args({"ms_jit": True}, "mindspore", "cpu", framework_version=version)
    assert decision.status == status
    if status == "unsupported":
        assert "needs mindspore >= 2.6, found 2.5.0" in decision.line()
        assert "upgrade mindspore to 2.6 or newer" in decision.line()


def test_an_old_version_turns_a_supported_cell_into_a_stop():
    with pytest.raises(ft.FeatureGateError, match="needs mindspore >= 2.6, found 2.5.0"):
        ft.gate({"ms_jit": True}, "mindspore", "Ascend", framework_version="2.5.0", stream=io.StringIO())


# ------------------------------------------------------------------------- check_flags on scripts

def test_check_flags_spans_equals_form_underscores_and_companions():
    tokens = ["--bf16", "--tensor_model_parallel_size=2", "--use-torch-fsdp2", "--lr", "-1e-4",
              "--fsdp2-config-path", "./fsdp2.yaml", "--lora-target-modules", "linear_qkv", "linear_proj",
              "--lora-r", "16", "--seq-length", "32"]
    decisions = {d.feature: d for d in ft.check_flags(tokens, "mindspore", "cpu")}
    assert set(decisions) == {"bf16", "tensor-parallel", "torch-fsdp2", "lora"}
    assert decisions["bf16"].span == (0, 1)
    assert decisions["tensor-parallel"].span == (1, 2)
    assert decisions["tensor-parallel"].received == "--tensor_model_parallel_size=2"
    assert decisions["torch-fsdp2"].companion_spans == ((5, 7),)
    assert decisions["lora"].span == (7, 10)
    assert decisions["lora"].value == ["linear_qkv", "linear_proj"]
    assert decisions["lora"].companion_spans == ((10, 12),)


def test_values_that_do_not_trigger_are_left_alone():
    tokens = ["--tensor-model-parallel-size", "1", "--context-parallel-size", "1", "--recompute-method", "uniform"]
    assert ft.check_flags(tokens, "pytorch", "npu") == []


def test_shell_variables_are_flagged_as_unknown_values():
    tokens = ["--tensor-model-parallel-size", "$TP", "--ckpt-format", "${FMT}", "--fp16"]
    decisions = ft.check_flags(tokens, "mindspore", "npu")
    tp, fp16 = decisions
    assert (tp.feature, tp.value_known, tp.span) == ("tensor-parallel", False, (0, 2))
    assert (fp16.feature, fp16.value_known, fp16.span) == ("fp16", True, (4, 5))  # a choice among values ($FMT) cannot be judged


def test_a_flag_at_the_end_without_its_value_does_not_crash():
    assert ft.check_flags(["--fp16", "--tensor-model-parallel-size"], "pytorch", "cpu")[0].feature == "fp16"


def test_importing_the_gate_imports_no_framework():
    code = ("import sys, mmrun.backend.features as f, mmrun.launchers.features_cli; f.load_table(); "
            "f.check_flags(['--bf16'], 'mindspore', 'cpu'); "
            "print(sorted(m for m in ('torch', 'mindspore', 'torch_npu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


MS_DEVICE_KIND = {"npu": "Ascend", "cuda": "GPU", "cpu": "CPU"}


@pytest.mark.parametrize("fw", ft.FRAMEWORKS)
@pytest.mark.parametrize("dev", ft.DEVICES)
@pytest.mark.parametrize("name", ["nccl", "hccl", "gloo", "mccl"])
@pytest.mark.filterwarnings("ignore")  # the backend's own replacement notice
def test_backend_choice_agrees_with_the_backends_own_check(fw, dev, name):
    """The gate and mmrun.backend.checks (used by init_distributed) must pick the same backend."""
    from mmrun.backend import checks

    (decision,) = ft.check_flags(["--distributed-backend", name], fw, dev)
    chosen = name if decision.status == "supported" else decision.substitute
    kind = MS_DEVICE_KIND[dev] if fw == "mindspore" else dev
    assert checks.dist_backend(fw, kind, name) == chosen
