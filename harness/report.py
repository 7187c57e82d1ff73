"""The report: reports/<run-id>/report.md with results.json, plots and the workers' logs.

Everything is written into a hidden staging directory and renamed into place at the
end, so a report directory is either complete or absent; an existing report is never
overwritten, and two runs started in the same second get different run ids (a suffix -2, -3).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from common.config import RunConfig
from common.results import SCHEMA_VERSION, summary, write_json_atomic

# d2l's published figures (10 epochs, V100-class GPUs, FP32, test accuracy of the last epoch).
D2L_REFERENCE = [
    ("ResNet-18, MXNet Gluon Trainer (bs 256/lr 0.1, then bs 512/lr 0.2)", "13.1 s/epoch, 0.93", "6.8 s/epoch, 0.92"),
    ("ResNet-18, PyTorch nn.DataParallel", "12.2-14.2 s/epoch, 0.91", "7.5-9.3 s/epoch, 0.73-0.86"),
    ("LeNet from scratch, PyTorch (bs 256, lr 0.2)", "3.0 s/epoch, 0.83", "2.8 s/epoch, 0.84"),
]

STATUS_NOTE = {
    "failed": "failed", "timeout": "timed out", "diverged": "diverged",
    "unavailable": "not run", "interrupted": "interrupted",
}


class Staging:
    """`with Staging(out, backends) as s: ...; s.commit(results, meta)` -> the final directory.

    The staging directory `.tmp-<run-id>` is removed on leaving, whatever happened, unless `rescue`
    had to keep it because it holds the only copy of the results.
    """

    def __init__(self, out: Path, backends: list[str]):
        self.out = out
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + ("all" if len(backends) > 2 else "-".join(backends))
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
            return self

    def __enter__(self) -> "Staging":
        return self if self.path else self.create()

    def __exit__(self, *exc) -> None:
        if self.path.exists() and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)

    def rescue(self, results: list[dict], meta: dict) -> Path:
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

    def commit(self, results: list[dict], meta: dict) -> Path:
        write(self.path, results, {**meta, "run_id": self.run_id})
        final = self.out / self.run_id
        n = 2
        while final.exists():
            final = self.out / f"{self.run_id}-{n}"
            n += 1
        self.path.rename(final)
        return final


# ------------------------------------------------------------------------ numbers

def variant(c: dict) -> str:
    """The strategy with its backend options and speed levers, e.g. `gluon[kvstore=local]`, `ddp[bf16]`."""
    return RunConfig.from_dict(c).variant


def key(r: dict) -> tuple:
    c = r["config"]
    return c["backend"], variant(c), c["devices"]


def with_scaling(results: list[dict]) -> list[dict]:
    """Attach summary numbers, speed-up and efficiency against the 1-device run of the same backend/strategy."""
    rows = []
    base = {}
    for r in results:
        s = summary(r) if r["status"] == "ok" else {}
        if s.get("images_per_s") and r["config"]["devices"] == 1:
            base[key(r)[:2]] = s["images_per_s"]
    for r in results:
        s = summary(r) if r["status"] == "ok" else {}
        b = base.get(key(r)[:2])
        if s.get("images_per_s") and b:
            s["speedup"] = s["images_per_s"] / b
            s["efficiency"] = s["speedup"] / r["config"]["devices"]
        rows.append({"result": r, **s})
    rows.sort(key=lambda row: key(row["result"]))
    return rows


def fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


# --------------------------------------------------------------------------- plots

def plot_accuracy(rows: list[dict], path: Path) -> bool:
    ok = [row for row in rows if row["result"]["status"] == "ok" and row["result"]["epochs"]]
    if not ok:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = ["-", "--", ":", "-."]
    strategies = sorted({key(row["result"])[:2] for row in ok})
    markers = "osD^v<>"
    counts = sorted({row["result"]["config"]["devices"] for row in ok})
    for row in ok:
        r = row["result"]
        epochs = [e["epoch"] for e in r["epochs"]]
        # line style per backend/strategy, marker per device count: runs that agree exactly stay visible
        ax.plot(epochs, [e["test_acc"] for e in r["epochs"]], linestyle=styles[strategies.index(key(r)[:2]) % 4],
                marker=markers[counts.index(r["config"]["devices"]) % len(markers)], markerfacecolor="none",
                label=" ".join(map(str, key(r))) + " dev")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title("Test accuracy per epoch")
    ax.grid(alpha=0.3)
    ax.set_xticks(sorted({e["epoch"] for row in ok for e in row["result"]["epochs"]}))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_throughput(rows: list[dict], path: Path) -> bool:
    series: dict[tuple, list] = {}
    for row in rows:
        if row["result"]["status"] == "ok" and row.get("images_per_s"):   # (evaluation-only runs have none)
            point = (row["result"]["config"]["devices"], row["images_per_s"])
            series.setdefault(key(row["result"])[:2], []).append(point)
    if not any(len(points) > 1 for points in series.values()):
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    counts = sorted({p[0] for points in series.values() for p in points})
    for (backend, strategy), points in sorted(series.items()):
        points.sort()
        line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{backend} {strategy}")
        if points[0][0] == 1:  # linear scaling from the 1-device run, for reference
            ax.plot(counts, [points[0][1] * n for n in counts], linestyle=":", color=line.get_color(), alpha=0.5)
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


# ------------------------------------------------------------------------ markdown

def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines


def peak_memory(r: dict) -> str:
    """Peak device memory where the framework exposes it, else the worker's peak host RSS."""
    memory = r.get("memory") or {}
    if memory.get("peak_device_mb") is not None:
        return f"{memory['peak_device_mb']:.0f}"
    if memory.get("peak_host_rss_mb") is not None:
        return f"{memory['peak_host_rss_mb']:.0f} (host RSS)"
    return "—"


