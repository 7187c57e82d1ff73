"""One package per framework, with the same file names in each (read them side by side):

  backend.toml      name, aliases, strategies and what each needs (read by the harness, no imports)
  requirements.txt  the pinned environment .venvs/<name>/ is built from
  models.py         resnet18, lenet, and the canonical <-> native weight mapping
  parallel.py       devices, split, allreduce
  strategies.py     one Trainer per strategy (see common/loop.py), run(), train_steps()
  environment.py    versions, devices, threads, precision settings
  __main__.py       the worker: python -m backends.<name> --config C --result R
"""
