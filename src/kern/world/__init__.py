"""One engine or many: open_engine (stepping.py), the one way to open an engine for a verified
deployment, split or not, and StepEngine, the face the layers above drive; a split deployment's
ranks as threads of one process (ranks.py) or as processes under torchrun or Slurm
(processes.py)."""
