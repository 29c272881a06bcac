"""The llama family's kernels: cuda/ (the sm_90a sources, their pinned cubins and the typed
table of what a manifest launches) and cpu/ (the numpy modules the cpu manifests load)."""
