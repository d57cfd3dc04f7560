"""SpecDeck's decode speed on a GPU, in one table (issue 17, part 4). Run by docs/gpu/bench.sh.

    python docs/gpu/bench_gpu.py [--out FILE.json]      # the full run: CUDA, bf16, under 8 minutes
    python docs/gpu/bench_gpu.py --smoke                # every section at tiny sizes on the CPU
    python docs/gpu/bench_gpu.py --table FILE.json      # the table of a run that was cut short

What it measures, each through the engine's public API (Engine.load, generate, stream,
the backend's forward) and each "eager" and "compiled" where EngineConfig has a
`compile` field (issue 17, part 1; "n/a" where it has none):

- the device's copy bandwidth (engine.bench.system.copy_bandwidth: bytes read + written
  per second, a large tensor copied on the device), and from it each model's bandwidth
  floor, weight bytes read per token / bandwidth (engine.bench.system.floor_s_per_token);
- vanilla ms/token against that floor, for the embedded SmolLM2-135M-Instruct in bf16 (its
  GGUF converted once to a safetensors folder: the PyTorch backend would dequantize the GGUF
  at every load) and for random-weight Llama-3.2-1B and -3B shapes (their layers, heads and
  widths; SmolLM2's 49152-token vocabulary, so that the shipped tokenizer fits: the real
  ones have 128256 tokens, 0.16B and 0.24B more parameters in the tied embedding that the LM
  head reads at every token);
- the verify-cost curve: ms per target forward of 1..32 rows after a 64-token context;
- speculative efficiency with the draft equal to the target (acceptance about 1, k fixed):
  measured speedup / the speedup the engine's cost model predicts from the measured costs,
  so what is lost is the engine's own overhead;
- the n-gram drafter on the shipped input-reusing prompts (resources/prompts/bench.jsonl);
- Medusa and EAGLE trees at fixed node budgets on the embedded model with the shipped heads
  (resources/heads/): speedup, tokens per target forward, and their ratio.

Each section has a time budget (the whole run stays under 8 minutes); a section that fails
or runs out of time says so in its cells, and every cell is written to --out as it is
measured, so a run killed from outside still gives its table with --table.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's engine, whatever else is installed

EAGER, COMPILED = "eager", "compiled"
EMBEDDED = "smollm2-135m"
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


@dataclass(frozen=True)
class Run:
    """The sizes of one run: the full one on a GPU, or the smoke one on the CPU."""

    device: str
    dtype: str
    max_tokens: int
    repeats: int  # timed generations per measurement (the median is kept)
    rows: tuple[int, ...]  # the verify curve's row counts
    k: int  # draft length of the self-draft runs
    budgets: tuple[int, ...]  # Medusa and EAGLE node budgets
    prompts: int  # shipped reuse prompts the n-gram drafter runs on
    models: dict  # name -> Llama shape (None: the embedded model)
    seconds: dict  # section -> time budget per mode
    smoke: bool = False


FULL = Run(
    device="cuda",
    dtype="bfloat16",
    max_tokens=128,
    repeats=3,
    rows=(1, 2, 4, 8, 16, 32),
    k=4,
    budgets=(8, 16),
    prompts=6,
    models={
        EMBEDDED: None,
        # Llama-3.2-1B and -3B: layers, widths and heads as published, SmolLM2's vocabulary
        "llama-1b": dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
        ),
        "llama-3b": dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            head_dim=128,
        ),
    },
    seconds={"setup": 75, "bandwidth": 10, "vanilla": 55, "self-draft": 45, "ngram": 20, "medusa": 25, "eagle": 25},
)
SMOKE = Run(
    device="cpu",
    dtype="float32",
    max_tokens=6,
    repeats=1,
    rows=(1, 2, 4, 8, 16, 32),
    k=2,
    budgets=(4, 8),
    prompts=1,
    models={
        EMBEDDED: dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        ),
        "llama-1b": dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        ),
        "llama-3b": dict(
            hidden_size=96,
            intermediate_size=192,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
        ),
    },
    seconds={"setup": 60, "bandwidth": 10, "vanilla": 30, "self-draft": 30, "ngram": 20, "medusa": 20, "eagle": 20},
    smoke=True,
)
SELF_DRAFT_MODELS = (EMBEDDED, "llama-1b")  # the 3B twice would cost the most load time for the least news


# What each row measures, as its third column says it.
BANDWIDTH_WHAT = "copy bandwidth, GB/s (read + written)"
VANILLA_WHAT = "ms/token (x the bandwidth floor)"


def verify_what(run: Run) -> str:
    return "ms per forward at " + "/".join(map(str, run.rows)) + " rows"


def self_draft_what(run: Run) -> str:
    return f"draft = target, k {run.k}: speedup, acceptance, efficiency"


def ngram_what(run: Run) -> str:
    return f"reuse prompts ({run.prompts}): speedup, tokens/forward, speedup per token/forward"


def tree_what(budget: int) -> str:
    return f"{budget} nodes: speedup, tokens/forward, speedup per token/forward"


def row_keys(run: Run) -> list[tuple[str, str, str]]:
    """Every row of the table, (section, model, what), in order: each is printed, measured or not."""
    rows = [("bandwidth", run.device, BANDWIDTH_WHAT)]
    rows += [("vanilla", m, VANILLA_WHAT) for m in run.models]
    rows += [("verify", m, verify_what(run)) for m in run.models]
    rows += [("self-draft", m, self_draft_what(run)) for m in SELF_DRAFT_MODELS]
    rows.append(("ngram", EMBEDDED, ngram_what(run)))
    rows += [(kind, EMBEDDED, tree_what(b)) for kind in ("medusa", "eagle") for b in run.budgets]
    return rows


# -- the table, kept as cells and written as they come ---------------------------------------------


@dataclass
class Table:
    run: Run
    out: Path | None
    header: dict = field(default_factory=dict)
    cells: dict = field(default_factory=dict)  # "section|model|what" -> {mode: text}

    def put(self, key: tuple[str, str, str], mode: str, text: str) -> None:
        self.cells.setdefault("|".join(key), {})[mode] = text
        self.save()

    def fill(self, keys, mode: str, text: str) -> None:
        """`text` in every cell of `keys` not measured yet (a failure, a spent budget)."""
        for key in keys:
            if mode not in self.cells.get("|".join(key), {}):
                self.put(key, mode, text)

    def save(self) -> None:
        if self.out is not None:
            data = {"header": self.header, "smoke": self.run.smoke, "cells": self.cells}
            self.out.write_text(json.dumps(data, indent=1))

    def render(self) -> str:
        modes = (EAGER, COMPILED)
        lines = [f"{k}: {v}" for k, v in self.header.items()] + [""]
        lines.append("| section | model | measure | " + " | ".join(modes) + " |")
        lines.append("|---|---|---|" + "---|" * len(modes))
        for key in row_keys(self.run):
            cell = self.cells.get("|".join(key), {})
            lines.append("| " + " | ".join(key) + " | " + " | ".join(cell.get(m, "not run") for m in modes) + " |")
        return "\n".join(lines)


class OverBudget(BaseException):
    """A section's time is up. Not an Exception: the engine turns those into its own errors (a load
    that fails says the files may be corrupt), as it leaves KeyboardInterrupt alone."""


_deadline = float("inf")  # the running section's end (time.perf_counter())
HARD_STOP = 1.5  # past budget x this (+ 10 s), a section that is stuck is interrupted wherever it is


def check_time() -> None:
    """Called between measurements: OverBudget once the section's time is spent."""
    if time.perf_counter() > _deadline:
        raise OverBudget("over its budget")


