"""The EAGLE draft head: one decoder layer that runs in the target's feature space.

Li et al. 2024, EAGLE (arXiv 2401.15077) and EAGLE-2 (arXiv 2406.16858). The
target's final hidden state f_t (after its final norm: what its LM head reads)
and the embedding of the token that followed, e(x_{t+1}), go in; a guess at the
next feature comes out:

    z      = W_fc [e(x_{t+1}); f_t] (+ b)             (2H -> H, embedding first)
    z      = z + Attn(z)          (RoPE at position t, causal over earlier pairs;
                                   no input norm, as the published heads have none)
    g_{t+1} = z + MLP(RMSNorm(z))                     (SwiGLU, like the target's)
    q(x_{t+2}) = softmax(LM(g_{t+1}))                 (the target's own LM head)

Drafting feeds the head its own guesses: a draft token z after the pending
token is paired with the guessed feature g of the pending token, and so on
down the tree. The head's attention keeps its own KV cache (one layer).

On disk, two layouts are read:
- the published one (SafeAILab/EAGLE, EAGLE-1/2 heads): config.json of a
  one-layer LlamaConfig (hidden_size, intermediate_size, num_attention_heads,
  num_key_value_heads, rms_norm_eps, vocab_size...) and pytorch_model.bin
  (read with torch.load(weights_only=True)) or model.safetensors holding
  fc.weight (fc.bias), layers.0.self_attn.{q,k,v,o}_proj.weight,
  layers.0.mlp.{gate,up,down}_proj.weight, layers.0.post_attention_layernorm
  .weight; embed_tokens.weight, if present, is ignored (the target's is used).
  EAGLE-3 heads (midlayer.*, d2t/t2d, their own LM head) are engine/heads/eagle3.py's:
  this loader refuses them, pointing at the EAGLE-3 drafter.
- ours: the same names in model.safetensors, config.json with a "specdeck"
  section, and optionally `draft_vocab` (the ids, most frequent first, that the
  head may propose: scoring 8k of SmolLM2's 49k ids costs a sixth of the full
  LM head, and on this CPU the LM head is most of a draft step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.heads.files import check_weights, read_head_json, read_weights, save_head
from engine.heads.kinds import heads_config_kind

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PICKLE_WEIGHTS_FILE = "pytorch_model.bin"
DRAFT_VOCAB_KEY = "draft_vocab"
EAGLE3_ADVICE = "choose the EAGLE-3 drafter for it (--drafter eagle3, or EAGLE-3 head in the pair dialog)."


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int  # the target's vocabulary (the LM head's width)
    fc_bias: bool = True
    attention_bias: bool = False
    base_model: str = ""  # what the head was trained for (name or path), for messages
    training: dict = field(default_factory=dict)  # how it was made: data, steps, loss...

    @classmethod
    def for_target(cls, text_config, **overrides) -> EagleConfig:
        """The head that matches a transformers Llama-family config (one of its layers, plus fc)."""
        heads = int(text_config.num_attention_heads)
        head_dim = int(getattr(text_config, "head_dim", None) or text_config.hidden_size // heads)
        values = dict(
            hidden_size=int(text_config.hidden_size),
            intermediate_size=int(text_config.intermediate_size),
            num_heads=heads,
            num_kv_heads=int(getattr(text_config, "num_key_value_heads", None) or heads),
            head_dim=head_dim,
            rms_norm_eps=float(text_config.rms_norm_eps),
            vocab_size=int(text_config.vocab_size),
        )
        values.update(overrides)
        return cls(**values)

    def to_json(self) -> dict:
        """A one-layer LlamaConfig, as published heads have, plus our own section."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "hidden_act": "silu",
            "bias": self.fc_bias,
            "attention_bias": self.attention_bias,
            "specdeck": {"kind": "eagle", "base_model": self.base_model, "training": self.training},
        }


