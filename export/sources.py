"""One loader per source format behind one interface (CTranslate2-converter style).

A loader turns a directory on disk into a `Source`: the PyTorch model, the
tokenizer files the package will carry, and the manifest fields it knows.
Every problem a loader finds is collected and raised together.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.model.marian import ConversionError, load_marian
from seq2serve.model.package.manifest import GenerationDefaults
from seq2serve.model.package.tokenizer import PackageTokenizer
from seq2serve.model.transformer import Seq2SeqTransformer

# Sentences for the export-time check of ONNX Runtime against PyTorch.
SAMPLE_TEXTS = [
    "Open the file and save your changes.",
    "This package contains the documentation.",
    "A library for reading and writing compressed archives",
    "The server could not be started because the port is already in use.",
]


class SourceError(ValueError):
    def __init__(self, source: Path, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"cannot export {source}:\n  " + "\n  ".join(problems))


@dataclass
class Source:
    kind: str  # "seq2serve" | "marian"
    model: Seq2SeqTransformer
    name: str
    task: str
    source_language: str
    target_language: str
    source_spm: Path
    target_spm: Path
    vocab: dict[str, int]
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    origin: dict[str, Any] = field(default_factory=dict)
    # The longest source (tokens, EOS included) the model was trained on, where
    # known; the package's max_source_length is no more than this.
    trained_source_length: int | None = None

    def tokenizer(self, vocab_file: Path) -> PackageTokenizer:
        cfg = self.model.cfg
        return PackageTokenizer(self.source_spm, self.target_spm, vocab_file,
                                unk_id=cfg.unk_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id)


def default_generation(max_positions: int, beam_size: int = 4) -> GenerationDefaults:
    return GenerationDefaults(beam_size=beam_size, num_hypotheses=1, length_penalty=1.0,
                              max_length=min(256, max_positions), max_length_ratio=2.0,
                              min_length=0, no_repeat_ngram_size=0, repetition_penalty=1.0)


def detect(path: Path) -> str | None:
    config = path / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if data.get("format") == "seq2serve-checkpoint":
        return "seq2serve"
    if data.get("model_type") == "marian":
        return "marian"
    return None


def load_seq2serve(path: Path) -> Source:
    from seq2serve.model.checkpoint import load_checkpoint

    try:
        model, meta, tokenizer = load_checkpoint(path)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        # safetensors and torch report truncated or mismatched weights this way.
        raise SourceError(path, [f"{type(e).__name__}: {e}"]) from None
    task = meta.get("task", "translate")
    return Source(
        kind="seq2serve",
        model=model,
        name=meta.get("name") or path.resolve().name,
        task=task,
        source_language=meta.get("src_lang", "en"),
        target_language=meta.get("tgt_lang", "en"),
        source_spm=tokenizer.path,
        target_spm=tokenizer.path,
        vocab=PackageTokenizer.vocab_from_sentencepiece(tokenizer.path),
        generation=default_generation(model.cfg.max_positions),
        origin={"format": "seq2serve-checkpoint", "step": meta.get("step"),
                "valid": meta.get("valid")},
        trained_source_length=meta.get("train_args", {}).get("max_src_len"),
    )


def _marian_languages(path: Path) -> tuple[str, str]:
    """From tokenizer_config.json, else from an opus-mt-SRC-TGT directory name."""
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.is_file():
        data = json.loads(cfg_file.read_text(encoding="utf-8"))
        if data.get("source_lang") and data.get("target_lang"):
            return str(data["source_lang"]), str(data["target_lang"])
    parts = path.resolve().name.split("-")
    if len(parts) >= 4 and parts[0] == "opus" and parts[1] == "mt":
        return parts[2], parts[3]
    return "und", "und"


def load_marian_source(path: Path) -> Source:
    problems: list[str] = []
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (path / name).is_file():
            problems.append(f"{name}: missing (a Marian directory needs the tokenizer files)")
    tokenizer_cfg = path / "tokenizer_config.json"
    if tokenizer_cfg.is_file():
        if json.loads(tokenizer_cfg.read_text(encoding="utf-8")).get("separate_vocabs"):
            problems.append("tokenizer_config.json: separate_vocabs is not supported")
    model = None
    try:
        model = load_marian(path)
    except ConversionError as e:
        problems.extend(e.problems)
    vocab: dict[str, int] = {}
    if (path / "vocab.json").is_file():
        try:
            vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"vocab.json: not valid JSON ({e})")
    if model is not None and vocab and max(vocab.values()) >= model.cfg.tgt_vocab_size:
        problems.append(f"vocab.json: ids reach {max(vocab.values())} but the model's "
                        f"vocabulary has {model.cfg.tgt_vocab_size} entries")
    if problems or model is None:
        raise SourceError(path, problems)
    generation = default_generation(model.cfg.max_positions)
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        hf = json.loads(gen_file.read_text(encoding="utf-8"))
        generation = dataclasses.replace(
            generation, beam_size=int(hf.get("num_beams", generation.beam_size)),
            max_length=min(int(hf.get("max_length", 256)), model.cfg.max_positions),
            length_penalty=float(hf.get("length_penalty", 1.0)))
    src, tgt = _marian_languages(path)
    return Source(
        kind="marian",
        model=model,
        name=path.resolve().name,
        task="translate",
        source_language=src,
        target_language=tgt,
        source_spm=path / "source.spm",
        target_spm=path / "target.spm",
        vocab=vocab,
        generation=generation,
        origin={"format": "huggingface-marian"},
    )


LOADERS = {"seq2serve": load_seq2serve, "marian": load_marian_source}


def load_source(path: str | Path) -> Source:
    root = Path(path)
    if not root.is_dir():
        raise SourceError(root, [f"{root}: not a directory"])
    kind = detect(root)
    if kind is None:
        raise SourceError(root, [
            "config.json: missing, unreadable, or of an unknown architecture (expected a "
            "seq2serve checkpoint or a Hugging Face Marian model with model_type 'marian')"])
    return LOADERS[kind](root)
