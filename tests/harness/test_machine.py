"""The machine a report was made on (common/sysinfo.py machine, harness/reporting/provenance.py): cpuinfo read into
the CPU's identity and vector sets, the report header's line, and the words compare and history name a difference
with. Small inline cpuinfo samples, no /proc needed."""

from __future__ import annotations

from common import sysinfo
from common.results import provenance_problem
from harness.reporting import document, provenance

# The first processor of an AVX2-only host (AMD Zen 3): two processors, the second must not be read.
AVX2_ONLY_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another CPU
flags\t\t: avx512f
"""
# A Zen 4 host: AVX-512 with bfloat16 (no AMX, Intel's).
ZEN4_CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 fma avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni
"""
# Sapphire Rapids: AVX-512 and AMX's tiles with their bfloat16 multiply.
SAPPHIRE_RAPIDS_FLAGS = "avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"

ZEN4 = {
    "cpu": "AMD EPYC 9R14",
    "cpu_vendor": "AuthenticAMD",
    "cpu_family": 25,
    "cpu_model": 17,
    "vector_isa": ["AVX2", "AVX-512", "AVX512-BF16"],
    "cpus": 2,
    "gpus": [],
}
AVX2_ONLY = {**ZEN4, "vector_isa": ["AVX2"]}  # the same CPU but for its vector sets


def test_an_avx2_only_host_and_a_zen4_host_are_read_from_cpuinfo():
    assert sysinfo.cpu_identity(AVX2_ONLY_CPUINFO) == {
        "cpu": "AMD EPYC 7B13",
        "cpu_vendor": "AuthenticAMD",
        "cpu_family": 25,
        "cpu_model": 1,
        "vector_isa": ["AVX2"],
    }
    assert sysinfo.cpu_identity(ZEN4_CPUINFO) == {
        "cpu": "AMD EPYC 9R14",
        "cpu_vendor": "AuthenticAMD",
        "cpu_family": 25,
        "cpu_model": 17,
        "vector_isa": ["AVX2", "AVX-512", "AVX512-BF16"],
    }
    amx = sysinfo.cpu_identity(f"flags : {SAPPHIRE_RAPIDS_FLAGS}\n")["vector_isa"]
    assert amx == ["AVX2", "AVX-512", "AVX512-BF16", "AMX", "AMX-BF16"]


def test_cpuinfo_that_is_missing_or_odd_gives_unknowns_not_an_exception(tmp_path, monkeypatch):
    unknown = dict.fromkeys(("cpu", "cpu_vendor", "cpu_family", "cpu_model", "vector_isa"))
    odd = "\n\nno colon here\ncpu family : -3\nmodel : ²\n\x00 : \x00\n"
    assert sysinfo.cpu_identity("") == sysinfo.cpu_identity(odd) == unknown
    # flags listed but none of the vector sets: known to have none, not unknown
    assert sysinfo.cpu_identity("flags : fpu sse2\n")["vector_isa"] == []
    monkeypatch.setattr(sysinfo, "CPUINFO", str(tmp_path / "absent"))
    machine = sysinfo.machine()
    assert machine["vector_isa"] is None and machine["cpu_family"] is None
    assert machine["cpus"] == sysinfo.usable_cpus() >= 1
    assert provenance_problem({"machine": {**machine, "gpus": []}}) is None


def header(machine: dict | None) -> str:
    """report.md's Host line for a report whose provenance records `machine` (None: recorded none)."""
    recorded = {"version": "0.1.0", "commit": None, "uncommitted_changes": None, "host": "vm"}
    meta = {
        "run_id": "r",
        "command": "python -m harness",
        "started": "now",
        "preset": "quick",
        "data_source": "synthetic",
        "provenance": recorded if machine is None else {**recorded, "machine": machine},
    }
    text = document.render([], meta, {})
    (line,) = [line for line in text.splitlines() if line.startswith("- Host:")]
    return line


def test_the_header_names_the_cpu_its_vector_sets_cores_and_gpu():
    assert header({**ZEN4, "gpus": ["NVIDIA H200"]}) == (
        "- Host: AMD EPYC 9R14 (family 25, model 17), AVX2 AVX-512 AVX512-BF16, 2 cores; GPU NVIDIA H200"
    )
    assert header({**AVX2_ONLY, "cpu_family": None, "cpu_model": None, "cpus": 16}) == (
        "- Host: AMD EPYC 9R14, AVX2, 16 cores"
    )
    assert header({"cpu": None, "vector_isa": None, "gpus": ["NVIDIA H200"] * 8}) == (
        "- Host: unknown CPU, vector sets unknown, cores unknown; GPUs 8x NVIDIA H200"
    )
    assert (
        header(None) == "- Host: not recorded"
    )  # a report written before the machine was recorded


def test_a_machine_difference_is_named_in_a_few_words_and_only_where_both_sides_know():
    change = provenance.machine_change
    assert change(ZEN4, AVX2_ONLY) == "AVX-512 AVX512-BF16 -> AVX2 only"
    assert change(AVX2_ONLY, ZEN4) == "AVX2 only -> AVX-512 AVX512-BF16"
    assert change(ZEN4, {**ZEN4, "cpus": 16}) == "2 -> 16 cores"
    assert change({**ZEN4, "gpus": ["NVIDIA H100"]}, {**ZEN4, "gpus": ["NVIDIA H200"]}) == (
        "GPU NVIDIA H100 -> GPU NVIDIA H200"
    )
    assert change(ZEN4, {**ZEN4, "cpu_model": 1}) == (
        "AMD EPYC 9R14 (family 25, model 17) -> AMD EPYC 9R14 (family 25, model 1)"
    )
    assert change(ZEN4, {**ZEN4, "vector_isa": ["AVX512-BF16", "AVX2", "AVX-512"]}) is None
    assert (
        change(ZEN4, {**ZEN4, "vector_isa": None, "cpus": None}) is None
    )  # unknown: no difference
    assert change(ZEN4, None) is None and change(ZEN4, ZEN4) is None


def test_compares_line_names_a_machine_difference_or_says_a_machine_is_unknown():
    code = {"version": "0.1.0", "commit": "a" * 40, "uncommitted_changes": False, "host": "vm"}
    zen4, avx2 = {**code, "machine": ZEN4}, {**code, "machine": AVX2_ONLY}
    assert provenance.difference(zen4, avx2) == (
        "Code or host differ: machine AVX-512 AVX512-BF16 -> AVX2 only"
    )
    assert provenance.difference(zen4, zen4) is None
    assert provenance.difference(code, zen4) == "Machine unknown for OLD"
    assert provenance.difference({**code, "host": "gpu-7"}, code) == (
        "Code or host differ: hosts gpu-7 vs vm; machine unknown for OLD and NEW"
    )


def test_a_machine_that_is_not_names_and_numbers_is_refused():
    assert provenance_problem({"machine": ZEN4}) is None
    assert provenance_problem({"machine": {"cpus": "2"}}) == (
        "provenance.machine.cpus is not a whole number"
    )
    assert provenance_problem({"machine": {"vector_isa": "AVX2"}}) == (
        "provenance.machine.vector_isa is not a list of names"
    )
    assert provenance_problem({"machine": {"gpus": ["H200\nx"]}}) == (
        "provenance.machine.gpus is not a list of names"
    )
    assert provenance_problem({"machine": []}) == "provenance.machine is a list, not an object"