def summary_table(rows: list[dict]) -> list[str]:
    body = []
    for row in rows:
        r = row["result"]
        if r["status"] != "ok":
            continue
        c = r["config"]
        body.append([
            c["backend"], variant(c), f"{c['devices']}{' (sim.)' if c['simulated'] else ''}",
            str(c["batch_size"]), f"{c['lr']:g}",
            fmt(row.get("sec_per_epoch"), ".2f"), fmt(row.get("images_per_s"), ".1f"),
            fmt(row.get("speedup"), ".2f"), fmt(row.get("efficiency"), ".0%"),
            fmt(row.get("test_acc"), ".4f"), fmt(r.get("compile_s"), ".2f"),
            peak_memory(r), fmt(r.get("params"), ","),
        ])
    header = ["backend", "strategy", "devices", "batch", "lr", "s/epoch", "images/s", "speed-up",
              "efficiency", "test acc", "warm-up s", "peak mem MB", "params"]
    return _table(header, body) if body else ["No run finished successfully."]


def milliseconds(seconds: float | None) -> str:
    """Three significant digits without exponents: 1084, 35.8, 4.50, 0.00039."""
    if seconds is None:
        return "—"
    ms = 1e3 * seconds
    if ms >= 100:
        return f"{ms:.0f}"
    return f"{ms:.3g}" if ms >= 1 else f"{ms:.2g}"


def steps_table(rows: list[dict]) -> list[str]:
    """Step statistics and the communication figure of every run that has them."""
    body = []
    for row in rows:
        r = row["result"]
        step, ar = r.get("step_time"), r.get("allreduce")
        if r["status"] != "ok" or not step:
            continue
        c = r["config"]
        ms = milliseconds
        several = c["devices"] > 1     # on one device there is nothing to send: no bandwidth to speak of
        body.append([c["backend"], variant(c), str(c["devices"]), f"{ms(step['median_s'])}",
                     f"{ms(step['p10_s'])}–{ms(step['p90_s'])}", str(step["steps"]),
                     fmt(step.get("images_per_s"), ".1f"),
                     ms(ar and ar["median_s"]), fmt(ar.get("gb_per_s") if ar and several else None, ".2f"),
                     fmt(ar and ar.get("share_of_step"), ".0%")])
    if not body:
        return []
    mb = next(row["result"]["allreduce"]["bytes"] for row in rows
              if row["result"]["status"] == "ok" and row["result"].get("allreduce")) / 1e6
    return _table(["backend", "strategy", "devices", "step ms (median)", "p10–p90 ms", "steps", "images/s at median",
                   f"allreduce ms ({mb:.1f} MB)", "allreduce GB/s", "allreduce / step"], body)


