"""The llama family's manifests, one module a target: cpu.py, cuda.py (sm_90a, per op), mega.py
(sm_90a, decode as one kernel) and tp.py (any of them split over ranks), on what common.py
gives them all."""
