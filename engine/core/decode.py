"""The decode loop: one speculative step per target forward, yielded as it happens.

The engine knows nothing about chat or text beyond turning ids into pieces for
display; it takes prompt ids and yields `StepEvent`s.

Cache invariant: the target's cache holds every committed token but the last
one, which is "pending" and goes in front of the drafts in the next forward:

    committed:  x_1 ... x_{m-1} x_m
    cache:      x_1 ... x_{m-1}
    step feed:  [x_m, d_1, ..., d_n]        -> logits rows l_0 ... l_n
                l_{i-1} is p's row for d_i; l_n is the row after d_n (bonus)

After the verdict (j drafts kept, then token y), roll the cache back to
x_1..x_m d_1..d_j; y becomes the new pending token. Plain (vanilla) decoding is
the same step with n = 0, so both go through one code path and one sampler.

Trees (Medusa, EAGLE): the feed is [x_m, node_1, ..., node_n] with node i
attending to its ancestors only (`TreeForward.forward_tree`, parents shifted by one
for x_m in front); row i + 1 is p after node i. The verdict is a root-to-node
path (engine/core/verify_tree.py) and `keep_nodes` keeps x_m and that path. A backend
without tree attention (transformers' own forward; llama.cpp on a hybrid model, whose
recurrent state cannot branch) gets the draft's best branch as a chain, and the run says
so in `RunStats.notes`. Drafters that read the target's hidden
states (ReadsFeatures) get the rows of what the step kept (x_m, then the accepted drafts).

Extra rows (lookahead decoding's Jacobi window): a draft may add e rows that ride
along unverified. The feed becomes [x_m, node_1..node_n, extra_1..extra_e] in one
`TreeForward.forward_masked` call: x_m at offset 0, node i at its depth, extra j at
the offset the drafter gave; the mask is the tree's (each node sees x_m and its
ancestors) plus the drafter's block among the extra rows, which also see x_m
and the cache, while nodes and extras never see each other. So rows 0..n are
exactly what `forward_tree` would have returned and the verdict is unchanged;
rows n+1.. go to `observe_extra` (a ReadsExtraRows drafter), and `keep_rows` keeps x_m and the
accepted path (dropping the extras). The step costs n + 1 + e rows, and that is
what the cost model is told (`CostModel.observe_verify`) and what the predicted
speedup charges. Extras that would not fit in the context are dropped, and so
are they on a backend without tree attention (a chain cannot carry them).

Early exit (self-speculation): the drafter ran the target's first L layers over
x_m, d_1..d_{n-1}; the verifying forward starts from the residual stream they
left (`LayerExit.forward_from_exit`), so only d_n runs the first layers, and the
rows are the ones a full forward gives.

Each of these is one feed object (engine/core/feeds.py) that knows its forward,
its rule and its commit; the step below is the same for all of them. A generation's
draft bounds (n_min, n_max, p_min: engine/core/draft_bounds.py) come with its
DraftLength and are applied where k is chosen and where the draft is fitted to k.

The step is engine/core/batch.py's, for any number of sequences decoded together: one
target forward per step over the rows of all of them, each sequence judged and committed on
its own (engine/core/sequence.py). One generation alone, `decode_steps` below, is that
batch with one sequence: the same step, its forward its slot's own. The reply's text,
held back where it might begin a stop string, is engine/core/reply.py; the run's predicted
speedup is engine/core/prediction.py. The drafter's opt-in calls (hidden states, extra rows,
the prompt, the tree estimate: engine/drafters/base.py) are looked up once per generation,
not per step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from engine.backends.base import Backend
from engine.backends.capabilities import TreeForward, has
from engine.core.batch import Batch
from engine.core.draft_length import CostModel, DraftLength
from engine.core.events import StepEvent
from engine.core.sampling import SamplingConfig
from engine.drafters.base import Drafter, DraftsTrees


def decode_steps(
    target: Backend,
    prompt: list[int],
    sampling: SamplingConfig,
    *,
    drafter: Drafter | None = None,
    draft_length: DraftLength | None = None,
    costs: CostModel | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[StepEvent]:
    """Generate after `prompt`, speculatively when a drafter is given, plainly otherwise: a batch of one."""
    batch = Batch(target, costs if costs is not None else CostModel())
    try:
        batch.join(
            prompt,
            sampling,
            drafter=drafter,
            draft_length=draft_length,
            cancel=cancel,
            notes=run_notes(target, drafter),
        )
        while batch.sequences:
            for _, outcome in batch.step():
                if isinstance(outcome, BaseException):
                    raise outcome
                yield outcome
    finally:
        batch.close()


def run_notes(target: Backend, drafter: Drafter | None) -> tuple[str, ...]:
    """Sentences a UI should show about this target/drafter combination (RunStats.notes): first what
    loading the models found (a damaged GGUF: engine/models/gguf_check.py)."""
    draft_model = getattr(drafter, "backend", None)  # the model drafter's draft model
    notes = [*target.load_notes, *(draft_model.load_notes if isinstance(draft_model, Backend) else ())]
    if has(drafter, DraftsTrees) and not has(target, TreeForward):
        notes.append(
            f"The {target.name} backend verifies chains only, so each {drafter.name} draft tree is cut "
            "to its most likely branch: fewer tokens are accepted per step than with the PyTorch "
            "backend, which verifies the whole tree."
        )
    return tuple(notes)
