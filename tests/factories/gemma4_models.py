"""A tiny random Gemma 4 target and its assistant (transformers' gemma4_assistant), for tests.

`make_gemma4_pair(folder)` writes two folders side by side, as Google publishes them and a
user downloads them (gemma-4-e2b-it beside gemma-4-e2b-it-assistant):

- `folder/gemma-4-tiny`: a Gemma 4 model (the multimodal wrapper, model_type gemma4, the language
  model under model.language_model.*; `text_only=True` writes gemma4_text instead), 4 layers
  of hidden size 64 (sliding, full, sliding, full; the last two reuse the keys and values of
  the first two, as Gemma 4's small models do, so layers 0 and 1 are the ones an assistant
  reads), per-layer inputs of size 8, the SmolLM2 tokenizer;
- `folder/gemma-4-tiny-assistant`: its assistant, 2 layers (sliding, full) with no key or value
  projections, reading the target's hidden size 64 (backbone_hidden_size) and attending to
  layers 0 and 1's keys and values.

Kinds, as tests/factories/mtp_models.py's:
- "random": every weight random; the assistant's drafts are mostly rejected.
- "bigram": the target's layers write little (their output norms scaled by `leak`), so its
  next token depends mostly on the current one through its (untied) LM head; the assistant
  projects the token's embedding straight through, writes nothing in its layers and shares
  that LM head: most drafts are accepted, and where the target's layers leak in some are not.

`hidden` changes the target's hidden size (an assistant for another model: the assistant
still reads 64); `ordered=True` gives the assistant the ordered (centroid) LM head.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tests.factories.hf_models import BOS_ID, EMBEDDING_STD, EOS_ID, LAYER_GAIN, LOGIT_STD, VOCAB_SIZE, tokenizer_dir

BACKBONE = 64
TARGET, ASSISTANT = "gemma-4-tiny", "gemma-4-tiny-assistant"


def _text_config(hidden: int, n_layers: int, shared: int, sliding_window: int, per_layer: int, **extra) -> dict:
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        layer_types=["sliding_attention", "full_attention"] * (n_layers // 2),
        sliding_window=sliding_window,
        max_position_embeddings=2048,
        hidden_size_per_layer_input=per_layer,
        vocab_size_per_layer_input=VOCAB_SIZE if per_layer else 0,
        num_kv_shared_layers=shared,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=0,
        initializer_range=EMBEDDING_STD,
        **extra,
    )


def _random(shape, seed: int, name: str, std: float):
    import torch

    g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha1(f"{seed}:{name}".encode()).digest()[:7], "big"))
    return torch.randn(shape, generator=g) * std


def _fill(model, seed: int, leak: float | None) -> None:
    """Random weights as tests/factories/hf_models.py draws them; with `leak`, the layers' output
    norms (what each layer adds to the residual stream) scaled by it."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                output = any(k in name for k in ("post_attention", "post_feedforward", "post_per_layer"))
                param.fill_(leak if (leak is not None and output) else 1.0)
            elif param.dim() >= 2 and "embed" not in name and "lm_head" not in name:
                param.copy_(_random(param.shape, seed, name, LAYER_GAIN / param.shape[-1] ** 0.5))
            else:
                param.copy_(_random(param.shape, seed, name, EMBEDDING_STD))


def make_gemma4_pair(
    out_dir,
    *,
    kind: str = "bigram",
    seed: int = 0,
    hidden: int = BACKBONE,
    sliding_window: int = 4096,
    text_only: bool = False,
    ordered: bool = False,
    leak: float = 0.004,
) -> tuple[str, str]:
    """Write the target and its assistant under `out_dir`; return (target folder, assistant folder)."""
    import torch
    import transformers

    out = Path(out_dir)
    bigram = kind == "bigram"
    text = _text_config(hidden, 4, 2, sliding_window, 8)
    if text_only:
        target = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**text))
    else:
        config = transformers.Gemma4Config(text_config=text, tie_word_embeddings=False)
        target = transformers.Gemma4ForConditionalGeneration(config)
    target = target.to(torch.float32).eval()
    _fill(target, seed, leak if bigram else None)
    head = target.get_output_embeddings().weight
    with torch.no_grad():  # logits of a few nats: the final norm's scale
        target.get_decoder().norm.weight.fill_(LOGIT_STD / (EMBEDDING_STD * hidden**0.5))
    target.generation_config = transformers.GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    target.save_pretrained(out / TARGET)

    mine = _text_config(BACKBONE, 2, 2, sliding_window, 0)
    centroids = {"num_centroids": 2048, "centroid_intermediate_top_k": 32} if ordered else {}
    assistant_config = transformers.Gemma4AssistantConfig(
        text_config=mine, backbone_hidden_size=BACKBONE, use_ordered_embeddings=ordered, **centroids
    )
    assistant = transformers.Gemma4AssistantForCausalLM(assistant_config).to(torch.float32).eval()
    _fill(assistant, seed + 1, 0.0 if bigram else None)
    with torch.no_grad():
        assistant.model.norm.weight.fill_(LOGIT_STD / (EMBEDDING_STD * BACKBONE**0.5))
        if bigram and hidden == BACKBONE:  # the token's embedding straight through to the target's LM head
            assistant.pre_projection.weight.copy_(torch.cat([torch.eye(BACKBONE), torch.zeros(BACKBONE, BACKBONE)], 1))
            assistant.lm_head.weight.copy_(head)  # tied: the assistant's embeddings, which it never reads
        if ordered:
            order = torch.randperm(VOCAB_SIZE, generator=torch.Generator().manual_seed(seed))
            assistant.masked_embedding.token_ordering.copy_(order)
    assistant.save_pretrained(out / ASSISTANT)
    for item in tokenizer_dir().iterdir():
        shutil.copy2(item, out / TARGET / item.name)
    return str(out / TARGET), str(out / ASSISTANT)
