"""Every registered drafter reaches every consumer, and so does a new one added as its modules alone.

docs/architecture.md: "a new drafter is one module and one registry entry". Here each drafter the
registry lists, and a toy drafter of trees ("forks", written below into a temporary folder put on
`engine.drafters.__path__`, the way a new `engine/drafters/forks_spec.py` registers itself), is
walked through the CLI (its name in --drafter's help, its flags, the config it makes), the pair
dialog (listed, its fields), preflight (its own rules run), the charts (its depth bars, trees drawn
as trees on PyTorch), auto-tune (a candidate, with node budgets where it drafts trees), the status
line (its short name) and the wire (its statistics' type comes back as it went). A consumer that
keeps a list of its own instead of reading the spec fails here for the toy drafter.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import typing
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QSettings

from engine import EngineConfig, drafter_names, drafter_spec, option_settings, preflight, stat_fields
from engine.drafters import registry
from engine.drafters.base import TreeDraft
from tests.app.conftest import STRICT_QT_LOG

pytestmark = STRICT_QT_LOG

TOY = "forks"
TOY_SPEC = '''
"""A toy drafter of trees: the last two distinct tokens of the text, side by side (forks.py drafts)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.drafters.registry import DrafterSpec, DrafterStats, setting, stat


@dataclass(frozen=True)
class ForksOptions:
    width: int = setting(2, label="Branches", minimum=1, maximum=4, help="forks: tokens tried side by side",
                         cli="--forks-width")


@dataclass(frozen=True)
class ForksStats(DrafterStats):
    trees: int = stat(label="Trees drafted", chart=False)
    widest: int = stat(label="Widest tree", unit="nodes", chart=False)


def make(target, options, load):
    from engine.drafters.forks import ForksDrafter

    return ForksDrafter(options.width)


def preflight(ctx, options) -> list:
    from engine.models.doctor import Finding

    return [Finding("ok", "The forks drafter needs nothing", f"It tries {options.width} tokens side by side.")]


DRAFTER = DrafterSpec(
    name="forks",
    label="Forks (a test drafter of trees)",
    summary="Tries the last two distinct tokens side by side (a test drafter).",
    options=ForksOptions,
    make=make,
    preflight=preflight,
    stats=ForksStats,
    trees=True,
    short_name="forks drafter",
)
'''
TOY_ALGORITHM = '''
"""The forks drafter: a tree of depth one whose nodes are the text's last distinct tokens."""

from engine.drafters import base


class ForksDrafter(base.Drafter):
    name = "forks"

    def __init__(self, width: int) -> None:
        self.width, self.trees, self.widest = width, 0, 0

    def propose(self, context, k, sampling, generator):
        tokens = list(dict.fromkeys(reversed(context)))[: min(k, self.width)]
        if not tokens:
            return base.EMPTY_DRAFT
        self.trees, self.widest = self.trees + 1, max(self.widest, len(tokens))
        return base.TreeDraft(tokens=tokens, parents=tuple(-1 for _ in tokens))  # siblings after the pending token

    def stats(self):
        from engine.drafters.forks_spec import ForksStats

        return ForksStats(trees=self.trees, widest=self.widest)
