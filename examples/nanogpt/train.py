"""nanoGPT's train.py and sample.py as a ShapeScript driver: gpt.ss, character-level, trained on
examples/attention/corpus.txt with gradient accumulation, clipping, AdamW and the warmup-cosine lr,
estimate_loss on the train and val splits, a checkpoint kept when the val loss improves, --resume
from it, and then text sampled from the model.

    python examples/nanogpt/train.py                        # about 200 iterations, a few seconds
    python examples/nanogpt/train.py --iters 300 --resume   # go on from out-nanogpt/ckpt.safetensors
    python examples/nanogpt/train.py --devices "cpu[0 1]" --start "The " --num-samples 3

From a notebook or a script, the same pieces (notebooks/05_nanogpt.ipynb):

    run = train(Config(out_dir="out", max_iters=40))
    print(sample(run, start="The ", num_samples=2))
    run.stop()
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import shapescript as ss
from shapescript.errors import terminal_lines, terminal_text

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "attention" / "corpus.txt"
CHECKPOINT = "ckpt.safetensors"  # the model and the optimizer (its state, schedule and steps)
STATE = "ckpt.json"  # beside it: iter_num, best_val_loss, the vocabulary and the run's config
FORMAT = "shapescript-nanogpt-run"
MAX_STATE_BYTES = 1 << 20  # a run's JSON is a few KiB: anything far larger is not ours

__all__ = ["CheckpointError", "Config", "Corpus", "Run", "SettingsError", "estimate_loss", "get_batch", "main",
           "sample", "train"]


class SettingsError(ValueError):
    """A setting out of range: a clear message for the command line, not a traceback."""


class CheckpointError(SettingsError):
    """A checkpoint that can't be resumed from (missing, malformed, or not this run's)."""


@dataclass(frozen=True)
class Config:
    """train.py's settings, by nanoGPT's names. gpt.ss fixes dropout (0.1) and grad_clip (1.0); the
    model's width is n_head * head_size (nanoGPT's n_embd)."""

    out_dir: str = "out-nanogpt"
    dataset: str = str(CORPUS)
    eval_interval: int = 50
    log_interval: int = 10
    eval_iters: int = 10
    always_save_checkpoint: bool = False
    batch_size: int = 8
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    head_size: int = 16
    gradient_accumulation_steps: int = 2
    learning_rate: float = 3e-3
    max_iters: int = 200
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_iters: int = 20
    lr_decay_iters: int = 200
    min_lr: float = 3e-4
    seed: int = 1337
    devices: str = "cpu"
    max_new_tokens: int = 200  # sample.py's settings, which are dims of the program (New, TopK)
    top_k: int = 200

    def __post_init__(self) -> None:
        check_fields(self, "Config")
        at_least = {"eval_interval": 1, "log_interval": 1, "eval_iters": 1, "batch_size": 1, "block_size": 1,
                    "n_layer": 1, "n_head": 1, "head_size": 1, "gradient_accumulation_steps": 1, "max_iters": 0,
                    "warmup_iters": 0, "lr_decay_iters": 1, "seed": 0, "max_new_tokens": 1, "top_k": 1}
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise SettingsError(f"Config.{name} must be at least {low}, not {getattr(self, name)}")
        if self.seed >= 2**63:
            raise SettingsError(f"Config.seed must be below 2**63, not {self.seed}")
        for name in ("learning_rate", "weight_decay", "min_lr"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) < 0:
                raise SettingsError(f"Config.{name} must be a finite number >= 0, not {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise SettingsError(f"Config.{name} must be in [0, 1), not {getattr(self, name)}")
        if self.lr_decay_iters <= self.warmup_iters:  # warmup_cosine's rule: the decay ends after the warmup
            raise SettingsError(f"Config.lr_decay_iters ({self.lr_decay_iters}) must be above "
                                f"warmup_iters ({self.warmup_iters})")
        if not self.devices.strip():
            raise SettingsError("Config.devices must name devices, such as 'cpu' or 'cpu[0 1]'")

    def dims(self, vocab_size: int) -> dict[str, int]:
        """gpt.ss's dims for these settings (top_k at most the vocabulary, as sample.py's topk takes
        min(top_k, vocab))."""
        return {"V": vocab_size, "T": self.block_size, "H": self.n_head, "Dh": self.head_size, "L": self.n_layer,
                "M": self.gradient_accumulation_steps, "New": self.max_new_tokens, "TopK": min(self.top_k, vocab_size)}


# What a resumed run takes from its checkpoint's config rather than its own, as train.py forces the
# checkpoint's model_args: the model's shape, and the optimizer's settings (ss.restore brings the
# checkpoint's back anyway; the fresh optimizer is made with them so that nothing disagrees).
RESUMED_FIELDS = ("block_size", "n_layer", "n_head", "head_size", "learning_rate", "weight_decay", "beta1",
                  "beta2", "warmup_iters", "lr_decay_iters", "min_lr")


KINDS: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "bool": bool, "str": str}


def check_fields(config: Config, where: str) -> None:
    """Each field of its annotated type: a bool is no int here, and an int passes for a float (1 for 1.0)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        kind = KINDS[str(f.type)]
        if isinstance(value, bool) != (f.type == "bool") or not isinstance(value, kind):
            raise SettingsError(f"{where}.{f.name} must be {f.type}, not {value!r}")


