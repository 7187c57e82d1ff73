"""The report's prose sections: how batches reach the devices, precision, devices, hashes, equivalence, environment."""

from __future__ import annotations

import statistics
from pathlib import Path

from common import caches, manifest
from common import levers as leverlib
from common.config import RunConfig
from common.results import Result
from harness.reporting.tables import devices_cell, fmt, key, milliseconds, table

# What a GPU run's speed depends on beyond the framework (recorded by the workers that have them).
GPU_SETTINGS = (
    ("input_copies", "input copies"),
    ("sgd_update", "SGD update"),
    ("compile", "compile"),
)


def input_line(cfg: RunConfig | None) -> str:
    """How batches reach the devices: assembled before each epoch's timer, copied inside it."""
    line = (
        "Input: each epoch's batches are assembled (one gather of its permutation) before its timer "
        "starts; "
    )
    if cfg and cfg.levers.resident_data:
        return (
            line
            + "with --resident-data they are also copied to the devices before it (no copy is timed)."
        )
    prefetch = cfg.levers.prefetch if cfg else 0
    if not prefetch:
        return (
            line
            + "each step copies its own batch to the devices (--prefetch 0), inside the epoch time."
        )
    return line + (
        f"each batch is put on the devices {prefetch} batches ahead of its step (on GPUs asynchronous copies "
        "from page-locked host memory, pinned before the timer where the framework copies from it), so the "
        "copies, inside the epoch time, overlap compute."
    )


def precision_line(cfg: RunConfig | None) -> str:
    levers = cfg.levers.on if cfg else []
    text = {
        "fp32": "fp32 everywhere, TF32 disabled explicitly",
        "tf32": "TF32 matmuls and convolutions",
        "bf16": "bfloat16 compute (autocast / flax dtype), float32 weights, gradients and SGD",
    }
    line = f"Precision: {text[cfg.levers.precision if cfg else 'fp32']}."
    others = [lever for lever in levers if lever not in text]
    switches = [
        leverlib.flag_words(name, True) for name, plain in leverlib.PLAIN.items() if plain is False
    ]
    return line + (
        f" Speed levers: {', '.join(others)} (see each backend's backend.toml for what they do)."
        if others
        else f" No other speed lever ({', '.join(switches)})."
    )


def devices_line(meta: dict) -> str:
    """What ran and how the devices were found (results saved before `detection` existed lack it)."""
    how = meta.get("detection")
    if meta.get("device_kind") == "cpu":
        return (
            f"- Devices: **simulated** ({how or 'no GPU was present'}): each device is a replica on the host "
            "CPU, so the figures measure the software path, not GPU scaling"
        )
    gpus = meta.get("gpus", [])
    return f"- Devices: {len(gpus)} GPU(s): {', '.join(gpus)}" + (f", {how}" if how else "")


def feeding_section(rows: list) -> list[str]:
    """What feeding cost the host in each run: its batches' path to the devices, the seconds before each epoch's
    timer (the gather, and the pinning or staging) and inside it (putting each batch ahead of its step), so that a
    slow input path shows as a figure."""
    body = []
    for row in rows:
        r, c = row.result, row.result.config
        fed = [e for e in r.epochs if e.prepare_s is not None and e.feed_s is not None]
        if not r.ok or not fed:
            continue
        prepare = statistics.mean(e.prepare_s for e in fed)
        feed = statistics.mean(e.feed_s for e in fed)
        epoch = statistics.mean(e.time_s for e in fed)
        body.append(
            [
                c.backend,
                c.variant,
                devices_cell(c),
                fmt(prepare, ".2f"),
                milliseconds(feed / fed[0].steps),
                fmt(feed / epoch, ".1%"),
                setting((r.environment or {}).get("input_copies") or "—"),
            ]
        )
    if not body:
        return []
    header = [
        "backend",
        "strategy",
        "devices",
        "before the timer, s/epoch",
        "put, ms/step",
        "put / epoch",
        "input path",
    ]
    return [
        "## Feeding",
        "",
        *table(header, body),
        "",
        "The host's seconds spent feeding, per epoch (the mean over the epochs). Before the timer, not timed: the "
        "epoch's gather (one numpy copy of its shuffled images) and, where the framework copies from page-locked "
        "memory, the batches pinned into it (as DataLoader's pin_memory thread does off the loop's path), or with "
        "--resident-data copied to the devices. Inside the timer: the host's time in putting each batch on the "
        "devices ahead of its step (the copies' launch; on a GPU they run on a copy stream beside the steps). "
        "Put / epoch is its share of the epoch's time: the part of the epoch the host spends on input, not steps.",
        "",
    ]


