"""A model's own multi-token-prediction (MTP) layer, read from its safetensors beside the model.

Some models ship layers trained to predict one token further than the model itself
(DeepSeek-V3, arXiv 2412.19437 section 2.2; GLM-4.5/4.6; Qwen3-Next; Qwen3.5 / Qwen3.6). transformers
drops them when it loads the model (unexpected keys), so they are read here from the
model folder's safetensors (never a pickle) and built from transformers' own decoder
layer class of that architecture, with the model's config, plus the norms and the
projection around it. Two published layouts:

- "deepseek" (DeepseekV3, Glm4Moe; `num_nextn_predict_layers` = n in config.json): layer
  N = num_hidden_layers onwards is stored as `model.layers.{N}.*`, holding `enorm`,
  `hnorm`, `eh_proj` (2H -> H, no bias), the decoder layer's own tensors under the
  model's usual names (self_attn.*, mlp.* with per-expert weights, the layer norms),
  `shared_head.norm` and, optionally, `shared_head.head` and `embed_tokens` (the
  model's LM head and embeddings where absent). Following vLLM's deepseek_mtp.py (and
  glm4_moe_mtp.py, the same block):

      z = eh_proj([enorm(e(x_{t+1})); hnorm(h_t)])     (embedding first; e = 0 at position 0)
      g_t = DecoderLayer(z)                            (the layer's own residuals)
      q(x_{t+2}) = softmax(head(shared_head.norm(g_t)))

  h_t is the target's final hidden state of x_t after its final norm (what vLLM hands
  its proposer: the hidden states the model returns); for the next draft the MTP
  layer's own g_t (before shared_head.norm) stands in for it.
- "qwen3-next" (Qwen3Next; Qwen3.5 and Qwen3.6, dense and MoE): `mtp.fc`,
  `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*` (one
  full-attention decoder layer of the model's own class, its MoE included) and `mtp.norm`,
  the target's embeddings and LM head shared. Qwen3.5 is published as a multimodal wrapper
  (model_type qwen3_5 / qwen3_5_moe: the text settings under `text_config`, with
  `mtp_num_hidden_layers`; the language model under `model.language_model.*`), and its
  `mtp.*` tensors sit beside it under the same names; transformers' Qwen3.5 classes skip
  them on load (`^mtp.*`). Experts may be stored per expert or fused (`mlp.experts.gate_up_proj`),
  as transformers names them. Following vLLM's qwen3_next_mtp.py and qwen3_5_mtp.py:

      g_t = norm(DecoderLayer(fc([pre_fc_norm_embedding(e(x_{t+1})); pre_fc_norm_hidden(h_t)])))
      q(x_{t+2}) = softmax(lm_head(g_t))                (g_t, after the norm, feeds the next draft)

The layer's attention keeps its own KV cache (a transformers DynamicCache, slot 0), one
row per position t. Only the first MTP layer is built: a model with several drafts every
token with it, as vLLM and llama.cpp do once k exceeds the layers.
"""

from __future__ import annotations

import copy
import glob
import importlib
import inspect
import json
import os
import re
from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import ModelLoadError

