"""What the systems are measured on: a seeded random MarianMTModel, the same
model converted for each system (cached in a work directory), and the inputs.

Random weights never emit EOS early, and every system is also told to produce
exactly `new_tokens` tokens (a minimum length equal to the maximum), so each
one does the same amount of decoding work. The inputs are random token ids
from the vocabulary (no specials), fixed by the seed and shared by all.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from seq2serve.export.sources import SAMPLE_TEXTS

EOS_ID = 0  # Marian's vocab.json: </s> 0, <unk> 1, ..., <pad> last
UNK_ID = 1


@dataclass(frozen=True)
class Shape:
    name: str
    d_model: int
    layers: int  # encoder and decoder each
    heads: int
    ffn: int
    vocab_size: int  # including <pad>, as in the Hugging Face config

    @property
    def pad_id(self) -> int:
        return self.vocab_size - 1

    @property
    def key(self) -> str:
        """A directory name that changes whenever the weights would."""
        return (f"{self.name}-d{self.d_model}-l{self.layers}-h{self.heads}-f{self.ffn}"
                f"-v{self.vocab_size}")


# Helsinki-NLP/opus-mt-en-de's architecture; the test-sized one for CI.
SHAPES = {
    "opus-mt": Shape("opus-mt", d_model=512, layers=6, heads=8, ffn=2048, vocab_size=58101),
    "tiny": Shape("tiny", d_model=32, layers=2, heads=4, ffn=64, vocab_size=100),
}

# SentencePiece needs some text; the pieces only matter to the exporter's
# tokenizer checks, as the benchmark feeds token ids directly.
_SPM_TEXT = SAMPLE_TEXTS


def _atomic_dir(out: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling and rename it into place, so an
    interrupted run never leaves a half-written cache entry behind."""
    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would follow the directory into the cache
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_tokenizer(out: Path, vocab_size: int) -> None:
    """source.spm/target.spm and a vocab.json of exactly `vocab_size` entries:
    </s> 0, <unk> 1, the SentencePiece pieces, filler pieces, <pad> last."""
    import sentencepiece as spm

    text = out / "spm-train.txt"
    text.write_text("\n".join(_SPM_TEXT * 20), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "spm"),
        vocab_size=min(120, max(20, vocab_size // 2)), model_type="unigram", unk_id=0,
        bos_id=-1, eos_id=1, pad_id=-1, hard_vocab_limit=False, minloglevel=2, num_threads=1)
    text.unlink()
    (out / "spm.model").rename(out / "source.spm")
    shutil.copyfile(out / "source.spm", out / "target.spm")
    (out / "spm.vocab").unlink()
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    vocab = {"</s>": EOS_ID, "<unk>": UNK_ID}
    for i in range(sp.get_piece_size()):
        if len(vocab) < vocab_size - 1:
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    filler = 0
    while len(vocab) < vocab_size - 1:
        vocab.setdefault(f"\u2581w{filler}", len(vocab))
        filler += 1
    vocab["<pad>"] = vocab_size - 1
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de"}), encoding="utf-8")


def build_marian(out: Path, shape: Shape, seed: int) -> Path:
    """A seeded random MarianMTModel directory (save_pretrained + tokenizer), cached."""

    def build(tmp: Path) -> None:
        import torch
        import transformers

        transformers.logging.disable_progress_bar()
        _write_tokenizer(tmp, shape.vocab_size)
        v = shape.vocab_size
        config = transformers.MarianConfig(
            vocab_size=v, decoder_vocab_size=v, d_model=shape.d_model,
            encoder_layers=shape.layers, decoder_layers=shape.layers,
            encoder_attention_heads=shape.heads, decoder_attention_heads=shape.heads,
            encoder_ffn_dim=shape.ffn, decoder_ffn_dim=shape.ffn, max_position_embeddings=512,
            pad_token_id=shape.pad_id, decoder_start_token_id=shape.pad_id,
            # No forced_eos_token_id (OPUS-MT's): the benchmark decodes exact lengths,
            # and the package's defaults force what the folder's generation config does.
            eos_token_id=EOS_ID, forced_eos_token_id=None, scale_embedding=True,
            activation_function="swish", share_encoder_decoder_embeddings=True)
        torch.manual_seed(seed)
        model = transformers.MarianMTModel(config).eval()
        with torch.no_grad():
            # HF zero-initialises biases and draws weights with std 0.02, which gives
            # near-uniform next-token distributions; spread them as a trained model's are.
            for name, p in model.named_parameters():
                if "embed_positions" not in name:
                    p.add_(0.2 * torch.randn_like(p))
            # Marian's <pad> embedding is zero: the decoder starts from it, and
            # CTranslate2 converts that into "start from a zero embedding".
            model.get_input_embeddings().weight[shape.pad_id] = 0.0
        model.save_pretrained(tmp)

    return _atomic_dir(out, build)


def vocabulary(marian_dir: Path) -> list[str]:
    """The pieces by id, as CTranslate2 takes its tokens."""
    vocab = json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8"))
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces


def converted_vocabulary(ctranslate2_dir: Path) -> list[str]:
    """The pieces by id of a CTranslate2 conversion (its converter's vocabulary)."""
    file = ctranslate2_dir / "shared_vocabulary.json"
    if not file.is_file():
        file = ctranslate2_dir / "target_vocabulary.json"
    pieces: list[str] = json.loads(file.read_text(encoding="utf-8"))
    return pieces


def random_sources(shape: Shape, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` sources of `length` ids (the last one EOS), never a special token."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(UNK_ID + 1, shape.pad_id, size=(count, length - 1))
    return [row + [EOS_ID] for row in ids.tolist()]


@dataclass(frozen=True)
class Models:
    """Where each system's copy of the model lives."""

    marian: Path
    packages: dict[str, Path]  # precision -> seq2serve package
    ctranslate2: Path | None


def exporter_key() -> str:
    """A digest of the source the graphs come from (the exporter, the model it
    traces and the Marian conversion that fills it): a change there (new graphs)
    must not be benchmarked through packages cached by an older one."""
    import hashlib

    import seq2serve.export as exporter
    import seq2serve.model.families as converted
    import seq2serve.model.package as package_format
    import seq2serve.model.transformer as traced

    digest = hashlib.sha256()
    sources = [*sorted(Path(exporter.__file__).parent.glob("*.py")), Path(traced.__file__),
               *sorted(Path(converted.__file__).parent.glob("*.py")),
               *sorted(Path(package_format.__file__).parent.glob("*.py"))]
    for file in sources:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:10]


def export_package(marian_dir: Path, out: Path, precision: str) -> Path:
    from seq2serve.export.exporter import export

    if not out.is_dir():
        export(marian_dir, out, precision=precision, progress=False)
    return out


def convert_ctranslate2(marian_dir: Path, out: Path) -> Path:
    """One float32 conversion; int8 is CTranslate2's load-time quantization of it
    (compute_type), which is what its converter's `--quantization int8` stores."""

    def build(tmp: Path) -> None:
        import ctranslate2

        with warnings.catch_warnings():  # MarianTokenizer's "pip install sacremoses"
            warnings.simplefilter("ignore")
            ctranslate2.converters.TransformersConverter(str(marian_dir)).convert(
                str(tmp), force=True)
        # The converter drops <pad> (Marian starts from a zero embedding instead);
        # every other id must keep its piece, or the token strings would mean other ids.
        converted = json.loads((tmp / "shared_vocabulary.json").read_text(encoding="utf-8"))
        if converted != vocabulary(marian_dir)[:-1]:
            raise RuntimeError(f"{tmp}: CTranslate2's vocabulary differs from vocab.json")

    return _atomic_dir(out, build)


def prepare_models(work: Path, shape: Shape, seed: int, precisions: set[str],
                   ctranslate2: bool) -> Models:
    """Build or reuse the Marian directory and its conversions under `work`."""
    root = work / f"{shape.key}-seed{seed}"
    marian = build_marian(root / "marian", shape, seed)
    (root / "shape.json").write_text(json.dumps(asdict(shape)), encoding="utf-8")
    key = exporter_key()
    packages = {p: export_package(marian, root / f"seq2serve-{p}-{key}", p)
                for p in sorted(precisions)}
    ct2 = convert_ctranslate2(marian, root / "ctranslate2") if ctranslate2 else None
    return Models(marian, packages, ct2)