def memory_section(rows: list) -> list[str]:
    """What one device holds, where a run sharded its parameters or measured its device's peak: its parameters
    and their gradients (each device ends the exchange with its gradients laid out as its parameters: whole when
    replicated, its shard when sharded), and the rest of the peak beside them."""
    runs = [row.result for row in rows if row.result.ok and row.result.memory]
    if not any(
        r.memory.parameters_mb is not None or r.memory.peak_device_mb is not None for r in runs
    ):
        return []
    body = []
    for r in runs:
        held = held_parameters_mb(r)
        peak = r.memory.peak_device_mb
        body.append(
            [
                r.config.backend,
                r.config.variant,
                devices_cell(r.config),
                fmt(held, ".1f"),
                fmt(held, ".1f"),
                fmt(peak, ".0f"),
                fmt(peak - 2 * held if peak is not None and held is not None else None, ".0f"),
            ]
        )
    header = [
        "backend",
        "strategy",
        "devices",
        "parameters, MiB",
        "gradients, MiB",
        "peak, MiB",
        "the rest of the peak, MiB",
    ]
    return [
        "## Memory a device holds",
        "",
        *table(header, body),
        "",
        "Per device. Parameters: a sharded strategy's shards as it measured them, else the whole model in "
        "float32 (the parameters stay float32 at every precision). Gradients: as the parameters, since each "
        "device ends the exchange holding the gradients of the parameters it keeps (a reduce-scatter leaves "
        "its shard). Peak: the framework's own count of the device's largest allocation, on a GPU. The rest: "
        "the peak less the parameters and gradients: the activations kept for the backward pass, the weights a "
        "sharded strategy gathers for a block, the exchange's buffers and the batch.",
        "",
    ]


def held_parameters_mb(r: Result) -> float | None:
    """The MiB of parameters one device of the run holds: its measured shards, else the whole model in float32."""
    if r.memory and r.memory.parameters_mb is not None:
        return r.memory.parameters_mb
    return 4 * r.params / 2**20 if r.params else None


def rounding_section(rows: list) -> list[str]:
    """What a compressed gradient exchange (--grad-dtype bf16) changed in the math, as each such run measured it
    (common/after_training.py exchange_rounding): a lossy lever is a figure, not a footnote."""
    measured = [row.result for row in rows if row.result.ok and row.result.rounding]
    if not measured:
        return []
    steps = max(len(r.rounding["steps"]) for r in measured)
    body = [
        [
            r.config.backend,
            r.config.variant,
            devices_cell(r.config),
            setting(r.rounding["against"]),
            *(fmt(d, ".2e") for d in r.rounding["steps"]),
            *["—"] * (steps - len(r.rounding["steps"])),
        ]
        for r in measured
    ]
    after = [f"after step {i + 1}" for i in range(steps)]
    return [
        "## Compressed gradients",
        "",
        *table(["backend", "strategy", "devices", "against", *after], body),
        "",
        "A compressed exchange changes the math, so each such run measured by how much: after everything timed, "
        "its trainer and one exchanging float32 gradients took the run's first steps side by side from its initial "
        "weights. Each figure is the L2 distance between their parameters over the distance the float32 exchange "
        "moved them (BatchNorm's running statistics left out): after step 1, one step's rounding; after the "
        "others, how it adds up. bfloat16 keeps 8 significant bits, so each rounding of a gradient is within "
        "2^-8 (0.4%) of it. Both trainers compute in float32 alike, so the first figure is the exchange's alone; "
        "the later ones are also the training's sensitivity, which amplifies any rounding, float32's own "
        "included (ResNet-18 from d2l's N(0, 0.01) weights: its float32 step is 3.5e-3 from its float64 step "
        "after one step and 0.3 after three; docs/sharded.md).",
        "",
    ]


