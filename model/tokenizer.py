"""SentencePiece subword tokenizer: one joint model for source and target.

Special ids match ModelConfig's defaults (pad 0, bos 1, eos 2, unk 3), so the
ids the tokenizer emits are the ids the model embeds with no remapping. As in
Marian, EOS is appended to every sequence, source and target alike; BOS is never
emitted by `encode` because the decoder start token is the model's business.
"""

from __future__ import annotations

import math
import os
import re
import string
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import sentencepiece as spm

SPIECE_UNDERLINE = "\u2581"  # SentencePiece's word-boundary mark

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe")

# Unicode normalization compiled into new tokenizers (so serving, which runs the
# same .model, applies it too). "nfc_nmt" (our rule, `normalization_rules`):
# NFC, every whitespace character -> " ", controls and zero-width marks dropped,
# full-width ASCII and Latin ligatures folded. SentencePiece's own default,
# nmt_nfkc, also folds "…" -> "...", "²" -> "2", "½" -> "1⁄2", "™" -> "TM":
# a model trained on it can never write those, and UI catalogs are full of "…".
NORMALIZATIONS = ("nfc_nmt", "nmt_nfkc", "nfkc", "identity")
DEFAULT_NORMALIZATION = "nfc_nmt"

# German and French letters and quotes that every new tokenizer with byte
# fallback holds as single pieces whatever the corpus (SentencePiece's
# required_chars), so the model writes "Ü" as one token, not two bytes.
REQUIRED_CHARS = "ÄÖÜäöüßẞÀÂÆÇÉÈÊËÎÏÔŒÙÛŸàâæçéèêëîïôœùûÿ«»„“”‚‘’€…–—"
# What every shipped tokenizer must give back unchanged.
ROUND_TRIP_CHARS = ("ÄÖÜäöüß" "éèêàçœ" "«»„“‚‘€" + string.digits + string.punctuation)
ROUND_TRIP_TEXTS = (
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "Ärger über Öl kostet 5 € – „Straße“ und ‚Fuß‘ (50 % mehr).",
    "« Où est l'œuf ? » demanda-t-il à Ève, déçu : ça coûte 12,50 €.",
    "Unable to transfer tracks: %s (%d of %d) {0} $HOME <b>--force</b> [x] | ~/a_b.c",
)


