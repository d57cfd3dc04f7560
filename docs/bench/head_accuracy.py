"""Held-out top-1 agreement of the shipped Medusa heads and EAGLE head with the embedded target.

The text is the target's own greedy replies (128 tokens, bfloat16, PyTorch backend) to the
benchmark prompts, which no head was trained on (engine/training/data.py keeps them out of
self-generation). With the target's true features in view (teacher forcing, as the training
validation measures):

- Medusa head k: does the head's top-1 from h_t equal the target's greedy token t + 1 + k?
- EAGLE depth 1: the head's guess g_{t+1} from (f_t, x_{t+1}); depth 2: g'_{t+2} from
  (g_{t+1}, x_{t+2}), the head fed its own guess as in a draft tree's second level. Does
  LM(g) give the target's greedy token after it?

With an EAGLE-3 head (shipped in resources/heads/eagle3-smollm2-135m, or the folder in
$SPECDECK_EAGLE3_HEADS), also its agreement at depths 1..7 (unrolled on its own guesses, as
its training-time test does), and what decides whether it ships: greedy tokens per target
forward of EAGLE-2 (the shipped head) and EAGLE-3 at the same node budget ($NODE_BUDGET, 10
by default) on the same prompts.

    python docs/bench/head_accuracy.py        (docs/benchmarks.md, "Shipped heads")

A dry run on a CPU: PROMPTS=2 MAX_TOKENS=16 (the first prompts only, shorter replies).
"""

import os

import torch

from engine.api import Engine, EngineConfig
from engine.backends.hf.backend import TorchBackend
from engine.bench.prompts import default_prompts_path, load_prompts
from engine.core.draft_length import CostModel
from engine.core.sampling import SamplingConfig
from engine.drafters.registry import make_drafter
from engine.models.locate import default_model_path
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

    @property
    def lm_head(self):
        return backend.lm_head


hits = {f"medusa head {k}": [0, 0] for k in range(1, 5)}
hits.update({"eagle depth 1": [0, 0], "eagle depth 2": [0, 0]})
texts = []  # (prompt ids, prompt ids + the target's greedy reply)
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "128"))
for prompt in load_prompts(default_prompts_path())[: int(os.environ.get("PROMPTS", "0")) or None]:
    ids = engine.prompt_ids(list(prompt.messages))
    reply = list(engine.generate(ids, SamplingConfig(max_tokens=MAX_TOKENS), speculative=False).tokens)
    text = ids + reply
    texts.append((ids, text))
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
        _, accuracy = eagle_losses(
            eagle, Target(), window, feats, labels, metric, feature_scale(feats, metric), None, train=False
        )
        n = window.shape[1]
        for depth, a in zip((1, 2), accuracy):
            hits[f"eagle depth {depth}"][0] += round(a * (n - depth))
            hits[f"eagle depth {depth}"][1] += n - depth
    print(prompt.id, "done", flush=True)
for name, (good, total) in hits.items():
    print(f"{name}: {good / total:.1%} of {total}")

# -- EAGLE-3 against EAGLE-2, when there is an EAGLE-3 head ------------------------------------------
from engine.models.shipped import default_heads_dir  # noqa: E402
from engine.training.eagle3 import eagle3_losses  # noqa: E402

EAGLE3 = os.environ.get("SPECDECK_EAGLE3_HEADS") or default_heads_dir("eagle3", backend.info)
if EAGLE3:
    budget = int(os.environ.get("NODE_BUDGET", "10"))
    eagle3_drafter = make_drafter(backend, EngineConfig().with_drafter("eagle3", heads=EAGLE3))  # watches its layers
    head3 = eagle3_drafter.head
    depths3 = {}
    for ids, text in texts:
        backend.prefill(text)
        with torch.no_grad():
            start = len(ids) - 1
            rows = torch.cat(
                [backend.cached_layer_features(0, len(text)), backend.cached_features(0, len(text))], dim=-1
            )[None, start:]
            labels = backend.lm_head(rows[..., -head3.config.hidden_size :]).argmax(-1)
            _, accuracy = eagle3_losses(head3, Target(), torch.tensor([text[start:]]), rows, labels, train=False)
        n = len(text) - start
        for depth, a in enumerate(accuracy, 1):
            good, total = depths3.get(depth, (0, 0))
            depths3[depth] = (good + round(a * (n - depth)), total + n - depth)
    for depth, (good, total) in depths3.items():
        print(f"eagle3 depth {depth}: {good / total:.1%} of {total}")
    eagle_drafter = make_drafter(backend, EngineConfig(drafter="eagle"))
    for name, drafter in (("eagle", eagle_drafter), ("eagle3", eagle3_drafter)):
        run = Engine(backend, drafter, EngineConfig(drafter=name, k=budget), CostModel())
        tokens = steps = 0
        for ids, _ in texts:
            stats = run.generate(ids, SamplingConfig(max_tokens=MAX_TOKENS)).stats
            tokens += stats.tokens
            steps += stats.steps
        print(f"{name} at {budget} nodes: {tokens / steps:.2f} tokens per target forward ({tokens} tokens)")
else:
    print("no EAGLE-3 head (none shipped, SPECDECK_EAGLE3_HEADS unset): EAGLE-3 not compared")
