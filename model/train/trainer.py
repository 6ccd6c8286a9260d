"""`seq2serve train`: tokenizer, model, schedule and loss, resumable training loop.

    seq2serve train --data data/ddtp/en-de --out runs/en-de --max-minutes 60
    seq2serve train --score runs/en-de/best --data data/ddtp/en-de --split test

A run directory is everything needed to continue: the tokenizer and token cache
are built once, checkpoints carry optimizer, RNG and data position, so running
the same command again after an interruption picks up where it stopped and, on
the same machine and thread count, takes the same steps it would have taken.
`--max-steps` and `--max-minutes` both count the whole run across resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seq2serve.model import checkpoint as ckpt
from seq2serve.model.config import ModelConfig
from seq2serve.model.data import mix, registry
from seq2serve.model.tokenizer import MODEL_TYPES, Tokenizer, segmentation, train_tokenizer
from seq2serve.model.train.batching import (
    BatchStream,
    TokenData,
    collate,
    length_batches,
    read_split,
    tokenize_mix,
    tokenize_split,
)
from seq2serve.model.train.evaluate import (
    MAIN_SCORE,
    TASKS,
    evaluate,
    format_report,
    generate,
    read_corpus_info,
    score,
)
from seq2serve.model.transformer import Seq2SeqTransformer


def configure(parser: argparse.ArgumentParser) -> None:
    io = parser.add_argument_group("data and run")
    io.add_argument("--data", help="corpus directory ({split}.src/.tgt, corpus.json), or a "
                    "weighted mix (`seq2serve data`: parts and weights in corpus.json) "
                    f"(default: {DATA_ROOT}/SRC-TGT from --src/--tgt, or "
                    f"{DATA_ROOT}/summarize-SRC for --task summarize)")
    io.add_argument("--src", help="source language; checked against the corpus's corpus.json")
    io.add_argument("--tgt", help="target language; checked against the corpus's corpus.json")
    io.add_argument("--out", help="run directory (checkpoints, best/, log.jsonl)")
    io.add_argument("--task", choices=TASKS, help="default: from corpus.json")
    io.add_argument("--resume", choices=("auto", "none"), default="auto",
                    help="auto: continue from the newest checkpoint in --out (default)")
    io.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    io.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    io.add_argument("--seed", type=int, default=1)
    io.add_argument("--no-progress", action="store_true", help="no tqdm bar")

    tok = parser.add_argument_group("tokenizer (first run only)")
    tok.add_argument("--tokenizer", type=Path, metavar="SPM_MODEL",
                     help="use this SentencePiece model instead of training one "
                          "(default with --init-from: the checkpoint's)")
    tok.add_argument("--vocab-size", type=int, default=8000)
    tok.add_argument("--spm-type", choices=MODEL_TYPES, default="unigram")
    tok.add_argument("--spm-sentences", type=int, default=200_000,
                     help="sentences sampled to train SentencePiece")
    tok.add_argument("--character-coverage", type=float, default=0.9995)
    tok.add_argument("--byte-fallback", action=argparse.BooleanOptionalAction, default=None,
                     help="spell characters outside the vocabulary as UTF-8 bytes, not <unk> "
                          "(default: on for vocabularies of 1024+ pieces)")
    tok.add_argument("--max-src-len", type=int, default=256, help="tokens incl. EOS; "
                     "longer sources are truncated")
    tok.add_argument("--max-tgt-len", type=int, default=128)

    arch = parser.add_argument_group("model (first run only; a resumed run keeps its own)")
    arch.add_argument("--init-from", type=Path, metavar="CHECKPOINT_DIR",
                      help="fine-tune: start from this checkpoint's architecture and weights "
                           "(the tokenizer may extend its vocabulary: new embedding rows "
                           "start as the mean of the pieces that spelled them); "
                           "--decoder-layers above the checkpoint's grows the decoder by "
                           "identity layers on top (pre-norm models); the other "
                           "--d-model/--layers/... flags are ignored")
    arch.add_argument("--d-model", type=int, default=256)
    arch.add_argument("--layers", type=int, default=3)
    arch.add_argument("--encoder-layers", type=int, help="default: --layers")
    arch.add_argument("--decoder-layers", type=int, help="default: --layers")
    arch.add_argument("--heads", type=int, default=4)
    arch.add_argument("--ffn", type=int, default=1024)
    arch.add_argument("--dropout", type=float, default=0.1)
    arch.add_argument("--pre-norm", action="store_true")

    opt = parser.add_argument_group("optimization")
    opt.add_argument("--max-tokens", type=int, default=4096,
                     help="padded source+target tokens per batch")
    opt.add_argument("--bucket-size", type=int, default=20_000,
                     help="examples per shuffled bucket sorted by length")
    opt.add_argument("--label-smoothing", type=float, default=0.1)
    opt.add_argument("--lr", type=float, help="peak learning rate (default: the paper's "
                     "d_model^-0.5 * warmup^-0.5)")
    opt.add_argument("--lr-scale", type=float, default=1.0, help="multiplies the schedule")
    opt.add_argument("--warmup", type=int, default=4000)
    opt.add_argument("--clip", type=float, default=1.0, help="gradient norm; 0 = off")
    opt.add_argument("--autocast", choices=("none", "bfloat16"), default="none",
                     help="bfloat16: forward pass and loss under torch.autocast (weights, "
                     "gradients and Adam stay float32); about 2x the steps per second on "
                     "CPUs with AMX-BF16 (unmeasured on CPUs without bfloat16 instructions)")
    opt.add_argument("--max-steps", type=int, help="total optimizer steps (across resumes)")
    opt.add_argument("--max-minutes", type=float, help="total wall-clock minutes of "
                     "training incl. validation (across resumes)")

    ev = parser.add_argument_group("validation and checkpoints")
    ev.add_argument("--eval-every", type=int, default=1000, help="steps; 0 = only at the end")
    ev.add_argument("--eval-max-sentences", type=int, default=500)
    ev.add_argument("--save-every-minutes", type=float, default=5.0)
    ev.add_argument("--keep", type=int, default=3, help="resume checkpoints kept (<1: all)")
    ev.add_argument("--save-dtype", choices=tuple(ckpt.SAVE_DTYPES), default="float32",
                    help="weights of best/ (resume checkpoints stay float32)")

    sc = parser.add_argument_group("scoring a finished checkpoint")
    sc.add_argument("--score", metavar="CHECKPOINT_DIR", help="score this checkpoint and a "
                    "copy-the-source baseline on --data --split instead of training; prints "
                    "a summary")
    sc.add_argument("--split", default="test")
    sc.add_argument("--reverse", action="store_true", help="read the split backwards, its "
                    "targets as sources (a de-en checkpoint on data/ddtp/en-de)")
    sc.add_argument("--kind", choices=registry.all_kinds(), metavar="KIND",
                    help="only the segments of this kind (needs {split}.kind): any kind of "
                    "a registered corpus source, " + ", ".join(registry.all_kinds()))
    sc.add_argument("--beam", type=int, default=1, help="only 1 (greedy) for now")
    sc.add_argument("--score-max-sentences", type=int, help="the first N (after --kind)")
    sc.add_argument("--samples", type=int, default=10, help="sample outputs in the report, "
                    "evenly spaced over the split")
    sc.add_argument("--score-out", help="write the full report here (JSON) and the "
                    "hypotheses next to it (.hyp)")


# -- optimization -----------------------------------------------------------------------


def loss_fn(logits: Tensor, labels: Tensor, pad_id: int, label_smoothing: float) -> Tensor:
    """Mean label-smoothed cross entropy over non-pad target tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=pad_id, label_smoothing=label_smoothing)


