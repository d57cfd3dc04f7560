"""A model store as a user's looks when a draft list comes up short: one model that fits the embedded
SmolLM2-135M as a draft, and beside it models and heads that do not, each for another reason.

    store/drafts/tiny-draft.gguf          SmolLM2's vocabulary, 3M parameters: 42:1, a draft
    store/drafts/speck.gguf               SmolLM2's vocabulary, 0.8M parameters: 170:1, too small to pay
    store/drafts/other-vocab.gguf         llama, a 4-token vocabulary: another vocabulary
    store/drafts/qwen-like.gguf           qwen2, a 6-token vocabulary: another family
    store/heads/medusa-qwen/              Medusa heads made for Qwen/Qwen2.5-0.5B-Instruct (hidden size 896)
    store/heads/medusa-smollm2/           Medusa heads made for SmolLM2-135M-Instruct (hidden size 576)

and, with `add_cached_eagle3_head`, an EAGLE-3 head in a Hugging Face cache.

Written with gguf-py, numpy and safetensors' numpy writer: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.factories.gguf_models import make_tiny_gguf
from tests.factories.model_stores import write_quant_gguf

OTHER_BASE = "Qwen/Qwen2.5-0.5B-Instruct"
TARGET_BASE = "SmolLM2-135M-Instruct"


def make_drafter_store(root) -> dict[str, str]:
    """Lay the store out under `root`; name -> path of each thing in it."""
    root = Path(root)
    drafts, heads = root / "drafts", root / "heads"
    drafts.mkdir(parents=True, exist_ok=True)
    paths = {
        "tiny-draft": make_tiny_gguf(str(drafts / "tiny-draft.gguf"), seed=1),
        "speck": make_tiny_gguf(str(drafts / "speck.gguf"), seed=2, n_embd=16, n_head=2, n_head_kv=1, n_ff=32),
        "other-vocab": write_quant_gguf(drafts / "other-vocab.gguf", "Q8_0"),
        "qwen-like": write_other_family_gguf(drafts / "qwen-like.gguf"),
        "medusa-qwen": write_medusa_heads(heads / "medusa-qwen", base_model=OTHER_BASE, hidden=896),
        "medusa-smollm2": write_medusa_heads(heads / "medusa-smollm2", base_model=TARGET_BASE, hidden=576),
    }
    return paths


def write_other_family_gguf(path) -> str:
    """A qwen2 GGUF with a vocabulary of its own: enough for metadata, not for llama.cpp."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="qwen2")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["!", '"', "#", "$", "%", "&"])
    w.add_tensor("token_embd.weight", np.zeros((6, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def write_medusa_heads(folder, *, base_model: str, hidden: int, num_heads: int = 2) -> str:
    """Medusa heads in our layout (config.json with the shared LM head, medusa_lm_head.safetensors),
    zero weights: enough to be found and judged, and to load where the shapes fit."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": 1,
        "base_model_name_or_path": base_model,
        "hidden_size": hidden,
        "vocab_size": 49152 if hidden == 576 else 151936,
        "specdeck": {"shared_lm_head": True, "training": {}},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    weights = {}
    for k in range(num_heads):
        weights[f"{k}.0.linear.weight"] = np.zeros((hidden, hidden), np.float16)
        weights[f"{k}.0.linear.bias"] = np.zeros(hidden, np.float16)
    save_file(weights, str(folder / "medusa_lm_head.safetensors"))
    return str(folder)


def add_cached_eagle3_head(hub, repo: str, *, base_model: str, hidden: int, heads: int, kv_heads: int) -> str:
    """An EAGLE-3 head as the Hugging Face cache holds a published one (models--org--name/snapshots/<hash>/):
    config.json only, which is all discovery reads; the snapshot folder."""
    repo_dir = Path(hub) / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text("0123456789abcdef")
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": 1,
        "vocab_size": 49152 if hidden == 576 else 128256,
        "draft_vocab_size": 8192,
        "_name_or_path": base_model,
    }
    (snapshot / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(snapshot)
