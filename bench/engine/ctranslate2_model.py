"""A seq2serve checkpoint directory as a CTranslate2 model directory.

`python -m seq2serve.bench.engine.ctranslate2_model CHECKPOINT OUT` writes OUT with
CTranslate2's own spec API (a `TransformerSpec` filled by a `Converter`
subclass, saved by `Converter.convert`), the way its fairseq and OpenNMT-py
converters do. The conversion is exact:

- pre- or post-norm stacks (`TransformerSpec(pre_norm=...)`), the final
  encoder/decoder LayerNorm of a pre-norm model;
- self-attention Q, K, V fused into one (3D, D) matrix and cross-attention K, V
  into one (2D, D) matrix, the layouts CTranslate2 computes with;
- the model's own sinusoid table (interleaved or split) given as the position
  encodings: CTranslate2's built-in table is the split layout, so an
  interleaved model would otherwise be computed with the wrong positions;
- scaled embeddings, the shared source/target matrix and the tied output
  projection (CTranslate2 stores identical arrays once, as aliases);
- LayerNorm epsilon, activation and special tokens from the checkpoint's
  ModelConfig, and one shared vocabulary: the SentencePiece pieces in id order,
  so a piece's CTranslate2 index is its seq2serve id.

The source EOS is added by CTranslate2 (`add_source_eos`), as the seq2serve
tokenizer appends it: callers pass SentencePiece pieces, as Argos Translate
does. The position table has the model's `max_positions` rows, so a source
and a translation are limited to that many tokens (CTranslate2 raises past it;
its default `max_decoding_length` 256 fits the shipped models' 512). Weights
are stored in float32; int8 and the other precisions are
CTranslate2's load-time quantization (`compute_type`).

`--vmap-from PACKAGE` also writes CTranslate2's vocabulary map (`vmap.txt`,
used with `translate_batch(use_vmap=True)`) built from a format 8 package's
shortlist table (`vocabulary_map`), so that CTranslate2 decodes over the same
candidates as the engine's shortlist.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
from ctranslate2.converters.converter import Converter
from ctranslate2.specs import common_spec, transformer_spec

from seq2serve.model.package import shortlist as lexical

ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELU,
    "gelu_new": common_spec.Activation.GELUTanh,
    "swish": common_spec.Activation.SWISH,
}
TOKENIZER_FILE = "sentencepiece.model"
# The vocabulary map's name in a model directory (ModelSpec.register_vocabulary_mapping).
VMAP_FILE = "vmap.txt"
COMPUTE_TYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8",
                 "int8_float32": "int8_float32"}


def _array(tensor: Any) -> np.ndarray:
    """A float32 numpy copy of a (possibly fp16) torch tensor."""
    array: np.ndarray = tensor.detach().float().cpu().numpy().copy()
    return array


def _set_linear(spec: Any, linear: Any) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _set_fused(spec: Any, linears: Sequence[Any]) -> None:
    """One linear layer computing `linears` side by side (rows concatenated)."""
    spec.weight = np.concatenate([_array(linear.weight) for linear in linears])
    spec.bias = np.concatenate([_array(linear.bias) for linear in linears])


def _set_norm(spec: Any, norm: Any) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _set_ffn(spec: Any, ffn: Any, norm: Any) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, ffn.fc1)
    _set_linear(spec.linear_1, ffn.fc2)


def _set_self_attention(spec: Any, attn: Any, norm: Any) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    _set_linear(spec.linear[1], attn.out_proj)


def _set_cross_attention(spec: Any, attn: Any, norm: Any) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear[0], attn.q_proj)
    _set_fused(spec.linear[1], [attn.k_proj, attn.v_proj])
    _set_linear(spec.linear[2], attn.out_proj)


def model_spec(model: Any, pieces: Sequence[str]) -> transformer_spec.TransformerSpec:
    """The TransformerSpec of a seq2serve `Seq2SeqTransformer` (eval mode) whose
    vocabulary is `pieces` (index = token id)."""
    cfg = model.cfg
    if cfg.encoder_heads != cfg.decoder_heads:
        raise ValueError(f"CTranslate2's TransformerSpec has one head count; this model has "
                         f"{cfg.encoder_heads} encoder and {cfg.decoder_heads} decoder heads")
    if not cfg.share_embeddings and len(pieces) != cfg.src_vocab_size:
        raise ValueError("separate source and target vocabularies are not supported")
    if len(pieces) != cfg.tgt_vocab_size:
        raise ValueError(f"the tokenizer has {len(pieces)} pieces but the model's vocabulary "
                         f"is {cfg.tgt_vocab_size}")
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.encoder_heads, pre_norm=cfg.pre_norm,
        activation=ACTIVATIONS[cfg.activation])
    positions = _array(model.positions)
    for stack, embed in ((spec.encoder, model.src_embed), (spec.decoder, model.tgt_embed)):
        stack.scale_embeddings = cfg.scale_embedding
        stack.position_encodings.encodings = positions
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else \
            stack.embeddings
        embeddings.weight = _array(embed.weight)
    if cfg.pre_norm:
        _set_norm(spec.encoder.layer_norm, model.encoder_norm)
        _set_norm(spec.decoder.layer_norm, model.decoder_norm)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers, strict=True):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.attn_block.norm)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.ffn_block.norm)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers, strict=True):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.self_block.norm)
        _set_cross_attention(layer_spec.attention, layer.cross_attn, layer.cross_block.norm)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.ffn_block.norm)
    spec.decoder.projection.weight = _array(model.output.weight)
    if model.final_logits_bias is not None:
        spec.decoder.projection.bias = _array(model.final_logits_bias)

    config = spec.config
    config.unk_token = pieces[cfg.unk_id]
    config.bos_token = pieces[cfg.bos_id]
    config.eos_token = pieces[cfg.eos_id]
    config.decoder_start_token = pieces[cfg.decoder_start_id]
    config.add_source_eos = True
    config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    return spec


def spm_pieces(tokenizer_file: str | os.PathLike[str]) -> list[str]:
    """The SentencePiece model's pieces in id order."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_file))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


