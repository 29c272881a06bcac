"""What kern reads from disk beside the manifest: JSON files, a checkpoint's safetensors and the
weights bound from them to a manifest's buffers, kernel modules fetched and checked against
their pinned sha256. Below the runtime, which opens an engine from them."""