def learning_rate(step: int, d_model: int, warmup: int, peak: float | None = None,
                  scale: float = 1.0) -> float:
    """The paper's schedule for optimizer step `step` (1-based): linear warmup,
    then inverse square root. `peak` rescales it to reach `peak` at `warmup`."""
    step = max(step, 1)
    shape = min(step ** -0.5, step * warmup ** -1.5)
    base = d_model ** -0.5 if peak is None else peak * warmup ** 0.5
    return scale * base * shape


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -- validation -------------------------------------------------------------------------


@torch.no_grad()
def validation_loss(model: Seq2SeqTransformer, data: TokenData, max_tokens: int,
                    device: torch.device) -> float:
    """Token-averaged NLL without label smoothing (comparable across settings)."""
    was_training = model.training
    model.eval()
    cfg = model.cfg
    total, count = 0.0, 0
    lengths = (data.src_lens + data.tgt_lens).tolist()
    for batch in length_batches(lengths, max_tokens):
        src, tgt_in, labels = (t.to(device) for t in collate(
            data, np.array(batch), cfg.pad_id, cfg.decoder_start_id))
        logits = model(src, src != cfg.pad_id, tgt_in)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                 labels.reshape(-1), ignore_index=cfg.pad_id,
                                 reduction="sum").item()
        count += int((labels != cfg.pad_id).sum())
    model.train(was_training)
    return total / max(count, 1)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- the run ----------------------------------------------------------------------------


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag checked between steps, so the run saves a
    checkpoint before exiting instead of dying mid-write."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handlers, no clean stop
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # second signal: the user really means it
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nsignal {signum}: finishing the step and saving a checkpoint "
              "(send again to abort)", file=sys.stderr)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def model_config(args: argparse.Namespace, vocab_size: int, corpus: dict[str, Any],
                 task: str) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model,
        encoder_layers=args.encoder_layers or args.layers,
        decoder_layers=args.decoder_layers or args.layers,
        encoder_heads=args.heads, decoder_heads=args.heads,
        encoder_ffn_dim=args.ffn, decoder_ffn_dim=args.ffn,
        max_positions=max(512, args.max_src_len, args.max_tgt_len + 1),
        dropout=args.dropout, pre_norm=args.pre_norm,
        extra=model_extra(corpus, task),
    ).validate()


