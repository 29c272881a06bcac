"""bench/ is a package only so that its probes run as modules from the repository root
(`python3 -m bench.probes.kda_tc`), where the test helpers they use import as tests.cuda.*
with no path set by hand. The scripts at this level are still run as files,
`python3 bench/<script>.py` (bench/README.md): bench/ is then their sys.path[0], and they import
their siblings by bare name (`from shared import ...`)."""
