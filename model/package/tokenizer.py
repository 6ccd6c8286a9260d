"""The package tokenizers, by the manifest's tokenizer type (`package_tokenizer`):

- "sentencepiece" (`PackageTokenizer`): SentencePiece pieces mapped to model ids
  by a vocab. This is Marian's scheme (source.spm / target.spm + vocab.json, whose
  ids are not the SentencePiece ids); seq2serve's own models write a vocab.json
  that maps each piece to its SentencePiece id, so one class serves both.
- "tokenizers" (`JsonTokenizer`): a Hugging Face tokenizer.json (BART's byte-level
  BPE) run by the `tokenizers` library alone, special tokens added by its
  post-processor as the model's tokenizer adds them.

A multilingual package (its manifest's `languages`) encodes a source with the
language token of its source language where the family puts it (before the text, or
after its EOS) and never decodes a language token, whether or not its tokenizer
marks them special.

No torch, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import sentencepiece as spm
import tokenizers

from seq2serve.model.package.languages import Languages
from seq2serve.model.package.manifest import ModelPackage

SPIECE_UNDERLINE = "\u2581"


class PackageTokenizer:
    def __init__(self, source_model: Path, target_model: Path, vocab: Path, *,
                 unk_id: int, eos_id: int, pad_id: int, languages: Languages | None = None):
        self.source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.target = spm.SentencePieceProcessor(model_file=str(target_model))
        self.piece_to_id: dict[str, int] = json.loads(Path(vocab).read_text(encoding="utf-8"))
        self.id_to_piece = {i: p for p, i in self.piece_to_id.items()}
        self.unk_id, self.eos_id, self.pad_id = unk_id, eos_id, pad_id
        self.languages = languages
        # Pieces that are model-level specials must never reach SentencePiece decoding.
        self.special_ids = {unk_id, eos_id, pad_id} | (languages.token_ids() if languages
                                                       else frozenset())

    def encode(self, text: str, language: int | None = None) -> list[int]:
        """Source text -> ids, EOS appended (as Marian's and M2M100's tokenizers
        do), and the source `language` token where the package puts it."""
        code: list[str] = []
        # A leading >>lang<< code of multilingual Marian models is a vocab entry, not text.
        if self.languages is None and text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2:]
        pieces = code + self.source.encode(text, out_type=str)
        ids = [self.piece_to_id.get(p, self.unk_id) for p in pieces] + [self.eos_id]
        return with_language(ids, language, self.languages)

    def encode_target(self, text: str) -> list[int]:
        """Target text -> ids, EOS appended (what the decoder is taught to produce)."""
        pieces = self.target.encode(text, out_type=str)
        return [self.piece_to_id.get(p, self.unk_id) for p in pieces] + [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        """Target ids -> text; stops at EOS, skips pad and unknown ids."""
        pieces: list[str] = []
        for i in ids:
            if i == self.eos_id:
                break
            if i in self.special_ids or i not in self.id_to_piece:
                continue
            pieces.append(self.id_to_piece[i])
        text = str(self.target.decode_pieces(pieces))
        return text.replace(SPIECE_UNDERLINE, " ").strip()

    @staticmethod
    def vocab_from_sentencepiece(model_file: Path) -> dict[str, int]:
        """A vocab.json for a seq2serve model: each piece keeps its SentencePiece id."""
        sp = spm.SentencePieceProcessor(model_file=str(model_file))
        return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


class JsonTokenizer:
    """A tokenizer.json (Hugging Face `tokenizers`): source and target share it."""

    def __init__(self, file: Path, *, unk_id: int, eos_id: int, pad_id: int,
                 languages: Languages | None = None):
        self.tokenizer = tokenizers.Tokenizer.from_file(str(file))
        self.unk_id, self.eos_id, self.pad_id = unk_id, eos_id, pad_id
        self.languages = languages
        self.language_ids = languages.token_ids() if languages else frozenset()

    def encode(self, text: str, language: int | None = None) -> list[int]:
        """Source text -> ids, with the special tokens the model's tokenizer adds
        (BART: <s> ... </s>). A multilingual package's: the text's pieces, EOS and
        the source `language` token where the package puts it (what NLLB's,
        M2M100's and mBART-50's tokenizers do for their `src_lang`)."""
        if self.languages is None:
            return list(self.tokenizer.encode(text).ids)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return with_language(ids + [self.eos_id], language, self.languages)

    def encode_target(self, text: str) -> list[int]:
        """Target text -> ids, as the model's tokenizer makes labels (the same
        encoding: BART's labels are <s> ... </s>)."""
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        """Target ids -> text; stops at EOS, skips special tokens (as transformers'
        decode(skip_special_tokens=True))."""
        kept: list[int] = []
        for i in ids:
            if i == self.eos_id:
                break
            if i not in self.language_ids:
                kept.append(i)
        return str(self.tokenizer.decode(kept, skip_special_tokens=True))


class Tokenizer(Protocol):
    """What the server and the exporter ask of a package's tokenizer."""

    eos_id: int

    def encode(self, text: str, language: int | None = None) -> list[int]: ...

    def encode_target(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def with_language(ids: list[int], language: int | None,
                  languages: Languages | None) -> list[int]:
    """Source ids (EOS last) with the language token where `languages` puts it."""
    if language is None:
        if languages is not None:
            raise ValueError("a multilingual package's source needs its language token")
        return ids
    if languages is None:
        raise ValueError("a language token for a package without languages")
    return [language, *ids] if languages.source_token == "prefix" else [*ids, language]


def package_tokenizer(package: ModelPackage) -> Tokenizer:
    """The tokenizer a model package lists in its manifest."""
    manifest = package.manifest
    files, tokens = manifest.tokenizer, manifest.special_tokens
    if files.type == "tokenizers":
        return JsonTokenizer(package.file(files.tokenizer_json), unk_id=tokens.unk,
                             eos_id=tokens.eos, pad_id=tokens.pad, languages=manifest.languages)
    return PackageTokenizer(package.file(files.source_model), package.file(files.target_model),
                            package.file(files.vocab), unk_id=tokens.unk, eos_id=tokens.eos,
                            pad_id=tokens.pad, languages=manifest.languages)
