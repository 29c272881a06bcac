"""The cpu target's kernel modules, copied into a deployment as they are: kernels.py (every op
of the cpu manifest) and collectives.py (the tensor-parallel split's all-reduce and all-gather)."""
