"""`mmrun compare --plot PNG`: the runs' curves over each other and their difference to the baseline."""
from __future__ import annotations

import io
import math

from mmrun.common.atomic_write import atomic_write
from mmrun.precision.log_compare import Comparison


class PlotUnavailable(RuntimeError):
    """matplotlib is missing: the `plot` extra."""


def plot_comparisons(comparisons: list[Comparison], path: str, metric: str = "lm loss") -> None:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'mmrun[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.5]})
    base = comparisons[0].baseline.series(metric)
    top.plot(sorted(base), [base[i] for i in sorted(base)], "o-", label=f"A {comparisons[0].baseline.path}",
             linewidth=2, markersize=3)
    tolerance_drawn = False
    for index, comp in enumerate(comparisons):
        label = chr(ord("B") + index)
        series = comp.test.series(metric)
        top.plot(sorted(series), [series[i] for i in sorted(series)], "x--", label=f"{label} {comp.test.path}",
                 linewidth=1.2, markersize=5)
        diff = comp.diffs.get(metric)
        if diff is None:
            continue
        values = [max(d, 1e-12) if math.isfinite(d) else float("nan") for d in diff.abs_diffs()]
        bottom.semilogy(diff.iterations, values, "s-", markersize=3, label=f"|{label} - A|")
        if not tolerance_drawn:
            bound = [diff.atol + diff.rtol * abs(x) for x in diff.baseline]
            bottom.semilogy(diff.iterations, [max(v, 1e-12) for v in bound], ":", color="gray",
                            label=f"tolerance (rtol {diff.rtol:g}, atol {diff.atol:g})")
            tolerance_drawn = True
        first = diff.summary()["first_outside"]
        if first is not None:
            top.axvline(first, color="tab:red", alpha=0.4, linestyle="--")
    top.set_ylabel(metric)
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    bottom.set_xlabel("iteration")
    bottom.set_ylabel("|difference|")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.legend(fontsize=7, loc="best")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buffer.getvalue())
