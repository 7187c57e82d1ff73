"""Nodes: a run on several nodes, framework-free. nodes.py reads the topology (--nodes, --node-rank,
--coordinator or Slurm's variables); across hosts, rollcall.py is the nodes' meeting before each run and watch.py
the run's heartbeats, which name a lost node."""
