"""Reporting: what the harness makes of the results, read as the untrusted files they are; it starts no worker.
document.py stages the report and writes it whole (report.md, results.json, the plots) from tables.py, steps.py,
outcomes.py, sections.py, plots.py and published.py (its numbers, its step times, its run-by-run listings, prose,
figures, and the published figures it quotes); trials.py says which repeated trials count; provenance.py, which
code made a report, and where; leftovers.py keeps a killed harness's staging directory as a report of its finished
runs; comparison.py says whether a run is slower or faster than another beyond noise (compare, history and parity
read it), reasons.py why a strategy's step is slower than its idiom's, read off their profiles."""
