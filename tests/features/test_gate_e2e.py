"""End to end: the GPT training entry runs the feature gate before it builds a model.

These start real jobs through `mmrun` (torchrun / msrun) on CPU. A missing training entry is a failure,
never a skip: the trainer layer of the table claims what this entry does.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmrun import features as ft

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "models" / "pretrain_gpt.py"

TINY_GPT = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--train-iters", "2", "--lr", "1e-3", "--log-interval", "1", "--mock-data",
            # one validation and one test iteration, not Megatron's default 100 each: a run that evaluates still
            # evaluates, and a MindSpore run drops from about 130 s to 50 s on 2 cores
            "--eval-iters", "1"]
ITERATION = re.compile(r"iteration\s+\d+\s*/\s*\d+")
# MindSpore runs that are not about the compiled step train in PyNative: two iterations do not pay back a compile
# (10-20 s a run); the run that carries the ms-jit entry compiles.
PYNATIVE = ["--no-ms-jit"]

# Entries whose supported CPU run needs more than the flag itself to mean anything.
EXTRA_SCRIPT_ARGS = {
    "ckpt-format-safetensors": lambda tmp: ["--save", str(tmp / "ckpt"), "--save-interval", "2"],
    "backend-gloo": lambda tmp: ["--global-batch-size", "4"],
    "backend-mccl": lambda tmp: ["--global-batch-size", "4"],
    # full recomputation needs its method and layer count (as in Megatron); selective ignores them
    "recompute": lambda tmp: ["--recompute-method", "uniform", "--recompute-num-layers", "1"],
}
TWO_PROCESSES = {"backend-gloo", "backend-mccl"}  # a communication backend only acts with world size > 1
EXCLUSIVE = [{"fp16", "bf16"}]  # the arguments refuse these together
# Model and optimizer parallelism (megatron-core on PyTorch, mindspore-parallel on MindSpore): each trigger trains alone, on the processes and
# with the arguments that make it mean something (a layout the tiny GPT splits evenly).
PARALLEL = {
    "tensor-parallel": (2, []),
    "pipeline-parallel": (2, []),
    "virtual-pipeline": (2, ["--pipeline-model-parallel-size", "2", "--num-layers", "8", "--global-batch-size", "4"]),
    "context-parallel": (2, []),
    "sequence-parallel": (2, ["--tensor-model-parallel-size", "2"]),
    "distributed-optimizer": (2, ["--global-batch-size", "4"]),
    # On MindSpore --use-mcore-models picks the fp32-only mindspore-parallel engine: it trains alone, not packed
    # with --fp16 and the other supported flags.
    "mcore-models": (1, []),
    # The FSDP2 engine trains alone too (it replaces mmrun's engine); torch_dcp is its checkpoint format.
    "torch-fsdp2": (2, ["--global-batch-size", "4"]),
    "ckpt-format-torch-dcp": (1, ["--use-torch-fsdp2"]),
}
# A parallel trigger that another parallel run already passes joins that run where the framework supports
# both: sequence parallelism trains with --tensor-model-parallel-size 2, virtual pipelines with
# --pipeline-model-parallel-size 2 (a MindSpore run costs tens of seconds).
CARRIED_BY = {"tensor-parallel": "sequence-parallel", "pipeline-parallel": "virtual-pipeline",
              # MindSpore's distributed optimizer is its data-parallel engine's: it joins the 2-process mccl run
              "distributed-optimizer": "backend-mccl"}

# An entry whose flag a capability's own end-to-end test already trains through this entry and mmrun (a MindSpore
# launch costs tens of seconds of CI's time): not started twice. test_mindspore_parallel_e2e trains
# --pipeline-model-parallel-size 2 alone, and --use-mcore-models in all its runs (on 2 processes, with a split).
# (framework, entry) -> that test, file::name (test_covering_tests_exist checks it).
COVERED_BY = {
    ("mindspore", "pipeline-parallel"):
        "tests/training/test_mindspore_parallel_e2e.py::test_mindspore_trains_like_megatron_core_on_pytorch",
    ("mindspore", "mcore-models"):
        "tests/training/test_mindspore_parallel_e2e.py::test_mindspore_trains_like_megatron_core_on_pytorch",
}


def needs_entry() -> None:
    assert ENTRY.is_file(), f"the training entry {ENTRY} is missing: the trainer layer (features/trainer.yaml) describes it"


def mmrun(framework: str, script_args: list[str], tmp_path: Path, nproc: int = 1,
          timeout: int = 240) -> tuple[int, str, str]:
    """Run `mmrun --ai-framework X models/pretrain_gpt.py ...`.

    Returns the exit code, everything printed (launcher and workers) and the workers' own output:
    msrun's worker_<rank>.log files, or torchrun's console (workers print there).
    """
    log_dir = tmp_path / "logs"
    launcher = ["--nproc-per-node", str(nproc), "--master-port", "0"]  # a free port: jobs may run side by side
    if framework == "mindspore":
        launcher += ["--log_dir", str(log_dir)]  # msrun keeps worker output in its log files
    cmd = [sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", framework, *launcher,
           str(ENTRY), *TINY_GPT, *script_args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    console = done.stdout + done.stderr
    workers = "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("worker_*.log"))) or console
    return done.returncode, console + workers, workers


@pytest.mark.slow
def test_unsupported_flag_under_mindspore_on_cpu_exits_2_before_building_the_model(tmp_path):
    needs_entry()
    code, out, _ = mmrun("mindspore", ["--use-flash-attn"], tmp_path)
    assert code == 2, out[-3000:]
    for tag in ("[stack]", "[mmrun trainer]"):  # MindSpore has no flash-attention CPU kernel; mmrun's GPT calls none
        assert f"error: {tag} --use-flash-attn (flash attention) is not supported with the mindspore backend on cpu" in out, out[-3000:]
    assert "Hint:" in out
    assert not ITERATION.search(out), "the model trained although the gate refused a flag"
    assert "FeatureGateError" not in out, "the gate's error escaped as a traceback instead of exit 2 + message"


@pytest.mark.slow
def test_truly_unsupported_flag_stops_even_with_warn(tmp_path):
    needs_entry()
    code, out, _ = mmrun("mindspore", ["--lora-target-modules", "linear_qkv", "--on-unsupported", "warn"], tmp_path)
    assert code == 2, out[-3000:]
    assert "[mmrun trainer] --lora-target-modules linear_qkv (LoRA fine-tuning) is not supported with the mindspore backend on cpu" in out
    assert not ITERATION.search(out)


@pytest.mark.slow
def test_warn_trains_with_a_fallback_feature_off(tmp_path):
    needs_entry()
    code, out, worker = mmrun("mindspore", ["--use-flash-attn", "--on-unsupported", "warn", *PYNATIVE], tmp_path)
    assert code == 0, out[-3000:]
    # Both layers turn the flag off: one line says it, the stack's (it cites its source)
    warning = "--use-flash-attn (flash attention) is not supported with the mindspore backend on cpu; running with it off"
    assert worker.count(f"[stack] {warning}") == 1, worker[-3000:]
    assert f"[mmrun trainer] {warning}" not in worker, worker[-3000:]
    assert ITERATION.search(out), out[-3000:]


@pytest.mark.slow
def test_nccl_on_cpu_is_substituted_with_a_notice(tmp_path):
    needs_entry()
    code, out, worker = mmrun("pytorch", ["--distributed-backend", "nccl", "--global-batch-size", "4"], tmp_path, nproc=2)
    assert code == 0, out[-3000:]
    notice = ("notice: [stack] --distributed-backend nccl (NCCL communication) is not available with the pytorch "
              "backend on cpu; using --distributed-backend gloo instead")
    assert worker.count(notice) == 1, worker[-3000:]  # both layers substitute gloo: one line (rank 0's) says it
    assert "[mmrun trainer] --distributed-backend nccl" not in worker, worker[-3000:]
    assert ITERATION.search(out)


def supported_runs(framework: str) -> list[list[tuple[ft.Feature, ft.Trigger]]]:
    """Every trigger the trainer layer supports on the CPU, packed into as few runs as possible.

    A MindSpore run costs tens of seconds, so compatible flags share a run; two triggers of one flag
    (--ckpt-format torch_dcp vs safetensors) cannot, nor can exclusive entries (--fp16 and --bf16).
    """
    trainer = ft.load_tables().layer("trainer")
    supported = [e for e in ft.load_tables().features
                 if trainer.lists(e.name) and trainer.cell(e.name, framework, "cpu").status == "supported"]
    carried = {name for name, host in CARRIED_BY.items() if host in {e.name for e in supported}}

    def fits(run: list[tuple[ft.Feature, ft.Trigger]], entry: ft.Feature, trig: ft.Trigger) -> bool:
        if entry.name in carried:
            return any(e.name == CARRIED_BY[entry.name] for e, _ in run)
        if entry.name in PARALLEL or any(e.name in PARALLEL for e, _ in run):
            return False
        return all(t.flag != trig.flag and {e.name, entry.name} not in EXCLUSIVE for e, t in run)

    runs: list[list[tuple[ft.Feature, ft.Trigger]]] = []
    for entry in sorted(supported, key=lambda e: e.name in carried):  # the host runs exist first
        for trig in entry.triggers:
            run = next((r for r in runs if fits(r, entry, trig)), None)
            if run is None:
                runs.append(run := [])
            run.append((entry, trig))
    return runs


SUPPORTED_RUNS = [
    pytest.param(fw, run, id=f"{fw}:" + ",".join(e.name for e, _ in run))
    for fw in ft.FRAMEWORKS for run in supported_runs(fw)
    if not (len(run) == 1 and (fw, run[0][0].name) in COVERED_BY)
]


def test_covering_tests_exist():
    """Each COVERED_BY entry is supported on the CPU, trains alone, and names a test that exists."""
    for (framework, name), test in COVERED_BY.items():
        assert [[e.name for e, _ in run] for run in supported_runs(framework) if name in {e.name for e, _ in run}] \
            == [[name]], (framework, name)
        path, _, function = test.partition("::")
        assert f"def {function}(" in (REPO / path).read_text(encoding="utf-8"), test


def direct(framework: str, script_args: list[str], timeout: int = 300) -> tuple[int, str]:
    """One process, no launcher (world size 1): the cheapest real run of the entry."""
    cmd = [sys.executable, str(ENTRY), *TINY_GPT, *script_args, "--ai-framework", framework]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("framework, run", SUPPORTED_RUNS)
def test_every_supported_cpu_entry_trains(framework, run, tmp_path):
    needs_entry()
    names = {entry.name for entry, _ in run}
    args = [tok for entry, trig in run for tok in trig.example_tokens()]
    for name in names:
        args += EXTRA_SCRIPT_ARGS.get(name, lambda tmp: [])(tmp_path)
    if framework == "mindspore" and "ms-jit" not in names:
        args += PYNATIVE
    parallel = [PARALLEL[name] for name in names if name in PARALLEL and CARRIED_BY.get(name) not in names]
    if parallel:
        nproc, extra = parallel[0]
        code, out, _ = mmrun(framework, args + extra, tmp_path, nproc=nproc, timeout=300)
    elif names & TWO_PROCESSES:
        code, out, _ = mmrun(framework, args, tmp_path, nproc=2, timeout=300)
    else:
        code, out = direct(framework, args)
    assert code == 0, f"{' '.join(args)}\n{out[-3000:]}"
    assert ITERATION.search(out), out[-3000:]
    assert "is not supported" not in out and "is not available" not in out, out[-3000:]
    if "ckpt-format-safetensors" in names:
        assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").exists()
        assert list((tmp_path / "ckpt").rglob("*.safetensors"))
