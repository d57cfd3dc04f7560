"""Tiny random models that ship MTP layers in the published layouts, for tests.

`make_mtp_model(folder, "deepseek_v3")` writes a 2-layer, hidden-64 model (few experts)
with the SmolLM2 tokenizer, saved by transformers, and then adds its MTP block to
model.safetensors under the published names (engine/heads/mtp.py): the decoder layer's
tensors are those transformers itself saves for a layer N of the same model (so they
carry the per-expert names a real checkpoint has), the rest drawn here.

"qwen3_5" and "qwen3_5_moe" are written as Qwen publishes Qwen3.5 / Qwen3.6: a multimodal
wrapper's config.json (model_type qwen3_5, the text settings under text_config with
mtp_num_hidden_layers), the language model's tensors under model.language_model.*, the LM
head as lm_head.weight and the MTP block as mtp.* (no vision tower: transformers' text
class skips it anyway, and a tiny copy need not carry one). The target is the hybrid it
is: a linear-attention (Gated DeltaNet) layer, then a full-attention one.

Kinds:
- "random": every weight random (layer gain as tests/factories/hf_models.py, logits
  scaled to a few nats): the MTP layer's drafts are mostly rejected.
- "bigram": the target's layers write almost nothing to the residual stream (down
  projections zero, attention outputs scaled by `leak`), so its next token depends
  mostly on the current one; the MTP layer is built to predict exactly that (the
  projection takes the token's embedding, its decoder layer writes nothing, its norm
  and head are the target's): most drafts are accepted, and where attention leaks in
  some are not.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.factories.hf_models import BOS_ID, EMBEDDING_STD, EOS_ID, LAYER_GAIN, LOGIT_STD, VOCAB_SIZE, tokenizer_dir

HIDDEN = 64


def _config(arch: str, n_layers: int, **extra):
    import transformers

    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=EMBEDDING_STD,
    )
    if arch == "deepseek_v3":
        return transformers.DeepseekV3Config(
            **common,
            num_key_value_heads=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            **extra,
        )
    if arch == "glm4_moe":
        return transformers.Glm4MoeConfig(
            **common,
            num_key_value_heads=2,
            head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            **extra,
        )
    if arch == "qwen3_next":
        types = ["linear_attention", "full_attention", "linear_attention", "full_attention"][: n_layers - 1]
        return transformers.Qwen3NextConfig(
            **common,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            shared_expert_intermediate_size=32,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            layer_types=[*types, "full_attention"],
            **extra,
        )
    if arch in QWEN3_5:
        text = dict(
            common,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            layer_types=[*["linear_attention", "full_attention"] * (n_layers // 2), "full_attention"][:n_layers],
            **extra,
        )
        del text["moe_intermediate_size"]
        if arch == "qwen3_5_moe":
            text |= dict(
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
            )
            return transformers.Qwen3_5MoeTextConfig(**text)
        return transformers.Qwen3_5TextConfig(**text)
    raise ValueError(arch)


QWEN3_5 = ("qwen3_5", "qwen3_5_moe")


def _generator(seed: int, name: str):
    import torch

    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha1(f"{seed}:{name}".encode()).digest()[:7], "big"))


def _random(shape, seed: int, name: str, std: float):
    import torch

    return torch.randn(shape, generator=_generator(seed, name)) * std


def make_mtp_model(
    out_dir,
    arch: str = "deepseek_v3",
    *,
    kind: str = "random",
    seed: int = 0,
    n_layers: int = 2,
    mtp: bool = True,
    head: bool = True,
    embed: bool = True,
    leak: float = 0.3,
) -> str:
    """Write the model to `out_dir` and return its path. `mtp`: add the MTP block (and, for the
    DeepSeek layout, num_nextn_predict_layers = 1); `head` / `embed`: the block carries its own
    shared_head.head / embed_tokens (DeepSeek layout; else the target's are used)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    out = Path(out_dir)
    staging = out.with_name(out.name + "-with-layer-n")
    deepseek = arch not in ("qwen3_next", *QWEN3_5)
    # Layer N = n_layers of a model one layer deeper is the MTP block's decoder layer.
    config = _config(arch, n_layers + 1, **({"num_nextn_predict_layers": 1} if deepseek and mtp else {}))
    model_cls = {
        "deepseek_v3": transformers.DeepseekV3ForCausalLM,
        "glm4_moe": transformers.Glm4MoeForCausalLM,
        "qwen3_next": transformers.Qwen3NextForCausalLM,
        "qwen3_5": transformers.Qwen3_5ForCausalLM,
        "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM,
    }[arch]
    model = model_cls(config).to(torch.float32).eval()
    # The stored weight of a norm that scales by 1, as the class initialises it: 1 for w * x,
    # 0 for Qwen3-Next's (1 + w) * x.
    unit = float(model.model.norm.weight.detach().mean())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if arch in QWEN3_5 and name.endswith("linear_attn.norm.weight"):
                param.fill_(1.0)  # the gated norm scales by w, not 1 + w: keep the linear attention's output
            elif name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(unit)
            elif "embed_tokens" in name or "lm_head" in name:
                param.copy_(_random(param.shape, seed, name, EMBEDDING_STD))
            elif param.dim() >= 2:
                param.copy_(_random(param.shape, seed, name, LAYER_GAIN / param.shape[-1] ** 0.5))
            else:
                param.copy_(_random(param.shape, seed, name, EMBEDDING_STD))
            if kind == "bigram" and ("down_proj" in name or "o_proj" in name or "out_proj" in name):
                layer = int(name.split(".")[2])
                param.mul_(leak if layer < n_layers and "down_proj" not in name else 0.0)
        scale = LOGIT_STD / (EMBEDDING_STD * HIDDEN**0.5)
        model.model.norm.weight.fill_(scale - 1.0 + unit)
    model.generation_config = transformers.GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    model.save_pretrained(staging)

    weights = load_file(str(staging / "model.safetensors"))
    prefix = f"model.layers.{n_layers}."
    target = {n: t for n, t in weights.items() if not n.startswith(prefix)}
    block = {n[len(prefix) :]: t for n, t in weights.items() if n.startswith(prefix)}
    h = HIDDEN
    if kind == "bigram":  # the block predicts what the token's own embedding predicts
        proj = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    else:
        proj = _random((h, 2 * h), seed, "mtp.proj", LAYER_GAIN / (2 * h) ** 0.5)
    jitter = 0.0 if kind == "bigram" else 0.2
    norms = {k: unit + _random((h,), seed, k, jitter) for k in ("embed", "hidden")}
    final = weights["model.norm.weight"].clone()
    if deepseek:
        mtp_tensors = {prefix + k: v for k, v in block.items()}
        mtp_tensors |= {
            prefix + "enorm.weight": norms["embed"],
            prefix + "hnorm.weight": norms["hidden"],
            prefix + "eh_proj.weight": proj,
            prefix + "shared_head.norm.weight": final,
        }
        if head:
            mtp_tensors[prefix + "shared_head.head.weight"] = weights["lm_head.weight"].clone()
        if embed:
            mtp_tensors[prefix + "embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    else:
        mtp_tensors = {"mtp.layers.0." + k: v for k, v in block.items()}
        mtp_tensors |= {
            "mtp.pre_fc_norm_embedding.weight": norms["embed"],
            "mtp.pre_fc_norm_hidden.weight": norms["hidden"],
            "mtp.fc.weight": proj,
            "mtp.norm.weight": final,
        }
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((staging / "config.json").read_text())
    data["num_hidden_layers"] = n_layers
    if "layer_types" in data:
        data["layer_types"] = data["layer_types"][:n_layers]
    if deepseek:
        data["num_nextn_predict_layers"] = 1 if mtp else 0
    if arch in QWEN3_5:
        target = {n.replace("model.", "model.language_model.", 1): t for n, t in target.items()}
        data = _qwen3_5_wrapper(arch, data, mtp)
    save_file({**target, **(mtp_tensors if mtp else {})}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(data, indent=2))
    shutil.copy2(staging / "generation_config.json", out / "generation_config.json")
    shutil.rmtree(staging)
    for item in tokenizer_dir().iterdir():
        shutil.copy2(item, out / item.name)
    return str(out)


def _qwen3_5_wrapper(arch: str, text: dict, mtp: bool) -> dict:
    """The config.json Qwen publishes for Qwen3.5 / Qwen3.6: the multimodal wrapper, the language
    model's settings under text_config (mtp_num_hidden_layers among them)."""
    text = {k: v for k, v in text.items() if k not in ("architectures", "transformers_version", "dtype")}
    text["mtp_num_hidden_layers"] = 1 if mtp else 0
    wrapper = "Qwen3_5MoeForConditionalGeneration" if arch == "qwen3_5_moe" else "Qwen3_5ForConditionalGeneration"
    return {
        "architectures": [wrapper],
        "model_type": arch,
        "text_config": text,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
