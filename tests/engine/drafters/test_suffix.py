"""Suffix decoding: the longest match votes, drafts sized by the match, earlier replies remembered, lossless."""

from __future__ import annotations

import numpy as np

from engine.api import Engine, EngineConfig, collect
from engine.core.decode import decode_steps
from engine.core.draft_length import CostModel, DraftLength
from engine.core.sampling import SamplingConfig
from engine.drafters.base import DraftsTrees, has
from engine.drafters.suffix import SuffixDrafter, SuffixHistory
from tests.engine.drafters.build import make_drafter
from tests.factories.fake import MarkovBackend, MarkovTreeBackend, random_transition
from tests.factories.fake import cycle_transition as cycle
from tests.stats_helpers import chi_square_pvalue, three_token_law

GREEDY = SamplingConfig(max_tokens=40)
EDIT = (
    "Here is a function:\n\ndef area(width, height):\n    return width * height\n\n"
    "Rename width to w and height to h, and show the whole function again."
)


def propose(drafter: SuffixDrafter, context: list[int], k: int = 16):
    return drafter.propose(context, k, GREEDY, None)


def run(backend, prompt, sampling, drafter=None, k=8):
    length = DraftLength(k) if drafter is not None else None
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=length)))


# -- what it drafts ----------------------------------------------------------------------------


def test_every_occurrence_of_the_longest_match_votes_for_what_follows():
    drafter = SuffixDrafter(trees=False)
    # "7 8 9" came three times: twice followed by 1 2, once by 5.
    context = [7, 8, 9, 1, 2, 0, 7, 8, 9, 5, 0, 7, 8, 9, 1, 2, 0, 3, 7, 8, 9]
    drafter.begin(context)
    draft = propose(drafter, context)
    assert draft.tokens[:2] == [1, 2]  # the majority (and the most recent)...
    context2 = [7, 8, 9, 1, 2, 0, 7, 8, 9, 1, 2, 0, 7, 8, 9, 1, 2, 0, 7, 8, 9, 5, 3, 7, 8, 9]
    drafter.begin(context2)
    assert propose(drafter, context2).tokens[:2] == [1, 2]  # ...and here the most recent is 5: votes win
    assert drafter.stats().match_length == 3


def test_a_draft_is_as_long_as_its_match_supports_and_stops_where_the_votes_split():
    text = list(range(10, 40))
    drafter = SuffixDrafter(trees=False, spec_factor=1.0)
    short = [*text, 99, 10]  # a one-token match: one token drafted
    drafter.begin(short)
    assert propose(drafter, short).tokens == [11]
    long = [*text, 99, *text[:12]]  # a 12-token match: 12 tokens drafted (k allowing)
    drafter.begin(long)
    assert propose(drafter, long, k=16).tokens == text[12:24]
    assert propose(drafter, long, k=5).tokens == text[12:17]  # never more than k
    # Two continuations half and half, and a least share above a half: nothing past the split.
    split = [5, 1, 2, 3, 4, 0, 6, 1, 2, 3, 7, 0, 8, 1, 2, 3]
    strict = SuffixDrafter(trees=False, min_prob=0.6)
    strict.begin(split)
    assert propose(strict, split).tokens == []


def test_a_tree_holds_both_continuations_best_first_and_its_best_branch_for_chain_backends():
    context = [1, 2, 3, 4, 5, 90, 1, 2, 3, 4, 6, 91, 1, 2, 3, 4, 5, 92, 1, 2, 3]
    drafter = SuffixDrafter(trees=True)
    drafter.begin(context)
    draft = propose(drafter, context, k=8)
    assert draft.tokens[0] == 4 and draft.parents[0] == -1
    children = {draft.tokens[i] for i, p in enumerate(draft.parents) if p == 0}
    assert children == {5, 6}  # both seen after "1 2 3 4"
    assert [draft.tokens[node] for node in draft.best_path][:2] == [4, 5]  # 5 twice, 6 once
    assert all(-1 <= p < i for i, p in enumerate(draft.parents))


