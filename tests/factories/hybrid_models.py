"""Tiny random-weight hybrid and sliding-window models in the published Hugging Face layout, for tests.

`make_hybrid_model(folder, "qwen3_5")` writes config.json + model.safetensors + the SmolLM2
tokenizer files (tests/factories/hf_models.py) for a model whose layers mix attention with
a recurrent kind: Qwen3.5's gated delta net (`qwen3_5_text`, the text-only model), LFM2's
short convolution (`lfm2`), Nemotron-H's and Granite 4's Mamba 2 (`nemotron_h`,
`granitemoehybrid`); or, for `gemma3_text`,
sliding-window attention with a window of `window` tokens. Layer sizes are tiny (hidden 64).

transformers initialises the recurrent parts (Mamba's A_log, dt_bias, D...) as those models
expect; the factory then redraws the 2-D projection weights with std LAYER_GAIN / sqrt(fan_in)
and scales the final norm so that the logits spread over about LOGIT_STD nats (measured), as
hf_models.py does and for the same reason: a peaked distribution gives greedy decoding a
clear argmax in float32. Weights depend only on `seed` (a generator per parameter name).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from tests.factories.hf_models import BOS_ID, EMBEDDING_STD, EOS_ID, LAYER_GAIN, LOGIT_STD, VOCAB_SIZE, tokenizer_dir

ARCHITECTURES = ("qwen3_5", "lfm2", "nemotron_h", "granitemoehybrid")
_FINAL_NORM = {"lfm2": "embedding_norm", "nemotron_h": "norm_f"}  # the norm before the LM head


def _config(arch: str, n_layers: int, hidden: int, window: int):
    import transformers

    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        max_position_embeddings=2048,
    )
    head = hidden // 4
    if arch == "qwen3_5":  # three gated-delta-net layers per full-attention one, as the published models
        return transformers.Qwen3_5TextConfig(
            **common,
            head_dim=head,
            linear_key_head_dim=head,
            linear_value_head_dim=head,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            layer_types=[("full_attention" if i % 4 == 3 else "linear_attention") for i in range(n_layers)]
            if n_layers >= 4
            else ["linear_attention", "full_attention"][:n_layers],
        )
    if arch == "lfm2":
        return transformers.Lfm2Config(
            **common,
            layer_types=[("full_attention" if i % 2 else "conv") for i in range(n_layers)],
            block_auto_adjust_ff_dim=False,
        )
    if arch == "nemotron_h":
        kinds = ("mamba", "attention", "mamba", "mlp")
        return transformers.NemotronHConfig(
            **common,
            head_dim=head,
            mamba_num_heads=4,
            mamba_head_dim=head,
            ssm_state_size=16,
            n_groups=1,
            chunk_size=16,
            layers_block_type=[kinds[i % 4] for i in range(n_layers)],
        )
    if arch == "granitemoehybrid":  # Granite 4 hybrid: Mamba 2 layers, one attention layer in four, dense MLP
        return transformers.GraniteMoeHybridConfig(
            **common,
            layer_types=[("attention" if i % 4 == 1 else "mamba") for i in range(n_layers)],
            mamba_n_heads=4,
            mamba_d_head=head,
            mamba_d_state=16,
            mamba_n_groups=1,
            mamba_chunk_size=16,
            mamba_expand=1,  # heads x head size = hidden x expand
            num_local_experts=0,
            shared_intermediate_size=2 * hidden,
        )
    if arch == "gemma3_text":  # five sliding layers per full one, as Gemma 3
        return transformers.Gemma3TextConfig(
            **common,
            head_dim=head,
            sliding_window=window,
            layer_types=[("full_attention" if i % 6 == 5 else "sliding_attention") for i in range(n_layers)],
        )
    raise ValueError(f"no tiny {arch} model here: choose one of {ARCHITECTURES} or gemma3_text")


def make_hybrid_model(
    out_dir: str | os.PathLike,
    arch: str = "qwen3_5",
    *,
    seed: int = 0,
    n_layers: int = 4,
    hidden: int = 64,
    window: int = 8,
    noise: float = 0.0,
) -> str:
    """Write a tiny random `arch` model + the SmolLM2 tokenizer to `out_dir`; return its path.

    `noise` > 0 moves every projection weight by that fraction of its std (a generator of its
    own): the model of the same seed, a little off, a draft model whose drafts are accepted
    often but not always."""
    import torch
    import transformers
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _config(arch, n_layers, hidden, window)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            generator = torch.Generator().manual_seed(
                int.from_bytes(hashlib.sha1(f"{seed}:{name}".encode()).digest()[:7], "big")
            )
            if "embed" in name:
                param.normal_(0.0, EMBEDDING_STD, generator=generator)
            elif param.dim() == 2:
                param.normal_(0.0, LAYER_GAIN / param.shape[1] ** 0.5, generator=generator)
                if noise:
                    off = torch.Generator().manual_seed(generator.initial_seed() + 1)
                    param.add_(torch.randn(param.shape, generator=off) * noise * LAYER_GAIN / param.shape[1] ** 0.5)
        final_norm = getattr(model.base_model, _FINAL_NORM.get(arch, "norm"))
        # The logits are linear in the final norm's gain: measure their spread on a few tokens and
        # scale the gain to LOGIT_STD (Mamba layers make the residual stream far larger than
        # attention ones, so no fixed gain fits every architecture). Gemma's norms scale by 1 + weight.
        offset = 1.0 if arch == "gemma3_text" else 0.0
        final_norm.weight.fill_(1.0 - offset)
        spread = model(input_ids=torch.arange(100, 132)[None], use_cache=False).logits.std().item()
        final_norm.weight.fill_(LOGIT_STD / spread - offset)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    model.save_pretrained(out)
    for item in tokenizer_dir().iterdir():
        shutil.copy2(item, out / item.name)
    return str(out)