@dataclass(frozen=True)
class Corpus:
    """The text as character ids, and prepare.py's split: the first 90% to train on, the rest for val."""

    text: str
    vocab: str  # the distinct characters, sorted: character i is token i

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Corpus:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SettingsError(f"the dataset {path} can't be read as text: {e}") from None
        if not text:
            raise SettingsError(f"the dataset {path} is empty")
        return cls(text, "".join(sorted(set(text))))

    def encode(self, s: str) -> list[int]:
        missing = sorted(set(s) - set(self.vocab))
        if missing:
            raise SettingsError(f"{''.join(missing)!r}: not in the corpus's characters")
        return [self.vocab.index(ch) for ch in s]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.vocab[i] for i in ids)

    @functools.cached_property
    def ids(self) -> torch.Tensor:
        index = {ch: i for i, ch in enumerate(self.vocab)}
        return torch.tensor([index[ch] for ch in self.text])

    def split(self, name: str) -> torch.Tensor:
        cut = int(len(self.ids) * 0.9)
        return {"train": self.ids[:cut], "val": self.ids[cut:]}[name]


def get_batch(data: torch.Tensor, batch_size: int, block_size: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT's get_batch: batch_size random windows of block_size + 1 tokens, as inputs and targets."""
    if len(data) <= block_size:
        raise SettingsError(f"block_size {block_size} needs more than {len(data)} tokens in the split")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    rows = torch.stack([data[i:i + block_size + 1] for i in ix.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def seed_for(seed: int, *what: object) -> int:
    """A seed for one iteration's draws (its batches, its dropout): a function of the run's seed and
    the iteration alone, so that a resumed run draws what the run it goes on would have drawn."""
    digest = hashlib.blake2b(repr((seed, *what)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def steps_batch(data: torch.Tensor, config: Config, iter_num: int) -> dict[str, torch.Tensor]:
    """One optimizer step's batches as gpt.ss's `Steps`: micro-batch k of the M is row k of each example."""
    g = torch.Generator().manual_seed(seed_for(config.seed, "train", iter_num))
    xs, ys = zip(*(get_batch(data, config.batch_size, config.block_size, g)
                   for _ in range(config.gradient_accumulation_steps)))
    return {"tokens": torch.stack(xs, dim=1), "targets": torch.stack(ys, dim=1)}


@dataclass
class Run:
    """A run's state: the program, model and optimizer (opt.steps is iter_num), the best val loss and
    what it printed. On several devices its workers run until `stop()`."""

    config: Config
    corpus: Corpus
    program: ss.Program
    model: Any
    optimizer: Any
    iter_num: int = 0
    best_val_loss: float = math.inf
    start_iter: int = 0
    losses: list[float] = field(default_factory=list)  # each iteration's mean micro-batch loss
    evals: list[tuple[int, float, float]] = field(default_factory=list)  # (iter_num, train, val)

    def stop(self) -> None:
        self.program.stop()


def load_program(config: Config, vocab_size: int) -> ss.Program:
    with warnings.catch_warnings():  # the small sizes replace gpt.ss's GPT-2 ones on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        try:
            return ss.load(HERE / "gpt.ss", dims=config.dims(vocab_size), devices=config.devices)
        except ValueError as e:  # load's arguments: a devices line it can't read
            raise SettingsError(str(e)) from None


def make_optimizer(m: Any, config: Config) -> Any:
    """configure_optimizers and get_lr: AdamW, the matrices decayed and the vectors not, the lr on
    nanoGPT's warmup-cosine schedule (the optimizer writes it before each update)."""
    schedule = ss.schedules.warmup_cosine(config.learning_rate, warmup=config.warmup_iters,
                                          decay_until=config.lr_decay_iters, floor=config.min_lr)
    return ss.adamw(m, lr=schedule, betas=(config.beta1, config.beta2), weight_decay=config.weight_decay,
                    no_decay=lambda name, p: p.ndim < 2)


def estimate_loss(run: Run) -> dict[str, float]:
    """The mean loss of eval_iters batches of each split, without dropout (Eval). The batches are drawn
    from the iteration's own seed, so a resumed run's estimate repeats the straight run's."""
    out = {}
    for split in ("train", "val"):
        data = run.corpus.split(split)
        g = torch.Generator().manual_seed(seed_for(run.config.seed, "eval", split, run.iter_num))
        losses = []
        for _ in range(run.config.eval_iters):
            x, y = get_batch(data, run.config.batch_size, run.config.block_size, g)
            losses.append(float(run.program.loss(run.model, {"tokens": x, "targets": y}, ss.Eval)))
        out[split] = sum(losses) / len(losses)
    return out


def write_safely(path: Path, write: Callable[[Path], None]) -> None:
    """`write` fills a temporary file that this process made, exclusively, beside `path`; it then
    replaces `path` whole. The temporary file is gone on every way out, an error's included."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_json(path: Path, value: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename makes it the run's


def save_checkpoint(run: Run) -> None:
    """The checkpoint, then its JSON: a crash between them leaves a JSON whose iter_num the
    checkpoint's step count contradicts, which --resume refuses."""
    out = Path(run.config.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_safely(out / CHECKPOINT, lambda tmp: ss.save(tmp, run.model, run.optimizer))
    state = {"format": FORMAT, "iter_num": run.iter_num, "best_val_loss": run.best_val_loss,
             "vocab": run.corpus.vocab, "config": dataclasses.asdict(run.config)}
    write_safely(out / STATE, lambda tmp: write_json(tmp, state))


def read_state(path: Path) -> tuple[int, float, str, Config]:
    """A run's JSON, every field checked: (iter_num, best_val_loss, vocab, config)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}")

    try:
        if path.stat().st_size > MAX_STATE_BYTES:
            raise bad(f"{path.stat().st_size:,} bytes, too large for a run's JSON")
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no checkpoint to resume from (train without --resume first)") from None
    except (OSError, ValueError, RecursionError) as e:  # unreadable, not UTF-8, not JSON, nested too deep
        raise bad(f"not a run's JSON ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise bad(f"not a run's JSON (its format must be {FORMAT!r})")
    if set(state) != {"format", "iter_num", "best_val_loss", "vocab", "config"}:
        raise bad(f"fields {sorted(state)}, expected format, iter_num, best_val_loss, vocab and config")
    iter_num, best, vocab, saved = state["iter_num"], state["best_val_loss"], state["vocab"], state["config"]
    if isinstance(iter_num, bool) or not isinstance(iter_num, int) or iter_num < 0:
        raise bad(f"iter_num must be a whole number >= 0, not {iter_num!r}")
    if isinstance(best, bool) or not isinstance(best, (int, float)) or not 0 <= best < math.inf:
        raise bad(f"best_val_loss must be a finite number >= 0, not {best!r}")
    if not isinstance(vocab, str) or not vocab or sorted(set(vocab)) != list(vocab):
        raise bad("vocab must be the corpus's distinct characters, sorted")
    names = {f.name for f in dataclasses.fields(Config)}
    if not isinstance(saved, dict) or set(saved) != names:
        got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise bad(f"config must hold Config's fields {sorted(names)}, not {got}")
    try:
        config = Config(**saved)
    except SettingsError as e:
        raise bad(f"its {e}") from None
    return iter_num, float(best), vocab, config


def train(config: Config, *, resume: bool = False, log: Callable[[str], None] | None = print) -> Run:
    """nanoGPT's training loop, from scratch into config.out_dir or, with `resume`, from its checkpoint
    (the model's shape and the optimizer's settings then come from there). Trains until iter_num is
    config.max_iters, estimating the losses every eval_interval iterations and at the end. The
    run's program stays loaded for `sample`: call `run.stop()` when done."""
    say = log or (lambda line: None)
    out = Path(config.out_dir).resolve()
    corpus = Corpus.read(config.dataset)
    start, best = 0, math.inf
    if resume:  # everything checked before anything loads or changes
        start, best, vocab, saved = read_state(out / STATE)
        if vocab != corpus.vocab:
            raise CheckpointError(f"{out / STATE}: its vocabulary is not {config.dataset}'s")
        if start > config.max_iters:
            raise SettingsError(f"max_iters {config.max_iters} is below the checkpoint's iter_num {start}")
        config = dataclasses.replace(config, **{name: getattr(saved, name) for name in RESUMED_FIELDS})
        say(f"resuming training from {out / CHECKPOINT} at iter {start}, best val loss {best:.4f}")
    program = load_program(config, len(corpus.vocab))
    try:
        m = program.Gpt.init(seed=config.seed)
        opt = make_optimizer(m, config)
        if resume:
            try:
                ss.restore(out / CHECKPOINT, m, opt)
            except (OSError, ss.ShapeError, ss.DomainError) as e:  # missing, not ours, another model's
                raise CheckpointError(f"can't resume: {e}") from None
            if opt.steps != start:
                raise CheckpointError(f"{out / CHECKPOINT} holds {opt.steps} optimizer steps but {out / STATE} "
                                      f"says iter_num {start}: they are not from the same save")
        run = Run(config, corpus, program, m, opt, iter_num=start, best_val_loss=best, start_iter=start)
        say(f"{sum(p.numel() for p in m.params()):,} parameters; {len(corpus.vocab)} characters; "
            f"{config.batch_size} x {config.gradient_accumulation_steps} sequences of {config.block_size} "
            f"per iteration")
        loop(run, say)
    except BaseException:
        program.stop()  # no worker left behind by a failed run
        raise
    return run


def loop(run: Run, say: Callable[[str], None]) -> None:
    """train.py's loop: at each eval_interval, estimate the losses and keep the best checkpoint
    (never at iteration 0, as train.py); then one optimizer step of M micro-batches."""
    config, train_data = run.config, run.corpus.split("train")
    while True:
        if run.iter_num % config.eval_interval == 0 or run.iter_num == config.max_iters:
            losses = estimate_loss(run)
            run.evals.append((run.iter_num, losses["train"], losses["val"]))
            say(f"step {run.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if losses["val"] < run.best_val_loss or config.always_save_checkpoint:
                run.best_val_loss = losses["val"]
                if run.iter_num > 0:
                    say(f"saving checkpoint to {Path(config.out_dir).resolve()}")
                    save_checkpoint(run)
        if run.iter_num >= config.max_iters:
            return
        lr, t0 = run.optimizer.lr, time.perf_counter()
        batch = steps_batch(train_data, config, run.iter_num)
        mode = ss.Train(seed=seed_for(config.seed, "dropout", run.iter_num))
        loss = float(run.program.accumulate_step(run.model, run.optimizer, batch, mode))
        run.losses.append(loss)
        if run.iter_num % config.log_interval == 0:
            say(f"iter {run.iter_num}: loss {loss:.4f}, lr {lr:.1e}, time {(time.perf_counter() - t0) * 1e3:.1f}ms")
        run.iter_num += 1


def sample(run: Run, start: str = "\n", *, num_samples: int = 1, temperature: float = 0.8, seed: int = 1337,
           max_new_tokens: int | None = None, top_k: int | None = None) -> list[str]:
    """sample.py: num_samples texts, each `start` and max_new_tokens characters after it, drawn with
    `temperature` from the top_k likeliest (by default the run's settings). The same seed draws the
    same texts. Other sizes than the run's load the program again with them (New and TopK are dims)."""
    prompt = torch.tensor([check_prompt(run.corpus, start, num_samples, temperature)] * num_samples,
                          dtype=torch.long)
    if num_samples == 0:
        return []
    config = dataclasses.replace(  # checked as any Config is
        run.config, max_new_tokens=run.config.max_new_tokens if max_new_tokens is None else max_new_tokens,
        top_k=run.config.top_k if top_k is None else top_k)
    if config.dims(len(run.corpus.vocab)) == run.config.dims(len(run.corpus.vocab)):
        return decode_all(run, run.program, run.model, prompt, temperature, seed)
    program = load_program(config, len(run.corpus.vocab))
    try:
        m = program.Gpt.init(seed=0)
        m.load_state_dict(run.model.state_dict())
        return decode_all(run, program, m, prompt, temperature, seed)
    finally:
        program.stop()


def check_prompt(corpus: Corpus, start: str, num_samples: int, temperature: float) -> list[int]:
    """The prompt's tokens, once sample's settings are checked (the command line checks them before
    it trains, rather than fail after)."""
    if not start:
        raise SettingsError("start must hold at least one character")
    if num_samples < 0:
        raise SettingsError(f"num_samples must be at least 0, not {num_samples}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise SettingsError(f"temperature must be a number > 0, not {temperature}")
    return corpus.encode(start)


def decode_all(run: Run, program: ss.Program, m: Any, prompt: torch.Tensor, temperature: float,
               seed: int) -> list[str]:
    tokens = program.generate(m, {"tokens": prompt}, float(temperature), ss.Train(seed=seed))
    return [run.corpus.decode(row) for row in tokens.tolist()]


def parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                epilog="Writes ckpt.safetensors and ckpt.json into --out-dir whenever the val "
                                       "loss improves; --resume goes on from them.")
    p.add_argument("--out-dir", default=d.out_dir, help="where the checkpoint goes (default %(default)s)")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint in --out-dir")
    p.add_argument("--dataset", default=d.dataset, help="the text to train on (default: the attention corpus)")
    p.add_argument("--iters", type=int, default=d.max_iters, help="max_iters: train until this iteration "
                   "(default %(default)s)")
    p.add_argument("--eval-interval", type=int, default=d.eval_interval, help="default %(default)s")
    p.add_argument("--eval-iters", type=int, default=d.eval_iters, help="batches per loss estimate "
                   "(default %(default)s)")
    p.add_argument("--log-interval", type=int, default=d.log_interval, help="default %(default)s")
    p.add_argument("--always-save-checkpoint", action="store_true", help="save at every eval, not only on "
                   "a better val loss")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per micro-batch "
                   "(default %(default)s)")
    p.add_argument("--grad-accum", type=int, default=d.gradient_accumulation_steps,
                   help="gradient_accumulation_steps: micro-batches per update (default %(default)s)")
    p.add_argument("--block-size", type=int, default=d.block_size, help="context length (default %(default)s)")
    p.add_argument("--n-layer", type=int, default=d.n_layer, help="default %(default)s")
    p.add_argument("--n-head", type=int, default=d.n_head, help="default %(default)s")
    p.add_argument("--head-size", type=int, default=d.head_size, help="each head's width (default %(default)s)")
    p.add_argument("--learning-rate", type=float, default=d.learning_rate, help="the peak lr (default %(default)s)")
    p.add_argument("--warmup-iters", type=int, help="default: a tenth of --iters")
    p.add_argument("--lr-decay-iters", type=int, help="default: --iters")
    p.add_argument("--min-lr", type=float, default=d.min_lr, help="default %(default)s")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="default %(default)s")
    p.add_argument("--seed", type=int, default=d.seed, help="for the batches, dropout and sampling "
                   "(default %(default)s)")
    p.add_argument("--devices", default=d.devices, help="e.g. cpu, 'cpu[0 1]', cuda (default %(default)s)")
    p.add_argument("--start", default="\n", help="the prompt the samples go on from (default: a newline)")
    p.add_argument("--num-samples", type=int, default=2, help="default %(default)s; 0 for none")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="default %(default)s")
    p.add_argument("--temperature", type=float, default=0.8, help="default %(default)s")
    p.add_argument("--top-k", type=int, default=d.top_k, help="at most the vocabulary's size "
                   "(default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="print only the samples")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line: train (or resume), then sample. Returns the numbers a test checks."""
    p = parser()
    args = p.parse_args(argv)
    try:
        config = Config(
            out_dir=args.out_dir, dataset=args.dataset, eval_interval=args.eval_interval,
            log_interval=args.log_interval, eval_iters=args.eval_iters,
            always_save_checkpoint=args.always_save_checkpoint, batch_size=args.batch_size,
            block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head, head_size=args.head_size,
            gradient_accumulation_steps=args.grad_accum, learning_rate=args.learning_rate, max_iters=args.iters,
            weight_decay=args.weight_decay,
            warmup_iters=args.iters // 10 if args.warmup_iters is None else args.warmup_iters,
            lr_decay_iters=max(args.iters, 1) if args.lr_decay_iters is None else args.lr_decay_iters,
            min_lr=args.min_lr, seed=args.seed, devices=args.devices, max_new_tokens=args.max_new_tokens,
            top_k=args.top_k)
        check_prompt(Corpus.read(config.dataset), args.start, args.num_samples, args.temperature)
    except SettingsError as e:
        p.error(terminal_text(str(e)))
    # What reaches the terminal is escaped: a corpus, a path or a prompt may hold control characters.
    run = train(config, resume=args.resume, log=None if args.quiet else lambda line: print(terminal_lines(line)))
    try:
        samples = sample(run, args.start, num_samples=args.num_samples, temperature=args.temperature,
                         seed=args.seed)
        for text in samples:
            print(terminal_lines(text))
            print("---------------")
        _, train_loss, val_loss = run.evals[-1]  # the loop always ends with an estimate
        return {"start_iter": run.start_iter, "iter_num": run.iter_num, "steps": run.optimizer.steps,
                "best_val_loss": run.best_val_loss, "first_val_loss": run.evals[0][2], "train_loss": train_loss,
                "val_loss": val_loss, "losses": run.losses, "evals": run.evals, "samples": samples,
                "vocab": run.corpus.vocab, "config": run.config}
    finally:
        run.stop()


if __name__ == "__main__":
    try:
        main()
    except SettingsError as e:  # a bad setting or checkpoint: its message, not a traceback
        sys.exit(terminal_text(f"{Path(sys.argv[0]).name}: error: {e}"))