class EagleHead(nn.Module):
    """fc + one decoder layer. `forward` maps (token embeddings, features) to guessed
    next features; attention is supplied by the caller (causal for training, the
    head's KV cache with a tree mask for drafting)."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        h, heads, kv, dim = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        self.q_proj = nn.Linear(h, heads * dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, kv * dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, kv * dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(heads * dim, h, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)
        # The token ids the head may propose (None = all); a buffer, saved with the weights.
        self.register_buffer("draft_vocab", None, persistent=False)

    def project(self, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """z = fc([e; f]) for rows (..., H) of embeddings and features."""
        return self.fc(torch.cat((embeds, features), dim=-1))

    def inputs(self, embeds: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what attention reads, the residual) for rows of embeddings and features: z and z."""
        z = self.project(embeds, features)
        return z, z

    def qkv(self, z: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries (..., heads, dim), keys and values (..., kv_heads, dim) of z (..., H);
        cos/sin (..., dim) in the usual (not sign-folded) form."""
        return rotary_qkv(self.config, self.q_proj, self.k_proj, self.v_proj, z, cos, sin)

    def finish(self, z: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention: residual, norm, MLP, residual."""
        return layer_tail(
            self.config,
            self.o_proj,
            self.post_attention_layernorm,
            self.gate_proj,
            self.up_proj,
            self.down_proj,
            z,
            attended,
        )

    def forward_sequences(
        self, embeds: torch.Tensor, features: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Training: (B, T, H) embeddings e(x_{t+1}) and features f_t -> guesses g_{t+1}
        (B, T, H), each pair attending causally to the earlier pairs of its sequence.
        cos/sin: (T, dim) for positions 0..T-1."""
        z = self.project(embeds, features)
        q, k, v = self.qkv(z, cos, sin)  # (B, T, heads, dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        groups = self.config.num_heads // self.config.num_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, dim)
        return self.finish(z, out.transpose(1, 2).flatten(-2))

    # -- files ---------------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """State dict in the published key layout (layers.0.self_attn.q_proj.weight...)."""
        out = {_PUBLISHED.get(name, name): t.detach().contiguous() for name, t in self.state_dict().items()}
        if self.draft_vocab is not None:
            out[DRAFT_VOCAB_KEY] = self.draft_vocab.detach().to(torch.int64).contiguous()
        return out

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a `weights()` dict (published names, plus draft_vocab if any)."""
        self.load_state_dict({_OURS[k]: weights[k].float() for k in self.weights() if k != DRAFT_VOCAB_KEY})
        vocab = weights.get(DRAFT_VOCAB_KEY)
        self.draft_vocab = None if vocab is None else vocab.to(torch.int64).flatten()

    def save(self, folder: str, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """config.json + model.safetensors, floats in `dtype` (bfloat16 by default: half the bytes of
        float32, and the head runs in the target's dtype anyway; None keeps the weights' own)."""
        save_head(self.weights(), self.config.to_json(), folder, dtype)


def rotary_qkv(config, q_proj, k_proj, v_proj, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The attention rows of a draft head's layer: q (..., heads, dim), k and v (..., kv_heads, dim)
    of x, q and k rotated by cos/sin (..., dim) in the usual form: q * cos + rotate_half(q) * sin."""
    q = q_proj(x).unflatten(-1, (config.num_heads, config.head_dim))
    k = k_proj(x).unflatten(-1, (config.num_kv_heads, config.head_dim))
    v = v_proj(x).unflatten(-1, (config.num_kv_heads, config.head_dim))
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def layer_tail(
    config,
    o_proj,
    post_norm: torch.Tensor,
    gate_proj,
    up_proj,
    down_proj,
    residual: torch.Tensor,
    attended: torch.Tensor,
) -> torch.Tensor:
    """A Llama layer after attention: z = residual + o(attended); z + down(silu(gate(n)) * up(n)),
    n = RMSNorm(z) with weight `post_norm`."""
    z = residual + o_proj(attended)
    h = F.rms_norm(z, (config.hidden_size,), post_norm, config.rms_norm_eps)
    return z + down_proj(F.silu(gate_proj(h)) * up_proj(h))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Our attribute names -> the published EAGLE names.
_PUBLISHED = {
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    "q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "q_proj.bias": "layers.0.self_attn.q_proj.bias",
    "k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "k_proj.bias": "layers.0.self_attn.k_proj.bias",
    "v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "v_proj.bias": "layers.0.self_attn.v_proj.bias",
    "o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "post_attention_layernorm": "layers.0.post_attention_layernorm.weight",
    "gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "up_proj.weight": "layers.0.mlp.up_proj.weight",
    "down_proj.weight": "layers.0.mlp.down_proj.weight",
}
_OURS = {published: ours for ours, published in _PUBLISHED.items()}


# -- loading ---------------------------------------------------------------------------


def read_config(folder: str) -> EagleConfig:
    """The head's config from `folder` (published or our layout)."""
    path, data = read_head_json(folder, "EAGLE", f"{WEIGHTS_FILE} (or {PICKLE_WEIGHTS_FILE})")
    try:
        if heads_config_kind(data) == "eagle3":
            raise ModelLoadError(f"{folder} holds an EAGLE-3 head, not an EAGLE-1/2 one: {EAGLE3_ADVICE}")
        return EagleConfig(**layer_fields(data), fc_bias=bool(data.get("bias", True)))
    except (ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(
            f"{path} is not an EAGLE head config: it needs hidden_size, intermediate_size and "
            f"num_attention_heads, as a one-layer Llama config. ({type(error).__name__}: {error})"
        ) from error


def load_head(folder: str, target: EagleConfig) -> EagleHead:
    """Load the head in `folder` for a target whose own layer shape is `target`
    (EagleConfig.for_target); a mismatch names what differs."""
    config = read_config(folder)
    checks = [
        ("hidden size", config.hidden_size, target.hidden_size),
        ("attention heads", config.num_heads, target.num_heads),
        ("key/value heads", config.num_kv_heads, target.num_kv_heads),
        ("head dimension", config.head_dim, target.head_dim),
    ]
    if config.vocab_size:
        checks.append(("vocabulary size", config.vocab_size, target.vocab_size))
    wrong = [f"{what} {theirs} (the target's: {ours})" for what, theirs, ours in checks if theirs != ours]
    if wrong:
        made_for = f" (made for {config.base_model})" if config.base_model else ""
        raise ModelLoadError(
            f"The EAGLE head in {folder}{made_for} does not fit this target: its {', '.join(wrong)}. "
            "Use a head trained for this target, or train one with specdeck-cli train-heads --kind eagle."
        )
    weights = _read_weights(folder)
    # Published heads differ in their biases; the weights say which they have.
    config = EagleConfig(
        **{
            **asdict(config),
            "vocab_size": target.vocab_size,
            "fc_bias": "fc.bias" in weights,
            "attention_bias": "layers.0.self_attn.q_proj.bias" in weights,
        }
    )
    head = EagleHead(config)
    if any(name.startswith("midlayer.") for name in weights) or "d2t" in weights:
        raise ModelLoadError(f"{folder} holds an EAGLE-3 head, not an EAGLE-1/2 one: {EAGLE3_ADVICE}")
    expected = head.weights()
    check_weights(weights, expected, folder, "EAGLE")
    head.load_state_dict({_OURS[k]: weights[k].float() for k in expected}, strict=True)
    vocab = weights.get(DRAFT_VOCAB_KEY)
    if vocab is not None:
        vocab = vocab.to(torch.int64).flatten()
        if vocab.numel() == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= target.vocab_size:
            raise ModelLoadError(
                f"The draft vocabulary in {folder} holds ids outside the target's vocabulary "
                f"(0..{target.vocab_size - 1}): the head belongs to another model."
            )
        head.draft_vocab = vocab
    return head.eval()


def _read_weights(folder: str) -> dict[str, torch.Tensor]:
    return read_weights(folder, WEIGHTS_FILE, PICKLE_WEIGHTS_FILE, "EAGLE")


def layer_fields(data: dict) -> dict:
    """What a draft head's config.json (a one-layer Llama config) says of its layer, and our section's
    facts: the fields EagleConfig and Eagle3Config share. KeyError / ValueError when it is no such config."""
    heads = int(data["num_attention_heads"])
    hidden = int(data["hidden_size"])
    ours = data.get("specdeck") or {}
    return dict(
        hidden_size=hidden,
        intermediate_size=int(data["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or hidden // heads),
        rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        vocab_size=int(data.get("vocab_size", 0)),
        attention_bias=bool(data.get("attention_bias", False)),
        base_model=str(ours.get("base_model") or data.get("_name_or_path") or ""),
        training=dict(ours.get("training") or {}),
    )
