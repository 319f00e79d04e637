"""`mmrun features`: both layers or one, table/json/markdown output, filters, --check, --entry, usage errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmrun import features as ft
from mmrun.features import cli

TABLES = ft.load_tables()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def matrix_rows(out: str, layer_tag: str) -> dict[str, list[str]]:
    """The rows of one layer's matrix in the text output, by feature name."""
    block = out.split(layer_tag, 1)[1].split("\n\n")[1]
    return {line.split()[0]: line.split() for line in block.splitlines()[2:]}


def test_table_shows_both_layers_with_every_entry_they_list(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    for layer in ft.LAYERS:
        tag = ft.table.LAYER_TAGS[layer]
        rows = matrix_rows(out, tag)
        assert set(rows) == {name for name in TABLES.layer(layer).cells}
    stack, trainer = matrix_rows(out, "[stack]"), matrix_rows(out, "[mmrun trainer]")
    # last columns are mindspore npu, cuda, cpu: bf16 stops on the CPU (no kernels) in both layers; the stack runs tensor
    # and context parallelism on MindSpore + Ascend and does not know about the CPU; mmrun's trainer runs tensor
    # parallelism on MindSpore's CPU (its MindSpore parallel engine) and refuses context parallelism everywhere
    assert (stack["bf16"][-1], trainer["bf16"][-1]) == ("NO", "NO")
    assert (stack["tensor-parallel"][-3:], trainer["tensor-parallel"][-1]) == (["yes", "?", "?"], "yes")
    assert (stack["context-parallel"][-3:], trainer["context-parallel"][-3:]) == (["yes", "?", "?"], ["NO"] * 3)
    assert trainer["backend-nccl"][-1] == "->mccl"
    assert "? = unknown" in out


def test_one_layer_only(capsys):
    code, out, _ = run(capsys, "--layer", "stack")
    assert code == 0 and "[stack]" in out and "[mmrun trainer]" not in out
    code, out, _ = run(capsys, "--layer", "trainer")
    assert code == 0 and "[mmrun trainer]" in out and "[stack]" not in out.split("\n\n", 1)[1].split("yes =")[0]


def test_one_framework_and_device_shows_reasons_hints_and_sources(capsys):
    code, out, _ = run(capsys, "--ai_framework", "mindspore", "--device", "cpu")
    assert code == 0
    stack_part, trainer_part = out.split("[mmrun trainer]", 1)
    bf16 = TABLES.layer("stack").cell("bf16", "mindspore", "cpu")
    line = next(l for l in stack_part.splitlines() if l.startswith("bf16 "))
    assert bf16.reason in line and bf16.hint in line and bf16.sources[0].key in line
    trainer_bf16 = TABLES.layer("trainer").cell("bf16", "mindspore", "cpu")
    assert trainer_bf16.reason in next(l for l in trainer_part.splitlines() if l.startswith("bf16 "))


def test_device_filter_keeps_both_frameworks(capsys):
    _, out, _ = run(capsys, "--device", "npu", "--layer", "stack")
    header = out.split("\n\n")[1].splitlines()[0].split()
    assert header[2:] == ["pytorch", "npu", "mindspore", "npu"]


def test_json_has_every_cell_of_each_layer_with_reason_hint_and_sources(capsys):
    code, out, _ = run(capsys, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["frameworks"] == ["pytorch", "mindspore"] and data["devices"] == ["npu", "cuda", "cpu"]
    assert set(data["layers"]) == {"stack", "trainer"} and data["layers"]["stack"]["columns"]["mindspore/npu"]
    by_name = {f["name"]: f for f in data["features"]}
    assert set(by_name) == {f.name for f in TABLES.features}
    for layer in ft.LAYERS:
        for name in TABLES.layer(layer).cells:
            for fw in ft.FRAMEWORKS:
                for dev in ft.DEVICES:
                    cell = TABLES.layer(layer).cell(name, fw, dev)
                    got = by_name[name]["support"][layer][fw][dev]
                    assert (got["status"], got["reason"], got["hint"]) == (cell.status, cell.reason, cell.hint)
                    assert got.get("sources", []) == [s.key for s in cell.sources]
                    assert all(key in data["sources"] for key in got.get("sources", []))
    assert by_name["backend-nccl"]["support"]["trainer"]["pytorch"]["cpu"]["substitute"] == "gloo"
    assert by_name["ms-jit"]["support"]["trainer"]["mindspore"]["cpu"]["min_version"] == "2.6"
    assert "stack" not in by_name["ms-jit"]["support"]  # mmrun's own switch: the stack does not judge it
    assert by_name["torch-fsdp2"]["companions"] == ["--fsdp2-config-path"]


def test_json_filtered(capsys):
    _, out, _ = run(capsys, "--format", "json", "--ai-framework", "pytorch", "--device", "cuda", "--layer", "trainer")
    data = json.loads(out)
    assert data["sources"] == {} and set(data["layers"]) == {"trainer"}
    assert all(list(f["support"]) == ["trainer"] and list(f["support"]["trainer"]) == ["pytorch"]
               and list(f["support"]["trainer"]["pytorch"]) == ["cuda"] for f in data["features"])


def test_markdown_filtered_is_a_table_per_layer(capsys):
    _, out, _ = run(capsys, "--format", "markdown", "--ai-framework", "mindspore", "--device", "cpu")
    lines = out.splitlines()
    headers = [l for l in lines if l.startswith("| feature ")]
    assert headers == ["| feature | flags | status | reason | hint | source |", "| feature | flags | status | reason | hint |"]
    rows = [l for l in lines if l.startswith("| ") and not l.startswith("| feature ")]
    assert len(rows) == sum(len(TABLES.layer(layer).cells) for layer in ft.LAYERS)


def test_check_judges_a_users_script_by_the_stack(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "npu",
                       "--check", "--tensor-model-parallel-size 2 --use-flash-attn --lora-target-modules linear_qkv --log-tps")
    assert code == 0  # nothing the MindSpore stack cannot run (--log-tps: the maintainers' msrun Omni script keeps it)
    assert [line.split(":")[0] for line in out.splitlines()] == ["ok", "ok", "ok", "ok"]
    assert all(" [stack] " in f" {line}" for line in out.splitlines())


def test_check_with_mmruns_trainer_as_entry_adds_the_trainer_layer(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "cpu", "--entry", "models/pretrain_gpt.py",
                       "--check", "--transformer-impl local --bf16 --context-parallel-size 2 --ckpt-format torch")
    assert code == 2
    assert [line.split(": [")[0] + " " + line.split("] ")[0].split("[")[1] for line in out.splitlines()] == [
        "ok mmrun trainer", "error stack", "error mmrun trainer", "unknown stack", "error mmrun trainer",
        "unknown stack", "notice mmrun trainer"]


def test_check_with_warn_runs_fallbacks(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "cpu", "--on-unsupported", "warn", "--layer", "trainer",
                       "--check", "--recompute-activation-function --use-flash-attn")
    assert code == 0
    assert [line.split(":")[0] for line in out.splitlines()] == ["warning", "warning"]


def test_check_with_warn_still_stops_what_has_no_kernel(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "cpu", "--on-unsupported", "warn", "--layer", "both",
                       "--check", "--bf16 --use-flash-attn")
    assert code == 2
    assert [line.split(":")[0] for line in out.splitlines()] == ["error", "error", "warning", "warning"]


def test_check_with_nothing_to_say(capsys):
    code, out, _ = run(capsys, "--ai-framework", "pytorch", "--device", "cpu", "--check", "--num-layers 2")
    assert code == 0 and out.startswith("ok: no flag that [stack] judges is turned on")


@pytest.mark.parametrize("argv, fragment", [
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--format", "yaml"], "invalid choice: 'yaml'"),
    (["--layer", "user"], "invalid choice: 'user'"),
    (["--check", "--bf16"], "--check needs --ai-framework and --device"),
    (["--entry", "models/pretrain_gpt.py"], "--entry only goes with --check"),
    (["--ai-framework", "pytorch", "--device", "cpu", "--check", "--bf16 'unclosed"], "could not split"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, fragment):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 or "usage:" in err


def test_help_has_examples(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "examples:" in out and "--check" in out and "--layer" in out and "--entry" in out


def test_broken_table_is_reported_not_raised(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "stack.yaml"
    bad.write_text("features:\n  x:\n    title: t\n")
    real = ft.loader._load
    monkeypatch.setattr(ft.loader, "_default_tables", lambda: real(ft.loader.CATALOGUE_PATH, {"stack": bad, "trainer": ft.loader.LAYER_PATHS["trainer"]}))
    code, _, err = run(capsys)
    assert code == 1 and err.startswith("mmrun features: ") and "stack.yaml" in err and len(err.splitlines()) == 1


def test_mmrun_dispatches_features():
    out = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "features", "--format", "json",
                          "--ai-framework", "mindspore", "--device", "cpu"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["features"][0]["support"]["stack"]["mindspore"]["cpu"]["status"]