def nodes_section(rows: list, topology: str) -> list[str]:
    """The runs on several nodes: how they were spread, over what, and what it cost."""
    several = [row for row in rows if row.result.ok and row.result.config.nodes.count > 1]
    if not several:
        return []
    lines = ["## Several nodes", "", f"{topology}." if topology else "", ""]
    body = []
    for row in several:
        r, c = row.result, row.result.config
        env, ar = r.environment or {}, r.allreduce
        strategy = (
            manifest.load(c.backend).strategies.get(c.strategy)
            if manifest.canonical_name(c.backend)
            else None
        )
        body.append(
            [
                c.backend,
                c.variant,
                hosts_cell(c),
                str(env.get("processes", "—")),
                str(c.local_devices),
                str(env.get("collective") or "—"),
                (strategy and strategy.engine or "—").split(" (")[0],
                milliseconds(ar and ar.median_s),
                fmt(row.sec_per_epoch, ".2f"),
                fmt(row.efficiency, ".0%"),
            ]
        )
    lines += table(
        [
            "backend",
            "strategy",
            "hosts",
            "processes (all roles)",
            "devices per host",
            "transport",
            "engine",
            "cross-process allreduce ms",
            "s/epoch (slowest rank)",
            "efficiency vs 1 device",
        ],
        body,
    )
    loopback = any(row.result.config.nodes.loopback for row in several)
    lines += [
        "",
        "Every node runs the same config with its own rank and feeds its own shard of each global batch "
        "(the same batches as one process: see the hashes); epoch and step times are the slowest rank's, "
        "losses and accuracy are summed over every rank."
        + (
            " **Loopback nodes** are process groups on one host joined over 127.0.0.1: they prove the engines "
            "and the math across processes, but share the host's cores and memory bus, so their speed says "
            "nothing about a network between hosts."
            if loopback
            else ""
        ),
    ]
    return lines


def hosts_cell(c) -> str:
    """The node count, and where this report's host (node 0) bound its engines: "2 (node 0: 10.0.0.1 on eth0)"."""
    if c.nodes.loopback:
        return f"{c.nodes.count} (loopback)"
    return f"{c.nodes.count} (node 0: {c.nodes.local_addr or '?'} on {c.nodes.interface or 'no interface found'})"


def setting(value) -> str:
    return (
        ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)
    )


def environment_section(results: list[Result]) -> list[str]:
    """Host once, then one line per backend/strategy from its largest run."""
    largest: dict[tuple, Result] = {}
    for r in results:
        seen = largest.get(key(r)[:2])
        if r.environment and (seen is None or r.config.devices >= seen.config.devices):
            largest[key(r)[:2]] = r
    if not largest:
        return ["No run reported its environment."]
    first = next(iter(largest.values())).environment
    lines = [
        f"- **Host**: {first.get('cpu')} ({first.get('cpus')} usable cores), {first.get('platform')}"
    ]
    lines += compile_cache_lines(results)
    for (backend, strategy), r in sorted(largest.items()):
        env = r.environment
        precision = ", ".join(f"{k}={v}" for k, v in (env.get("precision") or {}).items())
        devices = ", ".join(env.get("devices") or []) or "none the framework sees"
        lines.append(
            f"- **{backend} {strategy}** ({r.config.devices} devices: {devices}): "
            f"{env.get('framework')} {env.get('framework_version')} (CUDA {env.get('cuda') or '—'}, "
            f"cuDNN {env.get('cudnn') or '—'}), Python {env.get('python')}, numpy {env.get('numpy')}; "
            f"{env.get('processes')} process(es) x {env.get('threads_per_process')} CPU thread(s); "
            f"precision: {precision}; collective: {env.get('collective')}"
            + "".join(
                f"; {label}: {setting(env[name])}" for name, label in GPU_SETTINGS if env.get(name)
            )
        )
        if r.config.device_kind == "cpu" and env.get("framework_gpus"):
            lines.append(
                f"  - **{env.get('framework')} itself sees {env['framework_gpus']} GPU(s), yet this run used "
                f"simulated CPU devices**: the harness found no GPU (see Devices above, or pass --device gpu)"
            )
    return lines