class budget:
    """The section's deadline for check_time, and a hard stop later (SIGALRM) for a section stuck
    in one call: an interrupt in the middle of a load may leave transformers' state half set, so it
    is the last resort, not the rule."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self):
        global _deadline

        def expired(signum, frame):
            raise OverBudget("stopped in the middle: far over its budget")

        _deadline = time.perf_counter() + self.seconds
        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, self.seconds * HARD_STOP + 10)
        return self

    def __exit__(self, *exc) -> bool:
        global _deadline

        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        _deadline = float("inf")
        return False


def section(table: Table, name: str, mode: str, keys, work) -> None:
    """Run `work()` within the section's budget; whatever it did not measure says why."""
    started = time.perf_counter()
    seconds = table.run.seconds[name]
    try:
        with budget(seconds):
            work()
    except OverBudget as error:
        table.fill(keys, mode, f"not measured: the section was {error} ({seconds} s)")
    except Exception as error:  # one failure must not lose the table
        table.fill(keys, mode, f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
        traceback.print_exc()  # the whole story on stderr, the table keeps one line
    finally:
        free_memory()
    took = time.perf_counter() - started
    table.header[f"time {name} {mode}"] = f"{took:.0f} s"
    table.save()
    print(f"bench: {name} ({mode}) took {took:.0f} s", file=sys.stderr, flush=True)


def free_memory() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- the models --------------------------------------------------------------------------------------


def prepare_models(run: Run, work: Path, tokenizer: Path | None) -> dict[str, str]:
    """name -> a model folder: the embedded model converted to safetensors, random Llamas (kept
    in `work` for the next run)."""
    tokenizer = tokenizer or shipped_tokenizer(work)
    folders = {}
    for name, shape in run.models.items():
        check_time()
        folder = work / f"{name}-{run.dtype}"
        if not (folder / "config.json").is_file():
            if shape is None:
                convert_embedded(folder, run.dtype, tokenizer)
            else:
                random_llama(folder, shape, run, tokenizer)
        folders[name] = str(folder)
    return folders


def shipped_tokenizer(work: Path) -> Path:
    """The SmolLM2 tokenizer files, read from the shipped GGUF once (that takes seconds)."""
    from transformers import AutoTokenizer

    from engine.models.locate import default_model_path

    folder = work / "smollm2-tokenizer"
    if not (folder / "tokenizer.json").is_file():
        gguf = Path(default_model_path())
        staging = folder.with_name(folder.name + ".partial")
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        staging.rename(folder)
    return folder


def convert_embedded(folder: Path, dtype: str, tokenizer: Path) -> None:
    """The shipped SmolLM2-135M-Instruct GGUF as a safetensors folder in `dtype`, read as the
    PyTorch backend reads it (dequantized), so that each load takes a second instead of that."""
    from engine.backends.hf.loader import load as load_weights
    from engine.models.locate import default_model_path

    save(load_weights(default_model_path(), device="cpu", dtype=dtype).model, folder, tokenizer)


def save(model, folder: Path, tokenizer: Path) -> None:
    """`model` (safetensors) and the tokenizer files in `folder`, which appears complete or not at all."""
    import shutil

    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    shutil.copytree(tokenizer, staging, dirs_exist_ok=True)
    staging.rename(folder)


def random_llama(folder: Path, shape: dict, run: Run, tokenizer: Path) -> None:
    """A Llama of `shape` with random weights and the SmolLM2 tokenizer, saved in safetensors.

    Linear weights get std 1.5/sqrt(fan_in) and the final norm a gain that spreads the logits
    over about 4 nats (as tests/factories/hf_models.py does), so that greedy decoding has a
    clear argmax and a draft equal to the target is accepted; the special tokens' embedding
    rows are zero, so that no end-of-turn token stops a reply early."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        **shape,
    )
    device = run.device if not run.smoke else "cpu"
    dtype = getattr(torch, run.dtype)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(4.0 / (0.02 * shape["hidden_size"] ** 0.5) if name == "model.norm.weight" else 1.0)
            elif "embed_tokens" in name:
                param.normal_(0.0, 0.02, generator=generator)
                param[:3] = 0.0  # <|endoftext|>, <|im_start|>, <|im_end|>: never the argmax
            else:
                param.normal_(0.0, 1.5 / param.shape[-1] ** 0.5, generator=generator)
    save(model, folder, tokenizer)


# -- measuring -------------------------------------------------------------------------------------------


def compile_options() -> dict[str, dict | None]:
    """EngineConfig fields per mode; None for "compiled" when this engine has no `compile` field."""
    from engine import config as engine_config
    from engine.config import EngineConfig

    if "compile" not in {f.name for f in dataclasses.fields(EngineConfig)}:
        return {EAGER: {}, COMPILED: None}
    choices = getattr(engine_config, "COMPILES", ("auto", "off"))
    return {EAGER: {"compile": "off"}, COMPILED: {"compile": "on" if "on" in choices else "auto"}}


def load(
    run: Run, folder: str, options: dict, drafter: str = "none", k: int | str = "auto", measure=False, **drafter_options
):
    """Engine.load of `folder` on PyTorch with the run's device and dtype, `options` (the mode's
    compile field), `drafter` and its options; `measure`: time the verify costs at load."""
    from engine import Engine, EngineConfig

    config = EngineConfig(
        target=folder,
        backend="torch",
        device=run.device,
        dtype=run.dtype,
        n_ctx=2048,
        k=k,
        measure_costs=measure,
        **options,
    )
    if drafter != "none":
        config = config.with_drafter(drafter, **drafter_options)
    return Engine.load(config)


def timed(engine, ids, run: Run, *, speculative: bool, draft_length=None, repeats: int | None = None, warm=True):
    """The median-speed generation of `repeats` (default run.repeats), after one warm-up generation
    when `warm` (the first of an engine: CUDA's start, a compile): its GenerationResult."""
    from engine import SamplingConfig, collect
    from engine.drafters.base import forget_replies

    greedy = SamplingConfig(max_tokens=run.max_tokens)
    results = []
    for i in range((repeats or run.repeats) + int(warm)):
        check_time()
        if speculative:
            forget_replies(engine.drafter)  # each run meets its prompt afresh (a drafter that keeps replies)
        if draft_length is not None:
            result = collect(list(engine.stream(ids, greedy, speculative=True, draft_length=draft_length)))
        else:
            result = engine.generate(ids, greedy, speculative=speculative)
        if i >= int(warm):
            results.append(result)
    results.sort(key=ms_per_token)
    return results[len(results) // 2]


def ms_per_token(result) -> float:
    return 1e3 * result.stats.wall_s / max(result.stats.tokens, 1)


def verify_curve(backend, rows: tuple[int, ...], repeats: int) -> list[float]:
    """ms per forward of n rows after a 64-token context, per n (the median of `repeats` + 1, first dropped)."""
    context = 64
    ids = [(1000 + 37 * i) % 49000 + 100 for i in range(context + max(rows))]
    saved = list(backend.tokens)
    out = []
    try:
        backend.rollback(0)
        backend.prefill(ids[:context])
        for n in rows:
            times = []
            for _ in range(repeats + 1):
                check_time()
                start = time.perf_counter()
                backend.forward(ids[context : context + n])  # returns CPU logits: the device has finished
                times.append(time.perf_counter() - start)
                backend.rollback(context)
            out.append(1e3 * statistics.median(times[1:]))
    finally:
        backend.rollback(0)
        if saved:
            backend.prefill(saved)
    return out


def close(engine) -> None:
    if engine is not None:
        engine.close()


def measure_vanilla_and_verify(table: Table, mode: str, folders: dict, options: dict, bandwidth):
    """Vanilla ms/token against the floor at `bandwidth` (engine.bench.system.Bandwidth, or None),
    and the verify curve, for each model."""
    from engine.bench.system import floor_s_per_token

    run = table.run
    for name, folder in folders.items():
        engine = None
        try:
            check_time()
            engine = load(run, folder, options)
            ids = engine.prompt_ids(PROMPT)
            ms = ms_per_token(timed(engine, ids, run, speculative=False))
            if bandwidth is not None:
                floor_ms = 1e3 * floor_s_per_token(engine.target.info.weight_bytes, bandwidth)
                text = f"{ms:.2f} ({ms / floor_ms:.1f}x the {floor_ms:.3f} ms floor)"
            else:
                text = f"{ms:.2f} (no bandwidth measured)"
            table.put(("vanilla", name, VANILLA_WHAT), mode, text)
            curve = verify_curve(engine.target, run.rows, run.repeats)
            table.put(("verify", name, verify_what(run)), mode, " / ".join(f"{t:.2f}" for t in curve))
        finally:
            close(engine)
            free_memory()


def measure_self_draft(table: Table, mode: str, folders: dict, options: dict):
    run = table.run
    for name in SELF_DRAFT_MODELS:
        engine = None
        try:
            check_time()
            engine = load(
                run,
                folders[name],
                options,
                drafter="model",
                k=run.k,
                measure=True,
                draft=folders[name],
                backend="torch",
            )
            ids = engine.prompt_ids(PROMPT)
            vanilla = timed(engine, ids, run, speculative=False)
            spec = timed(engine, ids, run, speculative=True)
            speedup = ms_per_token(vanilla) / ms_per_token(spec)
            s = spec.stats
            efficiency = speedup / s.predicted_speedup if s.predicted_speedup else float("nan")
            said = (
                f"{speedup:.2f}x, a {s.draft_acceptance_rate:.2f}, {s.mean_acceptance_length:.2f} tok/fwd, "
                f"predicted {s.predicted_speedup:.2f}x, efficiency {efficiency:.2f}"
            )
            table.put(("self-draft", name, self_draft_what(run)), mode, said)
        finally:
            close(engine)
            free_memory()


def reuse_prompts(run: Run):
    from engine.bench.prompts import default_prompts_path, load_prompts

    return load_prompts(default_prompts_path(), kinds=("reuse",))[: run.prompts]


def vanilla_ms(engine, prompts, run: Run) -> dict[str, float]:
    """Vanilla ms/token per prompt id, one generation each after one warm-up for the engine."""
    ids = {p.id: engine.prompt_ids(list(p.messages)) for p in prompts}
    timed(engine, ids[prompts[0].id], run, speculative=False, repeats=1, warm=False)  # the warm-up
    timed(engine, ids[prompts[0].id], run, speculative=True, repeats=1, warm=False)
    return {
        p.id: ms_per_token(timed(engine, ids[p.id], run, speculative=False, repeats=1, warm=False)) for p in prompts
    }


def drafted_runs(engine, prompts, run: Run, vanilla: dict[str, float], draft_length=None) -> str:
    """Speedup (the sum of vanilla ms/token over the prompts / the speculative sum), tokens per
    target forward, and their ratio (what the speedup keeps of the tokens each forward gives)."""
    spec_ms = 0.0
    tokens = steps = 0
    for prompt in prompts:
        ids = engine.prompt_ids(list(prompt.messages))
        s = timed(engine, ids, run, speculative=True, draft_length=draft_length, repeats=1, warm=False)
        spec_ms += ms_per_token(s)
        tokens, steps = tokens + s.stats.tokens, steps + s.stats.steps
    speedup = sum(vanilla.values()) / spec_ms
    per_forward = tokens / max(steps, 1)
    return f"{speedup:.2f}x, {per_forward:.2f} tok/fwd, {speedup / per_forward:.2f}"


def measure_ngram(table: Table, mode: str, folders: dict, options: dict):
    run = table.run
    engine = None
    try:
        engine = load(run, folders[EMBEDDED], options, drafter="ngram")
        prompts = reuse_prompts(run)
        text = drafted_runs(engine, prompts, run, vanilla_ms(engine, prompts, run))
        table.put(("ngram", EMBEDDED, ngram_what(run)), mode, text)
    finally:
        close(engine)


def shipped_heads(kind: str, run: Run, folder: str, work: Path) -> str:
    """The heads SpecDeck ships for the embedded model; for the smoke run's tiny model, untrained
    heads of its shape (the same code path at a size a CPU runs in a second)."""
    from engine.models.shipped import resources_dir

    if not run.smoke:
        return str(resources_dir() / "heads" / f"{kind}-smollm2-135m")
    out = work / f"{kind}-heads"
    if not (out / "config.json").is_file():
        shape = run.models[EMBEDDED]
        if kind == "medusa":
            from engine.heads.medusa import MedusaConfig, MedusaHeads

            MedusaHeads(
                MedusaConfig(num_heads=3, num_layers=1, hidden_size=shape["hidden_size"], vocab_size=49152)
            ).save(str(out))
        else:
            from transformers import AutoConfig

            from engine.heads.eagle import EagleConfig, EagleHead

            EagleHead(EagleConfig.for_target(AutoConfig.from_pretrained(folder))).save(str(out))
    return str(out)


def measure_tree(kind: str):
    def measure(table: Table, mode: str, folders: dict, options: dict, work: Path):
        from engine.core.draft_length import DraftLength

        run = table.run
        engine = None
        try:
            heads = shipped_heads(kind, run, folders[EMBEDDED], work)
            engine = load(run, folders[EMBEDDED], options, drafter=kind, measure=True, heads=heads)
            prompts = reuse_prompts(run)
            vanilla = vanilla_ms(engine, prompts, run)
            for b in run.budgets:
                text = drafted_runs(engine, prompts, run, vanilla, draft_length=DraftLength(b, max(b, 16)))
                table.put((kind, EMBEDDED, tree_what(b)), mode, text)
        finally:
            close(engine)

    return measure


# -- the run --------------------------------------------------------------------------------------------


def header(run: Run, modes: dict) -> dict:
    import torch

    import engine

    device = torch.cuda.get_device_name(0) if run.device == "cuda" and torch.cuda.is_available() else run.device
    commit = os.popen(f"git -C {ROOT} rev-parse --short HEAD 2>/dev/null").read().strip() or "unknown"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": device,
        "torch": torch.__version__,
        "specdeck": f"{commit} ({Path(engine.__file__).parent})",
        "dtype": run.dtype,
        "max tokens": run.max_tokens,
        "mode": "smoke (tiny random models on the CPU)" if run.smoke else "full",
        "compiled": "EngineConfig(compile=...) "
        + (str(modes[COMPILED]) if modes[COMPILED] is not None else "does not exist here: n/a"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every section at tiny sizes on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="write the cells here as they are measured (JSON)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the models (default: a temp folder)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a folder with the SmolLM2 tokenizer files (default: read from the shipped GGUF)",
    )
    parser.add_argument("--table", type=Path, default=None, help="print the table of an earlier run's --out and stop")
    args = parser.parse_args(argv)

    if args.table is not None:
        data = json.loads(args.table.read_text())
        table = Table(SMOKE if data.get("smoke") else FULL, None, data["header"], data["cells"])
        print(table.render())
        return 0

    run = SMOKE if args.smoke else FULL
    import torch

    if run.device == "cuda" and not torch.cuda.is_available():
        print("No CUDA device here: run with --smoke for the CPU check, or on a GPU machine.", file=sys.stderr)
        return 2
    if run.smoke:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    default_work = "specdeck-gpu-bench-smoke" if run.smoke else "specdeck-gpu-bench"
    work = args.work or Path(tempfile.gettempdir()) / default_work
    work.mkdir(parents=True, exist_ok=True)
    modes = compile_options()
    table = Table(run, args.out, header(run, modes))
    for mode in modes:
        if modes[mode] is None:
            table.fill(row_keys(run), mode, "n/a")
    table.save()

    folders: dict[str, str] = {}

    def setup():
        folders.update(prepare_models(run, work, args.tokenizer))

    section(table, "setup", EAGER, row_keys(run)[1:], setup)  # without models only the bandwidth is left
    bandwidth = []  # the Bandwidth measured, once

    def measure_bandwidth():
        from engine.bench.system import copy_bandwidth

        measured = copy_bandwidth(run.device, nbytes=(2**30 if not run.smoke else 64 * 2**20))
        bandwidth.append(measured)
        table.put(row_keys(run)[0], EAGER, f"{measured.bytes_per_s / 1e9:.0f}")
        if modes[COMPILED] is not None:
            table.put(row_keys(run)[0], COMPILED, "(the same copy)")

    section(table, "bandwidth", EAGER, row_keys(run)[:1], measure_bandwidth)
    if not folders:
        print(table.render())
        return 1

    sections = [
        ("vanilla", lambda t, m, o: measure_vanilla_and_verify(t, m, folders, o, bandwidth[0] if bandwidth else None)),
        ("self-draft", lambda t, m, o: measure_self_draft(t, m, folders, o)),
        ("ngram", lambda t, m, o: measure_ngram(t, m, folders, o)),
        ("medusa", lambda t, m, o: measure_tree("medusa")(t, m, folders, o, work)),
        ("eagle", lambda t, m, o: measure_tree("eagle")(t, m, folders, o, work)),
    ]
    for mode, options in modes.items():  # every section eager first: a slow compile cannot cost the eager numbers
        if options is None:
            continue
        for name, measure in sections:
            keys = [k for k in row_keys(run) if k[0] == name or (name == "vanilla" and k[0] == "verify")]
            section(table, name, mode, keys, lambda: measure(table, mode, options))
    print(table.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
