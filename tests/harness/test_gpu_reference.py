"""benchmarks/gpu_reference.py: the GPU reference's pieces as commands, in the order that buys the most certainty
per GPU minute, the budget that picks and stops them, and the next run taking up where the last stopped (its smoke
run on the CPU is a benchmark command, not a test: minutes of ResNet-18; here the pieces run a fake interpreter)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import gpu_reference
from tests.harness.helpers import ROOT

SCRIPT = str(ROOT / "benchmarks" / "gpu_reference.py")


def pieces(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, SCRIPT, "list", "--python", "/opt/py", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def names(lines: list[str]) -> list[str]:
    return [line.split(" (~")[0] for line in lines]


def number(name: str) -> int:
    """A piece's number, as --piece takes it."""
    return next(i for i, piece in enumerate(gpu_reference.PIECES, 1) if piece.name == name)


def test_the_feeding_comes_first_then_keras_parity_and_each_framework_at_its_best_then_the_rest():
    lines = pieces()
    assert names(lines) == [
        "1. gpu-tests-torch",
        "2. torch-fed",
        "3. torch-resident",
        "4. keras",
        "5. parity",
        "6. d2l-best",
        "7. keras-compile",
        "8. readme",
        "9. resnet50-jax-resident",
        "10. torch-best",
        "11. jax-resident",
        "12. torch-graphs",
        "13. resnet50-torch-channels-last",
        "14. resnet50-torch-compile",
        "15. torch-compile",
        "16. torch-channels-last",
        "17. gpu-tests-jax",
        "18. check",
        "19. d2l-bf16",
        "20. d2l-fp32",
        "21. profile",
        "22. resnet50",
        "23. d2l-target",
        "24. test-torch",
        "25. test-jax",
        "26. resnet50-sharded",
        "27. resnet50-sharded-bf16-grads",
    ]
    line = dict(zip([n.split(". ")[1] for n in names(lines)], lines))
    # the files named relative to the project's root: a piece is the same command on every machine
    assert line["gpu-tests-torch"].endswith("-m pytest -q -rs tests/backends/test_torch.py -k cuda")
    # torch as written by default, its profiled steps as an epoch runs them, then resident batches on the same card
    assert (
        "--strategy scratch --gpus 1 --preset d2l --precision bf16 --epochs 2 --no-check --profile 5 "
        "--profile-epoch" in line["torch-fed"]
    )
    # Keras's own interpreter is the host's too, with its carried wheels
    assert "--backend keras" in line["keras"] and "--python keras=/opt/py" in line["keras"]
    assert "--profile 3" in line["keras"]
    assert line["parity"].endswith(
        "parity --backend torch,jax,keras --gpus 1 --python torch=/opt/py --python jax=/opt/py "
        "--python keras=/opt/py"
        + (" --data-dir .data/fashion-mnist" if gpu_reference.DATA.is_dir() else "")
        + " --device gpu --repeat 3 --max-trials 3"
    )
    # the d2l recipe's 10 epochs (the preset's) at each framework's best
    assert (
        "--backend torch,jax --strategy scratch,pmap,sharding --gpus 1 --preset d2l --precision bf16 "
        in (line["d2l-best"])
        and "--best --resident-data --no-check" in line["d2l-best"]
    )
    assert "--epochs" not in line["d2l-best"]
    assert (
        "--backend keras --strategy ddp" in line["keras-compile"]
        and "--compile" in line["keras-compile"]
    )
    assert (
        "--backend torch,jax,keras --gpus 1 --preset d2l --precision bf16 --best --epochs 3"
        in line["readme"]
    )
    # torch as written and at its best (--best), batches on the device, profiled; JAX beside it
    assert (
        "--backend torch --strategy scratch,ddp --gpus 1 --preset d2l --precision bf16 --best "
        "--resident-data --epochs 4 --profile 5 --no-check"
    ) in line["torch-best"]
    assert (
        "--backend jax --gpus 1 --preset d2l --precision bf16 --resident-data --epochs 4"
        in line["jax-resident"]
    )
    # each torch lever alone, 2 epochs of the same recipe
    for name, lever in (
        ("torch-graphs", "--compile --compile-mode reduce-overhead"),
        ("torch-compile", "--compile"),
        ("torch-resident", "--resident-data"),
        ("torch-channels-last", "--channels-last"),
    ):
        assert (
            f"--strategy scratch --gpus 1 --preset d2l --precision bf16 {lever} --epochs 2"
            in line[name]
        )
    assert (
        "--preset resnet50 --gpus 1 --channels-last --compile --profile 3"
        in line["resnet50-torch-compile"]
    )
    for trains in lines[1:4] + lines[5:16]:
        assert "--device gpu" in trains and "--python torch=/opt/py --python jax=/opt/py" in trains
    assert line["check"].endswith(
        "check --backend torch,jax --gpus 1 --model resnet18 --python torch=/opt/py --python jax=/opt/py"
        + " --python keras=/opt/py"
        + (" --data-dir .data/fashion-mnist" if gpu_reference.DATA.is_dir() else "")
    )
    assert "--preset d2l-target --precision bf16 --repeat 3" in line["d2l-target"]
    assert line["test-torch"].endswith("test --backend torch --python torch=/opt/py")
    # ResNet-50's sharded variants on one GPU: ddp beside fsdp in both reshard modes, then with bf16 gradients
    assert (
        "--backend torch --preset resnet50 --gpus 1 --strategy ddp,fsdp --no-check "
        "--option reshard_after_forward=true,false" in line["resnet50-sharded"]
    )
    assert "--strategy ddp,fsdp --no-check --grad-dtype bf16" in line["resnet50-sharded-bf16-grads"]


