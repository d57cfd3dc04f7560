"""The EAGLE-3 draft head: one decoder layer fed by three of the target's layers, with its own LM head.

Li et al. 2025, EAGLE-3 (arXiv 2503.01840), as SafeAILab/EAGLE publishes its heads (and
SpecForge, vLLM and SGLang load them). Notation as in engine/heads/eagle.py: the committed
tokens x_0 .. x_{L-1}; a_t is the concatenation of the inputs of three target layers
l1 < l2 < l3 at token t (the residual stream entering layer l, i.e. after layer l - 1,
residual included: low, middle and high level features instead of the final one):

    u_t        = W_fc a_t                                        (3H -> H, no bias)
    pair t     = (u_t, x_{t+1}) at position t
    y          = [RMSNorm_in(e(x_{t+1})); RMSNorm_hidden(u_t)]   (2H, embedding first)
    z          = u_t + W_o Attn(y)          (q, k, v: 2H -> heads; RoPE at position t;
                                             causal over earlier pairs)
    g_{t+1}    = z + MLP(RMSNorm_post(z))                         (SwiGLU)
    q(x_{t+2}) = softmax(W_lm RMSNorm(g_{t+1}))   over the draft vocabulary

Deeper drafts feed the head its own output: a draft token d after the pending token is
paired with g (before the final norm) in place of u, and so on down the tree. The LM
head scores D draft ids only; draft id i is target id i + d2t[i] (`d2t`, D int64
offsets), and t2d (V bools) marks the target ids that have one. Some heads (the
`speculators` convention) take the residual after the hidden norm: `norm_before_residual`.

On disk (the published layout, which ours is too): config.json, a one-layer LlamaConfig
with architectures ["LlamaForCausalLMEagle3"], draft_vocab_size and, optionally,
"eagle_config": {"eagle_aux_hidden_state_layer_ids": [l1, l2, l3]} (absent: layers 2,
L // 2 and L - 3 of an L-layer target, as SafeAILab's code picks them); weights in
model.safetensors or pytorch_model.bin (read with weights_only): fc.weight,
midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight,
norm.weight, lm_head.weight, d2t, t2d and, optionally, embed_tokens.weight (the head's own
copy of the target's embeddings; the target's are used when it is absent). Ours adds a
"specdeck" section to config.json (what it was made for, how it was trained).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from engine.backends.hf.architectures import SUPPORTED_ARCHITECTURES
from engine.errors import ModelLoadError
from engine.heads.eagle import PICKLE_WEIGHTS_FILE, WEIGHTS_FILE, layer_fields, layer_tail, rotary_qkv
from engine.heads.files import check_weights, read_head_json, read_weights, save_head
from engine.heads.kinds import heads_config_kind

ARCHITECTURE = "LlamaForCausalLMEagle3"
TRAIN_ADVICE = "Use a head trained for this target, or train one with specdeck-cli train-heads --kind eagle3."


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The target layers a head that names none reads: SafeAILab's 2, L // 2 and L - 3; for
    targets under 6 layers (test models), where those coincide or fall outside, the first,
    middle and last."""
    if n_layers >= 6:
        return (2, n_layers // 2, n_layers - 3)
    return tuple(sorted({0, n_layers // 2, max(0, n_layers - 1)}))


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int  # the target's vocabulary (t2d's length)
    draft_vocab_size: int  # the head's LM head rows (d2t's length)
    layers: tuple[int, ...] = ()  # the target layers whose inputs go into fc; () = default_layers
    rope_theta: float | None = None
    norm_before_residual: bool = False
    attention_bias: bool = False
    base_model: str = ""  # what the head was trained for (name or path), for messages
    training: dict = field(default_factory=dict)  # how it was made: data, steps, loss...

    @classmethod
    def for_target(cls, text_config, draft_vocab_size: int | None = None, **overrides) -> Eagle3Config:
        """The head that matches a transformers Llama-family config: its layer shape, the default
        layers, the whole vocabulary unless `draft_vocab_size` says fewer."""
        facts = target_facts(text_config)
        values = dict(
            hidden_size=facts["hidden size"],
            intermediate_size=int(text_config.intermediate_size),
            num_heads=facts["attention heads"],
            num_kv_heads=facts["key/value heads"],
            head_dim=facts["head dimension"],
            rms_norm_eps=float(text_config.rms_norm_eps),
            vocab_size=facts["vocabulary size"],
            draft_vocab_size=draft_vocab_size or facts["vocabulary size"],
            layers=default_layers(facts["layers"]),
            rope_theta=facts["rope theta"],
        )
        values.update(overrides)
        return cls(**values)

    def to_json(self) -> dict:
        """SafeAILab's EAGLE-3 config.json, plus our own section."""
        out = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "hidden_act": "silu",
            "attention_bias": self.attention_bias,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layers), "use_aux_hidden_state": True},
            "specdeck": {"kind": "eagle3", "base_model": self.base_model, "training": self.training},
        }
        if self.rope_theta is not None:
            out["rope_theta"] = self.rope_theta
        if self.norm_before_residual:
            out["norm_before_residual"] = True
        return out


class _Norm(nn.Module):
    """An RMSNorm's weight, under the name `weight` (the published key layout)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class Eagle3Head(nn.Module):
    """fc, one decoder layer (`midlayer`, over 2H inputs), the final norm and the draft LM head;
    attribute names are the published keys. Attention is supplied by the caller, as for EagleHead."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        h, heads, kv, dim = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.attention_bias
        self.fc = nn.Linear(len(config.layers) * h, h, bias=False)
        self.midlayer = layer = nn.Module()
        layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm = _Norm(h), _Norm(h), _Norm(h)
        layer.self_attn = attn = nn.Module()
        attn.q_proj = nn.Linear(2 * h, heads * dim, bias=bias)
        attn.k_proj = nn.Linear(2 * h, kv * dim, bias=bias)
        attn.v_proj = nn.Linear(2 * h, kv * dim, bias=bias)
        attn.o_proj = nn.Linear(heads * dim, h, bias=False)
        layer.mlp = mlp = nn.Module()
        mlp.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        mlp.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        mlp.down_proj = nn.Linear(config.intermediate_size, h, bias=False)
        self.norm = _Norm(h)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.embed_tokens: nn.Embedding | None = None  # the head's own embeddings, when its file has them

    @property
    def draft_ids(self) -> torch.Tensor:
        """The target id of each draft id (D,): i + d2t[i]."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """Draft ids for the target ids `ids` (any order; stored ascending, as published heads are)."""
        ids = torch.sort(ids.to(torch.long).flatten()).values
        self.d2t = (ids - torch.arange(ids.numel())).to(self.d2t.device)
        t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        self.t2d = t2d.to(self.d2t.device)

    def project(self, layer_features: torch.Tensor) -> torch.Tensor:
        """u = fc(a) for rows (..., 3H) of the target layers' inputs."""
        return self.fc(layer_features)

    def inputs(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what attention reads, the residual) for rows (..., H) of embeddings and hidden states
        (u, or the head's own g): [RMSNorm_in(e); RMSNorm_hidden(h)] and h."""
        c, layer = self.config, self.midlayer
        normed = F.rms_norm(hidden, (c.hidden_size,), layer.hidden_norm.weight, c.rms_norm_eps)
        embeds = F.rms_norm(embeds, (c.hidden_size,), layer.input_layernorm.weight, c.rms_norm_eps)
        return torch.cat((embeds, normed), dim=-1), normed if c.norm_before_residual else hidden

    def qkv(self, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries (..., heads, dim), keys and values (..., kv_heads, dim) of y (..., 2H)."""
        attn = self.midlayer.self_attn
        return rotary_qkv(self.config, attn.q_proj, attn.k_proj, attn.v_proj, y, cos, sin)

    def finish(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention: the guess g (before the final norm)."""
        layer = self.midlayer
        return layer_tail(
            self.config,
            layer.self_attn.o_proj,
            layer.post_attention_layernorm.weight,
            layer.mlp.gate_proj,
            layer.mlp.up_proj,
            layer.mlp.down_proj,
            residual,
            attended,
        )

    def logits(self, guesses: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (..., D) of guesses g (..., H)."""
        return self.lm_head(F.rms_norm(guesses, (self.config.hidden_size,), self.norm.weight, self.config.rms_norm_eps))

    # -- files ---------------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """State dict in the published key layout (embed_tokens only when the head has its own)."""
        return {name: t.detach().contiguous() for name, t in self.state_dict().items()}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a `weights()` dict (floats as float32 parameters, d2t and t2d as they are)."""
        state = self.state_dict()
        self.load_state_dict({k: weights[k].to(state[k].dtype) for k in state}, strict=True)

    def save(self, folder: str, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """config.json + model.safetensors, floats in `dtype` (None keeps the weights' own)."""
        save_head(self.weights(), self.config.to_json(), folder, dtype)


# -- loading ---------------------------------------------------------------------------


def target_facts(text_config) -> dict:
    """What a head must share with a transformers text config, by the words a refusal uses."""
    heads = int(text_config.num_attention_heads)
    rope = getattr(text_config, "rope_parameters", None) or {}
    theta = getattr(text_config, "rope_theta", None) or (rope.get("rope_theta") if isinstance(rope, dict) else None)
    return {
        "architecture": str(getattr(text_config, "model_type", "unknown")),
        "layers": int(text_config.num_hidden_layers),
        "hidden size": int(text_config.hidden_size),
        "attention heads": heads,
        "key/value heads": int(getattr(text_config, "num_key_value_heads", None) or heads),
        "head dimension": int(getattr(text_config, "head_dim", None) or text_config.hidden_size // heads),
        "vocabulary size": int(text_config.vocab_size),
        "rope theta": float(theta) if theta else None,
    }


def read_config(folder: str) -> Eagle3Config:
    """The head's config from `folder` (the published layout, ours included); `layers` stays ()
    when the file names none (load_head then takes default_layers of the target)."""
    path, data = read_head_json(folder, "EAGLE-3", f"{WEIGHTS_FILE} (or {PICKLE_WEIGHTS_FILE})")
    try:
        if "speculators_config" in data or "transformer_layer_config" in data:
            raise ModelLoadError(
                f"{folder} holds an EAGLE-3 head in the `speculators` layout (vLLM's converted heads), which "
                "SpecDeck does not read: use the head in SafeAILab's layout (config.json with draft_vocab_size, "
                "midlayer.* weights)."
            )
        if heads_config_kind(data) != "eagle3":
            raise ModelLoadError(
                f"{folder} holds an EAGLE-1/2 head (no draft vocabulary of its own): choose the EAGLE drafter for it."
            )
        if data.get("target_hidden_size") not in (None, data["hidden_size"]):
            raise ModelLoadError(
                f"The EAGLE-3 head in {folder} has a hidden size ({data['hidden_size']}) other than its target's "
                f"({data['target_hidden_size']}), which SpecDeck does not support. {TRAIN_ADVICE}"
            )
        eagle = data.get("eagle_config") or {}
        layers = eagle.get("eagle_aux_hidden_state_layer_ids") or data.get("eagle_aux_hidden_state_layer_ids") or ()
        theta = data.get("rope_theta") or (data.get("rope_parameters") or {}).get("rope_theta")
        return Eagle3Config(
            **layer_fields(data),
            draft_vocab_size=int(data["draft_vocab_size"]),
            layers=tuple(sorted(int(i) for i in layers)),  # concatenated in layer order, as the target runs them
            rope_theta=float(theta) if theta else None,
            norm_before_residual=bool(data.get("norm_before_residual", False)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ModelLoadError(
            f"{path} is not an EAGLE-3 head config: it needs hidden_size, intermediate_size, "
            f"num_attention_heads and draft_vocab_size, as a one-layer Llama config. ({type(error).__name__}: {error})"
        ) from error


def fit_target(config: Eagle3Config, text_config, folder: str) -> Eagle3Config:
    """`config` with its layers filled in, when it fits the target `text_config`; a ModelLoadError
    naming everything that differs otherwise."""
    target = target_facts(text_config)
    layers = config.layers or default_layers(target["layers"])
    made_for = f" (made for {config.base_model})" if config.base_model else ""
    if target["architecture"] not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"The EAGLE-3 head in {folder}{made_for} needs a Llama-family target "
            f"({', '.join(SUPPORTED_ARCHITECTURES)}), and this target is {target['architecture']!r}. {TRAIN_ADVICE}"
        )
    checks = [
        ("hidden size", config.hidden_size),
        ("attention heads", config.num_heads),
        ("key/value heads", config.num_kv_heads),
        ("head dimension", config.head_dim),
    ]
    if config.vocab_size:
        checks.append(("vocabulary size", config.vocab_size))
    if config.rope_theta and target["rope theta"]:
        checks.append(("rope theta", config.rope_theta))
    wrong = [f"{what} {theirs:g} (the target's: {target[what]:g})" for what, theirs in checks if theirs != target[what]]
    outside = [i for i in layers if not 0 <= i < target["layers"]]
    if outside:
        wrong.append(f"layers {list(layers)}, of which {outside} the target's {target['layers']} layers lack")
    if wrong:
        raise ModelLoadError(
            f"The EAGLE-3 head in {folder}{made_for} does not fit this target: its {', '.join(wrong)}. {TRAIN_ADVICE}"
        )
    return replace(config, layers=tuple(layers), vocab_size=target["vocabulary size"])


def load_head(folder: str, text_config) -> Eagle3Head:
    """Load the head in `folder` for the target whose transformers text config is `text_config`;
    a head made for another target is refused, naming what differs (fit_target)."""
    config = fit_target(read_config(folder), text_config, folder)
    weights = read_weights(folder, WEIGHTS_FILE, PICKLE_WEIGHTS_FILE, "EAGLE-3")
    config = replace(config, attention_bias="midlayer.self_attn.q_proj.bias" in weights)
    head = Eagle3Head(config)
    expected = head.state_dict()
    expected.pop("t2d")  # it follows from d2t (set_draft_vocab); some exports leave it out
    check_weights(
        weights,
        expected,
        folder,
        "EAGLE-3",
        {"fc.weight": f"fc reads {len(config.layers)} target layers of {config.hidden_size}"},
    )
    ids = torch.arange(config.draft_vocab_size) + weights["d2t"].to(torch.long)
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size or ids.unique().numel() != ids.numel():
        raise ModelLoadError(
            f"The draft vocabulary of the EAGLE-3 head in {folder} (d2t) maps to ids outside the target's "
            f"vocabulary (0..{config.vocab_size - 1}), or to one id twice: the head belongs to another model."
        )
    head.load_state_dict({k: weights[k].to(t.dtype) for k, t in expected.items()}, strict=False)
    head.set_draft_vocab(ids)
    embed = weights.get("embed_tokens.weight")
    if embed is not None:
        if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
            raise ModelLoadError(
                f"The EAGLE-3 embeddings in {folder} have shape {tuple(embed.shape)}, expected "
                f"{(config.vocab_size, config.hidden_size)}: the head belongs to another model."
            )
        head.embed_tokens = nn.Embedding.from_pretrained(embed.float(), freeze=True)
    return head.eval()