'''


@pytest.fixture(scope="module", autouse=True)
def toy(tmp_path_factory):
    """The forks drafter registered for this module: its two files in a folder on engine.drafters.__path__."""
    import engine.drafters

    folder = tmp_path_factory.mktemp("new_drafter")
    (folder / "forks_spec.py").write_text(textwrap.dedent(TOY_SPEC))
    (folder / "forks.py").write_text(textwrap.dedent(TOY_ALGORITHM))
    engine.drafters.__path__.append(str(folder))
    registry.rescan()
    yield
    engine.drafters.__path__.remove(str(folder))
    for module in ("engine.drafters.forks_spec", "engine.drafters.forks"):
        sys.modules.pop(module, None)
    registry.rescan()


NAMES = (*drafter_names(), TOY)


def test_the_toy_drafts_trees():
    drafter = registry.make_drafter(None, EngineConfig(target="default").with_drafter(TOY, width=3))
    draft = drafter.propose([5, 7, 9, 7], 8, None, None)
    assert isinstance(draft, TreeDraft) and draft.branches  # three siblings: a tree
    assert draft.tokens == [7, 9, 5] and draft.parents == (-1, -1, -1)
    assert drafter.stats().widest == 3


def test_the_engine_verifies_the_toys_trees_as_trees_on_pytorch(tmp_path):
    from engine.api import Engine
    from engine.core.sampling import SamplingConfig
    from tests.factories.hf_models import make_tiny_llama

    tiny = make_tiny_llama(tmp_path / "tiny", seed=0, n_layers=2)
    config = EngineConfig(target=tiny, dtype="float32", k=3, measure_costs=False).with_drafter(TOY, width=3)
    engine = Engine.load(config)
    try:
        prompt = engine.prompt_ids([{"role": "user", "content": "la la la la la la la la la la"}])
        comparison = engine.compare(prompt, SamplingConfig(max_tokens=12))
        assert comparison.identical  # greedy: the same tokens as plain decoding
        assert comparison.speculative.stats.drafted > 0 and engine.drafter.stats().widest > 1
        assert registry.node_budget(TOY, engine.target.info.backend) and not engine.notes  # no tree cut to a branch
    finally:
        engine.close()


@pytest.mark.parametrize("name", NAMES)
def test_the_cli_offers_it_with_its_flags(name, capsys, monkeypatch):
    from engine.cli.common import engine_config
    from engine.cli.main import build_parser

    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps help at hyphens: one line per option
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    help_text = capsys.readouterr().out
    drafter_help = next(line for line in help_text.splitlines() if line.strip().startswith("--drafter"))
    assert f" {name}," in drafter_help or f" {name} " in drafter_help
    for s in option_settings(name):
        assert s.flags[-1] in help_text, s
    config = engine_config(build_parser().parse_args(["generate", "--drafter", name, "--prompt", "hi"]))
    assert config.drafter == name and isinstance(config.options, drafter_spec(name).options)


@pytest.mark.parametrize("name", NAMES)
def test_the_pair_dialog_lists_it_with_its_fields(name, qtbot, tmp_path):
    from app.pair.dialog import PairDialog

    dialog = PairDialog(settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(dialog)
    spec = drafter_spec(name)
    index = dialog.form.drafter.findData(name)
    assert index >= 0 and dialog.form.drafter.itemText(index) == (spec.choice_label or spec.label)
    assert set(dialog.form.options[name]) == {s.name for s in option_settings(spec)}


@pytest.mark.parametrize("name", NAMES)
def test_preflight_runs_its_own_rules(name):
    from engine.models.locate import resolve
    from engine.preflight import PreflightContext

    config = EngineConfig(target="default").with_drafter(name)
    spec = drafter_spec(name)
    titles = {f.title for f in preflight(config).findings}
    assert "Cannot use this drafter" not in titles
    own = []
    if spec.preflight is not None:
        try:
            own = spec.preflight(PreflightContext(config, resolve("default")), config.drafter_options())
        except Exception as stop:  # a rule that ends the check (no draft model chosen): its findings
            own = list(stop.findings)
    assert {f.title for f in own} <= titles
    if spec.needs_torch:  # on llama.cpp it is refused, saying why
        refused = preflight(dataclasses.replace(config, backend="llama.cpp"))
        assert f"{spec.label} needs the PyTorch backend" in {f.title for f in refused.errors}


@pytest.mark.parametrize("name", NAMES)
def test_the_charts_draw_its_trees_as_trees_on_pytorch(name):
    from app.charts.data import drafter_view

    spec = drafter_spec(name)
    view = drafter_view(name)
    assert view.tree == spec.trees and view.depth_label == spec.depth_unit
    assert drafter_view(name, "torch").tree == spec.trees
    assert drafter_view(name, "llama.cpp").tree == spec.trees  # llama.cpp verifies trees too (sequence ids)
    charted = [s for s in stat_fields(spec.stats) if s.chart]
    assert (view.panel is not None) == bool(charted)
    if name == TOY:
        assert (view.tree, view.depth_label) == (True, "depth")


def test_the_live_charts_draw_suffix_trees_as_trees_on_both_backends(qtbot):
    from app.charts.live import LiveCharts

    charts = LiveCharts()
    qtbot.addWidget(charts)
    for backend in ("torch", "llama.cpp"):  # llama.cpp verifies whole trees through sequence ids
        charts.set_drafter("suffix", backend)
        assert "Acceptance per tree depth" in charts.depth.plot.titleLabel.text
        assert "Tree size and accepted length" in charts.draft_length.plot.titleLabel.text
    charts.set_drafter("ngram", "llama.cpp")  # a drafter of chains
    assert "Acceptance per draft position" in charts.depth.plot.titleLabel.text
    assert "Draft length k" in charts.draft_length.plot.titleLabel.text


def every_capability_target(backend: str = "torch"):
    from engine.backends.capabilities import WHY

    info = SimpleNamespace(
        name="m", path="/models/m", backend=backend, architecture="llama", vocab_size=100, n_layers=4
    )
    return SimpleNamespace(info=info, capabilities=frozenset(WHY) if backend == "torch" else frozenset())


@pytest.mark.parametrize("name", [n for n in NAMES if n != "none"])
def test_auto_tune_tries_it_where_the_target_can_serve_it(name, monkeypatch):
    from engine.bench.autotune import allowed_drafters, candidates_for
    from engine.bench.autotune_results import TREE_KS

    spec = drafter_spec(name)
    # What `ready` asks of the machine (heads on disk, MTP layers, a loaded draft model) granted:
    # auto-tune's candidates are then exactly the registry's.
    granted = {n: dataclasses.replace(drafter_spec(n), ready=None) for n in drafter_names()}
    monkeypatch.setattr(registry, "_registry", granted)
    allowed = allowed_drafters(EngineConfig(target="default"), every_capability_target())
    assert name in allowed
    found = [c for c in candidates_for(allowed, "torch") if c.drafter == name]
    assert found and all(c.budget == spec.trees for c in found)
    if spec.trees:
        assert [c.k for c in found] == list(TREE_KS)
    on_llama = allowed_drafters(EngineConfig(target="default"), every_capability_target("llama.cpp"))
    assert (name in on_llama) == (not spec.needs)


@pytest.mark.parametrize("name", NAMES)
def test_the_status_line_names_it(name):
    from app.shell.main_window import describe_engine

    config = EngineConfig(target="default").with_drafter(name)
    target = SimpleNamespace(name="SmolLM2", dtype="Q4_1", backend="llama.cpp", placement="")
    line = describe_engine(SimpleNamespace(config=config, target=target, speculative=True))
    assert f" · {drafter_spec(name).short} · " in line


def sample(stats_type):
    """A value of every field of `stats_type`, as a drafter would report them."""
    values = {}
    for f in dataclasses.fields(stats_type):
        hint = typing.get_type_hints(stats_type)[f.name]
        kinds = typing.get_args(hint) or (hint,)
        origin = typing.get_origin(hint)
        if origin is tuple:
            values[f.name] = ()
        elif int in kinds:
            values[f.name] = 3
        elif float in kinds:
            values[f.name] = 0.25
        elif str in kinds:
            values[f.name] = "auto"
        else:
            values[f.name] = None
    return stats_type(**values)


@pytest.mark.parametrize("name", NAMES)
def test_its_statistics_cross_the_wire_as_their_type(name):
    from engine.service import wire

    stats = sample(drafter_spec(name).stats)
    again = wire.drafter_stats_from_dict(wire.loads(wire.dumps(wire.drafter_stats_to_dict(stats))))
    assert type(again) is type(stats) and again == stats
