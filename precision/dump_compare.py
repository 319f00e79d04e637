"""`mmrun compare --dump DIR_A DIR_B`: pair two dumps' module records and name the first that diverges.

Records pair by name (`Module.<path>.<Class>.<forward|backward>.<n>`, the same on PyTorch and MindSpore
for mmrun's models) in A's execution order. Each tensor entry is judged:
- with both tensors (task "tensor"): msprobe's accuracy rule, cosine >= 0.99 or max abs error <= 1e-3,
  and in any case cosine >= 0.9 and max abs error <= 1;
- with statistics only: Max, Min, Mean and Norm each within stat_atol + stat_rtol x |A's value|.
The verdict names the first failing record in execution order, forward before backward: the module where
the runs part. A's dump is the baseline.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmrun.precision import dump_files

STATS = ("Max", "Min", "Mean", "Norm")
ROLES = {"forward": ("input_args", "output"), "backward": ("input", "output")}


@dataclass(frozen=True)
class TensorRule:
    """msprobe's "accuracy reached" rule for two tensors."""

    cosine: float = 0.99
    max_abs: float = 1e-3
    cosine_floor: float = 0.9
    max_abs_ceiling: float = 1.0

    def passes(self, cosine: float, max_abs: float) -> bool:
        if math.isnan(cosine) or math.isnan(max_abs):
            return False
        return (cosine >= self.cosine or max_abs <= self.max_abs) and cosine >= self.cosine_floor \
            and max_abs <= self.max_abs_ceiling


@dataclass
class EntryResult:
    record: str
    role: str  # "output.0", "input_args.1", ...
    passed: bool
    cosine: float | None
    max_abs: float | None
    max_rel: float | None
    norm_a: float | None
    norm_b: float | None
    reason: str = ""

    @property
    def norm_rel(self) -> float | None:
        if self.norm_a is None or self.norm_b is None:
            return None
        return abs(self.norm_b - self.norm_a) / abs(self.norm_a) if self.norm_a else abs(self.norm_b - self.norm_a)


def _close(a: float | None, b: float | None, rtol: float, atol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(b - a) <= atol + rtol * abs(a)


def _dtype(entry: dict) -> str:
    return str(entry.get("dtype", "")).lower().replace("torch.", "").replace("mindspore.", "")


def _tensor_metrics(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    diff = np.abs(a64 - b64)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(a64), 1e-12)).max()) if diff.size else 0.0
    na, nb = float(np.linalg.norm(a64)), float(np.linalg.norm(b64))
    if na == 0.0 and nb == 0.0:
        cosine = 1.0
    elif na == 0.0 or nb == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(a64, b64) / (na * nb))
    return cosine, max_abs, max_rel


def compare_entry(record: str, role: str, a: dict, b: dict, tensors_a: dict, tensors_b: dict,
                  stat_rtol: float, stat_atol: float, rule: TensorRule) -> EntryResult | None:
    if "Max" not in a and "Max" not in b:
        if a.get("value") != b.get("value"):
            return EntryResult(record, role, False, None, None, None, None, None,
                               f"value {a.get('value')!r} vs {b.get('value')!r}")
        return None  # a constant argument, equal
    if "Max" not in a or "Max" not in b:
        return EntryResult(record, role, False, None, None, None, None, None, "a tensor on one side only")
    result = EntryResult(record, role, True, None, None, None, a.get("Norm"), b.get("Norm"))
    if a.get("shape") != b.get("shape"):
        result.passed, result.reason = False, f"shape {a.get('shape')} vs {b.get('shape')}"
        return result
    if _dtype(a) != _dtype(b):
        result.reason = f"dtype {a.get('dtype')} vs {b.get('dtype')}"  # reported, judged by the values
    name_a, name_b = a.get("data_name"), b.get("data_name")
    if name_a in tensors_a and name_b in tensors_b:
        result.cosine, result.max_abs, result.max_rel = _tensor_metrics(tensors_a[name_a], tensors_b[name_b])
        if not rule.passes(result.cosine, result.max_abs):
            result.passed = False
            result.reason = (f"cosine {result.cosine:.6f}, max abs error {result.max_abs:.3g} (msprobe's rule: cosine "
                             f">= {rule.cosine} or max abs error <= {rule.max_abs:g}; cosine >= {rule.cosine_floor}, "
                             f"max abs error <= {rule.max_abs_ceiling:g})")
        return result
    off = [k for k in STATS if not _close(a.get(k), b.get(k), stat_rtol, stat_atol)]
    if off:
        result.passed = False
        result.reason = ", ".join(f"{k} {a.get(k):.7g} vs {b.get(k):.7g}" for k in off if a.get(k) is not None
                                  and b.get(k) is not None) or f"{', '.join(off)} differ"
    return result


@dataclass
class StepComparison:
    step: int
    rank: int
    entries: list[EntryResult]
    only_a: list[str]
    only_b: list[str]
    records: int
    framework_a: str
    framework_b: str

    def first_failing(self, direction: str) -> EntryResult | None:
        return next((e for e in self.entries if not e.passed and f".{direction}." in e.record), None)


