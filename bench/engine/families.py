"""The Hugging Face families at their smallest public shapes with seeded random
weights (`seq2serve bench --family`): bart-base, Pegasus at bart-base's size,
t5-small, flan-t5-small, and the multilingual m2m100_418M and
nllb-200-distilled-600M, each built as a Hugging Face folder (config.json,
weights, tokenizer files), exported as our packages (fp32, int8) and converted for
CTranslate2 by its own converter; plus a tiny shape of each family for the tests.

The multilingual ones (model_type m2m_100) are written as the hub's folders are:
M2M100 as sentencepiece.bpe.model + vocab.json (filled to the model's rows less its
100 language tokens and 8 made-up words, which M2M100Tokenizer numbers after it;
tokenizer_config lists the language tokens, which CTranslate2's M2M100 loader
takes its vocabulary's language entries from), NLLB-200 as NllbTokenizer's
tokenizer.json (its language tokens after the pieces; the model's rows past the
tokenizer are CTranslate2's made-up words). A source starts with its language
token (M2M100's and NLLB's current behaviour; `Ids.source_languages`, the codes of
`LANGUAGES` in turn), and every system's first new token is forced to the target
language's (`Ids.target`):
generate()'s forced_bos_token_id, CTranslate2's target_prefix, our engine's
per-source forced_bos; it counts as one of the `new_tokens`. The folder's
generation_config suppresses <pad>: transformers gives a generated <pad> the zero
position row (its positions count non-pad tokens), which no trained model meets;
every system is told the folder's suppressed tokens.

As on the OPUS-MT shape (workload.py), every system decodes exactly `new_tokens`
tokens (EOS banned until then) from the same random source ids, so each does the
same work. The tokenizers are small where SentencePiece needs training text
(Pegasus, T5: the model's vocabulary is larger than the tokenizer's, as T5's 32128
is); the sources are drawn from the tokenizer's ordinary pieces.

CTranslate2 4.8.5's BART/Pegasus loader reads config keys that transformers 5 no
longer writes (normalize_before, normalize_embedding): the conversion reads a COPY
of the folder whose config.json carries them, with the values that describe the
same model (`CT2_LEGACY_KEYS`); the folder the other systems load is untouched.
Its T5 loader pads the vocabulary to the model's size with names the tokenizer
already has (<extra_id_0>...): those rows are renamed in the converted vocabulary,
so that every id has its own piece. That loader also scales the decoder's output by
d_model**-0.5 whenever `config.tie_word_embeddings`, which transformers 5 sets for
every T5 (it says `scale_decoder_outputs` instead): a Flan-T5 folder would convert
to a model whose log-probs are those of logits * 0.044 (greedy tokens unchanged,
beam search not generate()'s). The conversion here scales only where
`scale_decoder_outputs` says so (`_t5_output_scale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seq2serve.bench.engine.workload import (
    Models,
    _atomic_dir,
    converted_vocabulary,
    export_package,
    exporter_key,
)
from seq2serve.export.sources import SAMPLE_TEXTS


@dataclass(frozen=True)
class Draw:
    """How the seeded random weights depart from transformers' initialisation.

    noise: N(0, noise^2) added to every tensor (Pegasus's sinusoid positions kept).
    relative: instead, N(0, (relative * s)^2) added to each tensor whose initial
    values spread by s (its standard deviation as drawn); the tensors drawn constant
    (norm weights) still get N(0, noise^2). T5 multiplies queries and keys without
    1/sqrt(d_kv) and initialises the query projection at (d_model * d_kv)^-0.5, so
    an absolute N(0, 0.1^2) makes every attention nearly hard and the 8+8 layer
    gated-gelu shape ill-conditioned in fp32; noise relative to each tensor's own
    scale keeps it exact.
    head_std: the folder gets its own output matrix (lm_head.weight, drawn
    N(0, head_std^2)) and `tie_word_embeddings: false` in config.json, as the hub's
    T5 v1.1 / Flan-T5 / mT5 folders have them (transformers 5 ties T5's weights
    unless a checkpoint holds a different lm_head.weight).
    """

    noise: float = 0.1
    relative: float | None = None
    head_std: float | None = None


@dataclass(frozen=True)
class FamilyShape:
    name: str
    family: str  # bart | pegasus | t5 | m2m100 | nllb
    config: dict[str, Any] = field(hash=False)  # the transformers config's arguments
    draw: Draw = Draw()

    @property
    def key(self) -> str:
        """A directory name that changes whenever the weights would."""
        described: Any = self.config
        if self.draw != Draw():
            described = {"config": self.config, "draw": vars(self.draw)}
        digest = json.dumps(described, sort_keys=True)
        if self.family in MULTILINGUAL:  # SentencePiece numbered as the hub's
            digest += " hub spm"
        import hashlib

        return f"{self.name}-{hashlib.sha256(digest.encode()).hexdigest()[:8]}"


_BART_IDS = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
_PEGASUS_IDS = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
_T5_IDS = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
# Nothing forced or blocked: every system decodes the same exact lengths.
_FREE = dict(forced_bos_token_id=None, forced_eos_token_id=None)


def _bart_like(vocab: int, d: int, layers: int, heads: int, ffn: int) -> dict[str, Any]:
    return dict(vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
                encoder_attention_heads=heads, decoder_attention_heads=heads,
                encoder_ffn_dim=ffn, decoder_ffn_dim=ffn)


# M2M100Config's own values beside the dimensions (m2m100_418M's and NLLB-200's).
_M2M100 = {**_BART_IDS, **_FREE, "activation_function": "relu", "scale_embedding": True}
MULTILINGUAL = ("m2m100", "nllb")
# M2M100Tokenizer's rows after vocab.json: its 100 language tokens, then 8 made-up words.
M2M100_EXTRA_ROWS = 100 + 8


FAMILY_SHAPES = {s.name: s for s in [
    # facebook/bart-base
    FamilyShape("bart", "bart", {**_bart_like(50265, 768, 6, 12, 3072), **_BART_IDS, **_FREE,
                                 "max_position_embeddings": 1024}),
    # Pegasus at bart-base's size, with Pegasus's vocabulary (google/pegasus-*: 96103)
    FamilyShape("pegasus", "pegasus", {**_bart_like(96103, 768, 6, 12, 3072), **_PEGASUS_IDS,
                                       **_FREE, "max_position_embeddings": 1024,
                                       "activation_function": "relu",
                                       "scale_embedding": True}),
    # google-t5/t5-small
    FamilyShape("t5", "t5", dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048,
                                 num_layers=6, num_decoder_layers=6, num_heads=8,
                                 feed_forward_proj="relu", tie_word_embeddings=True,
                                 **_T5_IDS)),
    # google/flan-t5-small, with its own output matrix. Drawn as the others
    # (transformers' initialisation + N(0, 0.1)), its fp32 log-probs differ from
    # float64 by ~0.2 and the exporter refuses it; relative noise and an output
    # matrix of std 0.2 keep fp32 within 1e-4 of float64 (docs/benchmarks.md).
    FamilyShape("flan-t5", "t5", dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024,
                                      num_layers=8, num_decoder_layers=8, num_heads=6,
                                      feed_forward_proj="gated-gelu",
                                      tie_word_embeddings=False, **_T5_IDS),
                Draw(relative=0.5, head_std=0.2)),
    # facebook/m2m100_418M
    FamilyShape("m2m100", "m2m100", {**_bart_like(128112, 1024, 12, 16, 4096), **_M2M100,
                                     "max_position_embeddings": 1024}),
    # facebook/nllb-200-distilled-600M: m2m100_418M's dimensions, NLLB's vocabulary
    FamilyShape("nllb", "nllb", {**_bart_like(256206, 1024, 12, 16, 4096), **_M2M100,
                                 "max_position_embeddings": 1024}),
    # the test-sized ones
    FamilyShape("tiny-bart", "bart", {**_bart_like(600, 32, 2, 4, 64), **_BART_IDS, **_FREE,
                                      "max_position_embeddings": 128}),
    FamilyShape("tiny-pegasus", "pegasus", {**_bart_like(300, 32, 2, 4, 64), **_PEGASUS_IDS,
                                            **_FREE, "max_position_embeddings": 128,
                                            "activation_function": "relu",
                                            "scale_embedding": True}),
    FamilyShape("tiny-t5", "t5", dict(vocab_size=240, d_model=32, d_kv=8, d_ff=64,
                                      num_layers=2, num_decoder_layers=2, num_heads=4,
                                      relative_attention_num_buckets=8,
                                      relative_attention_max_distance=16,
                                      feed_forward_proj="relu", tie_word_embeddings=True,
                                      **_T5_IDS)),
    FamilyShape("tiny-flan-t5", "t5", dict(vocab_size=240, d_model=32, d_kv=8, d_ff=48,
                                           # as many decoder layers as encoder layers:
                                           # generate()'s cache in transformers 5.x has
                                           # num_layers entries (IndexError otherwise)
                                           num_layers=2, num_decoder_layers=2, num_heads=3,
                                           relative_attention_num_buckets=8,
                                           relative_attention_max_distance=16,
                                           feed_forward_proj="gated-gelu",
                                           tie_word_embeddings=False, **_T5_IDS),
                Draw(relative=0.5, head_std=0.2)),
    # vocab.json of 100 entries (the 90 pieces, filler words) and the 108 rows after it
    # (drawn wider: at width 32 the scaled embedding of the last token outweighs the
    # layers below 1, and every system would repeat one token from the first step)
    FamilyShape("tiny-m2m100", "m2m100", {**_bart_like(208, 32, 2, 4, 64), **_M2M100,
                                          "max_position_embeddings": 128}, Draw(noise=1.0)),
    # the tokenizer's ~290 entries and a few rows past them
    FamilyShape("tiny-nllb", "nllb", {**_bart_like(320, 32, 2, 4, 64), **_M2M100,
                                      "max_position_embeddings": 128}, Draw(noise=1.0)),
]}
# The public shapes (`seq2serve bench --family`), in the order above.
FAMILIES = tuple(name for name in FAMILY_SHAPES if not name.startswith("tiny-"))
# The languages of a multilingual family's sources (in turn) and their one target, in
# the family's own codes.
LANGUAGES = {"m2m100": (("en", "fr", "zh"), "de"),
             "nllb": (("eng_Latn", "fra_Latn", "zho_Hans"), "deu_Latn")}

# The keys CTranslate2 4.8.5's BART/Pegasus loader reads and transformers 5 no
# longer writes, with the values that describe these models (BART: post-norm with
# layernorm_embedding; Pegasus: pre-norm, no layernorm_embedding).
CT2_LEGACY_KEYS = {
    "bart": dict(normalize_before=False, normalize_embedding=True),
    "pegasus": dict(normalize_before=True, normalize_embedding=False),
}

# A shape's family -> the model_type its folder says; the exporter's table of
# families (model/families/registry.py) has the rest.
MODEL_TYPES = {"bart": "bart", "pegasus": "pegasus", "t5": "t5", "m2m100": "m2m_100",
               "nllb": "m2m_100"}


def model_classes(family: str) -> tuple[str, str]:
    """transformers' config and model class a shape's folder is built with."""
    from seq2serve.model.families.registry import FAMILIES as ARCHITECTURES

    return ARCHITECTURES[MODEL_TYPES[family]].transformers_classes


def _train_spm(out: Path, prefix: str, model_type: str, **ids: int) -> Path:
    """A 90-piece SentencePiece model `prefix`.model trained on the sample texts
    with the given special ids."""
    import sentencepiece as spm

    text = out / "train.txt"
    text.write_text("\n".join(SAMPLE_TEXTS * 20), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / prefix), vocab_size=90, model_type=model_type,
        hard_vocab_limit=False, minloglevel=2, num_threads=1, **ids)
    text.unlink()
    (out / f"{prefix}.vocab").unlink()
    return out / f"{prefix}.model"


def _spm_tokenizer(out: Path, family: str) -> None:
    """A SentencePiece unigram model (pad 0, eos 1, unk 2, no bos: Pegasus's and
    T5's) trained on the sample texts, loaded by the family's tokenizer class and
    saved (spiece.model and tokenizer.json)."""
    import transformers

    _train_spm(out, "spiece", "unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    cls = transformers.PegasusTokenizer if family == "pegasus" else transformers.T5Tokenizer
    cls.from_pretrained(str(out)).save_pretrained(str(out))


def _multilingual_tokenizer(out: Path, family: str, vocab_size: int) -> None:
    """sentencepiece.bpe.model numbered as the hub's (<unk> 0, <s> 1, </s> 2, no pad)
    and the family's tokenizer files as its transformers class saves them, fairseq's
    numbering (<s> 0, <pad> 1, </s> 2, <unk> 3, then the pieces): M2M100's vocab.json
    filled up to `vocab_size` less its language tokens and made-up words; NLLB's
    tokenizer.json, which must fit in `vocab_size`."""
    import transformers

    model = _train_spm(out, "sentencepiece.bpe", "bpe", unk_id=0, bos_id=1, eos_id=2,
                       pad_id=-1)
    if family == "nllb":
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

        tok = transformers.NllbTokenizer.from_pretrained(
            str(out), extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
        if len(tok) > vocab_size:
            raise ValueError(f"NLLB's tokenizer has {len(tok)} entries, more than the "
                             f"model's {vocab_size} rows")
    else:
        import sentencepiece as spm
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

        sp = spm.SentencePieceProcessor(model_file=str(model))
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}  # fairseq's dictionary
        for i in range(3, sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
        filler = 0
        while len(vocab) < vocab_size - M2M100_EXTRA_ROWS:
            vocab.setdefault(f"\u2581w{filler}", len(vocab))
            filler += 1
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False),
                                        encoding="utf-8")
        codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
        tok = transformers.M2M100Tokenizer(
            str(out / "vocab.json"), str(model),
            additional_special_tokens=[f"__{code}__" for code in codes])
    tok.save_pretrained(str(out))


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the printable bytes as themselves, the others
    shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(shifted))]


def _bart_tokenizer(out: Path, vocab_size: int) -> None:
    """BART's byte-level BPE files with exactly `vocab_size` entries (<s> <pad> </s>
    <unk>, the 256 byte symbols, filler words, <mask> last, as bart-base's), no
    merges; tokenizer.json through BartTokenizer."""
    import transformers

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for symbol in _byte_symbols():
        vocab.setdefault(symbol, len(vocab))
    filler = 0
    while len(vocab) < vocab_size - 1:
        vocab.setdefault(f"\u0120w{filler}", len(vocab))
        filler += 1
    vocab["<mask>"] = vocab_size - 1
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    transformers.BartTokenizer.from_pretrained(str(out)).save_pretrained(str(out))


def build_folder(out: Path, shape: FamilyShape, seed: int) -> Path:
    """A seeded random Hugging Face folder of `shape`'s family, cached."""

    def build(tmp: Path) -> None:
        import torch
        import transformers

        transformers.logging.disable_progress_bar()
        if shape.family == "bart":
            _bart_tokenizer(tmp, shape.config["vocab_size"])
        elif shape.family in MULTILINGUAL:
            _multilingual_tokenizer(tmp, shape.family, shape.config["vocab_size"])
        else:
            _spm_tokenizer(tmp, shape.family)
        config_name, model_name = model_classes(shape.family)
        # The summarization task (the families' exporters need a folder to say its
        # task); T5's input prefix with it, nothing that changes decoding. A
        # multilingual model translates, as its exporter knows.
        task = ({} if shape.family in MULTILINGUAL else
                {"summarization": {"prefix": "summarize: "} if shape.family == "t5" else {}})
        config = getattr(transformers, config_name)(
            **shape.config, **({"task_specific_params": task} if task else {}))
        torch.manual_seed(seed)
        model = getattr(transformers, model_name)(config).eval()
        draw = shape.draw
        with torch.no_grad():
            # HF's initialisation (std 0.02, zero biases, identity norms) gives
            # near-uniform next-token distributions: spread them as a trained
            # model's are (Pegasus keeps its sinusoid position table).
            for name, p in model.named_parameters():
                if "embed_positions" in name:
                    continue
                scale = draw.noise
                if draw.relative is not None and p.numel() > 1 and float(p.std()) > 0:
                    scale = draw.relative * float(p.std())
                p.add_(scale * torch.randn_like(p))
            head = (None if draw.head_std is None else
                    draw.head_std * torch.randn(model.get_output_embeddings().weight.shape))
        model.save_pretrained(tmp)
        if head is not None:
            _own_output_matrix(tmp, head)
        # The generation settings say only what starts and ends a sequence.
        c = shape.config
        generation: dict[str, Any] = {
            k: c[k] for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id",
                              "bos_token_id") if k in c}
        if shape.family in MULTILINGUAL:
            generation["suppress_tokens"] = [c["pad_token_id"]]
        (tmp / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")

    return _atomic_dir(out, build)


def _own_output_matrix(folder: Path, head: Any) -> None:
    """lm_head.weight beside the shared embedding and `tie_word_embeddings: false`
    (no scale_decoder_outputs key), as a Flan-T5 folder on the hub has them."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = head.contiguous()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    file = folder / "config.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    config.pop("scale_decoder_outputs", None)
    config["tie_word_embeddings"] = False
    file.write_text(json.dumps(config, indent=2), encoding="utf-8")


@dataclass(frozen=True)
class Ids:
    eos: int
    low: int  # the ordinary pieces: [low, high)
    high: int
    # a multilingual family's: the sources' language tokens (in turn) and the target's
    source_languages: tuple[int, ...] = ()
    target: int | None = None


def source_ids(folder: Path, shape: FamilyShape) -> Ids:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    eos = config["eos_token_id"]
    if shape.family == "bart":  # specials 0..3, the byte symbols and words, <mask> last
        return Ids(eos, 4, config["vocab_size"] - 1)
    if shape.family in MULTILINGUAL:  # specials 0..3, the pieces, the language tokens
        sources, target = language_tokens(folder, shape.family)
        return Ids(eos, 4, min(sources + (target,)), sources, target)
    import sentencepiece as spm

    pieces = spm.SentencePieceProcessor(model_file=str(folder / "spiece.model")).get_piece_size()
    offset = 103 if shape.family == "pegasus" else 0  # Pegasus's ids: SentencePiece's + 103
    return Ids(eos, offset + 3, offset + pieces)  # past pad, eos, unk


def language_tokens(folder: Path, family: str) -> tuple[tuple[int, ...], int]:
    """The ids of `LANGUAGES[family]`'s source language tokens and of its target's,
    as the family's transformers tokenizer gives them."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    sources, target = LANGUAGES[family]
    if family == "m2m100":
        return tuple(tok.get_lang_id(code) for code in sources), tok.get_lang_id(target)
    ids = tok.convert_tokens_to_ids([*sources, target])
    if tok.unk_token_id in ids:
        raise ValueError(f"{folder}: the tokenizer lacks one of {[*sources, target]}")
    return tuple(ids[:-1]), ids[-1]


def random_sources(ids: Ids, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` sources of `length` ids (the last one EOS), ordinary pieces only; a
    multilingual family's first one its language token (one of `source_languages`,
    in turn)."""
    rng = np.random.default_rng(seed)
    languages = [[lang] for lang in ids.source_languages]
    rows = rng.integers(ids.low, ids.high, size=(count, length - 1 - bool(languages)))
    return [(languages[i % len(languages)] if languages else []) + row + [ids.eos]
            for i, row in enumerate(rows.tolist())]


def _pad_tokenizer(folder: Path, vocab_size: int) -> None:
    """CTranslate2's BART/Pegasus loader takes its vocabulary from the tokenizer and
    pads nothing: give the copy's tokenizer one placeholder per model row past its
    own pieces (the rows the tokenizer never produces, as in T5's 32128)."""
    import transformers

    tok = transformers.PegasusTokenizer.from_pretrained(str(folder))
    tok.add_tokens([f"<ct2_row_{i}>" for i in range(len(tok), vocab_size)])
    tok.save_pretrained(str(folder))


@contextlib.contextmanager
def _t5_output_scale() -> Iterator[None]:
    """CTranslate2's T5 loader, with the decoder output scaled only when the
    transformers model scales it (`config.scale_decoder_outputs`; transformers 5
    always sets tie_word_embeddings, which the loader goes by)."""
    from ctranslate2.converters import transformers as loaders
    from ctranslate2.specs import model_spec

    original = loaders.T5Loader.get_model_spec

    def get_model_spec(self: Any, model: Any) -> Any:
        spec = original(self, model)
        if not getattr(model.config, "scale_decoder_outputs", True):
            spec.decoder.scale_outputs = model_spec.OPTIONAL
        return spec

    loaders.T5Loader.get_model_spec = get_model_spec  # type: ignore[method-assign]
    try:
        yield
    finally:
        loaders.T5Loader.get_model_spec = original  # type: ignore[method-assign]


def convert_ctranslate2(folder: Path, out: Path, family: str) -> Path:
    """CTranslate2's TransformersConverter on the folder (float32; int8 is its
    load-time quantization); BART and Pegasus through a copy whose config.json
    carries the keys its loader needs (CT2_LEGACY_KEYS); T5 with its output scaled
    as transformers scales it (_t5_output_scale)."""

    def build(tmp: Path) -> None:
        import ctranslate2

        source = folder
        if family in CT2_LEGACY_KEYS:
            source = tmp.parent / f".{tmp.name}-source"
            shutil.rmtree(source, ignore_errors=True)
            shutil.copytree(folder, source)
            file = source / "config.json"
            config = json.loads(file.read_text(encoding="utf-8"))
            file.write_text(json.dumps({**config, **CT2_LEGACY_KEYS[family]}), encoding="utf-8")
            if family == "pegasus":
                _pad_tokenizer(source, config["vocab_size"])
        try:
            with warnings.catch_warnings(), _t5_output_scale():
                warnings.simplefilter("ignore")
                ctranslate2.converters.TransformersConverter(str(source)).convert(
                    str(tmp), force=True)
        finally:
            if source != folder:
                shutil.rmtree(source, ignore_errors=True)
        file = tmp / "shared_vocabulary.json"
        pieces = json.loads(file.read_text(encoding="utf-8"))
        seen: set[str] = set()
        for i, piece in enumerate(pieces):
            if piece in seen:
                pieces[i] = f"<ct2_row_{i}>"
            seen.add(pieces[i])
        file.write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")
        if len(pieces) != config_vocab(folder):
            raise RuntimeError(f"{tmp}: CTranslate2's vocabulary has {len(pieces)} entries, "
                               f"the model {config_vocab(folder)}")

    return _atomic_dir(out, build)


def vocabulary_map(ids: Ids, vocab_size: int, settings: Any, seed: int) -> str:
    """CTranslate2's vocabulary map (ctranslate2_model.vocabulary_map's format) of a
    random shortlist table with `settings`' sizes (a ShortlistSettings: `first`,
    `best`), the shortlist a trained model's table would give these random weights:
    always the `first` pieces (random ordinary ones) with EOS and the target
    language token, and for each source piece (the ordinary ones and the language
    tokens) `best` random targets. Tokens are written as ids, `<id>` being
    replaced by the converted vocabulary's piece (`with_vocabulary_map`)."""
    rng = np.random.default_rng(seed)

    def pick(count: int) -> list[int]:
        return sorted(rng.choice(np.arange(ids.low, vocab_size), size=count,
                                 replace=False).tolist())

    always = sorted({ids.eos, *([] if ids.target is None else [ids.target]),
                     *pick(settings.first)})
    lines = ["\t" + " ".join(map(str, always))]
    for source in [*range(ids.low, ids.high), *ids.source_languages]:
        lines.append(f"{source}\t" + " ".join(map(str, pick(settings.best))))
    return "\n".join(lines) + "\n"


def with_vocabulary_map(ct2: Path, out: Path, vmap: str) -> Path:
    """The CTranslate2 conversion `ct2` (its files linked, not copied) with `vmap`
    (vocabulary_map's text, ids) as its vocabulary map, written in its pieces."""
    from seq2serve.bench.engine.ctranslate2_model import VMAP_FILE

    def build(tmp: Path) -> None:
        pieces = converted_vocabulary(ct2)
        for file in ct2.iterdir():
            os.link(file, tmp / file.name)
        lines = []
        for line in vmap.splitlines():
            source, targets = line.split("\t")
            lines.append("\t".join(" ".join(pieces[int(i)] for i in part.split())
                                    for part in (source, targets)))
        (tmp / VMAP_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")

    return _atomic_dir(out, build)


def config_vocab(folder: Path) -> int:
    return int(json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab_size"])


def prepare_family(work: Path, shape: FamilyShape, seed: int, precisions: set[str],
                   ctranslate2: bool) -> Models:
    """Build or reuse the folder and its conversions under `work`."""
    root = work / f"{shape.key}-seed{seed}"
    folder = build_folder(root / "hf", shape, seed)
    key = exporter_key()
    packages = {p: export_package(folder, root / f"seq2serve-{p}-{key}", p)
                for p in sorted(precisions)}
    ct2 = convert_ctranslate2(folder, root / "ctranslate2", shape.family) if ctranslate2 else None
    return Models(folder, packages, ct2)
