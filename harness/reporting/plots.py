"""The report's figures: test accuracy per epoch, throughput against the device count (matplotlib, Agg)."""

from __future__ import annotations

import itertools
from pathlib import Path

from common.profiling import CATEGORIES
from harness.reporting.tables import Row, key


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(rows: list[Row], path: Path) -> bool:
    ok = [row.result for row in rows if row.result.ok and row.result.epochs]
    if not ok:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = ["-", "--", ":", "-."]
    strategies = sorted({key(r)[:2] for r in ok})
    markers = "osD^v<>"
    counts = sorted({r.config.devices for r in ok})
    for r in ok:
        epochs = [e.epoch for e in r.epochs]
        # line style per backend/strategy, marker per device count: runs that agree exactly stay visible
        ax.plot(
            epochs,
            [e.test_acc for e in r.epochs],
            linestyle=styles[strategies.index(key(r)[:2]) % 4],
            marker=markers[counts.index(r.config.devices) % len(markers)],
            markerfacecolor="none",
            label=" ".join(map(str, key(r)[:3]))
            + " dev"
            + (f" on {r.config.nodes.count} nodes" * (r.config.nodes.count > 1)),
        )
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title("Test accuracy per epoch")
    ax.grid(alpha=0.3)
    ax.set_xticks(sorted({e.epoch for r in ok for e in r.epochs}))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_time_to_accuracy(rows: list[Row], path: Path) -> bool:
    """--target-accuracy: every run's test accuracy against its timed training seconds, on the same axes, with
    the target as a line (drawn only where a run had a target)."""
    ok = [row.result for row in rows if row.result.ok and row.result.epochs]
    targets = sorted({r.target["accuracy"] for r in ok if r.target})
    if not targets:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in ok:
        seconds = list(itertools.accumulate(e.time_s for e in r.epochs))
        ax.plot(
            seconds,
            [e.test_acc for e in r.epochs],
            marker="o",
            markerfacecolor="none",
            label=" ".join(map(str, key(r)[:3])) + " dev",
        )
    for target in targets:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("timed training seconds (evaluation excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Time to accuracy (target {', '.join(f'{t:g}' for t in targets)})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_energy(rows: list[Row], path: Path) -> bool:
    """Every run that measured its energy: its test accuracy after each epoch against the joules of its timed epochs
    so far, beside the time-to-accuracy plot (drawn only where a run measured energy)."""
    ok = [
        row.result
        for row in rows
        if row.result.ok and row.result.energy and row.result.energy.get("measured")
    ]
    if not ok:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in ok:
        ax.plot(
            list(itertools.accumulate(r.energy["epochs_j"])),
            [e.test_acc for e in r.epochs],
            marker="o",
            markerfacecolor="none",
            label=" ".join(map(str, key(r)[:3])) + " dev",
        )
    ax.set_xlabel(f"joules of the timed epochs ({ok[0].energy['scope']})")
    ax.set_ylabel("test accuracy")
    ax.set_title("Accuracy against energy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_throughput(rows: list[Row], path: Path) -> bool:
    series: dict[tuple, list] = {}
    for row in rows:
        if row.result.ok and row.images_per_s:  # (evaluation-only runs have none)
            # one line per backend/strategy and node count (processes across nodes scale differently)
            c = row.result.config
            name = key(row.result)[:2] + ((f"{c.nodes.count} nodes",) if c.nodes.count > 1 else ())
            series.setdefault(name, []).append((c.devices, row.images_per_s))
    if not any(len(points) > 1 for points in series.values()):
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    counts = sorted({p[0] for points in series.values() for p in points})
    for name, points in sorted(series.items()):
        points.sort()
        (line,) = ax.plot(
            [p[0] for p in points], [p[1] for p in points], marker="o", label=" ".join(name)
        )
        if points[0][0] == 1:  # linear scaling from the 1-device run, for reference
            ax.plot(
                counts,
                [points[0][1] * n for n in counts],
                linestyle=":",
                color=line.get_color(),
                alpha=0.5,
            )
    ax.set_ylim(bottom=0)
    ax.set_xticks(counts)
    ax.set_xlabel("devices")
    ax.set_ylabel("images / s")
    ax.set_title("Training throughput vs devices (dotted: linear scaling)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_parity(rows: list[dict], limit: float, path: Path) -> bool:
    """Each strategy's step over its idiom's, with its 95% interval, beside 1 (parity) and the limit."""
    measured = [r for r in rows if "ratio" in r]
    if not measured:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(measured)))
    names = [f"{r['backend']} {r['strategy']} / {r['idiom']}" for r in measured]
    ratios = [r["ratio"] for r in measured]
    below = [r["ratio"] - r["interval"][0] for r in measured]
    above = [r["interval"][1] - r["ratio"] for r in measured]
    ax.errorbar(ratios, range(len(measured)), xerr=[below, above], fmt="o", capsize=4)
    ax.axvline(1.0, color="grey", linewidth=1)
    ax.axvline(limit, color="tab:red", linestyle="--", linewidth=1, label=f"limit {limit:.2f}")
    ax.set_yticks(range(len(measured)), names)
    ax.invert_yaxis()
    ax.set_xlabel("strategy step / idiom step, with its 95% interval")
    ax.set_title("Speed parity on one device")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_breakdown(rows: list[Row], path: Path) -> bool:
    """Each profiled run's step as a bar of its categories (milliseconds), on one axis: the --profile breakdown."""
    profiled = [row for row in rows if row.result.ok and row.profile and row.profile.get("seconds")]
    if not profiled:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.45 * len(profiled)))
    names = [" ".join(map(str, key(row.result)[:3])) + " dev" for row in profiled]
    left = [0.0] * len(profiled)
    for category, label in CATEGORIES.items():
        widths = [1e3 * (row.profile_seconds.get(category) or 0.0) for row in profiled]
        if any(widths):
            ax.barh(range(len(profiled)), widths, left=left, label=label)
            left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(profiled)), names)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per profiled step (on a GPU: per timed step)")
    ax.set_title("Where a step's time goes")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
