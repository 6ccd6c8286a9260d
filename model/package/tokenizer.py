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
import os
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

    def source_spans(self, text: str, language: int | None = None) -> list[tuple[int, int]]:
        """For each id of `encode(text, language)`, the characters of `text` it stands
        for as (start, end); EOS and the language token stand for none (start == end).
        SentencePiece reports UTF-8 byte offsets: turned into character offsets here."""
        spans: list[tuple[int, int]] = []
        offset = 0
        if self.languages is None and text.startswith(">>") and (end := text.find("<<")) != -1:
            spans.append((0, end + 2))
            offset = end + 2
        rest = text[offset:]
        chars = _char_of_byte(rest)
        for piece in self.source.encode(rest, out_type="proto").pieces:
            spans.append((offset + chars[piece.begin], offset + chars[piece.end]))
        spans.append((len(text), len(text)))  # EOS
        return with_language_spans(spans, language, self.languages, len(text))

    def target_spans(self, ids: list[int]) -> list[tuple[int, int]]:
        """For each of `ids`, the characters of `decode(ids)` it stands for as (start,
        end): empty for the ids decode skips, and for those after EOS."""
        kept: list[int] = []  # positions in ids of the pieces decoded
        pieces: list[str] = []
        for k, i in enumerate(ids):
            if i == self.eos_id:
                break
            if i in self.special_ids or i not in self.id_to_piece:
                continue
            kept.append(k)
            pieces.append(self.id_to_piece[i])
        proto = self.target.decode_pieces(pieces, out_type="proto")
        raw = str(proto.text).replace(SPIECE_UNDERLINE, " ")
        lead = len(raw) - len(raw.lstrip())
        length = len(raw.strip())
        spans = [(0, 0)] * len(ids)
        at = 0
        for k, piece in zip(kept, proto.pieces, strict=True):
            end = at + len(piece.surface)
            spans[k] = (min(max(at - lead, 0), length), min(max(end - lead, 0), length))
            at = end
        return spans

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

    def source_spans(self, text: str, language: int | None = None) -> list[tuple[int, int]]:
        """For each id of `encode(text, language)`, the characters of `text` it stands
        for as (start, end) (the tokenizer's own offsets; special tokens stand for none)."""
        if self.languages is None:
            encoding = self.tokenizer.encode(text)
            return [(a, b) if i not in encoding.special_tokens_mask or not mask else (a, a)
                    for i, ((a, b), mask) in enumerate(zip(encoding.offsets,
                                                          encoding.special_tokens_mask,
                                                          strict=True))]
        offsets = list(self.tokenizer.encode(text, add_special_tokens=False).offsets)
        return with_language_spans([*offsets, (len(text), len(text))], language,
                                   self.languages, len(text))

    def target_spans(self, ids: list[int]) -> list[tuple[int, int]]:
        """For each of `ids`, the characters of `decode(ids)` it stands for as (start,
        end). The tokenizer decodes whole lists only: each id's end is where the decoded
        prefix through it stops agreeing with the whole text."""
        text = self.decode(ids)
        spans: list[tuple[int, int]] = []
        at = 0
        for k in range(len(ids)):
            prefix = self.decode(ids[:k + 1])
            end = len(os.path.commonprefix([prefix, text]))
            spans.append((min(at, end), end))
            at = max(at, end)
        return spans

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

    def source_spans(self, text: str, language: int | None = None
                     ) -> list[tuple[int, int]]: ...

    def target_spans(self, ids: list[int]) -> list[tuple[int, int]]: ...


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


def with_language_spans(spans: list[tuple[int, int]], language: int | None,
                        languages: Languages | None, length: int) -> list[tuple[int, int]]:
    """`source_spans` with the language token's empty span where `with_language` puts
    the token."""
    if language is None or languages is None:
        return spans
    return [(0, 0), *spans] if languages.source_token == "prefix" else [*spans,
                                                                        (length, length)]


def _char_of_byte(text: str) -> list[int]:
    """For each UTF-8 byte offset of `text` (and its end), the character offset."""
    out: list[int] = []
    for k, ch in enumerate(text):
        out.extend([k] * len(ch.encode("utf-8")))
    out.append(len(text))
    return out


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