def accuracy_table(rows: list[dict]) -> list[str]:
    ok = [row["result"] for row in rows if row["result"]["status"] == "ok" and row["result"]["epochs"]]
    if not ok:
        return []
    n = max(len(r["epochs"]) for r in ok)
    body = [[" ".join(map(str, key(r)))] + [fmt(e["test_acc"], ".4f") for e in r["epochs"]]
            + [""] * (n - len(r["epochs"])) for r in ok]
    return _table(["run"] + [f"epoch {i + 1}" for i in range(n)], body)


def failures(rows: list[dict]) -> list[str]:
    """One entry per (backend, strategy, status, reason), naming the device counts it covers."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        r = row["result"]
        if r["status"] != "ok":
            reason = (r.get("error") or "no reason recorded").strip()
            groups.setdefault((*key(r)[:2], r["status"], reason), []).append(r)
    lines = []
    for (backend, strategy, status, reason), runs in groups.items():
        counts = ", ".join(str(r["config"]["devices"]) for r in runs)
        logs = ", ".join(f"`{r['log']}`" for r in runs if r.get("log"))
        lines.append(f"- **{backend} {strategy}**, {counts} device(s): {STATUS_NOTE.get(status, status)} — "
                     f"{reason.splitlines()[-1]}" + (f" (log: {logs})" if logs else ""))
        if status in ("failed", "timeout", "diverged") and len(reason.splitlines()) > 1:
            lines += ["", "  ```", *["  " + l for l in reason.splitlines()[-12:]], "  ```"]
    return lines


def input_line(cfg: dict) -> str:
    """How batches reach the devices: assembled before each epoch's timer, copied inside it."""
    line = ("Input: each epoch's batches are assembled (one gather of its permutation) before its timer "
            "starts; ")
    if cfg.get("resident_data"):
        return line + "with --resident-data they are also copied to the devices before it (no copy is timed)."
    prefetch = cfg.get("prefetch", 0)
    if not prefetch:
        return line + "each step copies its own batch to the devices (--prefetch 0), inside the epoch time."
    return line + (f"each batch is put on the devices {prefetch} batches ahead of its step (pinned host memory "
                   "and asynchronous copies on GPUs), so the copies, inside the epoch time, overlap compute.")


def environment_section(results: list[dict]) -> list[str]:
    """Host once, then one line per backend/strategy from its largest run."""
    largest: dict[tuple, dict] = {}
    for r in results:
        seen = largest.get(key(r)[:2])
        if r.get("environment") and (seen is None or r["config"]["devices"] >= seen["config"]["devices"]):
            largest[key(r)[:2]] = r
    if not largest:
        return ["No run reported its environment."]
    first = next(iter(largest.values()))["environment"]
    lines = [f"- **Host**: {first.get('cpu')} ({first.get('cpus')} usable cores), {first.get('platform')}"]
    for (backend, strategy), r in sorted(largest.items()):
        env = r["environment"]
        precision = ", ".join(f"{k}={v}" for k, v in (env.get("precision") or {}).items())
        devices = ", ".join(env.get("devices") or []) or "none the framework sees"
        lines.append(f"- **{backend} {strategy}** ({r['config']['devices']} devices: {devices}): "
                     f"{env.get('framework')} {env.get('framework_version')} (CUDA {env.get('cuda') or '—'}, "
                     f"cuDNN {env.get('cudnn') or '—'}), Python {env.get('python')}, numpy {env.get('numpy')}; "
                     f"{env.get('processes')} process(es) x {env.get('threads_per_process')} CPU thread(s); "
                     f"precision: {precision}; collective: {env.get('collective')}"
                     + "".join(f"; {label}: {setting(env[name])}" for name, label in GPU_SETTINGS if env.get(name)))
        if r["config"].get("device_kind", "cpu") == "cpu" and env.get("framework_gpus"):
            lines.append(f"  - **{env.get('framework')} itself sees {env['framework_gpus']} GPU(s), yet this run used "
                         f"simulated CPU devices**: the harness found no GPU (see Devices above, or pass --device gpu)")
    return lines


