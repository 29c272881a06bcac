# Source on the device machine (no network): install carried wheels, make kern and kern_models importable.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
mkdir -p /tmp/km && ln -sfn "$PWD/models" /tmp/km/kern_models
export PYTHONPATH=/tmp/site:$PWD/src:/tmp/km PYTHONUNBUFFERED=1 KERN_CACHE=/tmp/kern-cache
