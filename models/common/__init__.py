"""What the model families share: building and pinning cubins (cubins.py), the CUDA helpers
every family's kernels include (cuda/), seeded random checkpoints (random_checkpoint.py), the
GGUF import (gguf_to_hf.py), the generators' error (errors.py), face (generator.py) and
manifest writing (deployment.py)."""