DEEPSEEK, QWEN3_NEXT = "deepseek", "qwen3-next"
LAYOUTS = {
    DEEPSEEK: "DeepSeek-V3 style (model.layers.{N}: enorm, hnorm, eh_proj, shared_head)",
    QWEN3_NEXT: "Qwen3-Next style (mtp.fc, mtp.pre_fc_norm_*, mtp.layers.0, mtp.norm)",
}
# model_type -> (layout, transformers module, decoder layer class, RMSNorm class)
ARCHITECTURES = {
    "deepseek_v3": (DEEPSEEK, "deepseek_v3", "DeepseekV3DecoderLayer", "DeepseekV3RMSNorm"),
    "glm4_moe": (DEEPSEEK, "glm4_moe", "Glm4MoeDecoderLayer", "Glm4MoeRMSNorm"),
    "qwen3_next": (QWEN3_NEXT, "qwen3_next", "Qwen3NextDecoderLayer", "Qwen3NextRMSNorm"),
    # Qwen3.5 / Qwen3.6: the published multimodal wrapper, and the text-only configs.
    "qwen3_5": (QWEN3_NEXT, "qwen3_5", "Qwen3_5DecoderLayer", "Qwen3_5RMSNorm"),
    "qwen3_5_text": (QWEN3_NEXT, "qwen3_5", "Qwen3_5DecoderLayer", "Qwen3_5RMSNorm"),
    "qwen3_5_moe": (QWEN3_NEXT, "qwen3_5_moe", "Qwen3_5MoeDecoderLayer", "Qwen3_5MoeRMSNorm"),
    "qwen3_5_moe_text": (QWEN3_NEXT, "qwen3_5_moe", "Qwen3_5MoeDecoderLayer", "Qwen3_5MoeRMSNorm"),
}
SUPPORTED = (
    "DeepSeek-V3 (deepseek_v3), GLM-4.5/4.6 (glm4_moe), Qwen3-Next (qwen3_next) and Qwen3.5 / Qwen3.6 "
    "(qwen3_5, qwen3_5_moe)"
)
# Where a config.json says how many MTP layers the model ships, by layout (the first key found counts).
DECLARED = {DEEPSEEK: ("num_nextn_predict_layers",), QWEN3_NEXT: ("mtp_num_hidden_layers", "num_nextn_predict_layers")}
# Names of the scales that come with quantized weights (DeepSeek-V3's FP8 blocks: weight_scale_inv).
QUANT_SUFFIXES = ("_scale_inv", ".weight_scale", ".input_scale", ".qweight", ".scales")


@dataclass(frozen=True)
class MtpFiles:
    """Where a model's MTP layers are: the layout, the tensor-name prefix of the first, the files."""

    layout: str
    prefix: str  # "model.layers.61." or "mtp."
    n_layers: int
    names: dict[str, str]  # tensor name -> the safetensors file holding it (the first layer's only)


def find_mtp(folder: str, config: dict) -> MtpFiles:
    """The MTP layers of the model in `folder` (config.json's dict `config`), or a ModelLoadError
    saying what is missing: a check of names only (safetensors headers), no tensor is read."""
    model_type = str(config.get("model_type") or "")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if model_type not in ARCHITECTURES:
        raise ModelLoadError(
            f"MTP drafting reads the multi-token-prediction layers of {SUPPORTED} models; this model is "
            f"{model_type or 'of an unknown architecture'}, for which no MTP layout is known."
        )
    layout = ARCHITECTURES[model_type][0]
    n_hidden = int(text.get("num_hidden_layers") or 0)
    key = next((k for k in DECLARED[layout] if text.get(k) is not None), DECLARED[layout][0])
    declared = int(text.get(key) or 0)
    if declared == 0 and (layout == DEEPSEEK or text.get(key) is not None):
        raise ModelLoadError(
            f"This model ships no MTP layers ({key} = {declared} in its config.json): choose another drafter."
        )
    names = _tensor_files(folder)
    prefix = f"model.layers.{n_hidden}." if layout == DEEPSEEK else "mtp."
    required = ("eh_proj.weight", "enorm.weight", "hnorm.weight") if layout == DEEPSEEK else ("fc.weight",)
    missing = [prefix + r for r in required if prefix + r not in names]
    if missing:
        if layout == QWEN3_NEXT and not any(n.startswith(prefix) for n in names):
            raise ModelLoadError(
                f"This model ships no MTP layers (its weights hold no mtp.* tensors, though its config says "
                f"{key} = {declared or 'nothing'}: converted and quantized copies often drop them): use the "
                "original safetensors, or choose another drafter."
            )
        raise ModelLoadError(
            f"The config says this model has {declared or 1} MTP layer(s) ({LAYOUTS[layout]}), but its weights "
            f"lack {', '.join(missing)}: this copy was saved without them (converted and quantized copies "
            "often drop them). Use the original safetensors, or choose another drafter."
        )
    scaled = sorted(n for n in names if n.startswith(prefix) and n.endswith(QUANT_SUFFIXES))
    if scaled:
        raise ModelLoadError(
            f"The MTP layer of this model is stored quantized ({scaled[0]}: FP8 or similar blocks with "
            "their scales), and SpecDeck reads MTP weights in float only (bfloat16, float16, float32): "
            "use a bfloat16 copy of the model, or choose another drafter."
        )
    if layout == DEEPSEEK:
        layers = declared
    else:
        found = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
        layers = max(declared, len(found), 1)
    mine = {name: path for name, path in names.items() if name.startswith(prefix)}
    if layout == QWEN3_NEXT:  # the first layer only
        mine = {n: p for n, p in mine.items() if not re.match(r"mtp\.layers\.(?!0\.)\d+\.", n)}
    _refuse_other_model(mine, prefix + required[0], text)
    return MtpFiles(layout, prefix, layers, mine)


