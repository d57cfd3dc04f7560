"""Tiny targets and EAGLE-3 heads in SafeAILab's published layout, for tests.

- `make_bigram_llama(folder)`: a tiny Llama (untied LM head, as many KV heads as query
  heads) whose layers write almost nothing to the residual stream (down projections zero,
  attention outputs scaled by `leak`), so its next token depends mostly on the current one.
- `mirror_head(backend, draft_ids)`: an EAGLE-3 head built to predict exactly that: its
  attention reads the token's own normed embedding only (queries and keys scaled up so that
  a row attends to itself), copies it through v and o, the MLP writes nothing, the hidden
  part is normed to zero and taken as the residual (`norm_before_residual`), and the final
  norm and the LM head are the target's (its rows for `draft_ids`). Where attention leaks,
  some drafts are rejected.
- `write_published(folder, head)`: the head as SafeAILab publishes one (config.json with
  architectures LlamaForCausalLMEagle3, draft_vocab_size and eagle_config; the weights in
  pytorch_model.bin or model.safetensors, embed_tokens.weight optionally).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.factories.hf_models import make_tiny_model

SELF_ATTENTION = 3.0  # queries and keys of the mirror head: its own row outweighs the others by ~10 nats


def make_bigram_llama(out_dir, *, seed: int = 0, n_layers: int = 4, leak: float = 0.001) -> str:
    from safetensors.torch import load_file, save_file

    path = make_tiny_model(
        out_dir, "llama", seed=seed, n_layers=n_layers, n_kv_heads=4, tie_embeddings=False, norm_jitter=0.0
    )
    file = Path(path) / "model.safetensors"
    weights = load_file(str(file))
    for name, tensor in weights.items():
        if name.endswith("mlp.down_proj.weight"):
            tensor.zero_()
        elif name.endswith("self_attn.o_proj.weight"):
            tensor.mul_(leak)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(file), metadata={"format": "pt"})
    return path


def mirror_head(backend, draft_ids):
    """The head of the module docstring on the loaded bigram target `backend` (float32)."""
    import torch

    from engine.heads.eagle3 import Eagle3Config, Eagle3Head

    model = backend._model
    config = Eagle3Config.for_target(backend.text_config, draft_vocab_size=len(draft_ids), norm_before_residual=True)
    head = Eagle3Head(config)
    h = config.hidden_size
    copy = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)  # reads the embedding half of [e; hidden]
    layer = head.midlayer
    with torch.no_grad():
        for module in head.parameters():
            module.zero_()
        layer.input_layernorm.weight.fill_(1.0)  # hidden_norm stays 0: the hidden half is zero
        layer.post_attention_layernorm.weight.fill_(1.0)
        layer.self_attn.q_proj.weight.copy_(SELF_ATTENTION * copy)
        layer.self_attn.k_proj.weight.copy_(SELF_ATTENTION * copy)
        layer.self_attn.v_proj.weight.copy_(copy)
        layer.self_attn.o_proj.weight.copy_(torch.eye(h))
        head.norm.weight.copy_(model.model.norm.weight)
        ids = torch.sort(torch.as_tensor(draft_ids)).values
        head.lm_head.weight.copy_(model.lm_head.weight[ids])
    head.set_draft_vocab(ids)
    return head.eval()


def write_published(
    folder, head, *, pickle: bool = False, embed=None, extra: dict | None = None, drop: tuple[str, ...] = ()
) -> str:
    """`head` in SafeAILab's layout in `folder`; `embed` (V, H) saved as its embed_tokens.weight, `extra`
    merged into config.json, `drop` left out of the weights."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = head.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "bias": False,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.layers)},
        **({"norm_before_residual": True} if c.norm_before_residual else {}),
        **(extra or {}),
    }
    (folder / "config.json").write_text(json.dumps(config))
    weights = {k: v for k, v in head.weights().items() if k not in drop}
    if embed is not None:
        weights["embed_tokens.weight"] = embed.detach().contiguous()
    if pickle:
        torch.save(weights, str(folder / "pytorch_model.bin"))
    else:
        from safetensors.torch import save_file

        save_file(weights, str(folder / "model.safetensors"))
    return str(folder)
