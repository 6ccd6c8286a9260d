"""Tiny multilingual Hugging Face folders built in the tests, as the hub's are (issue
46): M2M100 (sentencepiece.bpe.model + vocab.json, M2M100Tokenizer), NLLB-200
(tokenizer.json, NllbTokenizer) and mBART-50 (tokenizer.json, MBart50Tokenizer), each
a random model of transformers' own classes with a SentencePiece model trained on the
corpus; and their exported packages (`multilingual_package`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from conftest import train_sentencepiece

from seq2serve.model.families import m2m100, mbart

PAD, EOS = 1, 2
FAMILIES = ("m2m100", "nllb", "mbart50")
# (source, target) in each family's own codes
PAIRS = {
    "m2m100": [("en", "de"), ("de", "fr"), ("fr", "zh")],
    "nllb": [("eng_Latn", "deu_Latn"), ("deu_Latn", "fra_Latn"), ("zho_Hant", "eng_Latn")],
    "mbart50": [("en_XX", "de_DE"), ("de_DE", "fr_XX"), ("fr_XX", "zh_CN")],
}
FAMILY_CODES = {"m2m100": m2m100.M2M100_CODES["m2m100"], "nllb": m2m100.NLLB_CODES,
                "mbart50": mbart.MBART50_CODES}
TOKENIZER_CLASS = {"m2m100": "M2M100Tokenizer", "nllb": "NllbTokenizer",
                   "mbart50": "MBart50Tokenizer"}


def write_spm(out: Path) -> None:
    """sentencepiece.bpe.model: a BPE trained on the corpus with the ids of the hub's
    (<unk> 0, <s> 1, </s> 2, no pad), which the families' tokenizers renumber
    fairseq's way (<s> 0, <pad> 1, </s> 2, <unk> 3, then the pieces)."""
    train_sentencepiece(out, "sentencepiece.bpe", 120, "bpe", unk_id=0, bos_id=1, eos_id=2,
                        pad_id=-1)


def write_tokenizer(family: str, out: Path) -> Any:
    """The family's tokenizer files as the hub's folders have them, written by its
    transformers class; the tokenizer."""
    write_spm(out)
    if family == "m2m100":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(out / "sentencepiece.bpe.model"))
        vocab = {"<s>": 0, "<pad>": PAD, "</s>": EOS, "<unk>": 3}  # fairseq's dictionary
        for i in range(3, sp.get_piece_size()):
            vocab[sp.id_to_piece(i)] = len(vocab)
        (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        tok = transformers.M2M100Tokenizer(str(out / "vocab.json"),
                                           str(out / "sentencepiece.bpe.model"))
    elif family == "nllb":
        tok = transformers.NllbTokenizer.from_pretrained(
            str(out), extra_special_tokens=list(m2m100.NLLB_CODES))
    else:
        tok = transformers.MBart50Tokenizer.from_pretrained(str(out))
    tok.save_pretrained(str(out))
    return tok


def hf_model(family: str, vocab: int, seed: int = 0, **overrides: Any) -> Any:
    """A tiny model of the family in which every weight matters."""
    args: dict[str, Any] = dict(
        vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=0,
        eos_token_id=EOS, decoder_start_token_id=EOS, dropout=0.1, scale_embedding=True,
        attn_implementation="eager")
    args.update(overrides)
    torch.manual_seed(seed)
    if family == "mbart50":
        model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**args))
    else:
        model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**args))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        if family == "mbart50":
            model.final_logits_bias.normal_()
    return model.eval()


def make_folder(family: str, out: Path, seed: int = 0, **overrides: Any) -> Path:
    tok = write_tokenizer(family, out)
    # Model vocabularies are larger than their tokenizers (NLLB's 256206; M2M100's
    # made-up words): every row is kept.
    extra = {"m2m100": 8, "nllb": 3, "mbart50": 0}[family]
    size = max(max(tok.get_vocab().values()),
               *(lang_id(family, tok, code) for code in FAMILY_CODES[family])) + 1
    model = hf_model(family, size + extra, seed, **overrides)
    model.save_pretrained(out)
    if family != "mbart50":
        # A generated pad takes transformers' zero position row (positions count
        # non-pad tokens); trained models never generate it, this tiny one must not.
        file = out / "generation_config.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), "suppress_tokens": [PAD]}))
    return out


def hf_tokenizer(family: str, folder: Path, src_lang: str | None = None) -> Any:
    kwargs = {} if src_lang is None else {"src_lang": src_lang}
    return getattr(transformers, TOKENIZER_CLASS[family]).from_pretrained(str(folder), **kwargs)


def lang_id(family: str, tok: Any, code: str) -> int:
    return tok.get_lang_id(code) if family == "m2m100" else tok.convert_tokens_to_ids(code)




def multilingual_package(family: str, out: Path, seed: int = 0) -> Path:
    """A tiny `family` folder ("m2m100", "nllb" or "mbart50") in `out`, exported at
    fp32 to out/package; the package's path."""
    from seq2serve.export.exporter import export

    folder = make_folder(family, out / f"tiny-{family}", seed)
    export(folder, out / "package", progress=False)
    return out / "package"