def compare_step(folder_a: Path, folder_b: Path, step: int, rank: int, stat_rtol: float, stat_atol: float,
                 rule: TensorRule = TensorRule()) -> StepComparison:
    dump_a, tensors_a = dump_files.read_step(folder_a)
    dump_b, tensors_b = dump_files.read_step(folder_b)
    data_a, data_b = dump_a.get("data", {}), dump_b.get("data", {})
    entries = []
    for name, rec_a in data_a.items():
        rec_b = data_b.get(name)
        parsed = dump_files.parse_record_name(name)
        if rec_b is None or parsed is None:
            continue
        for role in ROLES[parsed["direction"]]:
            for index, (ea, eb) in enumerate(zip(rec_a.get(role, []) or [], rec_b.get(role, []) or [])):
                result = compare_entry(name, f"{role}.{index}", ea, eb, tensors_a, tensors_b, stat_rtol, stat_atol, rule)
                if result is not None:
                    entries.append(result)
    return StepComparison(step, rank, entries, [n for n in data_a if n not in data_b],
                          [n for n in data_b if n not in data_a], len(set(data_a) & set(data_b)),
                          dump_a.get("framework", "?"), dump_b.get("framework", "?"))


def _module(record: str) -> str:
    parsed = dump_files.parse_record_name(record)
    return parsed["path"] if parsed else record


def _g(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def main_dump(args: argparse.Namespace) -> int:
    dir_a, dir_b = (Path(p) for p in args.paths)
    found_a, found_b = dump_files.dumped_steps(dir_a), dump_files.dumped_steps(dir_b)
    for folder, found in ((dir_a, found_a), (dir_b, found_b)):
        if not found:
            print(f"mmrun compare: error: {folder}: no step<S>/rank<R>/dump.json found; pass the dump_path of a "
                  "--dump-config run", file=sys.stderr)
            return 2
    keys = sorted(k for k in set(found_a) & set(found_b)
                  if (args.step is None or k[0] == args.step) and (args.rank is None or k[1] == args.rank))
    if not keys:
        print(f"mmrun compare: error: no (step, rank) dumped by both: A has {sorted(found_a)}, B has {sorted(found_b)}"
              f"{'' if args.step is None else f', --step {args.step}'}{'' if args.rank is None else f', --rank {args.rank}'}; "
              "dump the same steps and ranks", file=sys.stderr)
        return 2
    try:
        results = [compare_step(found_a[k], found_b[k], k[0], k[1], args.stat_rtol, args.stat_atol) for k in keys]
    except (OSError, ValueError, KeyError) as err:
        print(f"mmrun compare: error: a dump cannot be read ({err}); pass two --dump-config dump_path folders",
              file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps([{"step": r.step, "rank": r.rank, "only_a": r.only_a, "only_b": r.only_b,
                           "entries": [vars(e) for e in r.entries]} for r in results], indent=1, default=str))
    first: tuple[str, StepComparison, EntryResult] | None = None
    first_backward: tuple[StepComparison, EntryResult] | None = None
    if args.format == "text":
        print(f"A (baseline): {dir_a}  B: {dir_b}")
    for r in results:
        failing = [e for e in r.entries if not e.passed]
        if args.format == "text":
            print(f"step {r.step} rank {r.rank}: {r.framework_a} vs {r.framework_b}, {r.records} records paired "
                  f"({len(r.entries)} tensors), {len(failing)} outside the tolerance; only in A: {len(r.only_a)}, "
                  f"only in B: {len(r.only_b)}")
            if failing:
                print(f"  {'record':<52} {'entry':<12} {'cosine':>8} {'max abs':>9} {'norm A':>10} {'norm B':>10}  why")
                for e in failing[:args.max_rows or len(failing)]:
                    print(f"  {e.record:<52} {e.role:<12} {_g(e.cosine, '.6f'):>8} {_g(e.max_abs, '.3g'):>9} "
                          f"{_g(e.norm_a):>10} {_g(e.norm_b):>10}  {e.reason}")
                if args.max_rows and len(failing) > args.max_rows:
                    print(f"  ({args.max_rows} of {len(failing)} shown; --max-rows 0 shows all)")
        for direction in ("forward", "backward"):
            e = r.first_failing(direction)
            if e is not None and (first is None or (direction == "forward" and first[0] == "backward")):
                first = (direction, r, e)
            if e is not None and direction == "backward" and first_backward is None:
                first_backward = (r, e)
    tolerance = f"statistics within rtol {args.stat_rtol:g}, atol {args.stat_atol:g}; tensors by msprobe's rule"
    if first is None:
        if args.format == "text":
            print(f"verdict: PASS: every paired module agrees ({tolerance})")
        return 0
    if args.format == "text":
        direction, r, e = first
        print(f"first diverging module: {_module(e.record)} ({direction}, step {r.step} rank {r.rank}: {e.record} "
              f"{e.role}: {e.reason})")
        if first_backward is not None and direction == "forward":
            rb, eb = first_backward
            print(f"first diverging module in backward: {_module(eb.record)} (step {rb.step} rank {rb.rank}: "
                  f"{eb.record} {eb.role}: {eb.reason})")
        print(f"verdict: FAIL ({tolerance})")
    return 1
