"""kern inside another server (a host): the host schedules, caches and samples; kern runs the
manifest's programs as the forward pass. batch.py maps the host's batch onto the serving
protocol, layout.py checks the host's memory against the manifest's host states (both pure);
vllm/ is the vLLM plugin (torch and vllm, imported only inside vLLM's process)."""