# What a GPU run's speed depends on beyond the framework (recorded by the workers that have them).
GPU_SETTINGS = (("input_copies", "input copies"), ("sgd_update", "SGD update"), ("compile", "compile"))


def setting(value) -> str:
    return ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)


def hashes_section(results: list[dict]) -> list[str]:
    ok = [r for r in results if r["status"] == "ok"]
    weights = {r.get("weights_hash") for r in ok if r.get("weights_hash")}
    data = {r.get("data_hash") for r in ok if r.get("data_hash")}   # (evaluation-only runs train on nothing)
    lines = []
    if weights:
        lines.append("- Initial weights (canonical): "
                     + (f"`{next(iter(weights))[:16]}` for every run" if len(weights) == 1
                        else "**differ between runs**: " + ", ".join(f"`{str(w)[:16]}`" for w in weights)))
    if data:
        lines.append("- Training batch sequence: "
                     + (f"`{next(iter(data))[:16]}` for every run" if len(data) == 1
                        else "differs between runs (different device counts drop a different partial batch "
                             "or use a different global batch): "
                             + ", ".join(sorted(f"`{str(d)[:16]}`" for d in data))))
    return lines


def equivalence_section(eq: dict | None) -> list[str]:
    """The check's table: the same weights and batches through every backend, compared with torch."""
    if not eq:
        return ["## Equivalence", "", "Not checked in this run (`--no-check`; run `python -m harness check`)."]
    if eq.get("interrupted"):
        return ["## Equivalence", "", "Interrupted before the check finished (run `python -m harness check`)."]
    lines = ["## Equivalence", "",
             f"Every backend and strategy of this report, from the same canonical weights and batches "
             f"({eq['setup']}), compared with torch (`python -m harness check` runs the full version). "
             "Tolerances: forward max |Δlogits|; loss relative; gradients and the first SGD update relative "
             "(L2 over all parameters); the loss trace max |Δ|; k vs 1 device max |Δw| after one step. "
             "`math (float64)`: the loss and gradients computed in float64, where rounding cannot hide a "
             "difference in the math; `same math (float64)`: each strategy's own code path run in float64 "
             "(loss, gradients, a few steps of weights and BatchNorm running statistics) vs torch's, to 1e-10; "
             "`BatchNorm state`: the running mean and variance vs torch's (relative L2). "
             "Where float32 itself cannot meet a tolerance (ResNet-18 on a few images), "
             f"the row's tolerance is 3x the measured float32-vs-float64 distance, and a loss trace that float32 "
             "cannot follow (chaotic: torch's own float32 run leaves the float64 one) is reported as measured.", ""]
    rows = eq.get("rows") or []
    counts = {status: sum(r["status"] == status for r in rows) for status in ("ok", "FAIL", "measured", "not run")}
    lines += [f"**{len(rows)} rows: {counts['ok']} ok, {counts['FAIL']} failed, {counts['measured']} measured, "
              f"{counts['not run']} not run.**", ""]
    lines += eq.get("table", [])
    for name, reason in (eq.get("failures") or {}).items():
        lines.append(f"\n- {name}: could not be checked: {reason}")
    return lines


def precision_line(cfg: dict) -> str:
    levers = RunConfig.from_dict(cfg).levers if cfg else []
    text = {"fp32": "fp32 everywhere, TF32 disabled explicitly", "tf32": "TF32 matmuls and convolutions",
            "bf16": "bfloat16 compute (autocast / flax dtype), float32 weights, gradients and SGD"}
    line = f"Precision: {text[cfg.get('precision', 'fp32')]}."
    others = [lever for lever in levers if lever not in text]
    return line + (f" Speed levers: {', '.join(others)} (see each backend's backend.toml for what they do)."
                   if others else " No other speed lever (--compile, --channels-last, --resident-data).")


