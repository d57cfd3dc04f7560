#!/usr/bin/env bash
# Train the EAGLE head and the Medusa heads shipped for the embedded SmolLM2-135M-Instruct
# (resources/heads/{eagle,medusa}-smollm2-135m), and an EAGLE-3 head for it (a candidate for
# resources/heads/eagle3-smollm2-135m), with `specdeck-cli train-heads`, on one GPU.
#
#   bash docs/gpu/train_heads.sh PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR
#
# The GGUF is dequantized once into a float32 model folder (transformers parses a GGUF
# slowly, and three runs load the target), then: the target writes its own replies to
# SELF_GENERATE built-in prompts (batched on the GPU; the benchmark prompts are never among
# them), the EAGLE head trains on those replies plus the built-in text, and the EAGLE-3 and
# Medusa heads train on the same data (the replies are reused, not generated again). Each
# training stops after LIMIT_EAGLE / LIMIT_EAGLE3 / LIMIT_MEDUSA seconds at most; heads are saved at every
# checkpoint, so what a stopped run has is kept. The heads and the replies end up in OUT_DIR.
#
# The EAGLE-3 head ships only if it beats the shipped EAGLE-2 head's tokens per target forward
# at the same node budget: the last step runs docs/bench/head_accuracy.py on OUT_DIR's heads
# (COMPARE=0 skips it), which prints both, and the agreement per depth.
#
# Settings come from the environment; the defaults are the ones the shipped heads used.
# A dry run on a CPU: DEVICE=cpu STEPS=3 SELF_GENERATE=4 GEN_TOKENS=16 CACHE=2048 BATCH=2 ...
set -euo pipefail
GGUF=$1
OUT=$2
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-1200}
SELF_GENERATE=${SELF_GENERATE:-630}
GEN_TOKENS=${GEN_TOKENS:-512}
CACHE=${CACHE:-0}  # target features to cache (0 = all the data)
BATCH=${BATCH:-64}
LIMIT_EAGLE=${LIMIT_EAGLE:-260}  # seconds, self-generation included
LIMIT_EAGLE3=${LIMIT_EAGLE3:-300}  # seven depths per step, and the cache holds four hidden states per token
COMPARE=${COMPARE:-1}
LIMIT_MEDUSA=${LIMIT_MEDUSA:-180}
WORK=${WORK:-/tmp/specdeck-heads}
TARGET=$WORK/SmolLM2-135M-Instruct
mkdir -p "$WORK" "$OUT"

if [ ! -f "$TARGET/config.json" ]; then
  python3 - "$GGUF" "$TARGET" <<'PY'
import sys, time
from engine.backends.hf.backend import TorchBackend
start = time.time()
backend = TorchBackend(sys.argv[1], dtype="float32", device="cpu")
backend._model.save_pretrained(sys.argv[2])
backend._tok.save_pretrained(sys.argv[2])
backend.close()
print(f"[convert] {sys.argv[1]} -> {sys.argv[2]} in {time.time() - start:.0f} s", flush=True)
PY
fi

common=(--target "$TARGET" --data builtin --self-generate "$SELF_GENERATE" --gen-max-tokens "$GEN_TOKENS"
        --objective features --cache-tokens "$CACHE" --steps "$STEPS" --batch-size "$BATCH" --seq-len 256
        --lr 1e-3 --device "$DEVICE" --dtype bfloat16 --checkpoint-every 100 --log-every 100 --resume)

timeout "$LIMIT_EAGLE" python3 -m engine.cli.main train-heads --kind eagle --draft-vocab 8192 --out "$WORK/eagle" "${common[@]}" \
  || echo "[eagle] stopped (status $?)"
# The replies file of engine/training/checkpoint.py (REPLIES_FILE), reused by the later runs.
REPLIES=self_generated.jsonl
for kind in eagle3 medusa; do
  mkdir -p "$WORK/$kind/training"
  cp -n "$WORK/eagle/training/$REPLIES" "$WORK/$kind/training/$REPLIES" 2>/dev/null || true
done
timeout "$LIMIT_EAGLE3" python3 -m engine.cli.main train-heads --kind eagle3 --draft-vocab 8192 --out "$WORK/eagle3" "${common[@]}" \
  || echo "[eagle3] stopped (status $?)"
timeout "$LIMIT_MEDUSA" python3 -m engine.cli.main train-heads --kind medusa --heads 4 --layers 1 --out "$WORK/medusa" "${common[@]}" \
  || echo "[medusa] stopped (status $?)"

for kind in eagle eagle3 medusa; do
  mkdir -p "$OUT/$kind-smollm2-135m"
  cp "$WORK/$kind"/*.json "$WORK/$kind"/*.safetensors "$OUT/$kind-smollm2-135m/" 2>/dev/null || echo "[$kind] no heads saved"
done
cp "$WORK/eagle/training/$REPLIES" "$OUT/replies.jsonl" 2>/dev/null || true
ls -la "$OUT" "$OUT"/*

# EAGLE-3 against the shipped EAGLE-2 head (on the GPU's CPU: the embedded model in bfloat16, as the
# shipped heads were measured); copy eagle3-smollm2-135m into resources/heads/ only if it drafts more
# tokens per forward.
if [ "$COMPARE" = 1 ] && [ -f "$OUT/eagle3-smollm2-135m/config.json" ]; then
  SPECDECK_EAGLE3_HEADS="$OUT/eagle3-smollm2-135m" python3 docs/bench/head_accuracy.py | tee "$OUT/head_accuracy.txt"
fi