class CheckpointConverter(Converter):  # type: ignore[misc]  # ctranslate2 ships no types
    """CTranslate2 converter for a seq2serve checkpoint directory."""

    def __init__(self, checkpoint: str | os.PathLike[str]):
        self.checkpoint = Path(checkpoint)

    def _load(self) -> transformer_spec.TransformerSpec:
        import torch

        from seq2serve.model.checkpoint import load_checkpoint

        model, _, tokenizer = load_checkpoint(self.checkpoint)
        with torch.no_grad():
            spec = model_spec(model, spm_pieces(tokenizer.path))
        # The tokenizer travels with the model (Argos packages and callers need it).
        spec.register_file(str(tokenizer.path), TOKENIZER_FILE)
        return spec


def convert(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str],
            force: bool = False, vmap: str | os.PathLike[str] | None = None) -> Path:
    """Write the float32 CTranslate2 model of `checkpoint` to `out`, with the
    SentencePiece model beside it (TOKENIZER_FILE) and, given `vmap` (a file),
    that vocabulary map as VMAP_FILE."""
    return Path(CheckpointConverter(checkpoint).convert(
        str(out), vmap=None if vmap is None else str(vmap), force=force))


# -- the vocabulary map of a shortlist -------------------------------------------------


def vocabulary_map(table: lexical.LexicalTable, settings: lexical.ShortlistSettings,
                   pieces: Sequence[str], every_source: Sequence[int]) -> str:
    """CTranslate2's vocabulary map (vocabulary_map.cc: lines of `source n-gram<TAB>
    target tokens`, the line with an empty source listing the tokens always
    included) of a shortlist table with the engine's settings, tokens written as
    the pieces (index = id) of the shared vocabulary of `model_spec`.

    The always line holds what the table gives every source (`every_source`: the
    ids every source ends with, the EOS the tokenizer appends): the special
    pieces, the `first` most frequent and those ids' own translations, since
    CTranslate2 adds the source EOS after its look-up. Then one line per source
    piece: its translations by the table's rule (`LexicalTable.candidates` with no
    frequent pieces, less the specials the always line holds). So for one source
    the candidates CTranslate2 restricts the output to (the always line, the lines
    of its pieces, its unknown, start and end tokens) are the engine's candidates
    for it. CTranslate2 takes the union over a batch, so a batch's sources share
    their candidates there, unlike the engine's."""
    for name, ids in (("special", table.special), ("frequent", table.frequent)):
        if ids.size and int(ids.max()) >= len(pieces):
            raise ValueError(f"the table's {name} ids reach {int(ids.max())}, past the "
                             f"{len(pieces)} pieces")
    if table.source_vocab > len(pieces):
        raise ValueError(f"the table has {table.source_vocab} source ids, the vocabulary "
                         f"{len(pieces)} pieces")
    bad = [p for p in pieces if not p or any(c.isspace() for c in p)]
    if bad:  # a map's tokens are separated by spaces and tabs
        raise ValueError(f"pieces a vocabulary map cannot hold: {bad[:5]!r}")

    def tokens(ids: np.ndarray) -> str:
        return " ".join(pieces[i] for i in ids.tolist())

    lines = ["\t" + tokens(table.candidates(every_source, settings))]
    alone = lexical.ShortlistSettings(first=0, best=settings.best,
                                      threshold=settings.threshold)
    for source in range(table.source_vocab):
        own = np.setdiff1d(table.candidates([source], alone), table.special)
        if own.size:
            lines.append(f"{pieces[source]}\t{tokens(own)}")
    return "\n".join(lines) + "\n"


