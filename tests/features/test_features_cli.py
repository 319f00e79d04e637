"""`mmrun features`: table, json and markdown output, filters, --check, usage errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmrun.backend import features as ft
from mmrun.launchers import features_cli

TABLE = ft.load_table()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = features_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_lists_every_entry_and_column(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[:2] == ["feature", "flags"]
    assert " ".join(header[2:]) == "pytorch npu pytorch cuda pytorch cpu mindspore npu mindspore cuda mindspore cpu"
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip() and not line.startswith("yes =")}
    assert set(rows) == {e.name for e in TABLE.entries}
    # last column is mindspore cpu: bf16 stops there (no kernels), fp16 and local layers run, flash attention
    # falls back, tensor parallelism stops
    assert (rows["bf16"][-1], rows["fp16"][-1], rows["transformer-local"][-1], rows["flash-attention"][-1],
            rows["tensor-parallel"][-1]) == ("NO", "yes", "yes", "off", "NO")
    assert rows["backend-nccl"][-1] == "->mccl"


def test_one_framework_and_device_shows_reasons_and_hints(capsys):
    code, out, _ = run(capsys, "--ai_framework", "mindspore", "--device", "cpu")
    assert code == 0
    bf16 = TABLE.get("bf16").cell("mindspore", "cpu")
    line = next(l for l in out.splitlines() if l.startswith("bf16 "))
    assert bf16.reason in line and bf16.hint in line


def test_device_filter_keeps_both_frameworks(capsys):
    _, out, _ = run(capsys, "--device", "npu")
    assert out.splitlines()[0].split()[2:] == ["pytorch", "npu", "mindspore", "npu"]


def test_json_has_every_cell_with_reason_and_hint(capsys):
    code, out, _ = run(capsys, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["frameworks"] == ["pytorch", "mindspore"] and data["devices"] == ["npu", "cuda", "cpu"]
    by_name = {f["name"]: f for f in data["features"]}
    assert set(by_name) == {e.name for e in TABLE.entries}
    for entry in TABLE.entries:
        for fw in ft.FRAMEWORKS:
            for dev in ft.DEVICES:
                cell = entry.cells[(fw, dev)]
                got = by_name[entry.name]["support"][fw][dev]
                assert (got["status"], got["reason"], got["hint"]) == (cell.status, cell.reason, cell.hint)
    assert by_name["backend-nccl"]["support"]["pytorch"]["cpu"]["substitute"] == "gloo"
    assert by_name["ms-jit"]["support"]["mindspore"]["cpu"]["min_version"] == "2.6"
    assert by_name["torch-fsdp2"]["companions"] == ["--fsdp2-config-path"]


def test_json_filtered(capsys):
    _, out, _ = run(capsys, "--format", "json", "--ai-framework", "pytorch", "--device", "cuda")
    data = json.loads(out)
    assert all(list(f["support"]) == ["pytorch"] and list(f["support"]["pytorch"]) == ["cuda"] for f in data["features"])


def test_markdown_filtered_is_a_table(capsys):
    _, out, _ = run(capsys, "--format", "markdown", "--ai-framework", "mindspore", "--device", "cpu")
    lines = out.splitlines()
    assert lines[0] == "| feature | flags | status | reason | hint |"
    assert lines[1] == "|---|---|---|---|---|"
    assert len([l for l in lines if l.startswith("| ")]) == len(TABLE.entries) + 1


def test_check_stops_with_exit_2_and_one_line_per_flag(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "cpu",
                       "--check", "--transformer-impl local --bf16 --tensor-model-parallel-size 2 --ckpt-format torch")
    assert code == 2
    prefixes = [line.split(":")[0] for line in out.splitlines()]
    assert prefixes == ["ok", "error", "error", "notice"]


def test_check_with_warn_runs_fallbacks(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "cpu", "--on-unsupported", "warn",
                       "--check", "--recompute-granularity full --use-flash-attn")
    assert code == 0
    assert [line.split(":")[0] for line in out.splitlines()] == ["warning", "warning"]


def test_check_with_warn_still_stops_what_has_no_kernel(capsys):
    code, out, _ = run(capsys, "--ai-framework", "mindspore", "--device", "cpu", "--on-unsupported", "warn",
                       "--check", "--bf16 --use-flash-attn")
    assert code == 2
    assert [line.split(":")[0] for line in out.splitlines()] == ["error", "warning"]


def test_check_with_nothing_to_say(capsys):
    code, out, _ = run(capsys, "--ai-framework", "pytorch", "--device", "cpu", "--check", "--num-layers 2")
    assert code == 0 and out.startswith("ok: no flag in the table is turned on")


@pytest.mark.parametrize("argv, fragment", [
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--format", "yaml"], "invalid choice: 'yaml'"),
    (["--check", "--bf16"], "--check needs --ai-framework and --device"),
    (["--ai-framework", "pytorch", "--device", "cpu", "--check", "--bf16 'unclosed"], "could not split"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, fragment):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert fragment in err


def test_help_has_examples(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "examples:" in out and "--check" in out


def test_broken_table_is_reported_not_raised(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "features.yaml"
    bad.write_text("features:\n  x:\n    title: t\n")
    monkeypatch.setattr(ft, "load_table", lambda path=None: ft._load(bad))
    code, _, err = run(capsys)
    assert code == 1 and "entry 'x': missing key" in err


def test_mmrun_dispatches_features():
    out = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "features", "--format", "json",
                          "--ai-framework", "mindspore", "--device", "cpu"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["features"][0]["support"]["mindspore"]["cpu"]["status"]