def devices_line(meta: dict) -> str:
    """What ran and how the devices were found (results saved before `detection` existed lack it)."""
    how = meta.get("detection")
    if meta.get("device_kind") == "cpu":
        return (f"- Devices: **simulated** ({how or 'no GPU was present'}): each device is a replica on the host "
                "CPU, so the figures measure the software path, not GPU scaling")
    gpus = meta.get("gpus", [])
    return f"- Devices: {len(gpus)} GPU(s): {', '.join(gpus)}" + (f", {how}" if how else "")


def render(results: list[dict], meta: dict, plots: dict[str, bool]) -> str:
    rows = with_scaling(results)
    ok = [r for r in results if r["status"] == "ok"]
    cfg = (ok or results)[0]["config"] if results else {}
    L = [f"# Data-parallel training report `{meta['run_id']}`", ""]
    L += [f"- Command: `{meta['command']}`",
          f"- Started {meta['started']}, finished {meta.get('finished', '—')}",
          f"- Preset: {meta['preset']}; model {cfg.get('model')}, {cfg.get('epochs')} epoch(s), "
          f"train {cfg.get('train_size') or 'all 60,000'} / test {cfg.get('test_size') or 'all 10,000'} images, "
          f"seed {cfg.get('seed')}",
          f"- Data: {meta['data_source']}",
          "- Start: " + (f"weights loaded from `{cfg['load_weights']}`" if cfg.get("load_weights")
                          else "the canonical seeded initial weights") + f"; BatchNorm: {cfg.get('bn', 'local')}"
          + (" (statistics over the global batch)" if cfg.get("bn") == "sync" else " (per-device statistics)"),
          devices_line(meta),
          ""]
    if cfg.get("dataset") == "synthetic":
        L += ["> **Synthetic data**: random images, not Fashion-MNIST. Accuracy figures mean nothing here.", ""]
    L += ["## Summary", ""] + summary_table(rows) + [""]
    L += ["s/epoch and images/s: mean over all epochs of the timed training loop only (warm-up / compile, "
          "evaluation and data shuffling excluded). Speed-up and efficiency: images/s against the 1-device run "
          "of the same backend and strategy in this report (efficiency = speed-up / devices). "
          "Test acc: after the last epoch.", ""]
    steps = steps_table(rows)
    if steps:
        L += ["## Step time and communication", ""] + steps + [""]
        L += ["Step time: steady-state steps after training, each between two device barriers (so each step's "
              "time is known; the barriers remove overlap between steps, so images/s at the median can be a "
              "little below the epoch figure). Allreduce: the strategy's own reduction of a float32 buffer as "
              "large as the gradients, timed alone (median of 10); GB/s = bytes / time (algorithm bandwidth). "
              "Allreduce / step is an upper bound on what communication costs a step: DDP overlaps its bucketed "
              "allreduces with the backward pass, and simulated CPU devices share one memory.", ""]
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
    L += ["## d2l reference numbers", "",
          "Published by d2l.ai (10 epochs, V100-class GPUs, FP32, test accuracy of the last epoch); "
          "compare with a GPU run of the d2l preset, not with simulated CPU devices.", ""]
    L += _table(["run", "1 GPU", "2 GPUs"], [list(r) for r in D2L_REFERENCE]) + [""]
    L += ["## Method", "",
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
          "- " + precision_line(cfg), ""]
    L += hashes_section(results) + [""]
    L += equivalence_section(meta.get("equivalence")) + [""]
    L += ["## Environment", ""] + environment_section(results) + [""]
    L += [f"Raw numbers: [`results.json`](results.json) (schema v{SCHEMA_VERSION}); worker logs in `logs/`.", ""]
    return "\n".join(L)


def results_document(results: list[dict], meta: dict) -> dict:
    """What results.json holds: every number of the report."""
    return {"schema_version": SCHEMA_VERSION, **meta, "runs": results}


def write(directory: Path, results: list[dict], meta: dict) -> None:
    rows = with_scaling(results)
    plots = {"accuracy": plot_accuracy(rows, directory / "accuracy.png"),
             "throughput": plot_throughput(rows, directory / "throughput.png")}
    write_json_atomic(directory / "results.json", results_document(results, meta))
    (directory / "report.md").write_text(render(results, meta, plots))
    runs = directory / "runs"
    if runs.exists():
        shutil.rmtree(runs)  # configs and results are in results.json
