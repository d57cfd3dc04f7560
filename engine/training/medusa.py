"""Training draft heads by self-distillation on a frozen target: Medusa here, EAGLE in eagle.py,
EAGLE-3 in eagle3.py.

The run (data, self-generated replies, the feature cache, checkpoints, exact
resume, validation) is the same for every kind; `kind="eagle"` swaps the heads
and the loss for engine/training/eagle.py's, `kind="eagle3"` for eagle3.py's,
whose cache also holds three layers' inputs (features objective only).

Notation as in Cai et al. 2024 (arXiv 2401.10774): h_t is the target's final
hidden state at position t (after the final norm); the target's LM head turns
it into p_t, the distribution of token t + 1. Head k (k = 1..K) must guess
token t + 1 + k from h_t alone, so its label is the target's own distribution
for that token, p_{t+k}, computed with everything up to t + k in view:

    q_t^k = softmax(LM(head_k(h_t)))                      the head's guess
    L     = sum_k 0.8^k * mean_t KL(p_{t+k} || q_t^k)      (Medusa-1's decaying weights)

Soft labels: the whole of p, not its argmax, because acceptance depends on how
much of the target's mass a head puts where the target will sample; for greedy
decoding the argmax alone would do, and the KL still pushes the head's argmax
onto it. Memory stays bounded because p is never stored for a whole batch
(loss.py: it is recomputed per chunk of positions, full vocabulary, no
top-k truncation needed). The LM head is the target's,
frozen; gradients flow through it into the heads' residual blocks, which start
at zero (an untrained head repeats the target's next-token guess).

Two objectives:

- "kl" (the above, exact): per step one no-grad forward of the target over (B, T)
  tokens, then per chunk one teacher projection and, per head, one forward and
  backward through the full LM head. Slow: the LM head is most of the work.
- "features" (the default, as EAGLE trains): the target runs once over the data
  (features.py caches h_t and argmax p_t on disk), then each head regresses
  z_k(h_t) ~ h_{t+k} in the LM head's logit metric, plus a cross-entropy to the
  target's greedy token on a few random positions (loss.py). Since LM is shared
  and linear, z_k = h_{t+k} would give p_{t+k} exactly. Tens of times faster per
  token, so many epochs fit where "kl" does one.

Validation is the same for both: held-out KL and top-1 agreement with the full
LM head. The data order, and the positions the token term samples, are
functions of (seed, position, step) only and nothing else is random, so a
resumed run gives exactly the numbers of an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from engine.errors import ConfigError
from engine.heads.medusa import MedusaConfig, MedusaHeads
from engine.training import checkpoint as ckpt
from engine.training import eagle, eagle3
from engine.training.data import (
    BUILTIN,
    Document,
    Windows,
    builtin_documents,
    fingerprint,
    generation_prompts,
    read_documents,
    tokenize_documents,
)
from engine.training.features import FeatureCache, cached_windows, target_rows
from engine.training.loss import distill, feature_scale, logit_metric, regress
from engine.training.records import DEFAULT_CACHE_TOKENS, KINDS, OBJECTIVES, TrainProgress, TrainResult, TrainSettings  # noqa: F401

HEAD_DECAY = 0.8  # weight of head k is HEAD_DECAY ** k, as in the paper
GRAD_CLIP = 1.0
# Settings a resumed run must share with the run it continues (steps may grow; device, dtype may change).
RESUME_KEYS = (
    "target",
    "data",
    "self_generate",
    "num_heads",
    "num_layers",
    "batch_size",
    "seq_len",
    "lr",
    "seed",
    "gen_max_tokens",
    "gen_temperature",
    "max_builtin_chars",
    "objective",
    "cache_tokens",
    "kind",
    "draft_vocab",
)
# What a checkpoint saved before a setting existed meant.
OLD_DEFAULTS = {"objective": "kl", "kind": "medusa", "draft_vocab": eagle.DEFAULT_DRAFT_VOCAB}

# progress(event): one TrainProgress (records.py) per report, on train_heads' thread, in this order:
# "data" ("Reading <source>", step 0), "generate" (only with self_generate: step = replies written of
# `steps` asked for), "load" (the target), "data" again ("Tokenizing the training text"), "cache"
# ("features" objective only: step = windows cached of `steps`, with tokens_per_s and eta_s), then
# per step "train" (step of steps, loss, head_loss, head_accuracy, tokens_per_s, eta_s, step_s),
# "checkpoint" after each save, "validate", and last "done" (loss: the mean of the last steps;
# head_loss / head_accuracy: held out, per head) or "cancelled". A resumed run skips what its
# checkpoint holds; one already finished reports a single "done". Every event has a `message`
# except "train". As JSON: TrainProgress.to_dict / TrainProgress.from_dict.
Progress = Callable[[TrainProgress], None]


def train_heads(
    settings: TrainSettings,
    out_dir: str | os.PathLike,
    *,
    resume: bool = True,
    command: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> TrainResult:
    """Train Medusa heads (or, with settings.kind "eagle" or "eagle3", an EAGLE head) for
    `settings.target` into `out_dir` (see the module docstring and TrainSettings' fields).

    `resume`: continue the run saved in `out_dir` when there is one (it must have the same data and
    sizes); False starts over, replacing it. `command`: the command line recorded with the heads
    (default: this process's). `cancel` is checked between steps; a cancelled run saves a
    checkpoint first. `progress` gets one TrainProgress per report (the order above `Progress`).
    Raises ConfigError for bad settings or data, ModelLoadError / ModelNotFoundError for the target.
    """
    settings.check()
    run = _Run(settings, Path(out_dir), progress, cancel or threading.Event(), command or _command_line())
    return run.execute(resume)


def learning_rate(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over the first 5% (at most 100 steps), then cosine down to lr / 10."""
    warmup = max(1, min(100, steps // 20))
    if step < warmup:
        return lr * (step + 1) / warmup
    done = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * done)))


class _Run:
    """One call of train_heads: data, target, heads, optimizer, and the loop."""

    def __init__(
        self, settings: TrainSettings, out: Path, progress: Progress | None, cancel: threading.Event, command: str
    ) -> None:
        self.s = settings
        self.out = out
        self.report = progress or (lambda event: None)
        self.cancel = cancel
        self.command = command
        if settings.kind in EAGLE_KINDS:  # one head, reported per depth
            depths = EAGLE_KINDS[settings.kind]
            self.weights = [depths.DEPTH_DECAY**d for d in range(depths.DEPTHS)]
        else:
            self.weights = [HEAD_DECAY**k for k in range(1, settings.num_heads + 1)]
        self.history: dict[str, list] = {"loss": [], "head_loss": [], "head_accuracy": []}
        self.position = 0  # windows served so far
        self.step = 0
        self.train_seconds = 0.0
        self.replies = 0
        self.corpus_info: dict = {}
        self.cache: FeatureCache | None = None
        self.layers: tuple[int, ...] = ()  # eagle3: the target layers whose inputs the cache holds
        self.metric: torch.Tensor | None = None  # "features": the LM head's logit metric (loss.py)
        self.scale = 1.0

    # -- the run -------------------------------------------------------------------

    def execute(self, resume: bool) -> TrainResult:
        state = ckpt.load_state(self.out) if resume else None
        if not resume and ckpt.training_dir(self.out).exists():
            shutil.rmtree(ckpt.training_dir(self.out))  # starting over: the old run's files go
        # (With resume and no checkpoint yet, replies written by an earlier start are kept and reused.)
        if state is not None:
            self._check_resumable(state)
            if state.get("finished") and state["step"] >= self.s.steps:
                return self._stored_result(state)
        tokens = self._corpus(state is not None)
        if tokens is None:
            return self._cancelled_result()
        self.report(TrainProgress("load", 0, self.s.steps, message=f"Loading {self.s.target} for training"))
        from engine.training.target import load_target

        target = load_target(self.s.target, device=self.s.device, dtype=self.s.dtype)
        try:
            if not len(tokens):
                tokens = self._tokenize(target)
            saved = state.get("corpus_fingerprint") if state is not None else None
            if saved and saved != self.corpus_info.get("fingerprint"):
                raise ConfigError(
                    f"The training text changed since the run in {self.out} was saved, so it cannot continue "
                    "exactly. Start over, or use another folder."
                )
            windows = Windows(tokens, self.s.seq_len, self.s.seed, self.s.val_windows)
            self.corpus_info.update(
                corpus_tokens=len(tokens), train_windows=windows.n_train, validation_windows=windows.n_val
            )
            heads = self._make_heads(target, state, tokens)
            optimizer = torch.optim.AdamW(heads.parameters(), lr=self.s.lr, betas=(0.9, 0.999), weight_decay=0.0)
            if state is not None:
                optimizer.load_state_dict(state["optimizer"])
                self._restore(state)
            if self.s.objective == "features" and not self._build_cache(target, windows):
                self._save(heads, optimizer, finished=False)
                self.report(
                    TrainProgress(
                        "cancelled", self.step, self.s.steps, message="Cancelled; the features cached so far are kept"
                    )
                )
                return self._result(heads, cancelled=True, step_times=[])
            if self.s.kind == "eagle3":
                self._draft_vocab(heads, target)
            return self._loop(target, heads, optimizer, windows)
        finally:
            target.close()

    def _loop(self, target, heads, optimizer, windows: Windows) -> TrainResult:
        step_times: list[float] = []
        tokens_per_step = self.s.batch_size * self.s.seq_len
        while self.step < self.s.steps:
            if self.cancel.is_set():
                self._save(heads, optimizer, finished=False)
                self.report(TrainProgress("cancelled", self.step, self.s.steps, message="Cancelled; checkpoint saved"))
                return self._result(heads, cancelled=True, step_times=step_times)
            started = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(self.step, self.s.steps, self.s.lr)
            heads.train()
            if self.cache is not None and self.s.kind in EAGLE_KINDS:
                features, labels = self.cache.batch(self.position, self.s.batch_size)
                ids = windows.windows[self.cache.batch_windows(self.position, self.s.batch_size)]
                rows = torch.Generator().manual_seed(self.s.seed * 1_000_003 + self.step)  # noise, token rows
                head_loss, head_accuracy = self._eagle_losses(
                    heads, target, ids, features.to(target.device), labels, rows, train=True
                )
            elif self.cache is not None:
                features, labels = self.cache.batch(self.position, self.s.batch_size)
                rows = torch.Generator().manual_seed(self.s.seed * 1_000_003 + self.step)  # token-term positions
                head_loss, head_accuracy = regress(
                    heads,
                    target.logits,
                    features.to(target.device),
                    labels.to(target.device),
                    self.weights,
                    self.metric,
                    self.scale,
                    rows,
                )
            else:
                batch = windows.train_batch(self.position, self.s.batch_size).to(target.device)
                head_loss, head_accuracy = distill(heads, target, batch, self.weights, train=True)
            torch.nn.utils.clip_grad_norm_(heads.parameters(), GRAD_CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self.position += self.s.batch_size
            self.step += 1
            elapsed = time.perf_counter() - started
            self.train_seconds += elapsed
            step_times = (step_times + [elapsed])[-20:]
            loss = sum(w * kl for w, kl in zip(self.weights, head_loss))
            self.history["loss"].append(loss)
            self.history["head_loss"].append(head_loss)
            self.history["head_accuracy"].append(head_accuracy)
            mean_step = sum(step_times) / len(step_times)
            self.report(
                TrainProgress(
                    "train",
                    self.step,
                    self.s.steps,
                    loss,
                    tuple(head_loss),
                    tuple(head_accuracy),
                    tokens_per_step / mean_step,
                    mean_step * (self.s.steps - self.step),
                    step_s=mean_step,
                )
            )
            if self.step % self.s.checkpoint_every == 0 and self.step < self.s.steps:
                self._save(heads, optimizer, finished=False)
                self.report(TrainProgress("checkpoint", self.step, self.s.steps, message="Checkpoint saved"))
        self.report(TrainProgress("validate", self.step, self.s.steps, message="Measuring the held-out windows"))
        heads.eval()
        validation = self._validate(heads, target, windows)
        self._save(heads, optimizer, finished=True, validation=validation)
        result = self._result(heads, cancelled=False, step_times=step_times, validation=validation)
        self.report(
            TrainProgress(
                "done",
                self.step,
                self.s.steps,
                result.final_loss,
                validation[0],
                validation[1],
                result.tokens_per_s,
                0.0,
                message=f"Heads saved in {self.out}",
            )
        )
        return result

    def _validate(self, heads, target, windows: Windows) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(loss per head, top-1 agreement per head) over the held-out windows: Medusa's KL per
        head, or EAGLE's features loss (EAGLE-3's cross-entropy) per depth."""
        totals_kl = [0.0] * len(self.weights)
        totals_acc = [0.0] * len(self.weights)
        count = 0
        with torch.no_grad():
            for batch in windows.validation_batches(self.s.batch_size):
                if self.s.kind in EAGLE_KINDS:
                    features, labels = target_rows(target, batch.to(target.device), self.layers)
                    if self.metric is None and self.s.kind == "eagle":
                        self._prepare_metric(target, features)
                    kl, acc = self._eagle_losses(heads, target, batch, features.float(), labels, None, train=False)
                else:
                    kl, acc = distill(heads, target, batch.to(target.device), self.weights, train=False)
                n = len(batch)
                totals_kl = [t + n * x for t, x in zip(totals_kl, kl)]
                totals_acc = [t + n * x for t, x in zip(totals_acc, acc)]
                count += n
        return tuple(t / count for t in totals_kl), tuple(t / count for t in totals_acc)

    # -- data ----------------------------------------------------------------------

    def _build_cache(self, target, windows: Windows) -> bool:
        """Cache the target's features for the "features" objective (continuing a partial cache); False if cancelled."""
        n_cache = windows.n_train
        if self.s.cache_tokens:
            n_cache = min(n_cache, max(1, math.ceil(self.s.cache_tokens / self.s.seq_len)))
        folder = ckpt.training_dir(self.out)
        folder.mkdir(parents=True, exist_ok=True)
        self.cache = FeatureCache(
            folder,
            cached_windows(windows.n_train, n_cache, self.s.seed),
            self.s.seq_len,
            target.hidden_size,
            target.dtype,
            self.corpus_info.get("fingerprint", ""),
            self.s.seed,
            self.layers,
        )
        if not self.cache.complete:

            def show(done: int, total: int, rate: float) -> None:
                self.report(
                    TrainProgress(
                        "cache",
                        done,
                        total,
                        tokens_per_s=rate,
                        eta_s=(total - done) * self.s.seq_len / rate if rate else None,
                        message=f"Target features: {done} of {total} windows cached",
                    )
                )

            self.report(
                TrainProgress(
                    "cache", self.cache.built, n_cache, message=f"Running {self.s.target} once over {n_cache} windows"
                )
            )
            if not self.cache.build(target, windows.windows, show, self.cancel):
                return False
        if self.s.kind != "eagle3":  # the regression's metric; EAGLE-3 is scored on tokens only
            sample, _ = self.cache.rows(list(range(min(8, n_cache))))
            self._prepare_metric(target, sample)
        self.corpus_info.update(cache_windows=n_cache, cache_tokens=n_cache * self.s.seq_len)
        if self.cache.build_tokens_per_s:
            self.corpus_info["cache_build_tokens_per_s"] = round(self.cache.build_tokens_per_s, 1)
        return True

    def _draft_vocab(self, head, target) -> None:
        """EAGLE-3: the ids the head may propose, chosen before the first step (a resumed run keeps its
        own): the target's greedy tokens on the cached windows, most frequent first, EOS always in.
        What the target predicts, rather than the text's own tokens: on the target's own replies they
        are the same, on other text the head must propose what the target would say."""
        labels = self.cache.labels()
        if self.step == 0:
            always = [target.eos_id] if target.eos_id is not None else []
            head.set_draft_vocab(
                eagle.draft_vocabulary(labels, head.config.draft_vocab_size, target.vocab_size, always)
            )
        covered = head.t2d.cpu()[labels].float().mean()
        self.corpus_info.update(
            draft_vocab=head.config.draft_vocab_size,
            target_layers=list(self.layers),
            draft_vocab_coverage=round(float(covered), 4),
        )

    def _eagle_losses(self, head, target, ids, features, labels, generator, train: bool):
        """EAGLE's or EAGLE-3's losses and agreement per depth on a batch of cached rows."""
        if self.s.kind == "eagle3":
            return eagle3.eagle3_losses(head, target, ids, features, labels, train=train)
        return eagle.eagle_losses(head, target, ids, features, labels, self.metric, self.scale, generator, train=train)

    def _prepare_metric(self, target, sample: torch.Tensor) -> None:
        """The LM head's logit metric and the target's logit variance on `sample` features (loss.py)."""
        self.metric = logit_metric(target.lm_head.weight).to(target.device)
        self.scale = feature_scale(sample.float().to(target.device), self.metric)

    def _corpus(self, resuming: bool) -> torch.Tensor | None:
        """The token stream (read back when resuming), an empty tensor when it must still be
        tokenized (after the target loads), or None when cancelled while generating replies."""
        corpus_path = ckpt.training_dir(self.out) / ckpt.CORPUS_FILE
        if resuming and corpus_path.is_file():
            corpus = ckpt.load_file(corpus_path)
            self.corpus_info = dict(corpus["info"])
            self.replies = int(self.corpus_info.get("self_generated", 0))
            return corpus["tokens"]
        documents: list[Document] = []
        for source in self.s.data:
            self.report(TrainProgress("data", 0, self.s.steps, message=f"Reading {source}"))
            documents += builtin_documents(self.s.max_builtin_chars) if source == BUILTIN else read_documents(source)
        if self.s.self_generate > 0:
            from engine.training.self_generate import generate_replies

            prompts = generation_prompts(documents, self.s.self_generate, self.s.seed)
            self.report(TrainProgress("generate", 0, len(prompts), message=f"{self.s.target} writes its replies"))
            replies = generate_replies(
                self.s.target,
                prompts,
                str(ckpt.training_dir(self.out) / ckpt.REPLIES_FILE),
                max_tokens=self.s.gen_max_tokens,
                temperature=self.s.gen_temperature,
                seed=self.s.seed,
                device=self.s.device,
                dtype=self.s.dtype,
                progress=lambda done, total: self.report(
                    TrainProgress("generate", done, total, message=f"Reply {done} of {total} written")
                ),
                cancel=self.cancel,
            )
            if len(replies) < len(prompts):
                self.report(
                    TrainProgress(
                        "cancelled",
                        0,
                        self.s.steps,
                        message=f"Cancelled; {len(replies)} replies kept for the next start",
                    )
                )
                return None
            self.replies = len(replies)
            documents += replies
        self._documents = documents
        return torch.zeros(0, dtype=torch.int32)

    def _tokenize(self, target) -> torch.Tensor:
        self.report(TrainProgress("data", 0, self.s.steps, message="Tokenizing the training text"))
        tokens = tokenize_documents(target, self._documents)
        self.corpus_info = {
            "documents": len(self._documents),
            "self_generated": self.replies,
            "fingerprint": fingerprint(tokens),
        }
        ckpt.save_atomically(
            {"format": ckpt.FORMAT, "tokens": tokens, "info": dict(self.corpus_info)},
            ckpt.training_dir(self.out) / ckpt.CORPUS_FILE,
        )
        return tokens

    # -- heads and checkpoints -----------------------------------------------------

    def _make_heads(self, target, state: dict | None, tokens: torch.Tensor):
        if self.s.kind == "eagle3":  # its draft vocabulary follows once the cache is built (_draft_vocab)
            head = eagle3.make_head(target, target.name, self.s.seed, self.s.draft_vocab)
            if state is not None:
                head.load_weights(state["heads"])
            self.layers = head.config.layers
            return head
        if self.s.kind == "eagle":
            head = eagle.make_head(target, target.name, self.s.seed)
            if state is not None:
                head.load_weights(state["heads"])
            elif self.s.draft_vocab:
                always = [target.eos_id] if target.eos_id is not None else []
                head.draft_vocab = eagle.draft_vocabulary(tokens, self.s.draft_vocab, target.vocab_size, always)
            if head.draft_vocab is not None:
                covered = torch.isin(tokens.long(), head.draft_vocab).float().mean()
                self.corpus_info["draft_vocab"] = int(head.draft_vocab.numel())
                self.corpus_info["draft_vocab_coverage"] = round(float(covered), 4)
            return head
        config = MedusaConfig(
            num_heads=self.s.num_heads,
            num_layers=self.s.num_layers,
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            shared_lm_head=True,
            base_model=target.name,
        )
        heads = MedusaHeads(config, target.lm_head).to(target.device)  # float32 weights whatever the target's dtype
        if state is not None:
            heads.load_state_dict({f"heads.{name}": t for name, t in state["heads"].items()}, strict=True)
        return heads

    def _check_resumable(self, state: dict) -> None:
        saved = state.get("settings", {})
        current = asdict(self.s)
        saved = {**OLD_DEFAULTS, **saved}
        keys = [k for k in RESUME_KEYS if k != "cache_tokens" or current["objective"] == "features"]
        differ = [
            f"{key} {saved.get(key)!r} -> {current[key]!r}"
            for key in keys
            if _normal(saved.get(key)) != _normal(current[key])
        ]
        if differ:
            raise ConfigError(
                f"{self.out} holds a run at step {state['step']} made with other settings ({'; '.join(differ)}). "
                "Resume with the same settings (only --steps may grow), start over, or use another folder."
            )

    def _restore(self, state: dict) -> None:
        self.step = int(state["step"])
        self.position = int(state["data_position"])
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.history = {key: list(value) for key, value in state["history"].items()}

    def _training_facts(self, finished: bool, validation=None) -> dict:
        losses = self.history["loss"][-20:]
        rate = self.step * self.s.batch_size * self.s.seq_len / self.train_seconds if self.train_seconds else 0.0
        facts = {
            "method": METHODS[self.s.kind if self.s.kind in EAGLE_KINDS else self.s.objective],
            "objective": self.s.objective,
            "kind": self.s.kind,
            "target": self.s.target,
            "data": list(self.s.data),
            "self_generated": self.replies,
            **{k: v for k, v in self.corpus_info.items() if k != "fingerprint"},
            "steps": self.step,
            "steps_planned": self.s.steps,
            "batch_size": self.s.batch_size,
            "seq_len": self.s.seq_len,
            "lr": self.s.lr,
            "seed": self.s.seed,
            "tokens_seen": self.step * self.s.batch_size * self.s.seq_len,
            "final_loss": round(sum(losses) / len(losses), 5) if losses else None,
            "finished": finished,
            "command": self.command,
            "train_tokens_per_s": round(rate, 1),
            "seconds_per_step": round(self.train_seconds / self.step, 3) if self.step else None,
        }
        if self.cache is not None:
            facts["epochs"] = round(self.position / len(self.cache.windows), 3)
        if validation is not None:
            facts["validation_head_kl"] = [round(x, 5) for x in validation[0]]
            facts["validation_head_accuracy"] = [round(x, 5) for x in validation[1]]
        return facts

    def _save(self, heads, optimizer, finished: bool, validation=None) -> None:
        facts = self._training_facts(finished, validation)
        heads.config = type(heads.config)(**{**asdict(heads.config), "training": facts})
        ckpt.save_heads(heads, self.out)
        state = {
            "format": ckpt.FORMAT,
            "step": self.step,
            "finished": finished,
            "settings": asdict(self.s),
            "heads": {name: t.detach().cpu().clone() for name, t in heads.weights().items()},
            "optimizer": optimizer.state_dict(),
            "data_position": self.position,
            # The only randomness is the data order, a function of (seed, epoch): no generator state to keep.
            "rng": {"data_seed": self.s.seed},
            "history": self.history,
            "train_seconds": self.train_seconds,
            "corpus_fingerprint": self.corpus_info.get("fingerprint", ""),
            "training": facts,
        }
        ckpt.save_atomically(state, ckpt.state_path(self.out))

    # -- results -------------------------------------------------------------------

    def _result(self, heads, cancelled: bool, step_times: list[float], validation=None) -> TrainResult:
        losses = self.history["loss"][-20:]
        rate = self.s.batch_size * self.s.seq_len * len(step_times) / sum(step_times) if step_times else 0.0
        return TrainResult(
            out_dir=str(self.out),
            step=self.step,
            steps=self.s.steps,
            cancelled=cancelled,
            final_loss=sum(losses) / len(losses) if losses else None,
            head_accuracy=validation[1] if validation else (),
            head_loss=validation[0] if validation else (),
            tokens_per_s=rate,
            training=heads.config.training,
        )

    def _cancelled_result(self) -> TrainResult:
        return TrainResult(str(self.out), 0, self.s.steps, True, None, (), (), 0.0, {})

    def _stored_result(self, state: dict) -> TrainResult:
        facts = dict(state.get("training", {}))
        losses = list(state["history"]["loss"])[-20:]
        self.report(TrainProgress("done", state["step"], self.s.steps, message="Already trained for these steps"))
        return TrainResult(
            str(self.out),
            int(state["step"]),
            self.s.steps,
            False,
            sum(losses) / len(losses) if losses else None,
            tuple(facts.get("validation_head_accuracy", ())),
            tuple(facts.get("validation_head_kl", ())),
            0.0,
            facts,
        )


METHODS = {
    "kl": "self-distillation: KL(p_target(t+k) || head k), head weights 0.8^k",
    "features": "self-distillation on cached target features: ||z_k(h_t) - h_{t+k}||^2 in the LM head's logit "
    "metric / target logit variance + 0.1 CE(LM(z_k), argmax p_{t+k}) on 64 positions, head weights 0.8^k",
    "eagle": "EAGLE on cached target features, depths 1 and 2 (the second fed the head's own guesses): "
    "||g - f||^2 in the LM head's logit metric / target logit variance + 0.1 CE(LM(g), argmax p) on 64 "
    "positions, depth weights 1 and 0.5, Gaussian noise 0.05 x RMS on the input features; "
    "the reported per-head numbers are per depth",
    "eagle3": "EAGLE-3 on cached inputs of three target layers, unrolled 7 depths on its own outputs (the "
    "training-time test): soft cross-entropy to the target's distribution over the draft vocabulary, "
    "positions whose greedy token is outside it left out, depth weights 0.8^(d-1); the reported "
    "per-head numbers are per depth",
}
EAGLE_KINDS = {"eagle": eagle, "eagle3": eagle3}  # the one-head kinds, by the module of their loss


def _normal(value):
    """Settings compared across a save: tuples come back as lists, ints may have been floats."""
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in [os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])
