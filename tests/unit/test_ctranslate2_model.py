"""bench/engine/ctranslate2_model.py: a seq2serve checkpoint converted for
CTranslate2 decodes exactly as the seq2serve engine does on the fp32 package
exported from the same checkpoint (greedy, token for token), for the shipped en-de
model and for tiny random pre- and post-norm checkpoints; and the LibreTranslate
peer built on that conversion (bench/server/libretranslate_peer.py): its sentence
splitter, its Argos package, and, where .venv-lt holds LibreTranslate, an offline
start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import CORPUS

from seq2serve.bench.engine import ctranslate2_model as ct2_model
from seq2serve.bench.server import libretranslate_peer
from seq2serve.export.exporter import export
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import PackageTokenizer
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "checkpoints" / "en-de"
SENTENCES = ROOT / "tests" / "fixtures" / "ddtp_en_test_sample.txt"


def real_sentences(count: int) -> list[str]:
    lines = (line.strip() for line in SENTENCES.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line][:count]


def engine_and_ct2_greedy(package: Path, ct2_dir: Path, texts: list[str]
                          ) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy token ids (without EOS) per text: the seq2serve engine on `package`,
    and CTranslate2 (float32) on `ct2_dir` with the engine's length limit per
    source and its suppressed tokens."""
    manifest = load_package(package).manifest
    tok = PackageTokenizer(package / manifest.tokenizer.source_model,
                           package / manifest.tokenizer.target_model,
                           package / manifest.tokenizer.vocab, unk_id=manifest.special_tokens.unk,
                           eos_id=manifest.special_tokens.eos, pad_id=manifest.special_tokens.pad)
    eos = manifest.special_tokens.eos
    sources = [tok.encode(t) for t in texts]
    engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1), default_limits())
    greedy = DecodingOptions(beam_size=1, num_hypotheses=1)
    ours = [[t for t in result[0].token_ids if t != eos]
            for result in engine.generate(sources, greedy)]

    pieces = ct2_model.spm_pieces(ct2_dir / ct2_model.TOKENIZER_FILE)
    ids = {piece: i for i, piece in enumerate(pieces)}
    translator = ct2_model.load_translator(ct2_dir, "fp32")
    limit = engine.resolve(greedy)
    suppress = [pieces[i] for i in manifest.special_tokens.suppress]
    theirs = []
    for source in sources:  # one call per source: the engine's limit depends on its length
        source_pieces = [pieces[i] for i in source[:-1]]  # the model config adds EOS
        out = ct2_model.translate_pieces(translator, [source_pieces], 1,
                                         limit.max_new_tokens(len(source)), suppress)
        theirs.append([ids[p] for p in out[0]])
    return ours, theirs


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(fp32 package, CTranslate2 model) of the shipped en-de checkpoint."""
    work = tmp_path_factory.mktemp("ct2-en-de")
    assert ct2_model.main([str(SHIPPED), str(work / "ct2")]) == 0
    package = export(SHIPPED, work / "fp32", precision="fp32", progress=False).package
    return package, work / "ct2"


def test_shipped_en_de_greedy_equals_the_engine(shipped: tuple[Path, Path]) -> None:
    package, ct2_dir = shipped
    texts = real_sentences(20)
    ours, theirs = engine_and_ct2_greedy(package, ct2_dir, texts)
    assert all(len(t) > 2 for t in ours)  # real translations, not empty outputs
    assert theirs == ours


def test_bench_systems_return_the_same_ids_with_eos(shipped: tuple[Path, Path]) -> None:
    """`seq2serve bench --model`'s two systems, batched as it batches (sorted by
    length): the same greedy ids, each ended by the EOS both generated."""
    from seq2serve.bench.engine.systems import CheckpointCTranslate2, Seq2Serve
    from seq2serve.model.package.tokenizer import package_tokenizer

    package, ct2_dir = shipped
    tokenizer = package_tokenizer(load_package(package))
    sources = sorted((tokenizer.encode(t) for t in real_sentences(12)), key=len)
    ours_system = Seq2Serve(package, 1)
    theirs_system = CheckpointCTranslate2(ct2_dir, package, "fp32", 1)
    outputs = []
    for system in (ours_system, theirs_system):
        system.load()
        try:
            outputs.append([t for i in range(0, len(sources), 4)
                            for t in system.generate(system.prepare(sources[i: i + 4]), 1,
                                                     None)])
        finally:
            system.close()
    ours, theirs = outputs
    assert all(len(t) > 2 and t[-1] == tokenizer.eos_id for t in ours)
    assert theirs == ours


def test_converted_directory(shipped: tuple[Path, Path]) -> None:
    _, ct2_dir = shipped
    assert sorted(p.name for p in ct2_dir.iterdir()) == [
        "config.json", "model.bin", ct2_model.TOKENIZER_FILE, "shared_vocabulary.json"]
    config = json.loads((ct2_dir / "config.json").read_text())
    assert (config["add_source_eos"], config["decoder_start_token"], config["eos_token"],
            config["layer_norm_epsilon"]) == (True, "<s>", "</s>", 1e-5)
    vocab = json.loads((ct2_dir / "shared_vocabulary.json").read_text(encoding="utf-8"))
    assert vocab == ct2_model.spm_pieces(SHIPPED / "tokenizer.model")
    # int8 is a load-time choice of the same float32 model.
    translator = ct2_model.load_translator(ct2_dir, "int8")
    out = ct2_model.translate_pieces(translator, [["▁Open", "▁the", "▁file"]], 4)
    assert out[0] and all(p in vocab for p in out[0])


def tiny_checkpoint(out: Path, pre_norm: bool = True, activation: str = "gelu") -> Path:
    """A seeded random d32 checkpoint with its own 100-piece tokenizer (about a second)."""
    from seq2serve.model.checkpoint import save_checkpoint
    from seq2serve.model.config import ModelConfig
    from seq2serve.model.tokenizer import Tokenizer, train_tokenizer
    from seq2serve.model.transformer import Seq2SeqTransformer

    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10), encoding="utf-8")
    train_tokenizer([corpus], out / "tok.model", vocab_size=100)
    tok = Tokenizer(out / "tok.model")
    torch.manual_seed(1)
    cfg = ModelConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=32,
                      encoder_layers=2, decoder_layers=2, encoder_heads=4, decoder_heads=4,
                      encoder_ffn_dim=64, decoder_ffn_dim=64, pre_norm=pre_norm,
                      # CTranslate2's position table must cover its default 256 decoding
                      # steps: a random model never ends early
                      max_positions=300, activation=activation)
    model = Seq2SeqTransformer(cfg).eval()
    return save_checkpoint(out / "ckpt", model, out / "tok.model",
                           meta={"task": "translate", "src_lang": "en", "tgt_lang": "de"})


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre-norm", "post-norm"])
def test_tiny_random_checkpoint_greedy_equals_the_engine(tmp_path: Path, pre_norm: bool
                                                         ) -> None:
    ckpt = tiny_checkpoint(tmp_path, pre_norm)
    package = export(ckpt, tmp_path / "pkg", precision="fp32", progress=False).package
    ct2_dir = ct2_model.convert(ckpt, tmp_path / "ct2")
    ours, theirs = engine_and_ct2_greedy(package, ct2_dir, CORPUS[:5])
    assert theirs == ours


def test_cli_reports_a_missing_checkpoint(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert ct2_model.main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# -- the LibreTranslate peer ------------------------------------------------------------------


def sbd_classes(model: Path, text: str) -> list[int]:
    """The splitter's class per character of one paragraph, fed as MiniSBD feeds it
    (character ids, the `capitalized` feature, one <PAD> after the text)."""
    import numpy as np
    import onnxruntime as ort

    units = {u: i for i, u in enumerate(libretranslate_peer.SBD_UNITS)}
    ids = np.array([[units.get(c, 1) for c in text] + [0]], dtype=np.int64)
    upper = np.array([[[float(c.isupper())] for c in text] + [[0.0]]], dtype=np.float32)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"units": ids, "features": upper})[0]
    return [int(c) for c in logits.argmax(-1)[0, : len(text)]]


def test_sentence_splitter_rules(tmp_path: Path) -> None:
    model = libretranslate_peer.sbd_rules_model(tmp_path / "rules.onnx", "en")
    text = "It works. Yes it does. see e.g. Nothing! Why? No"
    ends = [i for i, c in enumerate(sbd_classes(model, text)) if c == 2]
    # ". Yes", ". see" (lower case: no), "e.g. Nothing" (a rule's false split), "! Why", "?" +
    # " No"; MiniSBD itself ends the paragraph's last sentence.
    assert [text[: i + 1] for i in ends] == [
        "It works.", "It works. Yes it does. see e.g.", "It works. Yes it does. see e.g. "
        "Nothing!", "It works. Yes it does. see e.g. Nothing! Why?"]
    assert set(sbd_classes(model, "No end")) == {1}


def test_argos_package_layout(tmp_path: Path) -> None:
    import json
    import zipfile

    ckpt = tiny_checkpoint(tmp_path / "tiny")
    out = libretranslate_peer.build_package(ckpt, tmp_path / "en-de.argosmodel")
    with zipfile.ZipFile(out) as archive:
        names = sorted(archive.namelist())
        metadata = json.loads(archive.read("translate-en_de-seq2serve/metadata.json"))
    assert names == [f"translate-en_de-seq2serve/{name}" for name in (
        "README.md", "metadata.json", "minisbd/rules.onnx", "model/config.json",
        "model/model.bin", "model/shared_vocabulary.json", "sentencepiece.model")]
    assert (metadata["from_code"], metadata["to_code"], metadata["type"]) == ("en", "de",
                                                                               "translate")
    home = libretranslate_peer.ArgosHome(tmp_path / "argos")
    home.install(out)
    assert (home.packages / "translate-en_de-seq2serve" / "model" / "model.bin").is_file()
    assert json.loads((home.index / "index.json").read_text()) == []
    assert home.environment()["ARGOS_PACKAGE_INDEX"].startswith("file://")


@pytest.mark.needs("libretranslate")
def test_libretranslate_serves_the_checkpoint_offline(tmp_path: Path) -> None:
    ckpt = tiny_checkpoint(tmp_path / "tiny")
    settings = libretranslate_peer.PeerSettings(intra_threads=1)
    with libretranslate_peer.start(ckpt, tmp_path / "work", settings=settings,
                                   start_timeout_s=60) as peer:
        # Seconds, not the minute of model-update retries of an online start.
        assert peer.started_seconds < 30
        answer = libretranslate_peer.translate(peer.url, ["Open the file.", "A library."])
        assert isinstance(answer, list) and len(answer) == 2
        assert all(isinstance(text, str) for text in answer)
    assert peer.process.poll() is not None
    log = peer.log.read_text()
    assert "Cannot update models" in log and "Downloading MiniSBD" not in log


def test_profile_times_ctranslate2_beside_the_graphs(shipped: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m seq2serve.bench.profile --ctranslate2`: CTranslate2's whole decoding of the same
    batches beside seq2serve's, and the bound that the graphs alone set."""
    from seq2serve.bench.profile import decoding as profile

    package, ct2_dir = shipped
    out = tmp_path / "profile.json"
    assert profile.main(["--package", str(package), "--data", str(SENTENCES),
                         "--sentences", "8", "--batch-size", "4", "--beam", "2",
                         "--threads", "1", "--repeats", "2", "--ctranslate2", str(ct2_dir),
                         "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    bound = report["ctranslate2"]
    split = report["split_seconds"]
    assert bound["ctranslate2_seconds"] > 0
    assert bound["graphs_seconds"] == split["encoder"] + split["decoder graph"]
    assert bound["now"] == bound["ctranslate2_seconds"] / report["median_seconds"]
    # The graphs are part of the wall time, so the bound is never below today's ratio.
    assert bound["at_most"] == bound["ctranslate2_seconds"] / bound["graphs_seconds"]
    assert bound["at_most"] > bound["now"]
    assert "encoder and decoder graphs alone" in capsys.readouterr().out


def test_onnx_runtime_beam_search_equals_the_engine_one_sentence_at_a_time(
        shipped: tuple[Path, Path], tmp_path: Path) -> None:
    """bench/engine/ort_beam_search.py's graph follows ONNX Runtime's BeamSearch contract:
    on the shipped en-de (fp32), one real sentence per call, its best hypotheses are
    the engine's, EOS and length limit included."""
    from seq2serve.bench.engine.ort_beam_search import OrtBeamSearch, build
    from seq2serve.bench.engine.systems import Seq2Serve
    from seq2serve.model.package.tokenizer import package_tokenizer

    package, _ = shipped
    graph = build(SHIPPED, tmp_path / "ort", "fp32")
    assert [p.name for p in graph.parent.iterdir()] == [graph.name]
    tokenizer = package_tokenizer(load_package(package))
    sources = [tokenizer.encode(t) for t in real_sentences(8)]
    outputs = []
    for system in (Seq2Serve(package, 1), OrtBeamSearch(graph, package, "fp32", 1)):
        system.load()
        try:
            outputs.append([t for s in sources
                            for t in system.generate(system.prepare([s]), 4, None)])
        finally:
            system.close()
    ours, theirs = outputs
    assert all(len(t) > 2 and t[-1] == tokenizer.eos_id for t in ours)
    assert theirs == ours
