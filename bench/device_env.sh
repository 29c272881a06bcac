# Sourced by the one-call device scripts (from the repository root, $OUT set, .whl carried): the
# carried wheels installed into /tmp/site, kern and kern_models (this tree's models/) importable,
# the GPU named.
: "${OUT:?set OUT, the folder whose files come back from the device call}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  > "$OUT/pip.log" 2>&1 || { tail -3 "$OUT/pip.log"; exit 1; }
mkdir -p /tmp/km && ln -sfn "$PWD/models" /tmp/km/kern_models
export PYTHONPATH="/tmp/site:$PWD/src:/tmp/km" PYTHONUNBUFFERED=1 KERN_CACHE=/tmp/kern-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
