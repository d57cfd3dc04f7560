"""Chained drafters: members asked in order, the best-paying one drafts, lossless whoever drafted."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine import ConfigError
from engine.api import Engine, EngineConfig, collect
from engine.cli.main import build_parser
from engine.cli.options import drafter_choice
from engine.core.decode import decode_steps
from engine.core.draft_length import DraftLength
from engine.core.sampling import SamplingConfig
from engine.drafters.base import EMPTY_DRAFT, ChainDraft, Draft, Drafter, FreeToAsk
from engine.drafters.chain import ChainDrafter
from engine.drafters.chain_spec import ChainStats
from engine.drafters.ngram import NgramDrafter
from engine.drafters.registry import drafter_spec, option_settings
from tests.factories.fake import MarkovBackend, MarkovDrafter, cycle_transition, random_transition
from tests.stats_helpers import chi_square_pvalue, three_token_law

GREEDY = SamplingConfig(max_tokens=40)


class Guesser(Drafter):
    """A free drafter that always drafts the token `step` ahead of the cycle (1: right, 2: wrong)."""

    name = "guesser"
    capabilities = frozenset({FreeToAsk})

    def __init__(self, vocab: int, step: int) -> None:
        self.vocab, self.step = vocab, step

    def propose(self, context, k, sampling, generator) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        last = context[-1]
        return ChainDraft(tokens=[(last + self.step * (i + 1)) % self.vocab for i in range(k)])


def run(backend, prompt, sampling, drafter, k=4):
    return collect(list(decode_steps(backend, prompt, sampling, drafter=drafter, draft_length=DraftLength(k))))


# -- the name, the options, the flags --------------------------------------------------------


def test_a_chain_takes_its_members_options_and_flags():
    spec = drafter_spec("suffix+model")
    assert spec.label == "Suffix decoding, then Draft model" and spec.loads_model and not spec.needs_torch
    names = [s.name for s in option_settings(spec)]
    assert names == [s.name for s in option_settings("suffix")] + [s.name for s in option_settings("model")]
    assert drafter_spec("suffix+eagle").needs_torch  # what a member needs, the chain needs

    args = build_parser().parse_args(
        ["generate", "-p", "hi", "--drafter", "suffix+model", "--draft", "d.gguf", "--suffix-depth", "12"]
    )
    name, options = drafter_choice(args)
    assert name == "suffix+model" and (options.draft, options.max_depth, options.min_prob) == ("d.gguf", 12, 0.2)
    config = EngineConfig(drafter=name, options=options)
    assert EngineConfig.from_dict(config.to_dict()) == config  # saved and read back by the app
    with pytest.raises(ConfigError, match="--ngram-max is an option of --drafter ngram"):
        drafter_choice(
            build_parser().parse_args(["generate", "-p", "hi", "--drafter", "suffix+model", "--ngram-max", "4"])
        )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("suffix+suffix", "names a drafter twice"),
        ("none+ngram", "includes plain decoding"),
        ("medusa+eagle", "cannot hold both medusa and eagle: both have the option 'heads'"),
        ("suffix+telepathy", "Unknown drafter 'telepathy'"),
        ("suffix+", "two or more, joined by '\\+'"),
    ],
)
def test_a_chain_that_cannot_work_says_why(name, message):
    with pytest.raises(ConfigError, match=message):
        drafter_spec(name)
    with pytest.raises(ConfigError):
        EngineConfig.from_dict({**EngineConfig().to_dict(), "drafter": name, "options": {}})


# -- which member drafts ----------------------------------------------------------------------


def test_the_member_whose_drafts_land_drafts_and_the_other_is_still_measured():
    vocab = 8
    backend = MarkovBackend(cycle_transition(vocab, noise=0.0))
    wrong, right = Guesser(vocab, step=2), MarkovDrafter(cycle_transition(vocab, noise=0.0))
    chain = ChainDrafter([("wrong", wrong), ("model", right)])
    result = run(backend, [0, 1, 2], GREEDY, chain)
    first, model = chain.members
    # The free guesser is tried once (nothing measured, it is asked first), then loses to the model.
    assert first.steps <= 1 and model.steps >= 8 and result.stats.acceptance_rate > 0.9
    assert first.length.acceptance < 0.2  # its unused drafts were checked every step
    stats = chain.stats()
    assert isinstance(stats, ChainStats) and stats.members == ("wrong", "model") and stats.drafted_by == 2
    assert ChainStats.describe(stats.as_dict()).startswith(f"wrong drafted {first.steps} steps")

    # The other way round: a free member that is right drafts, and the model sits out.
    chain = ChainDrafter([("right", Guesser(vocab, step=1)), ("model", MarkovDrafter(random_transition(vocab, 3)))])
    run(backend, [0, 1, 2], GREEDY, chain)
    assert chain.members[0].steps >= 8 and chain.members[1].steps <= 1


def test_sampled_chained_drafting_is_lossless():
    """Joint law of the first three tokens equals the target's, with n-gram lookup and a draft model
    of another law taking turns."""
    vocab, draws = 3, 2000
    target = random_transition(vocab, seed=5, sharpness=1.5)
    backend = MarkovBackend(target)
    prompt = [0, 1, 2, 0, 2, 1, 0, 1, 2, 0]
    counts = np.zeros(vocab**3)
    by_member = np.zeros(2)
    for seed in range(draws):
        chain = ChainDrafter([("ngram", NgramDrafter()), ("model", MarkovDrafter(random_transition(vocab, seed=9)))])
        result = run(backend, prompt, SamplingConfig(temperature=1.0, max_tokens=3, seed=seed), chain, k=2)
        a, b, c = result.tokens
        counts[(a * vocab + b) * vocab + c] += 1
        by_member += [m.steps for m in chain.members]
    assert by_member.min() > draws // 10  # both members drafted, many times
    assert chi_square_pvalue(counts, three_token_law(target, prompt[-1])) > 1e-3


# -- a real pair --------------------------------------------------------------------------------


EDIT = (
    "Here is a function:\n\ndef area(width, height):\n    return width * height\n\n"
    "Rename width to w and height to h, and show the whole function again."
)


def test_float32_greedy_suffix_then_draft_model_equals_vanilla(embedded_hf_dir, default_gguf):
    """The embedded model in float32 on PyTorch, drafted by suffix decoding and by its own Q4_1 file."""
    config = EngineConfig(target=embedded_hf_dir, backend="torch", dtype="float32", k=8, threads=1).with_drafter(
        "suffix+model", draft=default_gguf, backend="llama.cpp", threads=1
    )
    engine = Engine.load(config)
    try:
        comparison = engine.compare(engine.prompt_ids(EDIT), SamplingConfig(max_tokens=48))
        assert comparison.speculative.tokens == comparison.vanilla.tokens
        chain = engine.drafter
        assert chain.name == "suffix+model" and sum(m.steps for m in chain.members) > 0
        assert comparison.speculative.stats.steps < comparison.vanilla.stats.steps  # drafts landed
    finally:
        engine.close()


def test_the_cli_says_which_member_drafted(capsys):
    from engine.cli.main import main

    prompt = "Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges."
    assert (
        main(
            [
                "generate",
                "-p",
                prompt,
                "--drafter",
                "suffix+model",
                "--draft",
                "default",
                "--k",
                "4",
                "-n",
                "24",
                "-t",
                "1",
                "--draft-threads",
                "1",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("drafters: "))
    steps = [int(n) for n in re.findall(r"(?:suffix drafted|model) (\d+)", line)]
    assert line.startswith("drafters: suffix drafted") and len(steps) == 2 and sum(steps) > 0


def test_a_chain_declares_and_forwards_only_what_its_members_have():
    from engine.drafters.base import DraftsTrees, MeasuresCost, ReadsCosts, ReadsFeatures, RemembersReplies, has
    from engine.drafters.suffix import SuffixDrafter

    plain = ChainDrafter([("a", Guesser(8, 1)), ("b", Guesser(8, 2))])
    assert has(plain, ReadsCosts)  # the chain scores its members on the engine's curve
    assert not any(has(plain, p) for p in (DraftsTrees, ReadsFeatures, MeasuresCost, RemembersReplies))

    class Remembering(Guesser):
        capabilities = frozenset({FreeToAsk, RemembersReplies})

        def __init__(self, vocab, step):
            super().__init__(vocab, step)
            self.told = []

        def begin(self, prompt):
            self.told.append(("begin", list(prompt)))

        def forget(self):
            self.told.append(("forget",))

    remembering = Remembering(8, 1)
    mixed = ChainDrafter([("suffix", SuffixDrafter(trees=True)), ("r", remembering), ("g", Guesser(8, 2))])
    assert has(mixed, DraftsTrees) and has(mixed, RemembersReplies) and not has(mixed, ReadsFeatures)
    mixed.begin([1, 2, 3])
    mixed.forget()  # the plain guesser, which has neither, is not asked
    assert remembering.told == [("begin", [1, 2, 3]), ("forget",)]
