"""Compare the per-iteration metrics of two runs: differences, the first iteration out of tolerance, a verdict.

Tolerance is numpy.isclose's: |test - baseline| <= atol + rtol * |baseline|, the baseline being the
first run given. The default rtol of 1% is MindSpeed-MM's acceptance of a migrated model (per-step loss
within 1% of the baseline); two NaNs count as equal (both runs did the same thing), NaN against a number
does not. Only the metrics in `checked` decide the verdict; the others are reported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from mmrun.precision.run_logs import METRICS, RunMetrics


@dataclass
class MetricDiff:
    metric: str
    iterations: list[int]
    baseline: list[float]
    test: list[float]
    rtol: float
    atol: float

    def abs_diffs(self) -> list[float]:
        return [0.0 if (math.isnan(a) and math.isnan(b)) else abs(b - a) for a, b in zip(self.baseline, self.test)]

    def rel_diffs(self) -> list[float]:
        return [d / abs(a) if a not in (0.0,) and math.isfinite(a) else (0.0 if d == 0 else math.inf)
                for d, a in zip(self.abs_diffs(), self.baseline)]

    def outside(self) -> list[int]:
        """Iterations whose difference is beyond atol + rtol * |baseline| (NaN against a number included)."""
        bad = []
        for it, a, b, d in zip(self.iterations, self.baseline, self.test, self.abs_diffs()):
            if math.isnan(a) and math.isnan(b):
                continue
            if math.isnan(d) or not d <= self.atol + self.rtol * abs(a):
                bad.append(it)
        return bad

    def summary(self) -> dict:
        abs_d, rel_d = self.abs_diffs(), self.rel_diffs()
        finite_abs = [d for d in abs_d if math.isfinite(d)]
        finite_rel = [d for d in rel_d if math.isfinite(d)]
        outside = self.outside()
        return {"metric": self.metric, "iterations": len(self.iterations),
                "max_abs": max(finite_abs, default=math.nan), "mean_abs": _mean(finite_abs),
                "max_rel": max(finite_rel, default=math.nan), "mean_rel": _mean(finite_rel),
                "outside": len(outside), "first_outside": outside[0] if outside else None}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class Comparison:
    baseline: RunMetrics
    test: RunMetrics
    diffs: dict[str, MetricDiff]
    checked: tuple[str, ...]
    notes: list[str] = field(default_factory=list)

    @property
    def common(self) -> list[int]:
        return sorted(set(self.baseline.values) & set(self.test.values))

    def failures(self) -> list[str]:
        """Why the verdict is FAIL, one reason per line; empty when it passes."""
        reasons = []
        if not self.common:
            reasons.append("no iteration in common")
        for metric in self.checked:
            diff = self.diffs.get(metric)
            if diff is None or not diff.iterations:
                if self.common:
                    reasons.append(f"{metric}: not logged by both runs")
                continue
            first = diff.summary()["first_outside"]
            if first is not None:
                i = diff.iterations.index(first)
                reasons.append(f"{metric} first outside the tolerance at iteration {first}: {diff.baseline[i]:.6g} vs "
                               f"{diff.test[i]:.6g} (|diff| {diff.abs_diffs()[i]:.3g} > atol {diff.atol:g} + rtol "
                               f"{diff.rtol:g} x |baseline|)")
        return reasons


def compare(baseline: RunMetrics, test: RunMetrics, rtol: float = 0.01, atol: float = 0.0,
            checked: tuple[str, ...] = ("lm loss",)) -> Comparison:
    common = sorted(set(baseline.values) & set(test.values))
    diffs = {}
    for metric in METRICS:
        its = [it for it in common if metric in baseline.values[it] and metric in test.values[it]]
        if its:
            diffs[metric] = MetricDiff(metric, its, [baseline.values[i][metric] for i in its],
                                       [test.values[i][metric] for i in its], rtol, atol)
    result = Comparison(baseline, test, diffs, checked)
    only_a, only_b = set(baseline.values) - set(test.values), set(test.values) - set(baseline.values)
    if common and (only_a or only_b):
        result.notes.append(f"different lengths: compared the {len(common)} iterations both logged "
                            f"({common[0]}..{common[-1]}); only in A: {_span(only_a)}; only in B: {_span(only_b)}")
    for run, label in ((baseline, "A"), (test, "B")):
        for where in run.restarts:
            result.notes.append(f"{label} restarts at {where} (a resumed run): its later values are used")
        for note in run.notes:
            result.notes.append(f"{label}: {note}")
    if baseline.train_iters and test.train_iters and baseline.train_iters != test.train_iters:
        result.notes.append(f"--train-iters differ: A {baseline.train_iters}, B {test.train_iters} (the learning-rate "
                            "schedules differ with it)")
    return result


def _span(its: set[int]) -> str:
    if not its:
        return "none"
    ordered = sorted(its)
    return f"{len(ordered)} ({ordered[0]}..{ordered[-1]})" if len(ordered) > 1 else str(ordered[0])


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if math.isfinite(value) or math.isnan(value) else str(value)


def report_lines(comparison: Comparison, max_rows: int = 40) -> list[str]:
    """The side-by-side table (per iteration), the summary per metric, the notes; then the verdict line."""
    a, b = comparison.baseline, comparison.test
    lines = [f"A (baseline): {a.describe()}", f"B:            {b.describe()}"]
    common = comparison.common
    loss = comparison.diffs.get("lm loss")
    outside = set(loss.outside()) if loss else set()
    rows = common
    if max_rows and len(common) > max_rows:
        step = math.ceil(len(common) / max_rows)
        keep = set(common[::step]) | {common[-1]} | set(sorted(outside)[:3])
        rows = [it for it in common if it in keep]
    if rows:
        header = (f"{'iteration':>9}  {'lm loss A':>12}  {'lm loss B':>12}  {'abs diff':>9}  {'rel diff':>9}  "
                  f"{'grad norm A':>11}  {'grad norm B':>11}  {'scale A':>7}  {'scale B':>7}  {'skip A/B':>8}")
        lines += ["", header]
        for it in rows:
            ra, rb = a.values[it], b.values[it]
            la, lb = ra.get("lm loss"), rb.get("lm loss")
            ad = abs(lb - la) if la is not None and lb is not None else None
            rd = ad / abs(la) if ad is not None and la else None
            mark = "  <" if it in outside else ""
            skips = f"{_int(ra.get('skipped'))}/{_int(rb.get('skipped'))}"
            lines.append(f"{it:>9}  {_fmt(la):>12}  {_fmt(lb):>12}  {_sci(ad):>9}  {_sci(rd):>9}  "
                         f"{_fmt(ra.get('grad norm')):>11}  {_fmt(rb.get('grad norm')):>11}  "
                         f"{_fmt(ra.get('loss scale')):>7}  {_fmt(rb.get('loss scale')):>7}  {skips:>8}{mark}")
        if len(rows) < len(common):
            lines.append(f"({len(rows)} of {len(common)} iterations shown; --max-rows 0 shows all; '<' marks "
                         "lm loss outside the tolerance)")
    lines += ["", f"{'metric':<10}  {'compared':>8}  {'max abs':>9}  {'mean abs':>9}  {'max rel':>9}  {'mean rel':>9}  "
                  f"{'outside':>7}  first outside"]
    for metric, diff in comparison.diffs.items():
        s = diff.summary()
        checked = "" if metric in comparison.checked else "  (reported, not checked)"
        lines.append(f"{metric:<10}  {s['iterations']:>8}  {_sci(s['max_abs']):>9}  {_sci(s['mean_abs']):>9}  "
                     f"{_sci(s['max_rel']):>9}  {_sci(s['mean_rel']):>9}  {s['outside']:>7}  "
                     f"{'-' if s['first_outside'] is None else s['first_outside']}{checked}")
    skipped = {label: [it for it, row in run.values.items() if row.get("skipped")] for label, run in (("A", a), ("B", b))}
    if any(skipped.values()):
        lines.append(f"iterations reporting skipped steps: A {_span(set(skipped['A']))}, B {_span(set(skipped['B']))}")
    lines += [f"note: {note}" for note in comparison.notes]
    return lines


def _int(value: float | None) -> str:
    return "-" if value is None else str(int(value))


def _sci(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2e}"