def compile_cache_lines(results: list[Result]) -> list[str]:
    """How the runs' compile caches started (common/caches.py): cold, or shared, and the runs that found files
    already there; nothing for results that predate the record."""
    records = [(r, r.environment.get("compile_cache")) for r in results if r.environment]
    records = [(r, c) for r, c in records if isinstance(c, dict)]
    if not records:
        return []
    modes = {c.get("mode") for _, c in records}
    warm = [r for r, c in records if c.get("files_at_start")]
    if modes == {"cold"}:
        kept = ", ".join(f"{cache.display}'s" for cache in caches.unasked())
        unkept = " and ".join(c.display for c in caches.all_caches() if not c.unasked)
        line = (
            f"cold: every run (each trial, each node) compiled from nothing, its caches ({kept}) in a fresh "
            f"folder of its own; {unkept} kept none"
        )
    elif modes == {"shared"}:
        # every cache's folder is a subfolder of the shared one's machine folder
        folder = next(iter(next(iter(records))[1].get("folders", {}).values()), "")
        line = (
            f"shared (--compile-cache {str(Path(folder).parent)}): each run's warm-up could reuse what "
            f"earlier runs compiled; {len(warm)} of {len(records)} runs found a cache there already"
        )
    else:
        line = "not set by the harness for every run (workers started by hand?)"
    lines = [f"- **Compile caches**: {line}"]
    if modes == {"cold"} and warm:  # a cold folder must be empty: say so if one was not
        lines.append(f"  - **{len(warm)} run(s) found files in their cold folder**")
    return lines


def hashes_section(results: list[Result]) -> list[str]:
    ok = [r for r in results if r.ok]
    weights = {r.weights_hash for r in ok if r.weights_hash}
    # (evaluation-only runs train on nothing; a time-to-accuracy trial's own batch order is said apart)
    data = {r.data_hash for r in ok if r.data_hash and r.config.order_seed is None}
    orders = sorted({r.config.order_seed for r in ok if r.config.order_seed is not None})
    lines = []
    if weights:
        lines.append(
            "- Initial weights (canonical): "
            + (
                f"`{next(iter(weights))[:16]}` for every run"
                if len(weights) == 1
                else "**differ between runs**: " + ", ".join(f"`{str(w)[:16]}`" for w in weights)
            )
        )
    if data:
        lines.append(
            "- Training batch sequence: "
            + (
                f"`{next(iter(data))[:16]}` for every run"
                if len(data) == 1
                else "differs between runs (different device counts drop a different partial batch "
                "or use a different global batch): "
                + ", ".join(sorted(f"`{str(d)[:16]}`" for d in data))
            )
            + (
                f"; the time-to-accuracy trials after the first train on orders of their own (order seeds "
                f"{', '.join(map(str, orders))})"
                if orders
                else ""
            )
        )
    return lines + saved_weights_lines(ok)