def model_extra(corpus: dict[str, Any], task: str) -> dict[str, Any]:
    """What a model config records of its task and languages: its corpus's, also
    for a run started from another direction's checkpoint (de-en from en-de)."""
    return {"task": task, "src_lang": corpus.get("src_lang"), "tgt_lang": corpus.get("tgt_lang")}


DATA_ROOT = Path("data/ddtp")  # where `seq2serve data` writes by default


def resolve_data(args: argparse.Namespace) -> list[str]:
    """Fill in --data from --task/--src/--tgt, and check the languages against the
    corpus's corpus.json. Returns the problems found."""
    if args.data is None:
        if args.task == "summarize":
            args.data = str(DATA_ROOT / f"summarize-{args.src or 'en'}")
        elif args.src and args.tgt:
            args.data = str(DATA_ROOT / f"{args.src}-{args.tgt}")
        else:
            return ["give --data DIR, or --src and --tgt (reads "
                    f"{DATA_ROOT}/SRC-TGT, written by `seq2serve data`)"]
    info_file = Path(args.data) / "corpus.json"
    if not info_file.is_file():
        return [f"{info_file}: missing (build the corpus with `seq2serve data`)"]
    info = json.loads(info_file.read_text(encoding="utf-8"))
    return [f"--{flag} {getattr(args, flag)!r} does not match {args.data}, whose corpus.json "
            f"says {key} {info.get(key)!r}"
            for flag, key in (("src", "src_lang"), ("tgt", "tgt_lang"))
            if getattr(args, flag) and getattr(args, flag) != info.get(key)]


