"""The projection document of a finished run (`python -m harness project`, harness/projection.py): each backend and
strategy's measured pieces through the model of harness/reporting/scaling.py, checked against the run's own
measurements and a published table, as projection.md's lines and projection.png."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from common import architectures, manifest
from common.files import write_atomic
from common.results import Result
from harness.reporting import scaling
from harness.reporting.plots import pyplot
from harness.reporting.published import NVIDIA_RESNET50_SOURCE, RESNET50_8GPU, RESNET50_BATCH
from harness.reporting.tables import baseline, fmt, table
from harness.reporting.trials import group

OVERLAP_NOTE = (
    "Overlap: the share of the allreduce hidden behind the backward pass, 1 - (step_k - step_1) / "
    "allreduce_k at the largest device count k on real devices. Simulated devices share the cores that "
    "would overlap, so none is counted there. Measured link: the bandwidth the run's allreduce figure "
    "shows (latency folded in); on simulated devices, of the one memory bus they share. A sharded strategy "
    "moves more than one allreduce a step where it gathers the weights twice (FSDP's ZeRO-3: two all-gathers and "
    "a reduce-scatter, x 1.5), as its backend.toml declares."
)


# ------------------------------------------------------------------------------ the pieces of a run


def usable(r: Result) -> bool:
    """A finished run with the figures the model reads: a median step and the allreduce figure's bytes."""
    return bool(
        r.ok
        and r.step_time
        and r.step_time.median_s
        and r.step_time.median_s > 0
        and r.allreduce
        and r.allreduce.bytes
        and r.allreduce.bytes > 0
        and r.allreduce.median_s is not None
        and r.allreduce.median_s >= 0
    )


def run_pieces(results: list[Result]) -> list[tuple[scaling.Pieces, bool]]:
    """(pieces, shared host) per backend, strategy, model and per-device batch; runs across nodes apart (each
    node count its own process group), a configuration's kept trials (harness/reporting/trials.py) by their median."""
    groups: dict[tuple, dict[tuple, list[Result]]] = {}
    for t in group(results):
        runs = [r for r in t.kept if usable(r)]
        if runs:
            c = runs[0].config
            name = (
                *baseline(runs[0]),
                c.model,
                c.per_device_batch,
                c.image_side,
                c.nodes.count > 1,
            )
            groups.setdefault(name, {}).setdefault((c.devices, c.nodes.count), []).extend(runs)
    out = []
    for (backend, variant, model, batch, _, across), configs in groups.items():
        measured = [
            scaling.Measured(
                devices,
                nodes,
                statistics.median(r.step_time.median_s for r in runs),
                statistics.median(r.allreduce.median_s for r in runs),
            )
            for (devices, nodes), runs in configs.items()
        ]
        first = next(iter(configs.values()))[0]
        label = (
            f"{backend} {variant}"
            + (" across nodes" if across else "")
            + (f" ({model})" * (model != "resnet18"))
        )
        shared = first.config.simulated
        volume = communication_volume(first)
        piece = scaling.pieces(label, batch, first.allreduce.bytes, measured, shared, volume)
        out.append((piece, shared))
    return sorted(out, key=lambda item: item[0].name)


def communication_volume(r: Result) -> float:
    """A run's step communication in allreduces of its gradients, as its backend.toml declares it (1 where the
    backend is unknown here)."""
    c = r.config
    if c.backend not in manifest.known():
        return 1.0
    return manifest.load(c.backend).volume(c.strategy, c.options or {})


# ------------------------------------------------------------------------------ the tables


def pieces_table(items) -> list[str]:
    body = [
        [
            p.name,
            str(p.per_device_batch),
            fmt(p.compute_s * 1e3, ".0f"),
            fmt(p.nbytes / 1e6, ".1f") + (f" (x {p.volume:g} a step)" if p.volume != 1 else ""),
            f"{p.overlap:.0%} ({p.overlap_note})" if not shared else "0 (simulated)",
            f"{p.host_link.gb_per_s:.3g} GB/s at {p.fitted_at}" if p.host_link else "—",
        ]
        for p, shared in items
    ]
    return table(
        [
            "backend and strategy",
            "batch / device",
            "compute ms (1 device)",
            "gradients MB",
            "overlap",
            "measured link",
        ],
        body,
    ) + ["", OVERLAP_NOTE]


