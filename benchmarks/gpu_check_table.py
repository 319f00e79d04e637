#!/usr/bin/env python3
"""The one table at the end of benchmarks/gpu_check.sh, from what its steps left under $OUT.

    python benchmarks/gpu_check_table.py OUT_DIR

Reads steps.tsv (each step's result and last log line) and the benchmarks' JSON files (engine_matrix.json,
gpt_accelerator.json, hash_dropout.json, vlm_engines.json); a file a step did not write is a row saying so.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable


def _load(out: Path, name: str) -> Any:
    path = out / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _cell(text: Any) -> str:
    return str(text).replace("|", "/").replace("\n", " ")[:220]


def engine_rows(data: dict) -> list[tuple[str, str, str]]:
    rows = [(f"{c['model']} {c['engine']} {c['precision']}: train 4 + save, resume 2", c["status"], c["detail"])
            for c in data["cells"]]
    left = data.get("planned", len(data["cells"])) - len(data["cells"])
    if left > 0:
        rows.append(("engine cells not finished", "missing", f"{left} of {data['planned']} cells did not finish "
                     "(the step's time limit; see engines.log)"))
    return rows


def gpt_rows(data: dict) -> list[tuple[str, str, str]]:
    rows = data["rows"]
    mmrun = {r["precision"]: r for r in rows if r["impl"] == "mmrun" and "error" not in r}
    out = []
    for r in rows:
        what = f"GPT speed {r['precision']}: {r['impl']}"
        if "error" in r:
            out.append((what, "FAILED", r["error"]))
            continue
        ref = mmrun.get(r["precision"])
        ratio = f"mmrun / this {ref['tokens_per_s'] / r['tokens_per_s']:.2f}x" if ref and r["impl"] != "mmrun" else ""
        mfu = "" if r.get("mfu") is None else f", MFU {100 * r['mfu']:.1f} %"
        mem = "" if r.get("peak_device_memory_mb") is None else f", peak {r['peak_device_memory_mb']} MB"
        out.append((what, "measured", f"{r['step_ms']} ms/step, {r['tokens_per_s']} tokens/s{mfu}{mem}; {ratio}"))
    return out


def dropout_rows(data: list) -> list[tuple[str, str, str]]:
    out = []
    for r in data:
        shape = "x".join(map(str, r["shape"]))
        for what in ("forward", "forward+backward", "graph"):
            t = r.get(what)
            if isinstance(t, dict) and t.get("ratio") is not None:
                out.append((f"hash dropout {shape} {r['dtype']} {what} ({r['kernel']})", "measured",
                            f"{t['hash_ms']:.3f} vs F.dropout {t['native_ms']:.3f} ms: {t['ratio']:.2f}x"))
        if "kept_mib" in r:
            k = r["kept_mib"]
            out.append((f"hash dropout {shape} {r['dtype']} kept for backward", "measured",
                        f"{k['hash']:.1f} MiB vs F.dropout {k['native']:.1f} MiB"))
    return out


def vlm_rows(data: dict) -> list[tuple[str, str, str]]:
    rows = data["rows"]
    out = []
    for r in rows:
        what = f"VLM speed {r['precision']}: {r['impl']} engine"
        if "error" in r:
            out.append((what, "skipped" if "not installed" in r["error"] else "FAILED", r["error"]))
            continue
        base = next((b for b in rows if b["precision"] == r["precision"] and b["impl"] == "portable"
                     and "error" not in b), None)
        ratio = f"; {r['tokens_per_s'] / base['tokens_per_s']:.2f}x the portable engine" if (
            base and r["impl"] != "portable") else ""
        out.append((what, "measured", f"{r['step_ms']} ms/step, {r['tokens_per_s']} tokens/s{ratio}"))
    return out


SOURCES: tuple[tuple[str, str, Callable[[Any], list[tuple[str, str, str]]]], ...] = (
    ("engines", "engine_matrix.json", engine_rows),
    ("gpt_speed", "gpt_accelerator.json", gpt_rows),
    ("dropout_speed", "hash_dropout.json", dropout_rows),
    ("vlm_speed", "vlm_engines.json", vlm_rows),
)


def table(out: Path) -> str:
    rows: list[tuple[str, str, str]] = []
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines() if line] if (
        out / "steps.tsv").exists() else []
    ran = {s[0] for s in steps}
    with_rows = {step for step, _, _ in SOURCES}
    for step in steps:
        name, result, detail = (step + ["", ""])[:3]
        if name in with_rows and result == "ok":
            detail = f"its rows below ({name}.log)"  # its last log line is a table row: the rows say it better
        rows.append((f"step {name}", result, detail))
    for step, filename, rows_of in SOURCES:
        data = _load(out, filename)
        if data is None:
            if step in ran:
                rows.append((f"{step} results", "missing", f"{filename} was not written (see {step}.log)"))
            continue
        rows += rows_of(data)
    log = out / "environment.log"
    env = log.read_text().strip().replace("\n", "; ") if log.exists() else ""
    lines = [f"gpu_check, environment: {env}", "", "| what | result | detail |", "|---|---|---|"]
    lines += [f"| {_cell(a)} | {_cell(b)} | {_cell(c)} |" for a, b, c in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out")))
