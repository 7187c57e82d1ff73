"""results.schema.json: generated from the result dataclasses, committed, and every committed report's results.json
valid against it (with the `jsonschema` package, as another tool would validate)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from common import schema
from tests.harness.helpers import ROOT

COMMITTED = ROOT / "results.schema.json"
REPORTS = sorted((ROOT / "reports").glob("*/results.json"))


def test_the_committed_schema_is_the_one_the_dataclasses_give():
    """After a result or config field changes: python3 -m common.schema > results.schema.json"""
    assert json.loads(COMMITTED.read_text()) == schema.results_schema()


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(schema.results_schema())


@pytest.mark.parametrize("path", REPORTS, ids=[p.parent.name for p in REPORTS])
def test_every_committed_report_is_valid(path):
    jsonschema.validate(json.loads(path.read_text()), schema.results_schema())


def trained(doc: dict) -> dict:
    """The first run of a report that trained (some runs are refusals, with no epochs)."""
    return next(run for run in doc["runs"] if run.get("epochs"))


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda doc: trained(doc).update(status="fine"), "status"),
        (lambda doc: trained(doc)["config"].pop("backend"), "backend"),
        (lambda doc: trained(doc)["epochs"][0].update(time_s="fast"), "'fast' is not valid"),
        (lambda doc: doc.pop("started"), "started"),
    ],
)
def test_a_report_that_breaks_the_format_is_not_valid(change, where):
    doc = json.loads(REPORTS[-1].read_text())
    change(doc)
    with pytest.raises(jsonschema.ValidationError, match=where):
        jsonschema.validate(doc, schema.results_schema())