def check_rows(items) -> list[tuple[str, scaling.Measured, scaling.Point, bool]]:
    """(name, measured, projected at its devices, is the fit point) for every run on several devices."""
    rows = []
    for p, shared in items:
        profile = scaling.host_profile(p, shared)
        for m in p.measured:
            if profile and m.devices > 1:
                rows.append(
                    (
                        p.name,
                        m,
                        scaling.project(p, profile, [m.devices])[0],
                        m.devices == p.fitted_at,
                    )
                )
    return rows


def error(projected: float, measured: float) -> float:
    return projected / measured - 1


def check_table(rows) -> list[str]:
    body = [
        [
            name,
            str(m.devices) + (f" ({m.nodes} nodes)" if m.nodes > 1 else ""),
            fmt(m.step_s * 1e3, ".0f"),
            fmt(q.step_s * 1e3, ".0f"),
            "fit" if fit else f"{error(q.step_s, m.step_s):+.0%}",
            fmt((m.allreduce_s or 0) * 1e3, ".1f"),
            fmt(q.allreduce_s * 1e3, ".1f"),
        ]
        for name, m, q, fit in rows
    ]
    return table(
        [
            "backend and strategy",
            "devices",
            "measured step ms",
            "projected step ms",
            "error",
            "measured allreduce ms",
            "projected allreduce ms",
        ],
        body,
    )


def projection_table(items, profile: scaling.Profile, counts: list[int]) -> list[str]:
    body = []
    for p, _ in items:
        points = scaling.project(p, profile, counts)
        body.append(
            [p.name]
            + [f"{q.efficiency:.0%}" for q in points]
            + [fmt(points[-1].images_per_s, ",.0f"), fmt(points[-1].allreduce_s * 1e3, ".1f")]
        )
    return table(
        ["backend and strategy"]
        + [f"N={n}" for n in counts]
        + [f"images/s at {counts[-1]}", f"allreduce ms at {counts[-1]}"],
        body,
    )


def published_rows() -> list[dict]:
    """NVIDIA's 8-GPU ResNet-50 figures against the model's projection from their own 1-GPU figure, at the
    profile's bandwidth and at a tenth of it (how much the link matters)."""
    nbytes = 4 * architectures.trainable_count("resnet50")
    rows = []
    for s in RESNET50_8GPU:
        profile = scaling.PROFILES[s.profile]
        slow = replace(
            profile, inside=replace(profile.inside, gb_per_s=profile.inside.gb_per_s / 10)
        )
        p = scaling.Pieces(
            s.system, RESNET50_BATCH, nbytes, RESNET50_BATCH / s.one_gpu, 0.0, "", ()
        )
        at = {
            name: scaling.project(p, prof, [1, s.gpus])[-1]
            for name, prof in (("full", profile), ("tenth", slow))
        }
        rows.append(
            {
                "scaling": s,
                "projected": at["full"].efficiency,
                "tenth": at["tenth"].efficiency,
                "allreduce_ms": at["full"].allreduce_s * 1e3,
                "step_ms": at["full"].step_s * 1e3,
            }
        )
    return rows


def published_table() -> list[str]:
    body = [
        [
            r["scaling"].system,
            r["scaling"].precision,
            f"{r['scaling'].one_gpu:,.0f}",
            f"{r['scaling'].many_gpus:,.0f}",
            f"{r['scaling'].efficiency:.1%}",
            f"{r['projected']:.1%}",
            f"{100 * (r['projected'] - r['scaling'].efficiency):+.1f}",
            f"{r['tenth']:.1%}",
            f"{r['allreduce_ms']:.2f} / {r['step_ms']:.0f}",
        ]
        for r in published_rows()
    ]
    return table(
        [
            "system",
            "precision",
            "1 GPU images/s",
            "8 GPUs images/s",
            "published efficiency",
            "projected",
            "points",
            "at 1/10 the link",
            "allreduce / step ms",
        ],
        body,
    )


# ------------------------------------------------------------------------------ the document and the plot


# Energy scales with the time a device works and the power it draws doing it; the model projects the first, and
# a device's draw at another count (less busy while it waits on the ring) is measured by no run here.
ENERGY_NOT_PROJECTED = (
    "Energy: not projected. The model projects a step's time; what a device draws while it waits on the "
    "allreduce at another device count is not measured by this run (its report's Energy section holds what was)."
)


