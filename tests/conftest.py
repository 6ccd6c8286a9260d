"""Shared builders: tiny Hugging Face Marian directories made on the spot (no hub)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import system_tools
import torch
from serving import RunningServer

# One intra-op thread: the models here are tiny, and OpenMP's spinning threads
# slow a loaded 2-core machine down by 30x or more (measured: 139 s vs 4 s to
# build the Marian fixture while two trainings ran).
torch.set_num_threads(1)

CORPUS = [
    "Open the file and save your changes.",
    "This package contains the documentation for the library.",
    "A library for reading and writing compressed archives.",
    "The server could not be started because the port is in use.",
    "Tools to convert images between many formats.",
    "Command-line utilities for the network file system.",
    "This is a transitional dummy package. It can safely be removed.",
    "Python bindings for the graphics library.",
]


def train_sentencepiece(out: Path, prefix: str, vocab_size: int, model_type: str,
                        **ids: int) -> Path:
    """out/PREFIX.model: a SentencePiece model trained here on the corpus, with the
    special ids `ids` (unk_id, bos_id, eos_id, pad_id; -1 for none) a family's
    tokenizer expects; no .vocab file is left."""
    import sentencepiece as spm

    out.mkdir(parents=True, exist_ok=True)
    text = out / f"{prefix}-train.txt"
    text.write_text("\n".join(CORPUS * 20), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / prefix), vocab_size=vocab_size,
        model_type=model_type, hard_vocab_limit=False, minloglevel=2, num_threads=1, **ids)
    text.unlink()
    (out / f"{prefix}.vocab").unlink()
    return out / f"{prefix}.model"


def write_marian_tokenizer(out: Path, vocab_size: int = 120) -> dict[str, int]:
    """source.spm/target.spm and a Marian-style vocab.json (ids not the spm ids:
    </s> 0, <unk> 1, pieces, <pad> last), as OPUS-MT directories have them."""
    import sentencepiece as spm

    model = train_sentencepiece(out, "spm", vocab_size, "unigram", unk_id=0, bos_id=-1,
                                eos_id=1, pad_id=-1)
    shutil.move(model, out / "source.spm")
    shutil.copyfile(out / "source.spm", out / "target.spm")
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return vocab


def _teach_copying(model, tokenizer_dir: Path, steps: int) -> None:
    """A few Adam steps on "output the source": an untrained model repeats one
    token forever, which would make greedy/beam parity tests nearly vacuous; a
    briefly trained one gives varied tokens and ends sentences with EOS."""
    import torch
    import transformers

    tok = transformers.MarianTokenizer.from_pretrained(tokenizer_dir)
    batch = tok(CORPUS, text_target=CORPUS, return_tensors="pt", padding=True)
    batch["labels"][batch["labels"] == model.config.pad_token_id] = -100
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optim.zero_grad()
        model(**batch).loss.backward()
        optim.step()
    model.eval()


def make_marian_dir(out: Path, seed: int = 0, train_steps: int = 0,
                    generation: dict[str, Any] | None = None, **overrides: object) -> Path:
    """A MarianMTModel saved with save_pretrained beside a tiny SentencePiece
    tokenizer trained here: random (train_steps=0) or briefly taught to copy.
    Its generation_config.json is OPUS-MT's kind (beam 4, max_length the position
    count, padding a bad word) but forces no EOS (the suite compares with
    generate() at lengths, and finish reasons, of its own), updated by `generation`."""
    import torch
    import transformers

    vocab = write_marian_tokenizer(out)
    size = len(vocab)
    args = dict(vocab_size=size, decoder_vocab_size=size, d_model=32, encoder_layers=2,
                decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                pad_token_id=size - 1, decoder_start_token_id=size - 1, eos_token_id=0,
                forced_eos_token_id=0, scale_embedding=True, activation_function="swish")
    args.update(overrides)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**args)).eval()
    with torch.no_grad():  # HF zero-initialises biases; make every weight matter
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.add_(0.2 * torch.randn_like(p))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de"}), encoding="utf-8")
    if train_steps:
        _teach_copying(model, out, train_steps)
    settings = {"num_beams": 4, "max_length": model.config.max_position_embeddings,
                "bad_words_ids": [[model.config.pad_token_id]], "forced_eos_token_id": None,
                **(generation or {})}
    for key, value in settings.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("marian") / "opus-mt-en-de", train_steps=100)


@pytest.fixture(scope="session")
def marian_package(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from seq2serve.export.exporter import export

    out = tmp_path_factory.mktemp("packages") / "marian-fp32"
    export(marian_dir, out, progress=False)
    return out


@pytest.fixture(scope="session")
def hf_whole(marian_dir: Path) -> Callable[[str], str]:
    """generate() on a text as one input, under the folder's own generation settings:
    what the served model (marian_dir's package) gives a text it reads whole."""
    import transformers

    model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(marian_dir)

    def translate(text: str) -> str:
        with torch.no_grad():
            out = model.generate(**tokenizer([text], return_tensors="pt"))
        return str(tokenizer.decode(out[0], skip_special_tokens=True))

    return translate


@pytest.fixture(scope="module")
def models_dir(marian_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder serving the tiny Marian package as `tiny-en-de`."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(marian_package, root / "tiny-en-de")
    return root


@pytest.fixture
def stub(server):  # noqa: ANN001, ANN201 - `server`: the requesting module's RunningServer
    """A Translator stub on the module's `server` fixture."""
    import grpc

    from seq2serve.protos import translator_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.target) as channel:
        yield pb_grpc.TranslatorStub(channel)


class Box:
    """Collects what `deliver` receives."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.event = threading.Event()

    def __call__(self, value: Any) -> None:
        self.values.append(value)
        self.event.set()

    def get(self, timeout: float = 5.0) -> Any:
        assert self.event.wait(timeout), "nothing was delivered"
        assert len(self.values) == 1
        return self.values[0]


def msgfmt_check(path: Path) -> None:
    """gettext's own `msgfmt --check` accepts the .po file (formats, plural forms,
    header): for a test marked `needs("msgfmt")`."""
    result = subprocess.run([system_tools.path("msgfmt"), "--check", "-o", "/dev/null",
                             str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- system tools (tests/system_tools.py) ----------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*tools): runs these system tools (tests/system_tools.py's table); "
        "skipped, naming the install command, where one is missing or hidden "
        f"({system_tools.HIDE_VARIABLE})")


def pytest_runtest_setup(item: pytest.Item) -> None:
    names = tuple(n for mark in item.iter_markers("needs") for n in mark.args)
    unknown = sorted(set(names) - set(system_tools.TOOLS))
    if unknown:
        pytest.fail(f"needs({', '.join(map(repr, unknown))}): not in tests/system_tools.py's "
                    "table", pytrace=False)
    system_tools.declare(set(names))
    why = system_tools.missing(names)
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    """A client of the HTTP door of the module's own `server` fixture (a document, or
    a beam on a loaded 2-core machine, takes minutes: a generous timeout)."""
    assert server.http_url is not None
    with httpx.Client(base_url=server.http_url, timeout=300) as client:
        yield client
