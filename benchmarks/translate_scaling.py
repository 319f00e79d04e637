"""How `mmrun translate` scales with the script: time against input size and against nesting depth.

    .venv/bin/python benchmarks/translate_scaling.py              # the figures in docs/translate.md
    .venv/bin/python benchmarks/translate_scaling.py --quick      # inputs up to 1 MB, depth up to 1600
    .venv/bin/python benchmarks/translate_scaling.py --json out.json

Each input is translated in this process (`translate_script`, torchrun -> msrun, which also computes the undo
record by translating back), after one warm-up run; the bare tool is tree-sitter-bash parsing the same bytes, timed
in the same run, interleaved. Reported per input: CPU seconds of the translation (best of --repeat), of the parse,
their ratio, microseconds per KB, and the growth against the previous row (input 4x larger: linear time is 4x,
quadratic 16x). CPU time, not wall time: the machine is shared.

Shapes:
  repeated lines   a launch line whose undo record is needed, then `echo hi` lines (difflib's worst case: the
                   undo record took 17 s at 55 KB before, over 60 s at 5 MB)
  guide script     the MindSpeed guide's pretrain_single.sh (tests/translate/fixtures) repeated, each copy a
                   launch with its own options variable
  long line        one launch line with thousands of training arguments
  nested $( )      `torchrun ... $(echo $(echo ...))`, by depth (depth^3 before: 19 s at depth 400)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from mmrun.common.atomic_write import atomic_write
from mmrun.launchers.translate import Options, TranslationRefused, translate_script
from mmrun.launchers.translate.parse import _parser

GUIDE = Path(__file__).resolve().parents[1] / "tests" / "translate" / "fixtures" / "seed001_pretrain_single.sh"


def repeated_lines(size: int) -> bytes:
    head = b"#!/bin/bash\ntorchrun --nproc-per-node=2 --nnodes 1 pretrain_gpt.py --fp16\n"
    return head + b"echo hi\n" * ((size - len(head)) // 8)


def guide_script(size: int) -> bytes:
    text = GUIDE.read_bytes()
    copies = max(1, size // len(text))
    # Each copy gets its own DISTRIBUTED_ARGS name: one shared variable would be one launch rewritten many times.
    return text + b"".join(text.replace(b"DISTRIBUTED_ARGS", b"DISTRIBUTED_ARGS_%d" % i).split(b"\n", 1)[1] for i in range(1, copies))


def long_line(size: int) -> bytes:
    head = b"#!/bin/bash\ntorchrun --nproc_per_node 2 --nnodes 1 pretrain_gpt.py"
    return head + b" --lr 1e-4 --data $DATA" * ((size - len(head)) // 23) + b"\n"


def nested(depth: int) -> bytes:
    return b"#!/bin/bash\ntorchrun --nproc_per_node 2 pretrain_gpt.py --tag " + b"$(echo " * depth + b"x" + b")" * depth + b"\n"


def cpu_best(work: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def translate(source: bytes, target: str = "msrun") -> Callable[[], object]:
    """One full translation of `source` as a callable (the tests of tests/translate/test_scaling.py time it too)."""
    def work() -> object:
        try:
            return translate_script(source, Options(target=target, device="npu"), "bench.sh")
        except TranslationRefused as refused:  # a refusal is a full run too (parse, rules, report)
            return refused
    return work


def measure(shape: str, label: str, source: bytes, repeat: int) -> dict:
    translate(source)()  # warm-up: imports, the parser, the feature table
    parse = cpu_best(lambda: _parser().parse(source), repeat)
    seconds = cpu_best(translate(source), repeat)
    return {"shape": shape, "input": label, "bytes": len(source), "translate_cpu_s": round(seconds, 4),
            "parse_cpu_s": round(parse, 4), "ratio_to_parse": round(seconds / max(parse, 1e-6), 1),
            "us_per_kb": round(seconds * 1e6 / max(len(source) / 1024, 1e-9), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="inputs up to 1 MB and depth 1600")
    parser.add_argument("--repeat", type=int, default=2, help="runs per input; the best CPU time is kept (default 2)")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    sizes = [16 << 10, 64 << 10, 256 << 10, 1 << 20] + ([] if args.quick else [5 << 20])
    depths = [100 * 4 ** i for i in range(3 if args.quick else 4)]  # 100 .. 6400
    print(f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for shape, make in (("repeated lines", repeated_lines), ("guide script", guide_script), ("long line", long_line)):
        for size in sizes:
            rows.append(measure(shape, f"{size // 1024} KB", make(size), args.repeat))
            print(f"  {shape:<15} {rows[-1]['input']:>8}: {rows[-1]['translate_cpu_s']:8.3f} s", flush=True)
    for depth in depths:
        rows.append(measure("nested $( )", f"depth {depth}", nested(depth), args.repeat))
        print(f"  {'nested $( )':<15} {rows[-1]['input']:>8}: {rows[-1]['translate_cpu_s']:8.3f} s", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}\n")
    print("| shape | input | bytes | translate CPU s | tree-sitter parse CPU s | translate / parse | us per KB | growth vs previous row |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    previous: dict | None = None
    for row in rows:
        growth = ""
        if previous is not None and previous["shape"] == row["shape"]:
            growth = f"{row['translate_cpu_s'] / max(previous['translate_cpu_s'], 1e-6):.1f}x for {row['bytes'] / previous['bytes']:.1f}x"
        print(f"| {row['shape']} | {row['input']} | {row['bytes']} | {row['translate_cpu_s']:.3f} | {row['parse_cpu_s']:.4f} | "
              f"{row['ratio_to_parse']} | {row['us_per_kb']} | {growth} |")
        previous = row
    if args.json_out:
        atomic_write(args.json_out, json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
