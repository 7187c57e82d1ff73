"""The report: reports/<run-id>/report.md with results.json, plots and the workers' logs.

Results arrive as dicts (the workers' JSON) or Results; they are converted to Results once (tables.as_results)
and read by attribute after that. The rendering lives beside this module, in tables.py, steps.py, outcomes.py,
plots.py and sections.py; `python -m harness report DIR`, which renders a report again or exports it, is
harness/report.py.

Everything is written into a hidden staging directory and renamed into place at the
end, so a report directory is either complete or absent; an existing report is never
overwritten, and two runs started in the same second get different run ids (a suffix -2, -3).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from common import architectures
from common.config import imagenet_shaped
from common.files import write_json_atomic
from common.results import CONSISTENCY_LIMIT, CONSISTENCY_LOW, SCHEMA_VERSION, Result
from harness.reporting import flops, leftovers, provenance
from harness.reporting.energy import energy_section
from harness.reporting.limits import limits_section, profile_section
from harness.reporting.outcomes import accuracy_table, failures, trials_table
from harness.reporting.plots import (
    plot_accuracy,
    plot_breakdown,
    plot_energy,
    plot_parity,
    plot_throughput,
    plot_time_to_accuracy,
)
from harness.reporting.published import d2l_section, resnet50_section
from harness.reporting.sections import (
    best_section,
    devices_line,
    environment_section,
    equivalence_section,
    feeding_section,
    hashes_section,
    input_line,
    memory_section,
    nodes_section,
    parity_rows,
    parity_section,
    precision_line,
    rounding_section,
)
from harness.reporting.steps import consistency_notes, steps_table
from harness.reporting.tables import as_results, summary_table, targets, with_scaling


class Staging:
    """`with Staging(out, backends) as s: ...; s.commit(results, meta)` -> the final directory.

    The staging directory `.tmp-<run-id>` is removed on leaving, whatever happened, unless `rescue`
    had to keep it because it holds the only copy of the results.
    """

    def __init__(self, out: Path, backends: list[str]):
        self.out = out
        self.run_id = (
            time.strftime("%Y%m%d-%H%M%S")
            + "-"
            + ("all" if len(backends) > 2 else "-".join(backends))
        )
        self.path: Path | None = None
        self.keep = False

    def create(self) -> "Staging":
        """Claim a run id no other run has: the first free one of ID, ID-2, ID-3, ... (ids have one-second
        resolution, and runs started together share an --out). mkdir is atomic: one process wins each name."""
        self.out.mkdir(parents=True, exist_ok=True)
        base, n = self.run_id, 1
        while True:
            run_id = base if n == 1 else f"{base}-{n}"
            n += 1
            if (self.out / run_id).exists():
                continue
            try:
                (self.out / f".tmp-{run_id}").mkdir()
            except FileExistsError:
                continue
            self.run_id, self.path = run_id, self.out / f".tmp-{run_id}"
            leftovers.claim(self.path)  # (an OSError here: the caller removes the directory)
            return self

    def save_meta(self, meta: dict) -> None:
        """The run's header, kept from the start: a killed harness's next run reports its finished runs with it."""
        write_json_atomic(self.path / leftovers.META, meta)

    def __enter__(self) -> "Staging":
        return self if self.path else self.create()

    def __exit__(self, *exc) -> None:
        if self.path.exists() and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)

    def rescue(self, results: list[dict | Result], meta: dict) -> Path:
        """The report could not be written (a full disk, say): put its results.json where it can be found,
        in the system's temp directory; failing that, keep the staging directory (its runs/ holds each
        finished run's result JSON until the report is written). Returns where the results are."""
        fallback = Path(tempfile.gettempdir()) / f"dpbench-{self.run_id}-results.json"
        try:
            write_json_atomic(fallback, results_document(results, {**meta, "run_id": self.run_id}))
            return fallback
        except OSError:
            self.keep = True
            return self.path

    def commit(self, results: list[dict | Result], meta: dict) -> Path:
        write(self.path, results, {**meta, "run_id": self.run_id})
        final = self.out / self.run_id
        n = 2
        while final.exists():
            final = self.out / f"{self.run_id}-{n}"
            n += 1
        self.path.rename(final)
        for staged in (leftovers.OWNER, leftovers.META):  # the staging's, not the report's
            (final / staged).unlink(missing_ok=True)
        return final


def model_line(cfg) -> str:
    """The model, its size and what one step sends: why ResNet-50 scales unlike ResNet-18."""
    if cfg is None or cfg.model not in architectures.SPECS:  # (an old or altered results.json)
        return cfg.model if cfg else "—"
    params = architectures.trainable_count(cfg.model)
    return (
        f"{cfg.model} ({params / 1e6:.1f} M parameters: {params * 4 / 1e6:.0f} MB of float32 gradients "
        f"per step) on {cfg.image_side}x{cfg.image_side} images"
    )


def all_images(cfg, split: int) -> str:
    return (
        ("all 60,000", "all 10,000")[split] if cfg and not imagenet_shaped(cfg.dataset) else "all"
    )


