"""`mmrun features`: print the feature support matrix (framework x device), or check a flag list.

The matrix comes from backend/features.yaml through mmrun.backend.features, so what this prints is
what the training entry enforces. `--format markdown` with no filter prints docs/features.md.
No framework is imported.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from mmrun.backend import features as ft

EXAMPLES = """\
examples:
  mmrun features                                        # the whole matrix
  mmrun features --ai-framework mindspore --device cpu  # one column, with reasons and hints
  mmrun features --format json                          # for tools
  mmrun features --ai-framework mindspore --device cpu --check "--bf16 --use-flash-attn"
                                                        # what the gate does with these flags (exit 2 if it stops)
  mmrun features --format markdown > docs/features.md   # regenerate the docs page
"""

REGENERATE = "mmrun features --format markdown > docs/features.md"

# Short marks for the matrix, one per verdict.
MARKS = {"supported": "yes", "unsupported": "NO", "fallback": "off"}
LEGEND = ("yes = supported; NO = unsupported (the job stops); off = fallback: the job stops unless "
          "--on-unsupported warn, then runs with the feature off; ->X = fallback the gate makes by itself "
          "with a notice (X is used instead); >=V = needs framework version V")


def _mark(cell: ft.Cell) -> str:
    if cell.status == "fallback" and cell.has_substitute:
        text = "->" + ("off" if cell.substitute in (False, None) else str(cell.substitute))
    else:
        text = MARKS[cell.status]
    return f"{text} >={cell.min_version}" if cell.min_version else text


def _columns(framework: str | None, device: str | None) -> list[tuple[str, str]]:
    return [(fw, dev) for fw in ft.FRAMEWORKS for dev in ft.DEVICES
            if framework in (None, fw) and device in (None, dev)]


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, ["-" * w for w in widths], *rows]]
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _rows(table: ft.FeatureTable, framework: str | None, device: str | None, markdown: bool) -> tuple[list[str], list[list[str]]]:
    def flags(entry: ft.Entry) -> str:
        return ", ".join(f"`{t.describe()}`" for t in entry.triggers) if markdown else entry.describe_flags()
    if framework and device:
        header = ["feature", "flags", "status", "reason", "hint"]
        rows = []
        for entry in table.entries:
            cell = entry.cells[(framework, device)]
            rows.append([entry.name, flags(entry), _mark(cell), cell.reason, cell.hint or ""])
        return header, rows
    cols = _columns(framework, device)
    header = ["feature", "flags", *[f"{fw} {dev}" for fw, dev in cols]]
    rows = [[entry.name, flags(entry), *[_mark(entry.cells[c]) for c in cols]] for entry in table.entries]
    return header, rows


def render_table(framework: str | None = None, device: str | None = None, table: ft.FeatureTable | None = None) -> str:
    table = table or ft.load_table()
    header, rows = _rows(table, framework, device, markdown=False)
    return _text_table(header, rows) + "\n\n" + LEGEND


def render_json(framework: str | None = None, device: str | None = None, table: ft.FeatureTable | None = None) -> str:
    table = table or ft.load_table()
    cols = _columns(framework, device)
    features: list[dict[str, Any]] = []
    for entry in table.entries:
        cells: dict[str, dict[str, Any]] = {}
        for fw, dev in cols:
            cell = entry.cells[(fw, dev)]
            data: dict[str, Any] = {"status": cell.status, "reason": cell.reason, "hint": cell.hint}
            if cell.min_version:
                data["min_version"] = cell.min_version
            if cell.has_substitute:
                data["substitute"] = cell.substitute
            cells.setdefault(fw, {})[dev] = data
        features.append({
            "name": entry.name, "title": entry.title, "group": entry.group,
            "triggers": [{"flag": t.flag, "describe": t.describe(), "takes": t.takes, "dest": t.dest} for t in entry.triggers],
            "companions": [c.flag for c in entry.companions],
            "support": cells,
        })
    return json.dumps({"frameworks": sorted({fw for fw, _ in cols}, key=ft.FRAMEWORKS.index),
                       "devices": sorted({dev for _, dev in cols}, key=ft.DEVICES.index),
                       "features": features}, indent=2)


def _check_lines(args_text: str, framework: str, device: str, policy: str) -> tuple[list[str], bool]:
    """What the gate says about a flag list: lines prefixed error/warning/notice/ok, and whether it stops."""
    decisions = ft.check_flags(shlex.split(args_text), framework, device)
    lines, stops = [], False
    for d in decisions:
        stop = d.status == "unsupported" or (d.status == "fallback" and not d.automatic and policy == "error")
        stops |= stop
        prefix = "error" if stop else ("ok" if d.status == "supported" else ("notice" if d.automatic else "warning"))
        lines.append(f"{prefix}: {d.line(policy)}")
    if not decisions:
        lines.append(f"ok: no flag in the table is turned on ({framework} on {device})")
    return lines, stops


def render_markdown(framework: str | None = None, device: str | None = None, table: ft.FeatureTable | None = None) -> str:
    """docs/features.md when unfiltered; a markdown table for a filtered view."""
    table = table or ft.load_table()
    header, rows = _rows(table, framework, device, markdown=True)
    if framework or device:
        return _md_table(header, rows) + "\n\n" + LEGEND + "\n"
    example_args = "--transformer-impl local --bf16 --use-flash-attn --tensor-model-parallel-size 2 --distributed-backend nccl --ckpt-format torch"
    example_cmd = f'mmrun features --ai-framework mindspore --device cpu --check "{example_args}"'
    check_error, _ = _check_lines(example_args, "mindspore", "cpu", "error")
    out = [
        "# Feature support: what each framework and device runs",
        "",
        f"<!-- Generated from backend/features.yaml by `{REGENERATE}`. Edit the YAML, not this page; "
        "tests/features/test_docs.py fails when the page is stale. -->",
        "",
        f"Regenerate this page: `{REGENERATE}`",
        "",
        "mmrun keeps, in one table (`backend/features.yaml`), which Megatron/MindSpeed training flags its own "
        "models support on each framework (pytorch, mindspore) and device (npu, cuda, cpu). The Ascend guides ask "
        "users to switch off, by hand, the features the MindSpore backend lacks; mmrun checks them instead:",
        "",
        "- the training entry calls `mmrun.backend.features.gate(args, framework, device, on_unsupported)` right "
        "after parsing its arguments, before a model is built;",
        "- `mmrun translate` calls `check_flags(tokens, framework, device)` to mark or remove flags in launch scripts;",
        "- `mmrun features` prints the table (`--format table|json|markdown`) and checks a flag list (`--check`).",
        "",
        "## What the verdicts mean",
        "",
        "| verdict | default policy (`--on-unsupported error`) | `--on-unsupported warn` |",
        "|---|---|---|",
        "| supported | runs | runs |",
        "| unsupported | stops, exit 2, one line per flag | stops, exit 2 |",
        "| fallback | stops, exit 2 (running without the feature changes memory, speed or precision) "
        "| runs with the feature off, one warning per flag |",
        "| fallback with a substitute (`->X`) | runs with X instead and a notice: the swap cannot change "
        "what the job computes (communication backend, checkpoint file format, a switch of the other framework) "
        "| same |",
        "",
        "Each line names the flag as received, the framework and device, the reason and a hint.",
        "",
        "## Example",
        "",
        "```console",
        f"$ {example_cmd}",
        *check_error,
        "$ echo $?",
        "2",
        "```",
        "",
        "## In a training entry",
        "",
        "```python",
        "import sys",
        "from mmrun import backend",
        "from mmrun.backend.features import FeatureGateError, add_gate_arguments, gate",
        "",
        "add_gate_arguments(parser)             # --on-unsupported error|warn",
        "args = parser.parse_args()",
        "info = backend.current()",
        "try:",
        "    gate(args, info.framework, info.device_kind, args.on_unsupported,",
        "         framework_version=info.version).apply(args)   # fallbacks off, substitutes in",
        "except FeatureGateError as err:",
        "    print(err, file=sys.stderr)        # one line per flag",
        "    sys.exit(err.exit_code)            # 2, before any model is built",
        "```",
        "",
        "`check_flags(tokens, framework, device)` gives the same decisions for a token list, each with the "
        "`span` of tokens it came from (and `companion_spans` of flags that only configure it, such as "
        "`--fsdp2-config-path`), plus `replacement_tokens()` for a rewrite; a value that is a shell variable "
        "(`$TP`) is reported with `value_known=False`.",
        "",
        "## Matrix",
        "",
        _md_table(header, rows),
        "",
        LEGEND + ".",
        "",
        "## Reasons and hints",
        "",
    ]
    for group, entries in ft.entries_by_group(table).items():
        out += [f"### {group}", ""]
        for entry in entries:
            out += [f"#### {entry.title}", "", f"`{entry.name}`: {', '.join(f'`{t.describe()}`' for t in entry.triggers)}"]
            if entry.companions:
                out[-1] += f"; configured by {', '.join(f'`{c.flag}`' for c in entry.companions)}"
            out += [""]
            # Cells repeat across a row; list each distinct verdict once with where it applies.
            distinct: dict[ft.Cell, list[str]] = {}
            for fw, dev in _columns(None, None):
                distinct.setdefault(entry.cells[(fw, dev)], []).append(f"{fw}/{dev}")
            rows = [[", ".join(where), _mark(cell), cell.reason, cell.hint or ""] for cell, where in distinct.items()]
            out += [_md_table(["where", "verdict", "reason", "hint"], rows), ""]
    out += [
        "## What was verified",
        "",
        "- CPU cells: measured here with torch 2.13.0+cpu and mindspore 2.10.0 (fp16 and bf16 kernels, "
        "MindSpore's missing bf16 MatMul and flash-attention CPU kernels, gloo and mccl data parallelism, "
        "`mindspore.jit` of the train step). Every `supported` CPU cell has an end-to-end training run in "
        "`tests/features/test_gate_e2e.py`.",
        "- npu and cuda cells follow the frameworks' documentation (MindSpore's bf16 support list, "
        "`mindspore.jit` API history, torch_npu and NCCL/HCCL docs); they were not run on an NPU or a GPU.",
        "- Version conditions are the documented or measured minimum; older versions were not installed here.",
        "",
    ]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmrun features",
        description="Print which training flags mmrun's models support per framework and device "
                    "(from backend/features.yaml), or check a flag list against it.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ai-framework", "--ai_framework", dest="framework", choices=ft.FRAMEWORKS, default=None,
                        help="only this framework")
    parser.add_argument("--device", choices=ft.DEVICES, default=None, help="only this device")
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table", help="output format (default: table)")
    parser.add_argument("--check", metavar="ARGS", default=None,
                        help="training arguments as one string; print what the gate does with them "
                             "(needs --ai-framework and --device; exit 2 if the job would stop)")
    parser.add_argument("--on-unsupported", "--on_unsupported", dest="on_unsupported", choices=ft.POLICIES,
                        default="error", help="policy for --check (default: error)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # The value of --check is itself a flag list ("--bf16"); argparse would take it for an option.
    for i, token in enumerate(argv[:-1]):
        if token == "--check":
            argv[i:i + 2] = [f"--check={argv[i + 1]}"]
            break
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on a usage error, 0 for --help
        return int(exc.code or 0)
    try:
        if args.check is not None:
            if not (args.framework and args.device):
                print(f"mmrun features: --check needs --ai-framework and --device. Received: "
                      f"--ai-framework {args.framework}, --device {args.device}", file=sys.stderr)
                return 2
            try:
                lines, stops = _check_lines(args.check, args.framework, args.device, args.on_unsupported)
            except ValueError as err:  # shlex: unbalanced quotes
                print(f"mmrun features: --check could not split {args.check!r}: {err}", file=sys.stderr)
                return 2
            print("\n".join(lines))
            return 2 if stops else 0
        render = {"table": render_table, "json": render_json, "markdown": render_markdown}[args.format]
        text = render(args.framework, args.device)
    except ft.FeatureTableError as err:
        print(f"mmrun features: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