def render(
    meta: dict,
    items,
    profiles: list[scaling.Profile],
    counts: list[int],
    faster: float,
    plotted: bool,
    joined: list[dict] = (),
) -> list[str]:
    """projection.md's lines; `joined`: the metas of the reports whose runs joined this one's (--with)."""
    L = [
        f"# Scaling projection for `{meta['run_id']}`",
        "",
        "**A projection, not a measurement.** Each backend and strategy's measured pieces (one device's step, "
        "the gradient bytes, the allreduce figure and the overlap where real devices let it be measured) go "
        "through the model step(N) = compute + (1 - overlap) x allreduce(N), with a ring allreduce "
        "2(N-1)/N x bytes / bandwidth + 2(N-1) x latency inside a host and a hierarchical one across hosts "
        '(docs/scaling.md, "Scaling on paper"). Weak scaling: every device keeps the run\'s per-device batch.',
        "",
        f"- Run: `{meta.get('command', '')}` ({meta.get('preset', '')})",
        *(
            f"- With the runs of `{other.get('run_id', '')}`: `{other.get('command', '')}`"
            for other in joined
        ),
        f"- {ENERGY_NOT_PROJECTED}",
        "",
        "## The measured pieces",
        "",
    ]
    L += pieces_table(items) + [""]
    rows = check_rows(items)
    if rows:
        worst = max(
            (abs(error(q.step_s, m.step_s)) for _, m, q, fit in rows if not fit), default=None
        )
        L += [
            "## The model against this run's measurements",
            "",
            'The measured profile is fitted at one device count ("fit"); every other row is a prediction. '
            "Simulated devices share one host: the model charges N replicas' compute one after another and "
            "the ring's links as one memory bus.",
            "",
        ]
        L += check_table(rows) + [""]
        if worst is not None:
            L += [f"Largest error of a prediction: {worst:.0%}.", ""]
    compute = (
        "this run's one-device step"
        if faster == 1
        else f"this run's one-device step / {faster:g} (--faster: devices {faster:g} times faster than the run's)"
    )
    for profile in profiles:
        L += [
            f"## Projected on {profile.name}",
            "",
            f"{profile.summary}. Source: {profile.source}.",
            "",
            f"Compute: {compute}. Scaling efficiency (images/s per device against one device):",
            "",
        ]
        L += projection_table(faster_devices(items, faster), profile, counts) + [""]
    L += [
        "## The model against a published table",
        "",
        f"ResNet-50 v1.5 on 8 GPUs, {NVIDIA_RESNET50_SOURCE}: the published 8-GPU efficiency, and the "
        "model's from the published 1-GPU throughput, 25.6 M float32 gradients and the system's NVLink, "
        "no overlap counted.",
        "",
    ]
    L += published_table() + [""]
    if plotted:
        L += ["![Projected scaling efficiency](projection.png)", ""]
    return L


def host_series(
    p: scaling.Pieces, shared: bool
) -> tuple[list[int], list[float], list[float]] | None:
    """The run's own device counts, its measured and projected efficiency at each (per-device images/s against
    its run on the fewest devices): the model's line and the measured points of the plot's first panel."""
    profile = scaling.host_profile(p, shared)
    if profile is None:
        return None
    ref = p.measured[0]
    counts = [m.devices for m in p.measured]
    projected = [
        ref.step_s if m is ref else scaling.project(p, profile, [m.devices])[0].step_s
        for m in p.measured
    ]
    return counts, [ref.step_s / m.step_s for m in p.measured], [ref.step_s / s for s in projected]


def faster_devices(items, faster: float):
    """The pieces with devices that compute `faster` times faster (the declared profiles' devices)."""
    return [(replace(p, compute_s=p.compute_s / faster), shared) for p, shared in items]


def plot(
    items, profiles: list[scaling.Profile], counts: list[int], faster: float, path: Path
) -> bool:
    plt = pyplot()
    fig, axes = plt.subplots(
        1, 1 + len(profiles), figsize=(4.6 * (1 + len(profiles)), 4.2), squeeze=False
    )
    host, panels = axes[0][0], axes[0][1:]
    for p, shared in items:
        series = host_series(p, shared)
        if series:
            (line,) = host.plot(series[0], series[2], linestyle="--", label=p.name)
            host.plot(series[0], series[1], "o", color=line.get_color())
    host.set_title("this run's host: model (dashed) vs measured (dots)", fontsize=9)
    host.set_ylabel("scaling efficiency")
    for ax, profile in zip(panels, profiles):
        for p, _ in faster_devices(items, faster):
            points = scaling.project(p, profile, counts)
            ax.plot(
                [q.devices for q in points],
                [q.efficiency for q in points],
                marker=".",
                label=p.name,
            )
        ax.set_title(
            f"projected on {profile.name}"
            + (f" (devices x{faster:g} faster)" if faster != 1 else ""),
            fontsize=9,
        )
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("devices")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110), mode="wb")
    plt.close(fig)
    return True