class Tokenizer:
    """Thin wrapper over a SentencePiece model file."""

    def __init__(self, model_file: str | os.PathLike[str]):
        self.path = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.pad_id = self.sp.pad_id()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        self.unk_id = self.sp.unk_id()

    @classmethod
    def load(cls, model_file: str | os.PathLike[str]) -> Tokenizer:
        return cls(model_file)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        """Token ids ending in EOS; `max_len` counts the EOS (truncates the text)."""
        return self.encode_batch([text], max_len=max_len)[0]

    def encode_batch(self, texts: Sequence[str], max_len: int | None = None,
                     num_threads: int = -1) -> list[list[int]]:
        # SentencePiece tokenizes a list in C++ threads: ~100k lines per second.
        pieces = self.sp.encode(list(texts), out_type=int, num_threads=num_threads)
        if max_len is None:
            return [ids + [self.eos_id] for ids in pieces]
        keep = max(max_len - 1, 0)
        return [ids[:keep] + [self.eos_id] for ids in pieces]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` up to the first EOS; pad and BOS are dropped."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            kept.append(i)
        return self.sp.decode(kept)

    def decode_batch(self, rows: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(row) for row in rows]


BYTE_FALLBACK_MIN_VOCAB = 1024


def train_tokenizer(
    files: Sequence[str | os.PathLike[str]],
    model_file: str | os.PathLike[str],
    vocab_size: int = 8000,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    input_sentence_size: int = 200_000,
    seed: int = 1,
    num_threads: int = 2,
    byte_fallback: bool | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
) -> Tokenizer:
    """Train one SentencePiece model on all of `files` and write it to `model_file`.

    Deterministic for a given input and seed: the sentence sample is drawn with
    SentencePiece's own generator, which we seed first. `vocab_size` is a soft
    limit (hard_vocab_limit=False) so a tiny corpus gets a smaller vocabulary
    rather than an error; read `Tokenizer.vocab_size` for the real size.

    `byte_fallback` spells characters outside the vocabulary as UTF-8 byte
    pieces instead of `<unk>`, so every input round-trips and the model can
    write rare letters (German Ä/Ö/Ü fall below `character_coverage` 0.9995 on
    DDTP). It costs 256 pieces, so None means on from a 1024-piece vocabulary;
    from that size on, REQUIRED_CHARS are single pieces too.

    `normalization` is compiled into the model file (see NORMALIZATIONS).
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if vocab_size < 8:
        raise ValueError(f"vocab_size must be >= 8, got {vocab_size}")
    model_file = Path(model_file)
    if model_file.suffix != ".model":
        raise ValueError(f"model_file must end in .model, got {model_file}")
    model_file.parent.mkdir(parents=True, exist_ok=True)
    if byte_fallback is None:
        byte_fallback = vocab_size >= BYTE_FALLBACK_MIN_VOCAB
    spm.set_random_generator_seed(seed)
    # Train into a scratch prefix, then move: a crash never leaves half a model
    # that a resumed run would pick up.
    with tempfile.TemporaryDirectory(dir=model_file.parent) as tmp:
        prefix = Path(tmp) / "spm"
        options: dict[str, object] = {"normalization_rule_name": normalization}
        if normalization == "nfc_nmt":
            rules = Path(tmp) / "nfc_nmt.tsv"
            rules.write_text(normalization_rules(), encoding="utf-8")
            options = {"normalization_rule_tsv": str(rules)}
        if byte_fallback and vocab_size >= BYTE_FALLBACK_MIN_VOCAB:  # room for them
            options["required_chars"] = REQUIRED_CHARS
        spm.SentencePieceTrainer.train(
            input=[str(f) for f in files],
            model_prefix=str(prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=num_threads,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            pad_piece="<pad>",
            bos_piece="<s>",
            eos_piece="</s>",
            unk_piece="<unk>",
            hard_vocab_limit=False,
            max_sentence_length=16384,  # summarization sources are long paragraphs
            minloglevel=2,
            **options,
        )
        os.replace(prefix.with_suffix(".vocab"), model_file.with_suffix(".vocab"))
        os.replace(prefix.with_suffix(".model"), model_file)
    return Tokenizer(model_file)


_WORD_RUN = re.compile(rf"{SPIECE_UNDERLINE}?[^\W\d_]+")  # a run of letters, maybe word-initial


def _lines(files: Sequence[str | os.PathLike[str]]) -> Iterator[str]:
    for file in files:
        with open(file, encoding="utf-8") as handle:
            yield from (line.strip() for line in handle)


def unknown_characters(tokenizer: Tokenizer, files: Sequence[str | os.PathLike[str]]
                       ) -> dict[str, int]:
    """Characters of `files` (after the tokenizer's normalization) that encode to
    <unk>, with their counts, most frequent first."""
    counts: dict[str, int] = {}
    for line in _lines(files):
        for char in tokenizer.sp.normalize(line):
            if not char.isspace() and char != SPIECE_UNDERLINE:
                counts[char] = counts.get(char, 0) + 1
    unknown = {c: n for c, n in counts.items()  # (with byte fallback: none)
               if tokenizer.unk_id in tokenizer.sp.encode(c, out_type=int)}
    return dict(sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0])))


def segmentation(tokenizer: Tokenizer, piece: str) -> list[int]:
    """The ids `tokenizer` spells `piece`'s text with: `▁word` as a word after a
    space; a piece without `▁` as it would continue a word after a non-letter
    (spelled after "'" and read from the piece after it)."""
    if piece.startswith(SPIECE_UNDERLINE):
        return list(tokenizer.sp.encode(piece.replace(SPIECE_UNDERLINE, " "), out_type=int))
    ids: list[int] = tokenizer.sp.encode("'" + piece, out_type=int)
    while ids and "'" not in tokenizer.sp.id_to_piece(ids[0]):
        ids = ids[1:]
    return ids[1:]


def frequent_split_words(tokenizer: Tokenizer, files: Sequence[str | os.PathLike[str]],
                         count: int, min_count: int = 5) -> dict[str, float]:
    """The `count` words of `files` that save the most tokens as pieces of their own:
    runs of letters (with `▁` where they start a word, as SentencePiece writes them)
    that the tokenizer splits into several pieces, ranked by occurrences x pieces
    saved. Each maps to its unigram score: the log of its share of the files' tokens,
    raised where needed to just above the best split's, so the word is always
    spelled as one piece (vocabulary adaptation, as in Sato et al. 2020)."""
    words: Counter[str] = Counter()
    tokens = 0
    for line in _lines(files):
        tokens += len(tokenizer.sp.encode(line, out_type=int))
        # Normalized text writes "▁" for every space and one in front, as pieces do.
        words.update(_WORD_RUN.findall(tokenizer.sp.normalize(line)))
    pieces = {tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)}
    saving = []
    for word, n in words.items():
        if n >= min_count and word not in pieces:
            split = segmentation(tokenizer, word)
            if len(split) > 1 and tokenizer.unk_id not in split:
                saving.append((n * (len(split) - 1), word, n, split))
    saving.sort(key=lambda row: (-row[0], row[1]))
    chosen = {}
    for _, word, n, split in saving[:count]:
        best_split = sum(tokenizer.sp.get_score(i) for i in split)
        chosen[word] = max(math.log(n / max(tokens, 1)), best_split + 1.0)
    return chosen


def extend_vocabulary(model_file: str | os.PathLike[str], out_file: str | os.PathLike[str],
                      characters: Iterable[str], words: Mapping[str, float] | None = None
                      ) -> Tokenizer:
    """A copy of a SentencePiece model with `characters` appended as single-character
    pieces, then `words` (piece -> score, from `frequent_split_words`), with ids
    after the existing ones, so a model trained on the old vocabulary keeps every
    id. Characters score as the rarest existing piece, so they are only used where
    the old vocabulary had nothing but <unk>."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    existing = {p.piece for p in proto.pieces}
    normal = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
    floor = min(p.score for p in proto.pieces if p.type == normal)
    added = [(char, floor) for char in characters] + list((words or {}).items())
    for piece, score in added:
        if piece not in existing:
            proto.pieces.add(piece=piece, score=score, type=normal)
            existing.add(piece)
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(proto.SerializeToString())
    return Tokenizer(out)


def normalization_rules() -> str:
    """The "nfc_nmt" rule as SentencePiece's TSV (source code points, tab, target).

    SentencePiece applies a rule table by longest match, so NFC is spelled out:
    each canonical decomposition -> its composed character, and each singleton
    (U+212B ANGSTROM SIGN) -> its NFC form. Sequences whose combining marks
    are in another order than NFD's are left as they are.
    """
    rules: dict[str, str] = {}
    for cp in range(1, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        char = chr(cp)
        composed = unicodedata.normalize("NFC", char)
        decomposed = unicodedata.normalize("NFD", char)
        if composed != char:
            rules[char] = composed
        if decomposed != composed:
            rules[decomposed] = composed
        if char.isspace() and char != " ":
            rules[char] = " "  # NBSP, U+202F, tabs, line separators: one kind of space
        elif unicodedata.category(char) == "Cc" or char in "\u200b\u2060\ufeff\u00ad":
            rules[char] = ""  # controls, zero-width spaces, soft hyphen
    for cp in range(0xFF01, 0xFF5F):  # full-width ASCII
        rules[chr(cp)] = chr(cp - 0xFEE0)
    for cp in range(0xFB00, 0xFB07):  # ﬀ ﬁ ﬂ ﬃ ﬄ ﬅ ﬆ
        rules[chr(cp)] = unicodedata.normalize("NFKC", chr(cp))

    def hexes(text: str) -> str:
        return " ".join(f"{ord(c):X}" for c in text)

    return "".join(f"{hexes(k)}\t{hexes(v)}\n" for k, v in sorted(rules.items()))


def round_trip_failures(model_file: str | os.PathLike[str],
                        texts: Iterable[str] = ROUND_TRIP_TEXTS,
                        chars: str = ROUND_TRIP_CHARS) -> dict[str, str]:
    """Texts (and single characters) that a SentencePiece model does not give
    back unchanged, mapped to what came back; empty when all round-trip.

    Checks both ways serving decodes: ids -> text (`decode`) and pieces ->
    text (`decode_pieces`, what model/package/tokenizer.py does after mapping ids to
    pieces), and that no <unk> is produced. Apply it to each shipped
    tokenizer (a package's source.spm and target.spm).
    """
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    failures: dict[str, str] = {}
    for text in [*texts, *chars]:
        ids = sp.encode(text, out_type=int)
        by_ids = sp.decode(ids)
        by_pieces = sp.decode_pieces([sp.id_to_piece(i) for i in ids])
        if sp.unk_id() in ids or by_ids != text or by_pieces != text:
            failures[text] = by_ids if by_ids != text else by_pieces
    return failures
