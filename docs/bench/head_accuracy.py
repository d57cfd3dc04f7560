"""Held-out top-1 agreement of the shipped Medusa heads and EAGLE head with the embedded target.

The text is the target's own greedy replies (128 tokens, bfloat16, PyTorch backend) to the
benchmark prompts, which no head was trained on (engine/training/data.py keeps them out of
self-generation). With the target's true features in view (teacher forcing, as the training
validation measures):

- Medusa head k: does the head's top-1 from h_t equal the target's greedy token t + 1 + k?
- EAGLE depth 1: the head's guess g_{t+1} from (f_t, x_{t+1}); depth 2: g'_{t+2} from
  (g_{t+1}, x_{t+2}), the head fed its own guess as in a draft tree's second level. Does
  LM(g) give the target's greedy token after it?

    python docs/bench/head_accuracy.py        (docs/benchmarks.md, "Shipped heads")
"""

import torch

from engine.backends.hf.backend import TorchBackend
from engine.bench.prompts import default_prompts_path, load_prompts
from engine.drafters.registry import make_drafter
from engine.models.locate import default_model_path
from engine.core.sampling import SamplingConfig
from engine.api import Engine, EngineConfig
from engine.core.draft_length import CostModel
from engine.training.eagle import eagle_losses
from engine.training.loss import feature_scale, logit_metric

backend = TorchBackend(str(default_model_path()), dtype="bfloat16")
engine = Engine(backend, None, EngineConfig(), CostModel())
medusa = make_drafter(backend, EngineConfig(drafter="medusa")).heads.float()
eagle = make_drafter(backend, EngineConfig(drafter="eagle")).head.float()


class Target:  # what eagle_losses needs, on the backend
    device = "cpu"

    def embed(self, ids):
        return backend.embed(ids)

    def rope(self, positions):
        return backend.rope(positions)

    def logits(self, hidden):
        return backend.lm_head(hidden.to(torch.bfloat16)).float()


hits = {f"medusa head {k}": [0, 0] for k in range(1, 5)}
hits.update({"eagle depth 1": [0, 0], "eagle depth 2": [0, 0]})
for prompt in load_prompts(default_prompts_path()):
    ids = engine.prompt_ids(list(prompt.messages))
    reply = list(engine.generate(ids, SamplingConfig(max_tokens=128), speculative=False).tokens)
    text = ids + reply
    backend.prefill(text)
    with torch.no_grad():
        features = backend.cached_features(0, len(text)).float()  # f_t for every token
        greedy = backend.lm_head(features.to(torch.bfloat16)).argmax(-1)  # the target's token after t
        start = len(ids) - 1  # score the reply's positions only
        for k in range(1, 5):
            guess = backend.lm_head(medusa.features(features[start:-k])[k - 1].to(torch.bfloat16)).argmax(-1)
            truth = greedy[start + k :]
            hits[f"medusa head {k}"][0] += int((guess == truth).sum())
            hits[f"medusa head {k}"][1] += truth.numel()
        window = torch.tensor([text[start:]])
        feats = features[None, start:]
        labels = greedy[None, start:]
        metric = logit_metric(backend.lm_head.weight)
        _, accuracy = eagle_losses(eagle, Target(), window, feats, labels, metric, feature_scale(feats, metric),
                                   None, train=False)  # fmt: skip
        n = window.shape[1]
        for depth, a in zip((1, 2), accuracy):
            hits[f"eagle depth {depth}"][0] += round(a * (n - depth))
            hits[f"eagle depth {depth}"][1] += n - depth
    print(prompt.id, "done", flush=True)
for name, (good, total) in hits.items():
    print(f"{name}: {good / total:.1%} of {total}")