def saved_weights_lines(ok: list[Result]) -> list[str]:
    """--save-weights: where each run's trained weights went, or why they did not (the run's figures stand)."""
    lines = []
    for r in ok:
        saved = r.saved_weights
        if saved is None:
            continue
        c, why = r.config, saved.extra.get("error")
        run = f"{c.backend} {c.variant} x{c.devices}"
        lines.append(
            f"- Trained weights of {run} **not saved** to `{saved.path}`: {why} (the run's figures stand)"
            if why
            else f"- Trained weights of {run} saved to `{saved.path}` (`{str(saved.sha256)[:16]}`)"
        )
    return lines


def equivalence_section(eq: dict | None) -> list[str]:
    """The check's table: the same weights and batches through every backend, compared with torch."""
    if not eq:
        return [
            "## Equivalence",
            "",
            "Not checked in this run (`--no-check`; run `python -m harness check`).",
        ]
    if eq.get("interrupted"):
        return [
            "## Equivalence",
            "",
            "Interrupted before the check finished (run `python -m harness check`).",
        ]
    lines = [
        "## Equivalence",
        "",
        f"Every backend and strategy of this report, from the same canonical weights and batches "
        f"({eq['setup']}), compared with torch (`python -m harness check` runs the full version). "
        "Tolerances: forward max |Δlogits|; loss relative; gradients and the first SGD update relative "
        "(L2 over all parameters); the loss trace max |Δ|; k vs 1 device max |Δw| after one step. "
        "`math (float64)`: the loss and gradients computed in float64, where rounding cannot hide a "
        "difference in the math; `same math (float64)`: each strategy's own code path run in float64 "
        "(loss, gradients, a few steps of weights and BatchNorm running statistics) vs torch's, to 1e-10 "
        "or 30x float64's own rounding measured in the check, if larger; "
        "`BatchNorm state`: the running mean and variance vs torch's (relative L2). "
        "Where float32 itself cannot meet a tolerance (ResNet-18 on a few images), "
        f"the row's tolerance is 3x the measured float32-vs-float64 distance, and a loss trace that float32 "
        "cannot follow (chaotic: torch's own float32 run leaves the float64 one) is reported as measured.",
        "",
    ]
    rows = eq.get("rows") or []
    counts = {
        status: sum(r["status"] == status for r in rows)
        for status in ("ok", "FAIL", "measured", "not run")
    }
    lines += [
        f"**{len(rows)} rows: {counts['ok']} ok, {counts['FAIL']} failed, {counts['measured']} measured, "
        f"{counts['not run']} not run.**",
        "",
    ]
    lines += eq.get("table", [])
    for name, reason in (eq.get("failures") or {}).items():
        lines.append(f"\n- {name}: could not be checked: {reason}")
    return lines


def parity_rows(parity) -> list[dict]:
    """The well-formed rows of results.json's "parity" (a file read back is untrusted input)."""
    rows = parity.get("rows") if isinstance(parity, dict) else None
    numbers = ("suite_step_s", "idiom_step_s", "ratio")
    return [
        r
        for r in (rows if isinstance(rows, list) else [])
        if isinstance(r, dict)
        and all(isinstance(r.get(k), str) for k in ("backend", "strategy", "idiom", "verdict"))
        and (
            all(k not in r for k in numbers)
            or all(isinstance(r.get(k), (int, float)) for k in numbers)
            and isinstance(r.get("interval"), list)
            and len(r["interval"]) == 2
            and all(isinstance(v, (int, float)) for v in r["interval"])
        )
    ]


def faster_idioms(rows: list[dict]) -> list[tuple[str, float]]:
    """The backends whose own idiom is faster than every strategy of theirs (each interval above 1), with the
    fastest strategy's ratio: what a user of that framework would gain over the suite."""
    backends: dict[str, list[dict]] = {}
    for r in rows:
        backends.setdefault(r["backend"], []).append(r)
    return [
        (backend, min(r["ratio"] for r in mine))
        for backend, mine in backends.items()
        if all("ratio" in r and r["interval"][0] > 1 and decided(r) for r in mine)
    ]


