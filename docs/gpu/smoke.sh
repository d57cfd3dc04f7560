#!/usr/bin/env bash
# A one-minute check of the GPU paths on a tiny random Llama: batched self-generation,
# EAGLE and Medusa training, and EAGLE / Medusa decoding on CUDA (greedy output must equal
# plain decoding in float32).
#
#   bash docs/gpu/smoke.sh TOKENIZER_DIR
#
# TOKENIZER_DIR holds the SmolLM2 tokenizer files (tokenizer.json, tokenizer_config.json,
# chat_template.jinja), e.g. those of a converted embedded model.
set -euo pipefail
TOK=$1
WORK=${WORK:-/tmp/specdeck-smoke}
DEVICE=${DEVICE:-cuda}
TINY=$WORK/tiny
mkdir -p "$TINY"
python3 - "$TINY" <<'PY'
import sys, torch, transformers
config = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                  bos_token_id=1, eos_token_id=2, max_position_embeddings=2048)
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).save_pretrained(sys.argv[1])
PY
cp "$TOK"/tokenizer.json "$TOK"/tokenizer_config.json "$TOK"/chat_template.jinja "$TINY"/
small=(--target "$TINY" --data builtin --self-generate 4 --gen-max-tokens 16 --cache-tokens 2048 --steps 5
       --batch-size 4 --seq-len 64 --device "$DEVICE" --dtype bfloat16 --log-every 5 --resume)
python3 -m engine.cli.main train-heads --kind eagle --draft-vocab 2048 --out "$WORK/eagle" "${small[@]}"
python3 -m engine.cli.main train-heads --kind medusa --heads 3 --out "$WORK/medusa" "${small[@]}"
for kind in eagle medusa; do
  python3 -m engine.cli.main generate --target "$TINY" --drafter "$kind" --heads "$WORK/$kind" --device "$DEVICE" \
    --dtype float32 --k 8 --prompt "Write a short poem about the sea." --max-tokens 24 --compare --json \
    | python3 -c "import json,sys; r=json.load(sys.stdin); print('$kind', 'identical:', r['identical'], 'drafted:', r['stats']['drafted'], 'tokens per step:', r['stats'].get('tokens_per_step'))"
done