def step_time_section(rows: list) -> list[str]:
    """The steps timed one by one after training, the strategy's allreduce beside them, and the runs whose epoch
    and step figures disagree."""
    steps = steps_table(rows)
    if not steps:
        return []
    L = ["## Step time and communication", ""] + steps + [""]
    L += [
        "Step time: steady-state steps after training, each between two device barriers (so each step's "
        "time is known; the barriers remove overlap between steps, so images/s at the median can be a "
        "little below the epoch figure). Allreduce: the strategy's own reduction of a float32 buffer as "
        "large as the gradients, timed alone (median of 10); GB/s = bytes / time (algorithm bandwidth). "
        "Allreduce / step is an upper bound on what communication costs a step: DDP overlaps its bucketed "
        "allreduces with the backward pass, and simulated CPU devices share one memory. Epoch / steps: "
        f"the s/epoch above over (steps per epoch x the median step); below {CONSISTENCY_LOW:g} or beyond "
        f"{CONSISTENCY_LIMIT:g} (bold) the two figures disagree, and the run is named below. On a GPU, "
        f"below {CONSISTENCY_LOW:g}: the timed step, from barrier to barrier, charges an asynchronous "
        "framework its dispatch and its sync every step, which an epoch's steps overlap with the device's "
        f"work, so the epoch is faster than its steps at the median step; beyond {CONSISTENCY_LIMIT:g}: the "
        "epoch loses time its steps do not show (the input pipeline between steps, a compile inside it).",
        "",
    ]
    notes = consistency_notes(rows)
    if notes:
        L += ["**Figures that disagree**:", ""] + notes + [""]
    return L


def render(results: list[dict | Result], meta: dict, plots: dict[str, bool]) -> str:
    """report.md's text. meta["schema_version"], where given, is that of the results.json it describes."""
    results = as_results(results)
    rows = with_scaling(results)
    ok = [r for r in results if r.ok]
    cfg = (ok or results)[0].config if results else None
    get = lambda name, default=None: getattr(cfg, name) if cfg else default
    L = [f"# Data-parallel training report `{meta['run_id']}`", ""]
    L += [
        f"- Command: `{meta['command']}`",
        provenance.header_line(meta.get("provenance")),
        provenance.machine_line(meta.get("provenance")),
        f"- Started {meta['started']}, finished {meta.get('finished', '—')}",
        *resumed_line(meta.get("resumed")),
        f"- Preset: {meta['preset']}; model {model_line(cfg)}, {get('epochs')} epoch(s), "
        f"train {get('train_size') or all_images(cfg, 0)} / test {get('test_size') or all_images(cfg, 1)} images, "
        f"seed {get('seed')}",
        f"- Data: {meta['data_source']}",
        "- Start: "
        + (
            f"weights loaded from `{get('load_weights')}`"
            if get("load_weights")
            else "the canonical seeded initial weights"
        )
        + f"; BatchNorm: {get('bn', 'local')}"
        + (
            " (statistics over the global batch)"
            if get("bn") == "sync"
            else " (per-device statistics)"
        ),
        devices_line(meta),
        "",
    ]
    if get("dataset") in ("synthetic", "imagenet-synthetic"):
        real = "Fashion-MNIST" if get("dataset") == "synthetic" else "ImageNet"
        L += [
            f"> **Synthetic data**: random images, not {real}. Accuracy figures mean nothing here.",
            "",
        ]
    L += ["## Summary", ""] + summary_table(rows) + [""]
    L += [
        "s/epoch and images/s: mean over all epochs of the timed training loop only (warm-up / compile, "
        "evaluation and data shuffling excluded). TFLOP/s: the model's training FLOPs per image (3 x the forward "
        "pass's convolution and dense multiply-adds, counted from the architecture) x images/s; in brackets its "
        f"share of the devices' peak at the run's precision ({flops.PEAKS_SOURCE}; MFU), on a GPU whose peak "
        "is known; elsewhere its share of the framework's own matrix product measured on this host (\"of "
        "matmul\"; below, How far from the machine's limit). Speed-up and efficiency: images/s against the "
        "1-device run "
        "of the same backend and strategy in this report (efficiency = speed-up / devices). "
        "Test acc: after the last epoch. Rounding alone moves it: runs of the same math part after a few "
        "steps, so two accuracies differ only where the gap exceeds the spread of each over trials on their "
        "own batch orders (--target-accuracy with --repeat; docs/time-to-accuracy.md)."
        + TARGET_NOTE
        * any(targets(row) for row in rows),
        "",
    ]
    L += best_section(meta.get("best"))
    if plots.get("time_to_accuracy"):
        L += ["![Time to accuracy](time_to_accuracy.png)", ""]
    L += parity_section(meta.get("parity"), plots.get("parity", False))
    trials = trials_table(rows)
    if trials:
        L += ["## Trials", ""] + trials + [""]
        L += [
            "Each configuration ran in several fresh processes (--repeat). The summary gives the median over the "
            "trials kept and, beside images/s, their range; a trial that did not finish is dropped, and of five "
            "or more finished trials the fastest and the slowest are dropped too (MLPerf's rule). The step "
            "statistics pool every timed step of the kept trials.",
            "",
        ]
    L += nodes_section(rows, meta.get("topology", ""))
    L += step_time_section(rows)
    L += feeding_section(rows)
    L += memory_section(rows)
    L += rounding_section(rows)
    L += energy_section(rows, plots.get("energy", False))
    L += profile_section(rows, plots.get("breakdown", False))
    L += limits_section(rows)
    if plots.get("accuracy"):
        L += ["![Test accuracy per epoch](accuracy.png)", ""]
    if plots.get("throughput"):
        L += ["![Throughput vs devices](throughput.png)", ""]
    acc = accuracy_table(rows)
    if acc:
        L += ["## Test accuracy per epoch", ""] + acc + [""]
    fails = failures(rows)
    if fails:
        L += ["## Failed or not run", ""] + fails + [""]
    L += resnet50_section(results) if get("model") == "resnet50" else d2l_section()
    L += [
        "## Method",
        "",
        "- Same start: every run loads the same canonical initial weights (numpy, seeded; d2l's N(0, 0.01) "
        "for conv and dense weights, zero biases).",
        "- Same data: one seeded permutation per epoch in numpy; global batches are split evenly across the "
        "devices; the last partial batch is dropped.",
        "- Same math: one SGD step on the mean cross-entropy of the global batch (plain SGD, no momentum, "
        "no weight decay).",
        "- Timing: one warm-up step (timed and reported as warm-up / compile) then a reset to the initial "
        "weights; each epoch is timed between device barriers; multi-process runs report the slowest rank.",
        "- " + input_line(cfg),
        "- BatchNorm: in training each device normalises with its own shard's statistics (as d2l); before "
        "each evaluation the running statistics are averaged across replicas (nn.DataParallel keeps "
        "device 0's, as it does by design).",
        "- " + precision_line(cfg),
        "",
    ]
    L += hashes_section(results) + [""]
    L += equivalence_section(meta.get("equivalence")) + [""]
    L += ["## Environment", ""] + environment_section(results) + [""]
    version = meta.get("schema_version", SCHEMA_VERSION)
    L += [
        f"Raw numbers: [`results.json`](results.json) (schema v{version}); worker logs in `logs/`.",
        "",
    ]
    return "\n".join(L)


