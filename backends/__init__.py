"""One package per framework, with the same file names in each (read them side by side):

backend.toml      name, aliases, strategies and what each needs (read by the harness, no imports)
requirements.txt  the pinned environment .venvs/<name>/ is built from
models.py         resnet18, lenet, resnet50, the canonical <-> native weight mapping, predict
parallel.py       devices, split, allreduce; array, to_numpy, device_of for the tests
strategies.py     one Trainer per strategy (common/trainer.py), TRAINERS, REFERENCE
environment.py    versions, devices, threads, precision settings, and refusal (what backend.toml cannot say)
distributed.py    the strategies' engine across processes and nodes (join, leave), where each runs (launch)
__init__.py       BACKEND, its common.backend.Backend built from the modules above
__main__.py       the worker: python -m backends.<name> --config C --result R

Beside them, xla.py: the count of XLA's compilations, which jax's trainers and Keras's distribution share.
"""
