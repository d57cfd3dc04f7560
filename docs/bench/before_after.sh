#!/usr/bin/env bash
# Speedups before and after a change, on one machine in one sitting: docs/run_benchmarks.sh's seven
# configurations, alternating per configuration between commit REV and the working tree, one repeat
# each (peers left out: their code is not ours). Then: python docs/bench/before_after.py OUT
#
#   bash docs/bench/before_after.sh be210f4 /tmp/ab     # issue 13: the commit before the redesign
set -uo pipefail
rev=${1:?usage: before_after.sh REV OUT}; out=${2:?usage: before_after.sh REV OUT}
root=$(cd "$(dirname "$0")/../.." && pwd)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$out/base"
git -C "$root" archive "$rev" | tar -x -C "$out/base"
# The command line's module moved in the redesign (engine/cli.py -> engine/cli/main.py).
base_cli=engine.cli; [ -f "$out/base/engine/cli/main.py" ] && base_cli=engine.cli.main
configs=(
  "llama-ngram|--target default --drafter ngram"
  "torch-bf16-ngram|--target default --backend torch --dtype bfloat16 --drafter ngram"
  "torch-int8-ngram|--target default --backend torch --dtype int8 --drafter ngram"
  "torch-bf16-medusa|--target default --backend torch --dtype bfloat16 --drafter medusa"
  "torch-bf16-eagle|--target default --backend torch --dtype bfloat16 --drafter eagle"
  "torch-bf16-lookahead|--target default --backend torch --dtype bfloat16 --drafter lookahead"
  "torch-bf16-early-exit|--target default --backend torch --dtype bfloat16 --drafter early-exit"
)
cd "$out"  # not the checkout: PYTHONPATH decides which engine runs
for entry in "${configs[@]}"; do
  name=${entry%%|*}; args=${entry#*|}
  # shellcheck disable=SC2086 # the arguments are meant to split
  PYTHONPATH="$out/base" python -m $base_cli bench $args --max-tokens 128 --repeat 1 --json "$out/base-$name.json" \
    > "$out/base-$name.txt" 2>&1
  echo "$(date +%T) before $name: exit $?"
  # shellcheck disable=SC2086
  PYTHONPATH="$root" python -m engine.cli.main bench $args --max-tokens 128 --repeat 1 --json "$out/new-$name.json" \
    > "$out/new-$name.txt" 2>&1
  echo "$(date +%T) after $name: exit $?"
done
