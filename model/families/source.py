"""What a loader gives the exporter: a `Source` (the PyTorch model, the tokenizer files
the package will carry, and the manifest fields it knows), or a `SourceError`
listing every problem found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.model.package.manifest import GenerationDefaults
from seq2serve.model.package.tokenizer import PackageTokenizer
from seq2serve.model.transformer import Seq2SeqTransformer


class SourceError(ValueError):
    def __init__(self, source: Path, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"cannot export {source}:\n  " + "\n  ".join(problems))


@dataclass
class Source:
    kind: str  # "seq2serve", or the Hugging Face model_type ("marian")
    model: Seq2SeqTransformer
    name: str
    task: str
    source_language: str
    target_language: str
    source_spm: Path
    target_spm: Path
    vocab: dict[str, int]
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    # The tokens the package never generates (its special_tokens.suppress); None:
    # padding and a distinct start token (our own checkpoints). A Hugging Face
    # folder says what generate() suppresses (families/generation.py).
    suppress: tuple[int, ...] | None = None
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