def decided(row: dict) -> bool:
    """Whether a parity row has a verdict: not one from fewer trials than its rule asks for."""
    return not str(row.get("verdict", "")).startswith("too few trials")


def best_section(best) -> list[str]:
    """--best (results.json's meta["best"], untrusted when re-read): what each backend's best mode switched on, or
    that its best is its default, and why."""
    if not isinstance(best, dict) or not best:
        return []
    notes = [f"- {' '.join(note.split())}" for note in best.values() if isinstance(note, str)]
    return [
        "## Best mode (--best)",
        "",
        "Each framework ran as asked and, beside it, in its documented fastest mode for these devices (its "
        "backend.toml's [best]): the summary's rows with the levers named here.",
        "",
        *notes,
        "",
    ]


def parity_section(parity, plotted: bool) -> list[str]:
    """`python -m harness parity`'s figures: each strategy's step time over its framework's idiom's."""
    if parity is None:
        return []
    rows = parity_rows(parity)
    limit = parity.get("limit") if isinstance(parity, dict) else None
    limit = limit if isinstance(limit, (int, float)) else 1.10
    alpha = parity.get("alpha") if isinstance(parity, dict) else None
    alpha = alpha if isinstance(alpha, (int, float)) and 0 < alpha < 1 else 0.05
    lines = ["## Speed parity", ""]
    cells = []
    for r in rows:
        ratio, (low, high) = (r["ratio"], r["interval"]) if "ratio" in r else (None, (None, None))
        cells.append(
            [
                r["backend"],
                r["strategy"],
                f"{r['idiom']} ({r.get('framework') or '—'})",
                milliseconds(r.get("suite_step_s")),
                milliseconds(r.get("idiom_step_s")),
                fmt(ratio, ".2f"),
                f"[{low:.2f}, {high:.2f}]" if low is not None else "—",
                "/".join(map(str, r["trials"])) if isinstance(r.get("trials"), list) else "—",
                r["verdict"],
            ]
        )
    lines += table(
        [
            "backend",
            "strategy",
            "idiom",
            "strategy step ms",
            "idiom step ms",
            "ratio",
            f"{1 - alpha:.1%} interval".replace(".0%", "%"),
            "trials",
            "verdict",
        ],
        cells,
    )
    lines += [""]
    faster = faster_idioms(rows)
    for backend, ratio in faster:
        lines.append(
            f"- **{backend}: the framework's own loop is faster than every strategy** "
            f"(the fastest strategy takes {ratio:.2f}x the idiom's step)."
        )
    reasons = [r for r in rows if r.get("reason")]
    for r in reasons:
        lines.append(f"- {r['backend']} {r['strategy']}: {str(r['reason'])[:600]}")
    lines += [""] if reasons or faster else []
    if plotted:
        lines += ["![Strategy step over idiom step](parity.png)", ""]
    lines += [
        "Each strategy ran on one device beside its framework's own idiom (`benchmarks/idioms/`: the same "
        "ResNet-18, canonical weights, batches, batch size, learning rate and threads, written as the "
        "framework's examples write a training step), each side in fresh processes, trials interleaved. "
        "Both time the same steps the same way: one warm-up step, then each step alone, its batch on the "
        "device before its timer starts. Ratio: the strategy's median step over the idiom's (1.00 is "
        f"parity; at most {limit:.2f} is the goal). Interval: the two-level bootstrap of `compare` (trials "
        "drawn, then each trial's steps). The verdict reads the interval, not the point: an interval across "
        f"{limit:.2f} is inconclusive, and more trials narrow it: an undecided strategy runs again, one trial "
        "at a time, up to `--max-trials`, each look's interval widened to pay for looking again "
        "(docs/parity.md). On a GPU the idioms keep their "
        "framework's defaults (torch's cuDNN convolutions in TF32, JAX's default matmul precision) where the suite's "
        "fp32 turns TF32 off: part of a GPU ratio is that fairness rule.",
        "",
    ]
    return lines