def _refuse_other_model(names: dict[str, str], projection: str, text: dict) -> None:
    """MTP tensors made for another model (copied in beside it, or a config edited by hand) are refused
    before anything loads, naming what differs: the hidden size (the projection is (H, 2H)) and, where
    the block carries its own embeddings or head, the vocabulary size."""
    hidden, vocab = int(text.get("hidden_size") or 0), int(text.get("vocab_size") or 0)
    differences = []
    shape = _shape(names, projection)
    if hidden and shape is not None and tuple(shape) != (hidden, 2 * hidden):
        differences.append(f"hidden size {shape[0]} (this model's is {hidden})")
    for name in names:
        if vocab and name.endswith(("embed_tokens.weight", "shared_head.head.weight")):
            rows = (_shape(names, name) or (vocab,))[0]
            if rows != vocab:
                differences.append(f"vocabulary size {rows} (this model's is {vocab})")
                break
    if differences:
        raise ModelLoadError(
            "The MTP layers in this folder were made for another model: they have "
            + " and ".join(differences)
            + ". Use the model's original safetensors, or choose another drafter."
        )


def _shape(names: dict[str, str], name: str) -> list[int] | None:
    """A tensor's shape from its file's header (no data read)."""
    from safetensors import safe_open

    if name not in names:
        return None
    with safe_open(names[name], framework="pt") as f:
        return list(f.get_slice(name).get_shape())


def read_model_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"Cannot read {path} to look for MTP layers ({error}).") from error


def _tensor_files(folder: str) -> dict[str, str]:
    """Every tensor name of the folder's safetensors -> its file (from the index, or the headers)."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map", {})
        return {name: os.path.join(folder, file) for name, file in weight_map.items()}
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ModelLoadError(
            f"{folder} holds no safetensors files: MTP layers are read from a model's safetensors only "
            "(never a pickle, and a GGUF file's are not read)."
        )
    names: dict[str, str] = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            names.update(dict.fromkeys(f.keys(), path))
    return names


def _read(files: MtpFiles) -> dict[str, torch.Tensor]:
    """The first MTP layer's tensors, names without the prefix."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name, path in files.names.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        with safe_open(path, framework="pt") as f:
            for name in names:
                out[name[len(files.prefix) :]] = f.get_tensor(name)
    return out


