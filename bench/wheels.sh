# The wheels a GPU call carries in .whl/: kern's runtime and test dependencies that the device
# image lacks (or holds older than kern needs), at the versions constraints.txt pins (what CI
# tests), for the image's Python 3.12 on x86-64. Run here, from the repository root, before the
# first device call of a session; every recipe in bench/ installs .whl/*.whl into /tmp/site.
#
#   bash bench/wheels.sh        then carry [".whl"]
#
# The list is the device image's gaps as seen there: without openai's httpx2 chain the serve GPU
# tests skip ("could not import 'openai'"); without fastapi's opentelemetry-api they skip too ("No
# module named 'opentelemetry'"); either way the GPU suite is not whole. setuptools is the build
# backend pyproject.toml names: a user's `pip install .` (vllm_kern_gpu.sh's CLEAN=1) builds kern
# in an isolated env that finds it only here, offline.
set -euo pipefail
PKGS="pydantic pydantic-core annotated-types typing-inspection typing-extensions annotated-doc
fastapi opentelemetry-api starlette uvicorn h11 anyio sniffio idna llguidance gguf
openai jiter httpx2 httpcore2 truststore
jsonschema jsonschema-specifications referencing rpds-py setuptools"
pins=()
for p in $PKGS; do
  pin=$(grep -iE "^${p}==" constraints.txt || true)
  [ -n "$pin" ] || { echo "bench/wheels.sh: $p is not pinned in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 -d .whl "${pins[@]}"
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
echo "$(ls .whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1))"