def test_keras_compile_logs_its_graph_breaks_and_recompiles():
    env = gpu_reference.piece_env(gpu_reference.PIECES[number("keras-compile") - 1])
    assert env["TORCH_LOGS"] == "graph_breaks,recompiles"


def test_torch_logs_its_cuda_graphs_where_a_piece_captures_them():
    for piece in gpu_reference.PIECES:
        if piece.name == "keras-compile":
            continue
        graphs = "reduce-overhead" in piece.args or "--best" in piece.args
        assert (
            gpu_reference.piece_env(piece).get("TORCH_LOGS") == "cudagraphs,perf_hints"
        ) == graphs


def test_pieces_named_by_number_run_in_the_order_given():
    assert names(pieces("--piece", "9,4")) == ["9. resnet50-jax-resident", "4. keras"]


def test_the_budget_takes_the_first_pieces_whose_minutes_fit():
    fit = gpu_reference.within_budget(gpu_reference.PIECES, 7.5)
    assert sum(p.minutes for p in fit) <= 7.5
    assert fit == gpu_reference.PIECES[: len(fit)]
    assert sum(p.minutes for p in gpu_reference.PIECES[: len(fit) + 1]) > 7.5
    assert names(pieces("--budget", "7.5")) == names(pieces())[: len(fit)]


def test_a_pytest_piece_runs_inside_its_backend():
    env = gpu_reference.piece_env(gpu_reference.PIECES[number("gpu-tests-jax") - 1])
    assert env["DPBENCH_BACKEND"] == "jax" and str(ROOT) in env["PYTHONPATH"].split(":")


def test_the_smoke_run_is_the_same_pieces_on_the_cpu_cut_to_a_few_steps():
    smoke = pieces("--smoke")
    trains = smoke[1:4] + smoke[5:16]
    assert all("--device cpu --epochs 1" in line and "--device gpu" not in line for line in trains)
    # CUDA graphs are refused on the CPU: the smoke run compiles without them
    graphs = smoke[number("torch-graphs") - 1]
    assert "--compile --epochs 2" in graphs and "reduce-overhead" not in graphs
    assert pieces("--piece", "13", "--smoke") == [smoke[12]]
    parity = smoke[number("parity") - 1]
    assert parity.endswith("--device cpu --batch-size 8 --repeat 2 --timed-steps 3")


# A piece that writes what it finished on SIGTERM, as the harness does, and would otherwise run a minute.
WRITES_ON_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('report written', flush=True), sys.exit(0)))\n"
    "print('started', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_piece_running_past_the_budget_is_stopped_with_sigterm_and_counted_as_cut_off(
    monkeypatch, capfd
):
    monkeypatch.setattr(
        gpu_reference, "command", lambda *a: [sys.executable, "-c", WRITES_ON_SIGTERM]
    )
    two = gpu_reference.PIECES[18:20]
    started = time.monotonic()
    status = gpu_reference.run(two, python=None, smoke=False, deadline=time.monotonic() + 1)
    out = capfd.readouterr().out
    assert status == 1 and time.monotonic() - started < 30
    lines = out.splitlines()
    # the second piece never started
    assert lines.count("started") == 1 and "report written" in lines
    assert "0 of 2 pieces ok; failed: d2l-bf16 (cut off at the budget)" in out


