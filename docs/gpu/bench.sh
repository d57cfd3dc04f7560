#!/usr/bin/env bash
# SpecDeck's decode speed on a lent GPU, in one table, in under 8 minutes (issue 17, part 4).
#
#   bash docs/gpu/bench.sh            # the full run: CUDA, bf16 (the machine needs no internet)
#   bash docs/gpu/bench.sh --smoke    # every section at tiny sizes on the CPU, well under a minute
#
# The measuring is docs/gpu/bench_gpu.py (its docstring says what each row is). Each section has
# a time budget; should the whole run still pass LIMIT seconds, it is stopped and the table of
# what was measured is printed from the cells it wrote as it went ($OUT). Copy the output into
# docs/benchmarks.md with the date and the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
LIMIT=${LIMIT:-470}
OUT=${OUT:-$(mktemp -t specdeck-gpu-bench-XXXXXX.json)}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# The script runs this checkout's engine; an install is needed only for the dependencies.
if ! python3 -c "import engine, torch, transformers, safetensors, llama_cpp" 2>/dev/null; then
  echo "bench: installing this checkout (no dependencies are downloaded)" >&2
  python3 -m pip install -q --no-deps --no-build-isolation -e . >&2 || true
fi

timeout -k 10 "$LIMIT" python3 docs/gpu/bench_gpu.py --out "$OUT" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "bench: stopped after $LIMIT s; the table of what was measured:" >&2
  python3 docs/gpu/bench_gpu.py --table "$OUT"
fi
exit "$rc"