TARGET_NOTE = (
    " Time to target (--target-accuracy): the timed training seconds of the epochs up to the first whose test "
    "accuracy reached the target, and that epoch; the run stopped there. The test set is evaluated after every "
    "epoch, outside the timed loop, so the figure moves in steps of one epoch (docs/time-to-accuracy.md). With "
    "several trials, the median and the range over those that reached it; one that did not is counted, not "
    "ranked."
)


def results_document(results: list[dict | Result], meta: dict) -> dict:
    """What results.json holds: every number of the report, written in the current schema
    (common.results.load_results_json reads it back). A provenance it could not read back (a killed harness's
    meta.json is untrusted) is written as unknown."""
    meta = {k: v for k, v in meta.items() if k not in ("schema_version", "runs")}
    return {
        "schema_version": SCHEMA_VERSION,
        **meta,
        "provenance": provenance.known(meta.get("provenance")),
        "runs": [r.to_dict() for r in as_results(results)],
    }


def draw_plots(rows, directory: Path, parity=None) -> dict[str, bool]:
    """accuracy.png, throughput.png, breakdown.png (--profile) and (for `parity`'s figures) parity.png in
    `directory`; which of them there was anything to draw for."""
    limit = parity.get("limit") if isinstance(parity, dict) else None
    return {
        "accuracy": plot_accuracy(rows, directory / "accuracy.png"),
        "energy": plot_energy(rows, directory / "energy.png"),
        "throughput": plot_throughput(rows, directory / "throughput.png"),
        "time_to_accuracy": plot_time_to_accuracy(rows, directory / "time_to_accuracy.png"),
        "breakdown": plot_breakdown(rows, directory / "breakdown.png"),
        "parity": plot_parity(
            parity_rows(parity),
            limit if isinstance(limit, (int, float)) else 1.10,
            directory / "parity.png",
        ),
    }


def write(directory: Path, results: list[dict | Result], meta: dict) -> None:
    results = as_results(results)
    meta = {
        **meta,
        "schema_version": SCHEMA_VERSION,
    }  # that of the results.json written beside report.md
    rows = with_scaling(results)
    plots = draw_plots(rows, directory, meta.get("parity"))
    write_json_atomic(directory / "results.json", results_document(results, meta))
    (directory / "report.md").write_text(render(results, meta, plots))
    for staged in ("runs", "idioms"):  # configs and results are in results.json
        if (directory / staged).exists():
            shutil.rmtree(directory / staged)


def resumed_line(resumed) -> list[str]:
    """--resume: which report this one takes up again, and when (the runs that finished there are kept as they
    were, the others ran at this time)."""
    if not isinstance(resumed, dict):
        return []
    return [
        f"- Resumed `{resumed.get('from')}` at {resumed.get('at')}: its finished runs kept as they were, "
        "the others run now"
    ]
