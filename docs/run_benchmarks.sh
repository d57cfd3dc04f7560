#!/usr/bin/env bash
# The runs behind docs/benchmarks.md. Run on a quiet machine (nothing else using a
# core: llama.cpp's threads wait on each other when one is descheduled).
# Each writes its full JSON next to this script, in docs/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
out=docs/bench
mkdir -p "$out"

# 1. llama.cpp backend, n-gram drafter, against llama-cpp-python (chat completion, prompt lookup).
specdeck-cli bench --target default --drafter ngram --max-tokens 128 --repeat 3 --peers \
  --json "$out/llama-ngram.json" | tee "$out/llama-ngram.txt"

# 2. PyTorch backend, bf16 (this CPU's automatic dtype), n-gram drafter, against transformers'
#    generate (plain and prompt lookup) in the same dtype on the same weights.
specdeck-cli bench --target default --backend torch --dtype bfloat16 --drafter ngram --max-tokens 128 \
  --repeat 2 --peers --json "$out/torch-bf16-ngram.json" | tee "$out/torch-bf16-ngram.txt"

# 3. PyTorch backend, best configuration: int8 weights, bf16 compute, n-gram drafter.
specdeck-cli bench --target default --backend torch --dtype int8 --drafter ngram --max-tokens 128 \
  --repeat 2 --json "$out/torch-int8-ngram.json" | tee "$out/torch-int8-ngram.txt"

# 4. PyTorch backend, bf16, the shipped Medusa heads.
specdeck-cli bench --target default --backend torch --dtype bfloat16 --drafter medusa --max-tokens 128 \
  --repeat 2 --json "$out/torch-bf16-medusa.json" | tee "$out/torch-bf16-medusa.txt"

# 5-7. PyTorch backend, bf16: the shipped EAGLE head, lookahead decoding, self-speculative early exit
#      (2026-11-30; run 4 again for the Medusa heads shipped the same day).
for drafter in eagle lookahead early-exit; do
  specdeck-cli bench --target default --backend torch --dtype bfloat16 --drafter "$drafter" --max-tokens 128 \
    --repeat 2 --json "$out/torch-bf16-$drafter.json" | tee "$out/torch-bf16-$drafter.txt"
done