def test_earlier_replies_are_searched_in_later_generations_and_the_history_stays_bounded():
    drafter = SuffixDrafter(trees=False, history_tokens=1000, spec_factor=1.0)
    first_prompt = [500, 501]
    reply = list(range(100, 130))
    drafter.begin(first_prompt)
    propose(drafter, [*first_prompt, *reply])  # the engine shows the drafter the text as it grows
    # A new conversation whose text has never contained the reply: its start is found in the history.
    second = [600, 601, 602, *reply[:6]]
    drafter.begin(second)
    draft = propose(drafter, second)
    assert draft.tokens == reply[6:12] and drafter.stats().from_history == 1
    assert drafter.stats().history_tokens == len(reply)

    history = SuffixHistory(capacity=100)
    for start in range(0, 400, 40):
        history.add(list(range(start, start + 40)))
    assert history.tokens <= 100 and history.replies[-1] == list(range(360, 400))  # the oldest went first


def test_without_history_only_the_text_is_searched():
    drafter = SuffixDrafter(trees=False, history_tokens=0)
    drafter.begin([1, 2])
    propose(drafter, [1, 2, *range(100, 130)])
    drafter.begin([7, 100, 101, 102])
    assert propose(drafter, [7, 100, 101, 102]).tokens == [] and drafter.stats().history_tokens == 0


# -- lossless -----------------------------------------------------------------------------------


def test_greedy_equals_vanilla_with_chains_and_with_trees():
    t = cycle(12)
    prompt = list(range(12)) + [0, 1, 2]
    vanilla = run(MarkovBackend(t), prompt, GREEDY)
    for backend, trees in ((MarkovBackend(t), False), (MarkovTreeBackend(t), True)):
        drafter = SuffixDrafter(trees=trees)
        result = run(backend, prompt, GREEDY, drafter, k=8)
        assert result.tokens == vanilla.tokens
        assert result.stats.accepted > 20 and result.stats.steps < len(result.tokens) / 2  # long drafts, kept
        assert backend.tokens == [*prompt, *result.tokens][:-1]


def test_sampled_suffix_decoding_is_lossless_with_trees():
    """Joint law of the first three reply tokens equals the chain's, the tree both right and wrong."""
    vocab, draws = 3, 2000
    target = random_transition(vocab, seed=5, sharpness=1.5)
    backend = MarkovTreeBackend(target)
    prompt = [0, 1, 2, 0, 2, 1, 0, 1, 2, 0]
    counts = np.zeros(vocab**3)
    accepted = 0
    for seed in range(draws):
        drafter = SuffixDrafter(trees=True, history_tokens=0)
        result = run(backend, prompt, SamplingConfig(temperature=1.0, max_tokens=3, seed=seed), drafter, k=4)
        a, b, c = result.tokens
        counts[(a * vocab + b) * vocab + c] += 1
        accepted += result.stats.accepted
    assert accepted > draws // 4
    assert chi_square_pvalue(counts, three_token_law(target, prompt[-1])) > 1e-3


def test_float32_greedy_suffix_equals_vanilla_on_the_embedded_model_as_a_tree(embedded_hf_dir):
    from engine.backends.hf.backend import TorchBackend

    backend = TorchBackend(embedded_hf_dir, dtype="float32")
    try:
        engine = Engine(backend, make_drafter("suffix", backend), EngineConfig(drafter="suffix", k=12), CostModel())
        assert has(engine.drafter, DraftsTrees)  # the PyTorch backend verifies trees
        comparison = engine.compare(engine.prompt_ids(EDIT), SamplingConfig(temperature=0.0, max_tokens=40))
        assert comparison.identical, comparison.divergence
        s = comparison.speculative.stats
        assert s.accepted > 10 and s.tokens_per_step > 1.3  # the reply repeats the function
    finally:
        backend.close()


def test_on_llama_cpp_it_drafts_trees_and_the_reply_repeats_faster(default_llama):
    drafter = make_drafter("suffix", default_llama)
    assert has(drafter, DraftsTrees)  # llama.cpp verifies whole trees through sequence ids
    engine = Engine(default_llama, drafter, EngineConfig(drafter="suffix", k=12), CostModel())
    result = engine.generate(engine.prompt_ids(EDIT), SamplingConfig(temperature=0.0, max_tokens=40))
    s = result.stats
    assert s.accepted > 10 and s.tokens_per_step > 1.3
    assert drafter.stats().hits > 0 and drafter.stats().match_length >= 1