class MtpHead(nn.Module):
    """The first MTP layer: norms and projection in front of one decoder layer, a norm (and
    head) behind it. `forward` appends rows to `cache`; `logits` turns its output into q's logits."""

    def __init__(self, layout: str, text_config, layer_cls, norm_cls) -> None:
        super().__init__()
        self.layout = layout
        h, eps = int(text_config.hidden_size), float(text_config.rms_norm_eps)
        n = int(text_config.num_hidden_layers)
        config = copy.deepcopy(text_config)
        if hasattr(config, "layer_types") and config.layer_types is not None:  # the MTP layer attends fully
            config.layer_types = [*list(config.layer_types)[:n], "full_attention"]
        self.embed_norm = norm_cls(h, eps=eps)
        self.hidden_norm = norm_cls(h, eps=eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.layer = layer_cls(config, layer_idx=n)  # layer N: MoE or dense as the model's config says
        self.layer.self_attn.layer_idx = 0  # its KV rows live in slot 0 of the head's own cache
        self.final_norm = norm_cls(h, eps=eps)
        self.head: nn.Linear | None = None  # None: the target's LM head
        self.embed_tokens: nn.Embedding | None = None  # None: the target's embeddings
        params = inspect.signature(self.layer.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def forward(self, embeds, hidden, positions, position_embeddings, mask, cache) -> torch.Tensor:
        """Rows (n, H) of e(x_{t+1}) and h_t at `positions` (n,) -> g_t (n, H), appended to `cache`;
        mask: additive (n, cached + n) float, 0 where a row may attend."""
        if self.layout == DEEPSEEK:
            embeds = embeds.masked_fill((positions == 0)[:, None], 0.0)  # as vLLM: no token at position 0
        z = self.proj(torch.cat((self.embed_norm(embeds), self.hidden_norm(hidden)), dim=-1))
        out = self.layer(
            z[None],
            attention_mask=mask[None, None],
            position_ids=positions[None],
            position_embeddings=position_embeddings,
            use_cache=True,
            **{self._cache_kw: cache},
        )
        g = (out[0] if isinstance(out, tuple) else out)[0]
        return self.final_norm(g) if self.layout == QWEN3_NEXT else g

    def logits_input(self, g: torch.Tensor) -> torch.Tensor:
        """What the LM head reads for output g: shared_head.norm(g) (DeepSeek), g itself (Qwen3-Next)."""
        return self.final_norm(g) if self.layout == DEEPSEEK else g


def load_mtp(folder: str, text_config, files: MtpFiles | None = None) -> MtpHead:
    """The first MTP layer of the model in `folder`, in float32 on the CPU (the caller places it)."""
    config = read_model_config(folder)
    files = files or find_mtp(folder, config)
    _, module, layer_name, norm_name = ARCHITECTURES[str(config.get("model_type"))]
    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    head = MtpHead(files.layout, text_config, getattr(modeling, layer_name), getattr(modeling, norm_name))
    weights = _read(files)
    if files.layout == DEEPSEEK:
        ours = {
            "embed_norm.weight": "enorm.weight",
            "hidden_norm.weight": "hnorm.weight",
            "proj.weight": "eh_proj.weight",
            "final_norm.weight": "shared_head.norm.weight",
        }
        layer_prefix = ""
        if "shared_head.head.weight" in weights:
            head.head = nn.Linear(*reversed(weights["shared_head.head.weight"].shape), bias=False)
            ours["head.weight"] = "shared_head.head.weight"
        if "embed_tokens.weight" in weights:
            head.embed_tokens = nn.Embedding(*weights["embed_tokens.weight"].shape)
            ours["embed_tokens.weight"] = "embed_tokens.weight"
    else:
        ours = {
            "embed_norm.weight": "pre_fc_norm_embedding.weight",
            "hidden_norm.weight": "pre_fc_norm_hidden.weight",
            "proj.weight": "fc.weight",
            "final_norm.weight": "norm.weight",
        }
        layer_prefix = "layers.0."
    state = {}
    for name, tensor in head.state_dict().items():
        if name.startswith("layer."):
            value = _layer_tensor(weights, layer_prefix + name[len("layer.") :])
            where = files.prefix + layer_prefix + name[len("layer.") :]
        else:
            value, where = weights.get(ours.get(name, "")), files.prefix + ours.get(name, name)
        if value is None:
            raise ModelLoadError(
                f"The MTP layer in {folder} is incomplete: {where} is missing ({LAYOUTS[files.layout]}). "
                "Download the model's safetensors again, or choose another drafter."
            )
        if tuple(value.shape) != tuple(tensor.shape):
            raise ModelLoadError(
                f"The MTP weight {where} in {folder} has shape {tuple(value.shape)}, but the model's config "
                f"makes it {tuple(tensor.shape)}: the config and the weights disagree."
            )
        if value.dtype.itemsize == 1 and name.endswith(".weight"):  # float8 or int8 storage, scales elsewhere
            raise ModelLoadError(
                f"The MTP weight {where} in {folder} is stored in {value.dtype}: SpecDeck reads MTP weights in "
                "float only (bfloat16, float16, float32). Use a bfloat16 copy of the model, or choose another drafter."
            )
        state[name] = value.to(torch.float32) if value.is_floating_point() else value
    head.load_state_dict(state, strict=True)
    return head.eval()


def _layer_tensor(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """A decoder-layer tensor by transformers' name; fused experts (mlp.experts.gate_up_proj
    (E, 2I, H), mlp.experts.down_proj (E, H, I)) are stacked from the published per-expert
    weights (mlp.experts.{e}.gate_proj / up_proj / down_proj.weight)."""
    if name in weights:
        return weights[name]
    base, _, kind = name.rpartition(".")
    if kind not in ("gate_up_proj", "down_proj") or not base.endswith("experts"):
        return None
    experts = []
    for e in range(1 << 20):
        parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
        found = [weights.get(f"{base}.{e}.{part}.weight") for part in parts]
        if any(t is None for t in found):
            break
        experts.append(torch.cat(found, dim=0))
    return torch.stack(experts) if experts else None
