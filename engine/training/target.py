"""The frozen target as training sees it: final hidden states, its LM head, its tokenizer.

Training runs many tokens at once with no cache, which is not what a decoding
backend is for, so the model is loaded here with transformers directly (always
local files only, never remote code). Every parameter is frozen; the LM head
is shared with the heads, so gradients flow *through* it to the heads but never
change it.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from engine.backends.hf.device import pick_device, pick_dtype
from engine.errors import ModelLoadError
from engine.models.memory_errors import is_allocation_failure, out_of_memory, release_frames
from engine.models.locate import resolve


class FrozenTarget:
    """A causal LM loaded for training: `hidden_states(ids)` and `lm_head`, nothing learns."""

    def __init__(self, model, tokenizer, name: str, path: str, device: str, dtype: torch.dtype) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.path = path
        self.device = device
        self.dtype = dtype
        for param in model.parameters():
            param.requires_grad_(False)
        head = model.get_output_embeddings()
        if head is None:
            raise ModelLoadError(f"{name} has no output layer (LM head), so Medusa heads cannot share one.")
        self.lm_head: nn.Module = head
        self._body = getattr(model, model.base_model_prefix, None)
        if self._body is None:
            raise ModelLoadError(f"Cannot find the transformer body of {name} ({type(model).__name__}).")

    @property
    def hidden_size(self) -> int:
        return int(self.lm_head.weight.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def stop_ids(self) -> frozenset[int]:
        """Ids that end a reply: the generation config's EOS ids and the tokenizer's."""
        ids = set()
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states after the final norm, (B, T) -> (B, T, H), in the target's dtype."""
        out = self._body(input_ids=input_ids.to(self.device), use_cache=False)
        return out.last_hidden_state  # (B, T, H)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's input embeddings (..., H) of ids, in its dtype (no grad flows into them)."""
        return self.model.get_input_embeddings()(ids.to(self.device))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (n, head_dim) of the target's rotary embedding (for an EAGLE head)."""
        reference = self.lm_head.weight
        cos, sin = self._body.rotary_emb(reference, positions.to(self.device)[None])
        return cos[0], sin[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on any (..., H) features -> float32 (..., V); differentiable in `hidden`."""
        return self.lm_head(hidden.to(self.dtype)).float()

    # -- text ----------------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Plain text as the tokenizer encodes a document (with its BOS, if it adds one)."""
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A whole conversation through the chat template (no generation prompt)."""
        template = getattr(self.tokenizer, "chat_template", None)
        if template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        # No template (a base model): the same "role: content" lines the engine uses.
        lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return self.encode_text(lines)

    def close(self) -> None:
        self.model = self._body = self.lm_head = None


def load_target(spec: str, *, device: str = "auto", dtype: str = "auto") -> FrozenTarget:
    """Load `spec` ("default", a GGUF file, a model folder, a cached repo id) for training."""
    ref = resolve(spec)
    chosen_device = pick_device(device)
    chosen_dtype = pick_dtype(chosen_device, dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options: dict = {"local_files_only": True, "trust_remote_code": False}
    if ref.kind == "gguf":
        folder, options["gguf_file"] = os.path.split(ref.path)
        try:
            from transformers import GgufConfig

            options["quantization_config"] = GgufConfig(dequantize=True)
        except ImportError:  # older 5.x: dense is the only way
            pass
    else:
        folder = ref.path
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=chosen_dtype, **options)
        model = model.to(chosen_device).eval()
        options.pop("quantization_config", None)
        tokenizer = AutoTokenizer.from_pretrained(folder, **options)
    except Exception as error:  # noqa: BLE001 - every failure gets a message that says what to do
        if is_allocation_failure(error):
            release_frames(error)  # the half-loaded model, before the estimate reads the file
            raise out_of_memory(f"load {ref.name} for training", path=ref.path, backend="torch",
                                dtype=str(chosen_dtype).removeprefix("torch."), device=str(chosen_device)) from error  # fmt: skip
        detail = f"{type(error).__name__}: {error}"[:300]
        raise ModelLoadError(
            f"Could not load {ref.path} for training with transformers: the files may be incomplete, or the "
            f"architecture or quantization unsupported. ({detail})"
        ) from error
    return FrozenTarget(model, tokenizer, ref.name, ref.path, chosen_device, chosen_dtype)
