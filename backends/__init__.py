"""One package per framework, with the same file names in each (read them side by side):

backend.toml      name, aliases, strategies and what each needs (read by the harness, no imports)
requirements.txt  the pinned environment .venvs/<name>/ is built from
models.py         resnet18, lenet, resnet50, the canonical <-> native weight mapping, predict
parallel.py       devices, split, allreduce
strategies.py     one Trainer per strategy (common/trainer.py), REFERENCE, make_trainer, train, measure
environment.py    versions, devices, threads, precision settings, and refusal (what backend.toml cannot say)
distributed.py    the strategies' engine across processes and nodes
__init__.py       the interface: its entry points from common/backend.py's Backend
__main__.py       the worker: python -m backends.<name> --config C --result R
"""