def check_args(args: argparse.Namespace) -> list[str]:
    problems = []
    if not args.out:
        problems.append("--out is required for training")
    if args.max_steps is None and args.max_minutes is None:
        problems.append("give --max-steps and/or --max-minutes")
    if args.max_tokens < args.max_src_len + args.max_tgt_len:
        problems.append(f"--max-tokens ({args.max_tokens}) must be >= --max-src-len + "
                        f"--max-tgt-len ({args.max_src_len + args.max_tgt_len}) so every "
                        "example fits a batch")
    if not 0.0 <= args.label_smoothing < 1.0:
        problems.append(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if args.warmup < 1:
        problems.append(f"--warmup must be >= 1, got {args.warmup}")
    return problems


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _format_seconds(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def run_score(args: argparse.Namespace) -> int:
    if args.beam != 1:
        print("error: only --beam 1 (greedy) is implemented in the trainer's scorer; "
              "beam search lives in the server", file=sys.stderr)
        return 2
    if args.samples < 0:
        print(f"error: --samples must be >= 0, got {args.samples}", file=sys.stderr)
        return 2
    try:
        result = evaluate(args.score, args.data, args.split, args.score_max_sentences,
                          max_tokens=args.max_tokens, device=str(resolve_device(args.device)),
                          output=args.score_out, samples=args.samples, kind=args.kind,
                          reverse=args.reverse)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.score_out:
        print(f"\nreport: {args.score_out}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    problems = resolve_data(args)
    if problems:
        print("error:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    if args.score:
        return run_score(args)
    problems = check_args(args)
    if problems:
        print("error:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    return Trainer(args).train()


class Trainer:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out)
        self.data_dir = Path(args.data)
        self.corpus = read_corpus_info(self.data_dir)
        self.task = args.task or self.corpus.get("task", "translate")
        self.device = resolve_device(args.device)
        self.last_scores: dict[str, float] | None = None  # attached to checkpoints
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def log(self, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(f"[train] {message}", file=sys.stderr)  # keeps a live bar intact

    def prepare(self) -> None:
        """Tokenizer and token cache: built on the first run, reused afterwards."""
        args = self.args
        self.out.mkdir(parents=True, exist_ok=True)
        self.tokenizer_file = self.out / ckpt.TOKENIZER_FILE
        # A fine-tune keeps its checkpoint's tokenizer unless told otherwise: one
        # trained afresh would give the same ids to other pieces.
        # (Read only for a new run: a resumed run's start may be gone by now.)
        if not self.tokenizer_file.is_file():
            given = args.tokenizer or (
                Path(args.init_from) / ckpt.read_meta(args.init_from)["tokenizer"]["file"]
                if args.init_from is not None else None)
            if given is not None:
                shutil.copyfile(given, self.tokenizer_file)
        weighted = mix.is_weighted(self.data_dir)
        if not self.tokenizer_file.is_file():
            t0 = time.monotonic()
            with mix.train_text(self.data_dir, self.out) as files:
                train_tokenizer(
                    files, self.tokenizer_file, vocab_size=args.vocab_size,
                    model_type=args.spm_type, character_coverage=args.character_coverage,
                    byte_fallback=args.byte_fallback, input_sentence_size=args.spm_sentences,
                    seed=args.seed, num_threads=args.threads)
            self.log(f"trained {args.spm_type} tokenizer in {time.monotonic() - t0:.1f}s")
        self.tokenizer = Tokenizer(self.tokenizer_file)
        t0 = time.monotonic()
        cache = self.out / "cache"
        if weighted:
            self.train_data = tokenize_mix(self.data_dir, self.tokenizer, cache,
                                           args.max_src_len, args.max_tgt_len,
                                           threads=args.threads)
        else:
            self.train_data = tokenize_split(self.data_dir, "train", self.tokenizer, cache,
                                             args.max_src_len, args.max_tgt_len,
                                             threads=args.threads)
        self.valid_data = tokenize_split(self.data_dir, "valid", self.tokenizer, cache,
                                         args.max_src_len, args.max_tgt_len,
                                         limit=args.eval_max_sentences, threads=args.threads)
        self.valid_src, self.valid_ref = read_split(self.data_dir, "valid",
                                                    args.eval_max_sentences)
        self.log(f"{self.train_data.epoch_size} training pairs (after length filtering"
                 + (f"; {len(self.train_data)} before weighting" if weighted else "") + "), "
                 f"{len(self.valid_src)} validation "
                 f"pairs, vocab {self.tokenizer.vocab_size} "
                 f"({time.monotonic() - t0:.1f}s to load/tokenize)")

    def build(self) -> None:
        """Model, optimizer and position: fresh, or from the newest checkpoint."""
        args = self.args
        latest = ckpt.latest_checkpoint(self.out)
        if latest is not None and args.resume == "none":
            raise SystemExit(f"error: {self.out} already has checkpoints ({latest.name}); "
                             "use --resume auto or another --out")
        seed_everything(args.seed)
        init = None
        if latest is not None:
            meta = ckpt.read_meta(latest)
            cfg = ModelConfig.from_dict(meta["model"])
            # A resumed run keeps the start it had: --init-from is ignored, and its
            # checkpoints go on naming the checkpoint the run was initialised from.
            args.init_from = meta.get("train_args", {}).get("init_from")
        elif args.init_from is not None:
            init = ckpt.read_meta(args.init_from)
            layers = init["model"]["decoder_layers"]
            if (args.decoder_layers or layers) < layers:
                raise SystemExit(f"error: --decoder-layers {args.decoder_layers} is below "
                                 f"the {layers} of {args.init_from}; a decoder only grows")
            cfg = ModelConfig.from_dict({**init["model"],
                                         "src_vocab_size": self.tokenizer.vocab_size,
                                         "tgt_vocab_size": self.tokenizer.vocab_size,
                                         "decoder_layers": args.decoder_layers or layers,
                                         "extra": model_extra(self.corpus, self.task)})
        else:
            cfg = model_config(args, self.tokenizer.vocab_size, self.corpus, self.task)
        self.model = Seq2SeqTransformer(cfg).to(self.device)
        if init is not None:
            base = Tokenizer(Path(args.init_from) / init["tokenizer"]["file"])
            spelled = {i: segmentation(base, self.tokenizer.sp.id_to_piece(i))
                       for i in range(base.vocab_size, self.tokenizer.vocab_size)}
            init_rows = {i: ids for i, ids in spelled.items() if ids and base.unk_id not in ids}
            added = ckpt.load_weights_growing(args.init_from, self.model, cfg.unk_id,
                                                    init_rows)
            self.log(f"initialised from {args.init_from} (step {init.get('step')})"
                     + (f"; {added} new vocabulary rows: {len(init_rows)} start as the mean "
                        "of the pieces the old vocabulary spelled them with, the rest as "
                        "<unk>'s" if added else "")
                     + (f"; decoder grown from {layers} to {cfg.decoder_layers} layers, the "
                        "new ones on top starting as the identity"
                        if cfg.decoder_layers > layers else ""))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(0.9, 0.98),
                                          eps=1e-9)
        self.step, self.epoch, self.index = 0, 0, 0
        self.best_score = -math.inf
        self.elapsed_before = 0.0
        self.train_tokens = 0
        if latest is not None:
            ckpt.load_model_weights(latest, self.model, self.device)
            state = ckpt.load_trainer_state(latest)
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.epoch, self.index = state["step"], state["epoch"], state["index"]
            self.best_score = state["best_score"]
            self.elapsed_before = state["elapsed_seconds"]
            self.train_tokens = state.get("train_tokens", 0)
            set_rng_state(state["rng"])
            self.log(f"resumed from {latest} (step {self.step}, epoch {self.epoch}, "
                     f"{self.elapsed_before / 60:.1f} min so far)")
        self.model.train()
        self.stream = BatchStream(self.train_data, args.max_tokens, args.seed, args.bucket_size,
                                  self.epoch, self.index)
        params = sum(p.numel() for p in self.model.parameters())
        self.log(f"model {params / 1e6:.2f}M parameters on {self.device}: "
                 f"{json.dumps({k: v for k, v in cfg.to_dict().items() if k != 'extra'})}")

    def meta(self, scores: dict[str, float] | None) -> dict[str, Any]:
        args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}
        return {"task": self.task, "src_lang": self.corpus.get("src_lang"),
                "tgt_lang": self.corpus.get("tgt_lang"), "step": self.step,
                "data": str(self.data_dir), "train_args": args, "valid": scores or {},
                "elapsed_seconds": self.elapsed()}

    def save(self, scores: dict[str, float] | None = None) -> Path:
        state = {"optimizer": self.optimizer.state_dict(), "step": self.step,
                 "epoch": self.stream.epoch, "index": self.stream.index,
                 "best_score": self.best_score, "elapsed_seconds": self.elapsed(),
                 "train_tokens": self.train_tokens, "rng": rng_state()}
        path = ckpt.save_checkpoint(
            self.out / ckpt.CHECKPOINTS_DIR / ckpt.step_dir_name(self.step), self.model,
            self.tokenizer_file, self.meta(scores), trainer_state=state)
        ckpt.prune_checkpoints(self.out, self.args.keep)
        return path

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def validate(self) -> dict[str, float]:
        args = self.args
        valid_loss = validation_loss(self.model, self.valid_data, args.max_tokens, self.device)
        hyps = generate(self.model, self.tokenizer, self.valid_src, args.max_src_len,
                        args.max_tgt_len, args.max_tokens, self.device)
        return {"valid_loss": valid_loss, **score(self.task, hyps, self.valid_ref)}

    def train(self) -> int:
        self.prepare()
        self.build()
        args = self.args
        from tqdm import tqdm

        self.started = time.monotonic()
        start_step = self.step
        last_save = time.monotonic()
        last_eval_step = saved_step = -1
        # Statistics over the steps since the last log line.
        window = {"loss": 0.0, "steps": 0, "tokens": 0, "tgt_tokens": 0,
                  "t0": time.monotonic()}
        bar = tqdm(total=args.max_steps, initial=self.step, disable=args.no_progress,
                   dynamic_ncols=True, desc="train", unit="step")
        cfg = self.model.cfg
        ema_loss = ema_rate = None
        log_path = self.out / "log.jsonl"
        with StopSignal() as stop:
            while True:
                if args.max_steps is not None and self.step >= args.max_steps:
                    break
                if args.max_minutes is not None and self.elapsed() >= args.max_minutes * 60:
                    break
                if stop.signum is not None:
                    break
                t_step = time.monotonic()
                src, tgt_in, labels = (t.to(self.device, non_blocking=True) for t in collate(
                    self.train_data, self.stream.next(), cfg.pad_id, cfg.decoder_start_id))
                lr = learning_rate(self.step + 1, cfg.d_model, args.warmup, args.lr,
                                   args.lr_scale)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                with torch.autocast(self.device.type, dtype=torch.bfloat16,
                                    enabled=args.autocast == "bfloat16"):
                    logits = self.model(src, src != cfg.pad_id, tgt_in)
                    loss = loss_fn(logits, labels, cfg.pad_id, args.label_smoothing)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if args.clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip)
                self.optimizer.step()
                self.step += 1

                loss_value = loss.item()  # syncs, so the step time below is real
                tokens = int((src != cfg.pad_id).sum() + (labels != cfg.pad_id).sum())
                tgt_tokens = int((labels != cfg.pad_id).sum())
                self.train_tokens += tokens
                window["loss"] += loss_value
                window["steps"] += 1
                window["tokens"] += tokens
                window["tgt_tokens"] += tgt_tokens
                rate = tokens / max(time.monotonic() - t_step, 1e-9)
                ema_loss = loss_value if ema_loss is None else 0.98 * ema_loss + 0.02 * loss_value
                ema_rate = rate if ema_rate is None else 0.95 * ema_rate + 0.05 * rate
                if not args.no_progress:
                    bar.update(1)
                    if self.step % 10 == 0 or self.step == 1:
                        bar.set_postfix(loss=f"{ema_loss:.3f}", tok_s=f"{ema_rate:.0f}",
                                        eta=_format_seconds(self.eta(window)), lr=f"{lr:.2e}")

                if args.eval_every and self.step % args.eval_every == 0:
                    self.log_eval(log_path, window, lr)
                    last_eval_step = self.step
                if time.monotonic() - last_save >= args.save_every_minutes * 60:
                    self.save(self.last_scores)
                    saved_step, last_save = self.step, time.monotonic()
            bar.close()
            if stop.signum is None and last_eval_step != self.step and window["steps"]:
                self.log_eval(log_path, window, lr)
            if saved_step != self.step and self.step > start_step:
                path = self.save(self.last_scores)
                self.log(f"saved {path}")
            if stop.signum is not None:
                self.log(f"stopped by signal {stop.signum} at step {self.step}")
                return 128 + stop.signum
        self.log(f"done: step {self.step}, {self.elapsed() / 60:.1f} min, "
                 f"best {MAIN_SCORE[self.task]} {self.best_score:.2f}")
        return 0

    def eta(self, window: dict[str, Any]) -> float:
        args = self.args
        per_step = (time.monotonic() - window["t0"]) / max(window["steps"], 1)
        candidates = []
        if args.max_steps is not None:
            candidates.append((args.max_steps - self.step) * per_step)
        if args.max_minutes is not None:
            candidates.append(args.max_minutes * 60 - self.elapsed())
        return min(candidates)

    def log_eval(self, log_path: Path, window: dict[str, Any], lr: float) -> None:
        """Validate, append one line to log.jsonl, update best/, reset the window."""
        seconds = time.monotonic() - window["t0"]
        train_seconds = max(seconds, 1e-9)
        t0 = time.monotonic()
        scores = self.validate()
        eval_seconds = time.monotonic() - t0
        main = scores[MAIN_SCORE[self.task]]
        record = {
            "step": self.step, "epoch": self.stream.epoch, "elapsed_s": round(self.elapsed(), 2),
            "train_loss": window["loss"] / max(window["steps"], 1), **scores,
            "tokens_per_s": window["tokens"] / train_seconds,
            "tgt_tokens_per_s": window["tgt_tokens"] / train_seconds,
            "step_time_s": train_seconds / max(window["steps"], 1),
            "eval_s": round(eval_seconds, 2), "lr": lr,
            "peak_memory_mb": round(peak_memory_mb(self.device), 1),
        }
        with log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self.last_scores = scores
        improved = main > self.best_score
        if improved:
            self.best_score = main
            ckpt.save_checkpoint(self.out / ckpt.BEST_DIR, self.model, self.tokenizer_file,
                                 self.meta(scores), save_dtype=self.args.save_dtype)
        self.log(f"step {self.step}: train {record['train_loss']:.3f} valid "
                 f"{scores['valid_loss']:.3f} " + " ".join(
                     f"{k} {v:.2f}" for k, v in scores.items() if k != "valid_loss")
                 + f" | {record['tokens_per_s']:.0f} tok/s" + (" *best*" if improved else ""))
        window.update(loss=0.0, steps=0, tokens=0, tgt_tokens=0, t0=time.monotonic())
