"""`harness history`: each configuration's figures across reports, in time order, with compare's marks; synthetic
reports with a planted slow one, no framework."""

from __future__ import annotations

import json

import numpy as np

from tests.harness.helpers import run_harness
from tests.harness.test_compare import NO_MACHINE, run_dict, write_runs
from tests.harness.test_machine import AVX2_ONLY, ZEN4


def reports(tmp_path, slowdowns: list[float], machines: list | None = None) -> list:
    """One report per slowdown of torch scratch on 1 device (3 trials of 20 steps each, 3% noise), started in
    that order, each from its own commit, on its machine of `machines` (None: not recorded; default: ZEN4)."""
    machines = machines or [ZEN4] * len(slowdowns)
    rng = np.random.default_rng(0)
    paths = []
    for i, slowdown in enumerate(slowdowns):
        runs = [
            run_dict(
                "torch",
                "scratch",
                1,
                list(0.1 * slowdown * (1 + 0.03 * rng.standard_normal(20))),
                trial,
            )
            for trial in (1, 2, 3)
        ]
        path = write_runs(
            tmp_path / "reports" / f"2026112{i}-000000-torch",
            runs,
            {
                **NO_MACHINE,
                "commit": f"{i}" * 40,
                **({"machine": machines[i]} if machines[i] else {}),
            },
        )
        doc = json.loads((path / "results.json").read_text())
        (path / "results.json").write_text(
            json.dumps({**doc, "started": f"2026-11-2{i} 00:00:00 UTC"})
        )
        paths.append(path)
    return paths


def test_a_planted_slow_report_is_marked_where_it_happened_and_the_rest_are_not(tmp_path):
    reports(tmp_path, [1.0, 1.01, 1.3, 1.3])
    (tmp_path / "reports" / "notes").mkdir()  # a foreign folder
    bad = tmp_path / "reports" / "20261129-000000-bad"
    bad.mkdir()
    (bad / "results.json").write_text("{not json")
    out = tmp_path / "history"
    result = run_harness("history", str(tmp_path / "reports"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 2026")]
    assert [row.split(" | ")[2] for row in rows] == ["0000000", "1111111", "2222222", "3333333"]
    marks = [row.split(" | ")[7] for row in rows]
    assert marks == ["", "~", "+", "~"], rows
    # the median step as measured: 100 ms, then 130 (3% noise)
    steps = [float(row.split(" | ")[3]) for row in rows]
    assert np.allclose(steps, [100, 101, 130, 130], rtol=0.02), steps
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 2 and all(len(line.splitlines()) == 1 for line in skipped)
    assert any("notes" in line for line in skipped) and any("bad" in line for line in skipped)
    assert (out / "history.md").read_text().startswith("# History")
    pngs = list(out.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 1000


def test_nothing_readable_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_harness("history", str(tmp_path / "empty"), "--out", str(tmp_path / "h"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("harness: error: no readable report")
    assert "Traceback" not in result.stderr


def test_a_report_from_another_machine_is_marked_x_naming_it_and_one_without_its_machine_is_not(
    tmp_path,
):
    """The step that is the host's (AVX-512 to AVX2 only) is x; a step from a report that recorded no machine
    keeps its mark, saying the machine is unknown."""
    reports(tmp_path, [1.0, 1.3, 1.3, 1.7], [ZEN4, AVX2_ONLY, None, AVX2_ONLY])
    result = run_harness("history", str(tmp_path / "reports"), "--out", str(tmp_path / "history"))
    assert result.returncode == 0, result.stderr
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| 2026")]
    steps = [float(row[3]) for row in rows]
    assert np.allclose(steps, [100, 130, 130, 170], rtol=0.02), steps
    assert [(row[7], row[8].rstrip(" |")) for row in rows] == [
        ("", ""),
        ("x", "another machine: AVX-512 AVX512-BF16 -> AVX2 only"),
        ("~", ""),
        ("+", "machine unknown for OLD"),
    ]


def test_a_folder_that_does_not_exist_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nonexistent"
    result = run_harness("history", str(missing), "--out", str(tmp_path / "h"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"harness: error: no readable report in {missing} ({missing}: not a folder)"
    ]


def test_a_report_another_one_resumed_is_counted_once(tmp_path):
    """A resumed report holds the finished runs of the report it took up, as they were: history counts them once,
    from the resumed one, and says which it skipped."""
    first, resumed, _ = reports(tmp_path, [1.0, 1.0, 1.0])
    doc = json.loads((resumed / "results.json").read_text())
    doc["resumed"] = {"from": str(first), "at": "2026-11-21 00:00:00 UTC"}
    (resumed / "results.json").write_text(json.dumps(doc))
    result = run_harness("history", str(tmp_path / "reports"), "--out", str(tmp_path / "history"))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 2026")]
    assert [row.split(" | ")[2] for row in rows] == ["1111111", "2222222"]
    assert f"skipped {first}: {resumed} resumed it and holds its finished runs" in result.stderr