def package_vocabulary_map(package: str | os.PathLike[str], pieces: Sequence[str]) -> str:
    """`vocabulary_map` of a format 8 package's shortlist table and settings (its
    manifest's `shortlist`); ValueError if the package has none."""
    from seq2serve.model.package.manifest import load_package

    loaded = load_package(Path(package))
    spec, path = loaded.manifest.shortlist, loaded.shortlist_table_path
    if spec is None or path is None:
        raise ValueError(f"{loaded.path}: no vocabulary shortlist (format 8 has one)")
    settings = lexical.ShortlistSettings(spec.first, spec.best, spec.threshold)
    table = lexical.load(path, settings).table
    return vocabulary_map(table, settings, pieces, [loaded.manifest.special_tokens.eos])


def convert_with_vmap(checkpoint: str | os.PathLike[str], package: str | os.PathLike[str],
                      out: str | os.PathLike[str], force: bool = False) -> Path:
    """`convert`, with the vocabulary map of `package`'s shortlist as VMAP_FILE."""
    import tempfile

    from seq2serve.model.checkpoint import read_meta

    pieces = spm_pieces(Path(checkpoint) / read_meta(Path(checkpoint))["tokenizer"]["file"])
    text = package_vocabulary_map(package, pieces)
    with tempfile.TemporaryDirectory(prefix="seq2serve-vmap-") as tmp:
        vmap = Path(tmp) / VMAP_FILE
        vmap.write_text(text, encoding="utf-8")
        return convert(checkpoint, out, force=force, vmap=vmap)


def load_translator(model_dir: str | os.PathLike[str], precision: str = "fp32",
                    threads: int = 1, device: str = "cpu") -> Any:
    """CTranslate2's Translator on a converted model, quantized at load
    (`precision`: fp32, fp16, int8 or int8_float32)."""
    return ctranslate2.Translator(str(model_dir), device=device,
                                  compute_type=COMPUTE_TYPES[precision],
                                  intra_threads=threads, inter_threads=1)


def translate_pieces(translator: Any, sources: Sequence[Sequence[str]], beam_size: int,
                     max_decoding_length: int = 256,
                     suppress: Sequence[str] = ()) -> list[list[str]]:
    """Best hypothesis per source (pieces without EOS; the source EOS is added
    by the model's config). `suppress`: pieces never generated, as the seq2serve
    engine never generates its manifest's `never_generated()` ids."""
    results = translator.translate_batch(
        [list(s) for s in sources], beam_size=beam_size, num_hypotheses=1,
        max_decoding_length=max_decoding_length,
        suppress_sequences=[[p] for p in suppress] or None)
    return [list(r.hypotheses[0]) for r in results]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seq2serve.bench.engine.ctranslate2_model",
        description="Convert a seq2serve checkpoint directory to a CTranslate2 model "
                    "directory (float32; quantize at load with compute_type).")
    parser.add_argument("checkpoint", type=Path, help="seq2serve checkpoint directory")
    parser.add_argument("out", type=Path, help="CTranslate2 model directory to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--vmap-from", type=Path, default=None, metavar="PACKAGE",
                        help="also write the vocabulary map (vmap.txt, for use_vmap) of this "
                        "format 8 package's shortlist table")
    args = parser.parse_args(argv)
    try:
        if args.vmap_from is not None:
            path = convert_with_vmap(args.checkpoint, args.vmap_from, args.out,
                                     force=args.force)
        else:
            path = convert(args.checkpoint, args.out, force=args.force)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
