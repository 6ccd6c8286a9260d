"""What a loader gives the exporter: a `Source` (the PyTorch model, the tokenizer files
the package will carry, and the manifest fields it knows), or a `SourceError`
listing every problem found.

A source's tokenizer is SentencePiece (`source_spm`, `target_spm` and `vocab`, the
package's vocab.json) or one Hugging Face tokenizer.json (`tokenizer_json`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.model.families.hf import TOKENIZER_JSON
from seq2serve.model.package.languages import Languages
from seq2serve.model.package.manifest import GenerationDefaults, TokenizerFiles
from seq2serve.model.package.tokenizer import JsonTokenizer, PackageTokenizer, Tokenizer
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
    source_spm: Path | None = None
    target_spm: Path | None = None
    vocab: dict[str, int] = field(default_factory=dict)
    tokenizer_json: Path | None = None  # instead of the three above
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    # The tokens the package never generates (its special_tokens.suppress); None:
    # padding and a distinct start token (our own checkpoints). A Hugging Face
    # folder says what generate() suppresses (families/generation.py).
    suppress: tuple[int, ...] | None = None
    origin: dict[str, Any] = field(default_factory=dict)
    # The longest source (tokens, EOS included) the model was trained on, where
    # known; the package's max_source_length is no more than this.
    trained_source_length: int | None = None
    # What the model expects before every input (T5's task prefix): the manifest's
    # input_prefix, which the server adds.
    input_prefix: str = ""
    # A multilingual model's languages (model/package/languages.py); its
    # source_language and target_language are then MULTILINGUAL.
    languages: Languages | None = None

    def tokenizer_files(self) -> TokenizerFiles:
        """The manifest's tokenizer entry for the files `write_tokenizer` writes."""
        if self.tokenizer_json is not None:
            return TokenizerFiles(type="tokenizers", tokenizer_json=TOKENIZER_JSON)
        return TokenizerFiles(source_model="source.spm", target_model="target.spm",
                              vocab="vocab.json")

    def write_tokenizer(self, out: Path) -> Tokenizer:
        """The tokenizer's files copied (or, vocab.json, written) into the package
        directory `out`; the tokenizer reading them there."""
        cfg = self.model.cfg
        ids = dict(unk_id=cfg.unk_id, eos_id=cfg.eos_id, pad_id=cfg.pad_id)
        languages = self.languages
        files = self.tokenizer_files()
        if self.tokenizer_json is not None:
            shutil.copyfile(self.tokenizer_json, out / files.tokenizer_json)
            return JsonTokenizer(out / files.tokenizer_json, **ids, languages=languages)
        assert self.source_spm is not None and self.target_spm is not None
        shutil.copyfile(self.source_spm, out / files.source_model)
        shutil.copyfile(self.target_spm, out / files.target_model)
        (out / files.vocab).write_text(json.dumps(self.vocab, ensure_ascii=False),
                                       encoding="utf-8")
        return PackageTokenizer(out / files.source_model, out / files.target_model,
                                out / files.vocab, **ids,
                                languages=languages)


def folder_name(path: Path) -> str:
    """A folder's model name: its own, or for a snapshot in the Hugging Face hub's
    cache (models--ORG--NAME/snapshots/COMMIT, the folder `snapshot_download` gives)
    the repository's NAME (a repository id never holds "--")."""
    folder = path.resolve()
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--"):
        return repo.split("--")[-1]
    return folder.name


def default_generation(max_positions: int, beam_size: int = 4) -> GenerationDefaults:
    return GenerationDefaults(beam_size=beam_size, num_hypotheses=1, length_penalty=1.0,
                              max_length=min(256, max_positions), max_length_ratio=2.0,
                              min_length=0, no_repeat_ngram_size=0, repetition_penalty=1.0)
