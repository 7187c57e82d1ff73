"""Which code made a report: the commit and uncommitted changes of a real (temporary) git checkout, the version from
its pyproject.toml, and null where they cannot be known (harness/reporting/provenance.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from common import sysinfo
from harness.reporting import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(root: Path, *args: str) -> str:
    """git in `root`, with an identity of its own and no user or system configuration."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "dpbench",
        "GIT_AUTHOR_EMAIL": "dpbench@example.invalid",
        "GIT_COMMITTER_NAME": "dpbench",
        "GIT_COMMITTER_EMAIL": "dpbench@example.invalid",
    }
    done = subprocess.run(
        ["git", *args], cwd=root, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A committed project: pyproject.toml and one module."""
    root = tmp_path / "suite"
    (root / "harness").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "dpbench"\nversion = "9.8.7"\n')
    (root / "harness" / "run.py").write_text("x = 1\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_a_clean_checkout_records_its_commit_version_and_host(checkout):
    assert provenance.record(checkout) == {
        "version": "9.8.7",
        "commit": git(checkout, "rev-parse", "HEAD"),
        "uncommitted_changes": False,
        "host": socket.gethostname(),
        "machine": {**sysinfo.machine(), "gpus": []},  # no GPUs given
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "harness" / "run.py").write_text("x = 2\n"),  # a tracked file edited
        lambda root: (root / "harness" / "new.py").write_text("y = 1\n"),  # a new file of code
        lambda root: (root / "harness" / "run.py").unlink(),
        lambda root: git(root, "mv", "harness/run.py", "harness/moved.py"),  # staged
        lambda root: (
            (root / "reports").mkdir() or git(root, "mv", "harness/run.py", "reports/run.py")
        ),
    ],
)
def test_uncommitted_changes_to_the_code_are_noticed(checkout, change):
    change(checkout)
    assert provenance.uncommitted_changes(checkout) is True


def test_what_the_suite_writes_into_its_tree_is_not_a_change(checkout):
    (checkout / "reports" / "20260101-000000-all").mkdir(parents=True)
    (checkout / "reports" / "20260101-000000-all" / "report.md").write_text("# a report\n")
    (checkout / ".venvs" / "harness").mkdir(parents=True)
    (checkout / ".venvs" / "harness" / "pyvenv.cfg").write_text("home = /usr\n")
    assert provenance.uncommitted_changes(checkout) is False
    (checkout / "notes.py").write_text("")  # but a file beside them is
    assert provenance.uncommitted_changes(checkout) is True


def test_a_new_commit_is_a_new_commit_id(checkout):
    first = provenance.git_commit(checkout)
    (checkout / "harness" / "run.py").write_text("x = 3\n")
    git(checkout, "commit", "-q", "-am", "second")
    assert provenance.git_commit(checkout) == git(checkout, "rev-parse", "HEAD") != first
    assert provenance.uncommitted_changes(checkout) is False


def test_a_copy_that_is_no_checkout_has_no_commit(tmp_path, checkout):
    copy = tmp_path / "copy"
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
    recorded = provenance.record(copy)
    assert recorded["commit"] is None and recorded["uncommitted_changes"] is None
    assert recorded["version"] == "9.8.7"


def test_a_copy_inside_another_checkout_is_not_that_checkouts_commit(checkout):
    inner = checkout / "vendored" / "suite"
    inner.mkdir(parents=True)
    (inner / "pyproject.toml").write_text('[project]\nname = "dpbench"\nversion = "1.0.0"\n')
    assert provenance.git_commit(checkout) and provenance.git_commit(inner) is None


def test_without_git_the_commit_is_unknown(checkout, monkeypatch):
    monkeypatch.setenv("PATH", str(checkout / "no-such-dir"))
    recorded = provenance.record(checkout)
    assert recorded["commit"] is None and recorded["uncommitted_changes"] is None


def test_a_renamed_file_counts_where_it_was_and_where_it_is():
    moved_into_reports = "R  reports/old.md\0docs/old.md\0"
    assert provenance.changed_paths(moved_into_reports) == ["reports/old.md", "docs/old.md"]
    assert provenance.changed_paths(" M harness/run.py\0?? reports/x/\0") == [
        "harness/run.py",
        "reports/x/",
    ]
