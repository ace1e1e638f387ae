"""The charts of the plays that draw one (not a play): bench.py's ``fleet.png`` and tune.py's plot of
each sweep, total tok/s against concurrency, one line per series. matplotlib (requirements-dev.txt)
is imported when a chart is drawn, and only here: rigup/ is the roles' library and never imports
it. The plays hand :func:`plot` to their engines (plays/bench.py ``record``, plays/tuning.py
``record``), which leave a chart out, saying so, where matplotlib is missing (ImportError)."""

from __future__ import annotations

from pathlib import Path

# The plot's line colours, in the order of its series (matplotlib's tab10): a test finds each line by it.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
PLOT_SIZE_IN, PLOT_DPI = (10, 6), 100


def series(results: dict[str, dict]) -> list[tuple[str, list[int], list[float]]]:
    """The plot's lines: (``host/instance``, concurrency levels, total tok/s), by host then instance."""
    return [(f"{host}/{name}", [lv["concurrency"] for lv in inst["levels"]], [lv["total_tps"] for lv in inst["levels"]])
            for host, result in sorted(results.items()) for name, inst in sorted(result["instances"].items())
            if inst.get("levels")]


def plot(results: dict[str, dict], path: Path, title: str = "rigup bench: throughput per host and instance") -> None:
    """``fleet.png``: total tok/s against concurrency, one line per host and instance."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=PLOT_SIZE_IN, dpi=PLOT_DPI)
    for (label, levels, tps), color in zip(series(results), COLORS * 10):
        ax.plot(levels, tps, marker="o", linewidth=2.5, color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({n for _, levels, _ in series(results) for n in levels}))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("total tokens/s (generation)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    pyplot.close(fig)
