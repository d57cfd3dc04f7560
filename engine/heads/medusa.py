"""Medusa-1 heads: each predicts one more token ahead from the target's last hidden state.

Cai et al. 2024 (arXiv 2401.10774). Head k (k = 1..K) maps the final hidden state
h_t (after the final norm) of position t to a distribution over the token at
t + 1 + k; the target's own LM head already predicts t + 1. Each head is

    z = h + SiLU(W_j z + b_j)     (num_layers residual blocks, W_j starts at zero)
    logits = LM(z)                (the target's LM head, or the head's own)

so an untrained head repeats the target's next-token prediction.

On disk, two layouts are read:
- the published one (FasterDecoding/Medusa): config.json with medusa_num_heads,
  medusa_num_layers, base_model_name_or_path, and medusa_lm_head.safetensors
  (or medusa_lm_head.pt, read with torch.load(weights_only=True)) holding
  "{k}.{j}.linear.weight/bias" and each head's own LM head "{k}.{num_layers}.weight";
- ours, the same names plus "specdeck" keys in config.json, where
  "shared_lm_head": true means the heads have no LM head of their own and use the
  target's. That keeps trained heads small enough to ship (the 49152 x 576 LM
  head of SmolLM2-135M alone is 113 MB in float32).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from engine.errors import ModelLoadError
from engine.heads.files import check_weights, read_weights

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "medusa_lm_head.safetensors"
PICKLE_WEIGHTS_FILE = "medusa_lm_head.pt"


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int  # residual blocks per head
    hidden_size: int
    vocab_size: int
    shared_lm_head: bool = True  # use the target's LM head (ours) or each head's own (published)
    base_model: str = ""  # what the heads were trained for (name or path), for messages
    training: dict = field(default_factory=dict)  # how they were made: data, steps, loss...

    def to_json(self) -> dict:
        data = {
            "medusa_num_heads": self.num_heads,
            "medusa_num_layers": self.num_layers,
            "base_model_name_or_path": self.base_model,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "specdeck": {"shared_lm_head": self.shared_lm_head, "training": self.training},
        }
        return data


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # start as the identity: heads begin as the LM head
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads; `forward(h)` gives logits (K, ..., V) for hidden states h (..., H)."""

    def __init__(self, config: MedusaConfig, lm_head: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        heads = []
        for _ in range(config.num_heads):
            blocks: list[nn.Module] = [ResBlock(config.hidden_size) for _ in range(config.num_layers)]
            if not config.shared_lm_head:
                blocks.append(nn.Linear(config.hidden_size, config.vocab_size, bias=False))
            heads.append(nn.Sequential(*blocks))
        self.heads = nn.ModuleList(heads)
        # The target's LM head is borrowed, not owned: kept out of state_dict and parameters.
        self._lm_head = [lm_head]

    @property
    def lm_head(self) -> nn.Module | None:
        return self._lm_head[0]

    def set_lm_head(self, lm_head: nn.Module | None) -> None:
        self._lm_head[0] = lm_head

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each head's transformed hidden state (K, ..., H), before any LM head (shared heads only)."""
        return torch.stack([head(hidden) for head in self.heads])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.config.shared_lm_head:
            return torch.stack([head(hidden) for head in self.heads])
        if self.lm_head is None:
            raise RuntimeError("these Medusa heads share the target's LM head: call set_lm_head first")
        return self.lm_head(self.features(hidden))

    # -- files ---------------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """State dict in the published key layout: "{k}.{j}.linear.weight"..."""
        return {name.removeprefix("heads."): t.detach().contiguous() for name, t in self.state_dict().items()}

    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        save_file(self.weights(), os.path.join(folder, WEIGHTS_FILE))
        with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(self.config.to_json(), f, indent=2)


def read_config(folder: str) -> MedusaConfig:
    """The heads' config from `folder`, in either layout; sizes inferred from the weights when missing."""
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isdir(folder):
        raise ModelLoadError(
            f"Medusa heads folder not found: {folder}. Give the folder holding config.json and {WEIGHTS_FILE}."
        )
    if not os.path.isfile(path):
        raise ModelLoadError(f"{folder} has no config.json, so it is not a Medusa heads folder.")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        num_heads = int(data["medusa_num_heads"])
        num_layers = int(data.get("medusa_num_layers", 1))
    except (ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(
            f"{path} is not a Medusa config: it needs medusa_num_heads (and medusa_num_layers). ({error})"
        ) from error
    ours = data.get("specdeck") or {}
    weights = _read_weights(folder)
    first = weights.get("0.0.linear.weight")
    if first is None or num_heads < 1 or num_layers < 1:
        raise ModelLoadError(f"The weights in {folder} do not hold Medusa heads (no '0.0.linear.weight').")
    shared = bool(ours.get("shared_lm_head", f"0.{num_layers}.weight" not in weights))
    own = weights.get(f"0.{num_layers}.weight")
    vocab = int(data.get("vocab_size") or (own.shape[0] if own is not None else 0))
    return MedusaConfig(
        num_heads=num_heads,
        num_layers=num_layers,
        hidden_size=int(first.shape[1]),
        vocab_size=vocab,
        shared_lm_head=shared,
        base_model=str(data.get("base_model_name_or_path") or ""),
        training=dict(ours.get("training") or {}),
    )


def load_heads(folder: str, hidden_size: int, vocab_size: int, lm_head: nn.Module | None = None) -> MedusaHeads:
    """Load heads for a target with this hidden size and vocabulary; clear errors when they do not fit."""
    config = read_config(folder)
    if config.hidden_size != hidden_size:
        raise ModelLoadError(
            f"The Medusa heads in {folder} were made for a hidden size of {config.hidden_size} "
            f"(base model {config.base_model or 'unknown'}), but the target's is {hidden_size}: "
            "use heads trained for this target, or train some with specdeck-cli train-heads."
        )
    if not config.shared_lm_head and config.vocab_size != vocab_size:
        raise ModelLoadError(
            f"The Medusa heads in {folder} predict {config.vocab_size} tokens but the target's "
            f"vocabulary has {vocab_size}: they belong to another model family."
        )
    if config.shared_lm_head:
        config = MedusaConfig(**{**asdict(config), "vocab_size": vocab_size})
    heads = MedusaHeads(config, lm_head)
    weights = _read_weights(folder)
    expected = heads.weights()
    check_weights(weights, expected, folder, "Medusa")
    heads.load_state_dict({f"heads.{k}": weights[k] for k in expected}, strict=True)
    return heads.eval()


def _read_weights(folder: str) -> dict[str, torch.Tensor]:
    return read_weights(folder, WEIGHTS_FILE, PICKLE_WEIGHTS_FILE, "Medusa")
