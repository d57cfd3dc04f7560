"""Chained drafters' registry entries: "suffix+model" is suffix decoding, then a draft model.

A chain is named by its members joined with "+", in the order they are asked
(`--drafter suffix+model`); the algorithm is chain.py. Its entry is made from
its members' when the name is first looked up (`chained_spec`, through
`registry.drafter_spec`), so every pair of drafters chains without a module of
its own:

- its options are one frozen dataclass with every member's option fields, each
  with its own setting (flag, label, default), so the CLI's flags and the pair
  dialog's fields of a chain are its members', and `--draft` sets up the chain's
  draft model as it does the model drafter's;
- it needs what any member needs, loads a model if a member does, drafts trees
  if a member does, can be served where every member can, and its preflight is
  its members' findings in order;
- its statistics are `ChainStats`, for every chain: who drafted each step, and
  each member's share. They are charted under the name "chain" (`CHAIN_STATS`).

A chain may not hold a drafter twice, plain decoding, or two members with an
option of the same name (Medusa's and EAGLE's --heads): it says which.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from engine.drafters.options import DrafterStats, stat
from engine.drafters.spec import DrafterSpec, Load
from engine.errors import ConfigError
from engine.lazy import named

CHAIN_MARK = "+"
STATS_NAME = "chain"  # the name every chain's statistics are charted under
# The chains the pair dialog lists (any other is one flag away): a drafter that costs nothing and
# drafts long where the text repeats, then one that drafts everywhere (TensorRT-LLM's suffix
# automaton before its neural drafter; llama.cpp's n-gram types before its draft model).
SUGGESTED = ("suffix+model", "suffix+eagle", "suffix+medusa")


@dataclass(frozen=True)
class ChainStats(DrafterStats):
    drafted_by: int = stat(label="Drafted by", unit="member (1 = first, 0 = none)")
    members: tuple = stat(label="Members", chart=False, default=())
    steps: tuple = stat(label="Steps drafted", chart=False, default=())
    accepted: tuple = stat(label="Tokens accepted", chart=False, default=())

    @classmethod
    def describe(cls, values: dict) -> str | None:
        """ "suffix drafted 40 steps (312 tokens accepted), model 12 (30)"."""
        rows = list(zip(values.get("members") or (), values.get("steps") or (), values.get("accepted") or ()))
        if not rows:
            return None
        (name, steps, accepted), *rest = rows
        first = f"{name} drafted {steps:,} steps ({accepted:,} tokens accepted)"
        return ", ".join([first, *(f"{n} {s:,} ({a:,})" for n, s, a in rest)])


CHAIN_STATS = DrafterSpec(
    name=STATS_NAME,
    label="Chained drafters",
    summary="Several drafters; each step the one that pays most drafts.",
    options=type("NoOptions", (), {}),
    make=lambda target, options, load: None,
    stats=ChainStats,
)

_made: dict[str, DrafterSpec] = {}


def is_chain(name: str) -> bool:
    return isinstance(name, str) and CHAIN_MARK in name


def member_names(name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in name.split(CHAIN_MARK))


def chained_spec(name: str, lookup: typing.Callable[[str], DrafterSpec]) -> DrafterSpec:
    """The entry of the chain `name`, made once from its members' entries (`lookup(member)`)."""
    spec = _made.get(name)
    if spec is None:
        spec = _made[name] = _make_spec(name, tuple(lookup(member) for member in _checked_names(name)))
    return spec


def made_chains() -> tuple[DrafterSpec, ...]:
    """The chains looked up so far (the owner of a chain's options type is among them)."""
    return tuple(_made.values())


def split_options(members: tuple[DrafterSpec, ...], options) -> list:
    """Each member's own options, from the chain's one options value."""
    values = dataclasses.asdict(options)
    return [m.options(**{f.name: values[f.name] for f in dataclasses.fields(m.options)}) for m in members]


def _checked_names(name: str) -> tuple[str, ...]:
    names = member_names(name)
    if len(names) < 2 or not all(names):
        raise ConfigError(f"A chain of drafters names two or more, joined by '+' (suffix+model), got {name!r}.")
    if len(set(names)) < len(names):
        raise ConfigError(f"The chain {name!r} names a drafter twice: each member once.")
    if "none" in names:
        raise ConfigError(f"The chain {name!r} includes plain decoding ('none'), which drafts nothing: drop it.")
    return names


def _make_spec(name: str, members: tuple[DrafterSpec, ...]) -> DrafterSpec:
    fields, owners = [], {}
    for member in members:
        hints = typing.get_type_hints(member.options)
        for f in dataclasses.fields(member.options):
            if f.name in owners:
                raise ConfigError(
                    f"The chain {name!r} cannot hold both {owners[f.name]} and {member.name}: both have the "
                    f"option {f.name!r}. Chain one of them."
                )
            owners[f.name] = member.name
            fields.append((f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata)))
    options = dataclasses.make_dataclass(
        "".join(part.title().replace("-", "") for part in member_names(name)) + "ChainOptions", fields, frozen=True
    )
    needs = tuple(dict.fromkeys(need for member in members for need in member.needs))

    def make(target, chain_options, load: Load):
        from engine.backends.capabilities import require

        ChainDrafter = named("engine.drafters.chain:ChainDrafter")  # chain.py imports this module

        made = []
        try:
            for member, member_options in zip(members, split_options(members, chain_options)):
                for capability in member.needs:
                    require(target, capability, member.label)
                drafter = member.make(target, member_options, load)
                if drafter is None:
                    raise ConfigError(f"{member.label} drafts nothing here, so it cannot be in a chain.")
                made.append((member.name, drafter))
            return ChainDrafter(made)
        except BaseException:
            for _, drafter in made:
                drafter.close()
            raise

    def preflight(ctx, chain_options) -> list:
        findings = []
        for member, member_options in zip(members, split_options(members, chain_options)):
            if member.preflight is not None:
                findings += member.preflight(ctx, member_options)
        return findings

    def ready(target, chain_options) -> bool:
        return all(m.can_serve(target, o) for m, o in zip(members, split_options(members, chain_options)))

    labels = [member.label.split(" (")[0] for member in members]
    spec = DrafterSpec(
        name=name,
        label=", then ".join(labels),
        short_name=", then ".join(member.short for member in members),
        summary=(
            f"Each step, whichever of {', '.join(labels)} is expected to gain most drafts: the members "
            "that cost nothing are asked first and kept when their draft pays best."
        ),
        options=options,
        make=make,
        needs=needs,
        preflight=preflight,
        stats=ChainStats,
        loads_model=any(member.loads_model for member in members),
        reads_weights=any(member.reads_weights for member in members),
        trees=any(member.trees for member in members),
        draft_probabilities=any(member.draft_probabilities for member in members),
        ready=ready,
        torch_reason=next((member.torch_reason for member in members if member.needs), ""),
    )
    return spec