def test_a_piece_out_of_range_or_a_budget_nothing_fits_is_refused_in_one_line():
    for args, says in (
        (["--piece", "28"], "--piece must be 1..27 (got 28)"),
        (["--piece", "6,0"], "--piece must be 1..27 (got 0)"),
        (["--piece", "six"], "must be piece numbers, comma-separated"),
        (["--budget", "0.5"], "no piece left fits 0.5 minutes"),
        (["--budget", "-1"], "must be a positive number of minutes"),
        (["--budget", "inf"], "must be a positive number of minutes"),
    ):
        out = subprocess.run(
            [sys.executable, SCRIPT, "run", *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, args


# The interpreter the pieces run with here: it notes each command it is given and ends at once, with status 1
# where the command holds $FAKE_FAILS.
FAKE_PYTHON = """#!/bin/sh
printf '%s\\n' "$*" >> "$(dirname "$0")/ran.log"
if [ -n "$FAKE_FAILS" ]; then case "$*" in *"$FAKE_FAILS"*) exit 1;; esac; fi
exit 0
"""


@dataclass
class Lease:
    """A project's reports/ in a temporary folder, and the pieces run there by the fake interpreter."""

    root: Path
    python: str

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def command(self, number: int) -> list[str]:
        return gpu_reference.command(gpu_reference.PIECES[number - 1].args, self.python, False)

    def report(self, number: int, run_id: str, statuses: list[str], finished: bool = True) -> Path:
        """A report of piece `number`, as its harness writes it: its command, and a run per status."""
        doc = {
            "command": "python -m harness " + shlex.join(self.command(number)[3:]),
            "runs": [{"status": s} for s in statuses],
            **({"finished": "2027-01-01 00:00:00 UTC"} if finished else {}),
        }
        return self.write(run_id, json.dumps(doc))

    def write(self, run_id: str, text: str) -> Path:
        folder = self.reports / run_id
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(text)
        return folder

    def run(self, *args: str) -> int:
        return gpu_reference.main(["run", "--python", self.python, *args])

    def ran(self) -> list[str]:
        log = self.root / "ran.log"
        return log.read_text().splitlines() if log.exists() else []

    def ran_as(self, number: int) -> str:
        """How the fake interpreter notes piece `number`'s own command."""
        return " ".join(self.command(number)[1:])


@pytest.fixture
def lease(tmp_path, monkeypatch) -> Lease:
    monkeypatch.setattr(gpu_reference, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(gpu_reference, "catch_stop_signals", lambda: None)
    monkeypatch.delenv("FAKE_FAILS", raising=False)
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return Lease(tmp_path, str(python))


def test_a_piece_whose_latest_report_is_complete_is_skipped_saying_which_report_holds_its_runs(
    lease, capsys
):
    lease.report(19, "20270101-000000-jax-torch", ["ok", "interrupted"])
    # the report that resumed it, later: every run finished, one of them failed (a finding, not a cut)
    resumed = lease.report(19, "20270102-000000-jax-torch", ["ok", "failed"])
    assert lease.run("--piece", "19,20") == 0
    out = capsys.readouterr().out
    assert f"== piece d2l-bf16: done, skipped: {resumed} holds its runs (1 of them failed)" in out
    assert lease.ran() == [lease.ran_as(20)]
    assert "1 of 1 pieces ok" in out


def test_a_cut_off_piece_is_resumed_from_its_report_by_the_harness_s_own_resume(lease, capsys):
    cut = lease.report(20, "20270101-000000-jax-torch", ["ok", "ok", "interrupted", "interrupted"])
    parity = lease.report(5, "20270101-000100-jax-torch", ["ok", "interrupted"])
    killed = lease.report(10, "20270101-000200-torch-killed", ["ok"], finished=False)
    assert lease.run("--piece", "20,5,10,11") == 0
    assert lease.ran() == [
        f"-m harness --resume {cut}",
        f"-m harness parity --resume {parity}",
        f"-m harness --resume {killed}",
        lease.ran_as(11),
    ]
    out = capsys.readouterr().out
    assert f"== piece d2l-fp32, resumed ({cut} holds 2 of its 4 runs): -m harness --resume" in out
    assert f"== piece torch-best, resumed (its harness was killed; {killed} holds" in out


def test_a_damaged_report_or_done_file_is_said_in_one_line_and_its_piece_runs_again(lease, capsys):
    cut_short = lease.write("20270101-000000-jax-torch", '{"command": "python -m harness --bac')
    odd = lease.report(20, "20270101-000100-jax-torch", ["ok", "lost"])
    (lease.reports / "gpu-reference-done.json").write_text("[1, 2")
    assert lease.run("--piece", "19,20,17") == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and not any("Traceback" in line for line in err)
    assert err[0] == (
        f"gpu_reference: {cut_short}/results.json cannot be read (Unterminated string starting at: line 1 "
        "column 13 (char 12)): it counts for no piece"
    )
    assert err[1] == (
        f"gpu_reference: {lease.reports}/gpu-reference-done.json cannot be read (Expecting ',' delimiter: "
        "line 1 column 6 (char 5)): the pieces it marks done run again"
    )
    assert err[2] == (
        f"gpu_reference: piece d2l-fp32: its report {odd} is damaged (a run has no status the harness "
        "writes): it runs again from the start"
    )
    assert lease.ran() == [lease.ran_as(19), lease.ran_as(20), lease.ran_as(17)]


def test_a_piece_without_a_report_is_done_once_it_ended_by_itself_with_status_0(
    lease, capsys, monkeypatch
):
    monkeypatch.setenv("FAKE_FAILS", " check ")
    assert lease.run("--piece", "17,18") == 1
    marks = json.loads((lease.reports / "gpu-reference-done.json").read_text())
    assert list(marks) == [shlex.join(lease.command(17)[1:])]
    capsys.readouterr()
    assert lease.run("--piece", "17,18") == 1
    out = capsys.readouterr().out
    assert "== piece gpu-tests-jax: done, skipped: it ended with status 0 at " in out
    # the check failed: it runs again
    assert lease.ran() == [lease.ran_as(17), lease.ran_as(18), lease.ran_as(18)]


def test_the_budget_picks_from_the_pieces_left_a_cut_off_one_at_the_share_of_its_runs_left(
    lease, capsys
):
    # the CUDA tests (1.5 min) done, torch-fed (0.6 min) half done, torch-resident 0.4 min, keras 2.5 min
    gpu_reference.mark_done(lease.command(1))
    half = lease.report(2, "20270101-000100-torch", ["ok", "interrupted"])
    assert lease.run("--budget", "0.75") == 0
    assert lease.ran() == [f"-m harness --resume {half}", lease.ran_as(3)]
    capsys.readouterr()
    assert gpu_reference.main(["list", "--python", lease.python, "--budget", "0.75"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in listed] == [
        "1. gpu-tests-torch (~1.5 min)",
        f"2. torch-fed (~0.3 of 0.6 min; cut off, {half} holds 1 of its 2 runs)",
        "3. torch-resident (~0.4 min)",
    ]
    assert listed[1].endswith(f": -m harness --resume {half}")
    assert listed[0].startswith("1. gpu-tests-torch (~1.5 min): done, it ended with status 0 at ")


def test_fresh_runs_every_piece_from_the_start_whatever_its_report_says(lease):
    lease.report(19, "20270101-000000-jax-torch", ["ok", "ok"])
    lease.report(20, "20270101-000100-jax-torch", ["ok", "interrupted"])
    assert lease.run("--piece", "19,20", "--fresh") == 0
    assert lease.ran() == [lease.ran_as(19), lease.ran_as(20)]


@pytest.mark.parametrize(
    "args, says",
    [
        (["run", "--bogus"], "gpu_reference: error: unrecognized arguments: --bogus (see --help)"),
        (
            ["run", "--piece", "six"],
            "gpu_reference: error: argument --piece: must be piece numbers",
        ),
        (["nothing"], "gpu_reference: error: argument action: invalid choice: 'nothing'"),
        (
            ["run", "--python", "/nonexistent/python"],
            "gpu_reference: error: --python /nonexistent/python: no such interpreter",
        ),
    ],
)
def test_a_bad_flag_or_interpreter_is_one_line_and_exit_2_with_no_usage(args, says):
    out = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60
    )
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and line.startswith(says), out.stderr
    assert out.stdout == ""  # refused before any piece started


class StartedWhileStopped:
    """A piece's Popen during which Ctrl-C arrives (after the fork, before Popen returns): the moment that lost the
    process and left it running, when the KeyboardInterrupt was raised inside Popen."""

    def __init__(self, *args, **kwargs):
        self.signals = []
        signal.raise_signal(signal.SIGINT)

    def send_signal(self, sig):
        self.signals.append(sig)

    def wait(self, timeout=None):
        return 0


def default_stop_signals() -> None:
    """The stop signals at their defaults, whatever the test runner inherited (a shell's background job ignores
    Ctrl-C, and the script leaves an ignored signal ignored)."""
    for sig in gpu_reference.STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def test_ctrl_c_while_a_piece_starts_stops_that_piece(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(
        gpu_reference.subprocess,
        "Popen",
        lambda *a, **k: started.append(StartedWhileStopped()) or started[-1],
    )
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal gives it
    try:
        status = gpu_reference.run(gpu_reference.PIECES[:1], None, smoke=True, deadline=None)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert status == 130
    assert [child.signals for child in started] == [[signal.SIGTERM]]
    assert "interrupted in piece" in capsys.readouterr().err


# A piece's harness that runs a minute and is killed by SIGTERM (the script's own stop).
SLEEPS = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_stops_the_piece_and_exits_128_plus_its_number(tmp_path, sig, status):
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{SLEEPS}")
    python.chmod(0o755)
    child = subprocess.Popen(
        [sys.executable, SCRIPT, "run", "--python", str(python), "--piece", "2", "--fresh"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stop_signals,
    )
    try:
        for line in child.stdout:
            if line.strip() == "started":
                break
        child.send_signal(sig)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == status, err
    assert "interrupted in piece torch-fed" in err and "Traceback" not in err
