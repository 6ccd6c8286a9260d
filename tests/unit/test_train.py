"""Tokenizer, batching, loss, checkpoints and the trainer on a tiny fixture corpus."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from seq2serve.model import checkpoint as ckpt
from seq2serve.model.config import ModelConfig
from seq2serve.model.package.tokenizer import PackageTokenizer
from seq2serve.model.tokenizer import (
    REQUIRED_CHARS,
    ROUND_TRIP_TEXTS,
    SPIECE_UNDERLINE,
    Tokenizer,
    round_trip_failures,
    train_tokenizer,
)
from seq2serve.model.train import batching
from seq2serve.model.train import trainer as train
from seq2serve.model.train.batching import read_split
from seq2serve.model.train.evaluate import (
    evaluate,
    generate,
    sample_indices,
    score,
    score_with_signatures,
)
from seq2serve.model.transformer import Seq2SeqTransformer

CORPUS = Path(__file__).parents[1] / "fixtures" / "tiny_corpus"
TINY = [
    "--data", str(CORPUS), "--vocab-size", "120", "--character-coverage", "1.0",
    "--d-model", "64", "--layers", "2", "--heads", "4", "--ffn", "128",
    "--dropout", "0.1", "--label-smoothing", "0", "--max-tokens", "256",
    "--max-src-len", "24", "--max-tgt-len", "24", "--lr", "3e-3", "--warmup", "30",
    "--threads", "1", "--no-progress", "--eval-max-sentences", "6",
]


def train_args(out: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.configure(parser)
    return parser.parse_args([*TINY, "--out", str(out), *extra])


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


# -- tokenizer ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    out = tmp_path_factory.mktemp("spm") / "spm.model"
    return train_tokenizer([CORPUS / "train.src", CORPUS / "train.tgt"], out, vocab_size=120,
                           character_coverage=1.0, num_threads=1)


def test_tokenizer_special_ids_match_model_config(tokenizer: Tokenizer) -> None:
    cfg = ModelConfig()
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (
        cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.unk_id)
    assert [tokenizer.sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert 20 < tokenizer.vocab_size <= 120


def test_tokenizer_round_trip(tokenizer: Tokenizer) -> None:
    sources, targets = read_split(CORPUS, "train")
    for text in sources + targets:
        ids = tokenizer.encode(text)
        assert ids[-1] == tokenizer.eos_id and tokenizer.bos_id not in ids
        assert tokenizer.unk_id not in ids
        assert tokenizer.decode(ids) == text
    ids = tokenizer.encode("das Paket enthält die Dokumentation")
    # decode stops at the first EOS and skips pad/BOS around the text
    assert tokenizer.decode([tokenizer.bos_id, *ids, 5, 6, tokenizer.pad_id]) == (
        "das Paket enthält die Dokumentation")
    truncated = tokenizer.encode("das Paket enthält die Dokumentation", max_len=3)
    assert len(truncated) == 3 and truncated[-1] == tokenizer.eos_id


def test_byte_fallback_spells_unseen_characters(tmp_path: Path) -> None:
    # Characters below the coverage threshold (German Ä/Ö/Ü on DDTP) must round-trip
    # through bytes, not become <unk> that no model can write back.
    text = "Übersetzung: Ärger über Öl kostet 5 €"
    files = [CORPUS / "train.src", CORPUS / "train.tgt"]
    plain = train_tokenizer(files, tmp_path / "plain.model", vocab_size=300,
                            byte_fallback=False, num_threads=1)
    assert plain.unk_id in plain.encode(text)
    spelled = train_tokenizer(files, tmp_path / "bytes.model", vocab_size=300,
                              byte_fallback=True, num_threads=1)
    ids = spelled.encode(text)
    assert spelled.unk_id not in ids
    assert spelled.decode(ids) == text


def test_new_tokenizers_round_trip_german_and_french(tmp_path: Path) -> None:
    # `seq2serve train`'s default vocabulary size (a soft limit: the tiny corpus
    # yields fewer pieces) turns on byte fallback and the required letters.
    files = [CORPUS / "train.src", CORPUS / "train.tgt"]
    tok = train_tokenizer(files, tmp_path / "t.model", vocab_size=8000, num_threads=1)
    assert round_trip_failures(tok.path) == {}
    # letters the tiny corpus never shows are single pieces, not byte spellings
    assert "Ü" not in "".join(read_split(CORPUS, "train")[1])
    assert [c for c in REQUIRED_CHARS if tok.sp.piece_to_id(c) == tok.unk_id] == []
    # serving (model/package/tokenizer.py) runs the same model file and gets the same text
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(PackageTokenizer.vocab_from_sentencepiece(tok.path)))
    served = PackageTokenizer(tok.path, tok.path, vocab, unk_id=tok.unk_id, eos_id=tok.eos_id,
                              pad_id=tok.pad_id)
    for text in ROUND_TRIP_TEXTS:
        ids = served.encode(text)
        assert ids == tok.encode(text) and tok.unk_id not in ids
        assert served.decode(ids) == text


def test_round_trip_helper_reports_what_is_lost(tmp_path: Path) -> None:
    files = [CORPUS / "train.src", CORPUS / "train.tgt"]
    plain = train_tokenizer(files, tmp_path / "p.model", vocab_size=120, byte_fallback=False,
                            num_threads=1)
    failures = round_trip_failures(plain.path)
    assert "Ü" in failures and "€" in failures and failures["Ü"] != "Ü"
    assert ROUND_TRIP_TEXTS[0] in failures


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("Öffnen…", "Öffnen…"),  # nmt_nfkc would write "Öffnen..."
        ("5 m² ½ ™", "5 m² ½ ™"),
        ("U\u0308ber E\u0301te", "Über Éte"),  # NFC composes
        ("Fichier\u00a0: «\u202fOui\u202f»", "Fichier : « Oui »"),  # NBSP, narrow NBSP
        ("ﬁle Ｆｉｌｅ", "file File"),
        ("a\u200bb\u00adc\x07d", "abcd"),
    ],
)
def test_default_normalization(tmp_path: Path, raw: str, normalized: str) -> None:
    files = [CORPUS / "train.src", CORPUS / "train.tgt"]
    tok = train_tokenizer(files, tmp_path / "n.model", vocab_size=1024, num_threads=1)
    assert tok.decode(tok.encode(raw)) == normalized


def test_nmt_nfkc_would_rewrite_typography(tmp_path: Path) -> None:
    files = [CORPUS / "train.src", CORPUS / "train.tgt"]
    tok = train_tokenizer(files, tmp_path / "k.model", vocab_size=1024, num_threads=1,
                          normalization="nmt_nfkc")
    assert tok.decode(tok.encode("Öffnen… 5 m²")) == "Öffnen... 5 m2"
    with pytest.raises(ValueError, match="normalization must be one of"):
        train_tokenizer(files, tmp_path / "x.model", normalization="nfd")


def test_tokenizer_training_is_deterministic(tokenizer: Tokenizer, tmp_path: Path) -> None:
    again = train_tokenizer([CORPUS / "train.src", CORPUS / "train.tgt"],
                            tmp_path / "again.model", vocab_size=120, character_coverage=1.0,
                            num_threads=1)
    # Compare pieces and scores: the file also records its (temporary) paths.
    def pieces(t: Tokenizer) -> list[tuple[str, float]]:
        return [(t.sp.id_to_piece(i), t.sp.get_score(i)) for i in range(t.vocab_size)]

    assert pieces(again) == pieces(tokenizer)


def test_token_cache_truncates_sources_drops_long_targets(tokenizer: Tokenizer,
                                                           tmp_path: Path) -> None:
    data = batching.tokenize_split(CORPUS, "train", tokenizer, tmp_path, max_src_len=4,
                                   max_tgt_len=8)
    _, targets = read_split(CORPUS, "train")
    assert len(data) == sum(len(tokenizer.encode(t)) <= 8 for t in targets) > 0
    assert data.src_lens.max() <= 4 and data.tgt_lens.max() <= 8
    assert all(data.src(i)[-1] == tokenizer.eos_id for i in range(len(data)))
    again = batching.tokenize_split(CORPUS, "train", tokenizer, tmp_path, 4, 8)  # from cache
    assert np.array_equal(again.tgt_ids, data.tgt_ids)
    assert len(batching.tokenize_split(CORPUS, "train", tokenizer, tmp_path, 4, 64)) == 40


def test_scores_for_both_tasks() -> None:
    refs = ["the cat sat on the mat", "a small tool for images"]
    perfect = score("translate", refs, refs)
    assert perfect["bleu"] == pytest.approx(100) and perfect["chrf"] == pytest.approx(100)
    rouge = score("summarize", ["the cats sat", "a tool"], refs)
    assert set(rouge) == {"rouge1", "rouge2", "rougeL"}
    assert 0 < rouge["rougeL"] < 100


# -- batching, loss, schedule ---------------------------------------------------------------


def test_epoch_batches_respect_budget_and_cover_everything_once() -> None:
    rng = np.random.default_rng(0)
    src_lens = rng.integers(2, 60, size=1000)
    tgt_lens = rng.integers(2, 40, size=1000)
    batches = batching.epoch_batches(src_lens, tgt_lens, max_tokens=300, seed=1, epoch=0,
                                     bucket_size=256)
    for b in batches:
        assert len(b) * (src_lens[b].max() + tgt_lens[b].max()) <= 300
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    same = batching.epoch_batches(src_lens, tgt_lens, 300, seed=1, epoch=0, bucket_size=256)
    assert all(np.array_equal(a, b) for a, b in zip(batches, same, strict=True))
    other = batching.epoch_batches(src_lens, tgt_lens, 300, seed=1, epoch=1, bucket_size=256)
    assert [b.tolist() for b in other] != [b.tolist() for b in batches]


def test_batch_stream_resumes_at_its_position() -> None:
    data = batching.TokenData(np.arange(1, 301, dtype=np.int32) % 50 + 4,
                              np.arange(0, 301, 3), np.ones(200, dtype=np.int32) * 7,
                              np.arange(0, 201, 2))
    stream = batching.BatchStream(data, max_tokens=20, seed=3, bucket_size=32)
    seen = [stream.next() for _ in range(60)]  # crosses epoch boundaries
    epoch, index = stream.epoch, stream.index
    later = [stream.next().tolist() for _ in range(10)]
    resumed = batching.BatchStream(data, max_tokens=20, seed=3, bucket_size=32, epoch=epoch,
                                   index=index)
    assert [resumed.next().tolist() for _ in range(10)] == later
    assert epoch >= 1 and len(seen) == 60


def test_collate_shifts_targets_behind_start_token() -> None:
    data = batching.TokenData(np.array([5, 6, 2, 7, 2], dtype=np.int32), np.array([0, 3, 5]),
                              np.array([8, 9, 2, 10, 2], dtype=np.int32), np.array([0, 3, 5]))
    src, tgt_in, labels = batching.collate(data, np.array([1, 0]), pad_id=0, start_id=1)
    assert src.tolist() == [[7, 2, 0], [5, 6, 2]]
    assert labels.tolist() == [[10, 2, 0], [8, 9, 2]]
    assert tgt_in.tolist() == [[1, 10, 0], [1, 8, 9]]


def test_loss_is_torch_label_smoothing_over_non_pad_tokens() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.tensor([[4, 5, 2, 0, 0], [6, 7, 8, 9, 2]])
    got = train.loss_fn(logits, labels, pad_id=0, label_smoothing=0.1)
    keep = labels.reshape(-1) != 0
    want = F.cross_entropy(logits.reshape(-1, 11)[keep], labels.reshape(-1)[keep],
                           label_smoothing=0.1)
    torch.testing.assert_close(got, want)
    # garbage logits at pad positions change nothing
    noisy = logits.clone()
    noisy[0, 3:] = 1e4
    torch.testing.assert_close(train.loss_fn(noisy, labels, 0, 0.1), got)


def test_learning_rate_schedule() -> None:
    assert train.learning_rate(4000, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert train.learning_rate(100, 256, 100, peak=1e-3) == pytest.approx(1e-3)
    assert train.learning_rate(400, 256, 100, peak=1e-3) == pytest.approx(5e-4)
    assert train.learning_rate(50, 256, 100, peak=1e-3) == pytest.approx(5e-4)


# -- checkpoints ----------------------------------------------------------------------------


def test_checkpoint_round_trip_fp16_and_pruning(tokenizer: Tokenizer, tmp_path: Path) -> None:
    cfg = ModelConfig(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
                      d_model=32, encoder_layers=1, decoder_layers=1, encoder_heads=2,
                      decoder_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64)
    model = Seq2SeqTransformer(cfg).eval()
    for dtype in ("float32", "float16"):
        path = ckpt.save_checkpoint(tmp_path / dtype, model, tokenizer.path,
                                    {"task": "translate", "step": 7}, save_dtype=dtype)
        loaded, meta, tok = ckpt.load_checkpoint(path)
        assert meta["step"] == 7 and meta["weights"]["dtype"] == dtype
        assert ModelConfig.from_dict(meta["model"]) == cfg
        assert tok.vocab_size == tokenizer.vocab_size
        with safe_open(str(path / ckpt.WEIGHTS_FILE), "pt") as f:
            names = list(f.keys())
            stored = f.get_tensor(names[0]).dtype
        assert stored == getattr(torch, dtype)
        # tied embeddings (source, target, output) are one stored tensor
        assert sum("embed" in n or n.startswith("output") for n in names) == 1
        src = torch.tensor([[5, 6, 2]])
        tgt = torch.tensor([[1, 7, 8]])
        tol = 0 if dtype == "float32" else 2e-2
        torch.testing.assert_close(loaded(src, src != 0, tgt), model(src, src != 0, tgt),
                                   atol=tol, rtol=tol)
    assert not list(tmp_path.glob(".tmp-*"))

    run = tmp_path / "run"
    for step in (10, 20, 30, 40):
        ckpt.save_checkpoint(run / "checkpoints" / ckpt.step_dir_name(step), model,
                             tokenizer.path, trainer_state={"step": step})
    ckpt.prune_checkpoints(run, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [30, 40]
    assert ckpt.latest_checkpoint(run).name == ckpt.step_dir_name(40)
    assert ckpt.latest_checkpoint(tmp_path / "nothing") is None


# -- the trainer ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from seq2serve.server.cli.main import main

    out = tmp_path_factory.mktemp("run")
    argv = ["train", *TINY, "--out", str(out), "--max-steps", "300", "--eval-every", "50"]
    assert main(argv) == 0
    return out


def test_training_lowers_loss_and_memorizes(trained: Path) -> None:
    log = read_log(trained)
    assert [r["step"] for r in log] == [50, 100, 150, 200, 250, 300]
    assert log[-1]["train_loss"] < 0.5 * log[0]["train_loss"]
    assert {"bleu", "chrf", "valid_loss", "tokens_per_s"} <= set(log[0])
    model, meta, tokenizer = ckpt.load_checkpoint(trained / "checkpoints" /
                                                  ckpt.step_dir_name(300))
    assert meta["task"] == "translate" and meta["src_lang"] == "en" and meta["step"] == 300
    assert meta["train_args"]["d_model"] == 64
    sources, targets = read_split(CORPUS, "train")
    outputs = generate(model, tokenizer, sources[:8], max_len=24)
    assert outputs[0] == targets[0]
    assert score("translate", outputs, targets[:8])["bleu"] > 50
    assert (trained / "best" / "model.safetensors").is_file()
    assert not (trained / "best" / ckpt.STATE_FILE).exists()


def test_score_report_has_model_baseline_samples_and_settings(
        trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seq2serve.server.cli.main import main

    out = tmp_path / "scores.json"
    argv = ["train", "--score", str(trained / "best"), "--data", str(CORPUS), "--split",
            "test", "--score-out", str(out), "--samples", "3", "--threads", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["format"] == "seq2serve-score" and report["task"] == "translate"
    assert report["segments"] == 4 and report["split"] == "test" and report["kind"] is None
    for side in ("model", "copy_source"):
        assert set(report["scores"][side]) == {"bleu", "chrf"}
        assert all(0 <= v <= 100 for v in report["scores"][side].values())
    assert report["signatures"]["bleu"].startswith("nrefs:1|case:mixed|")
    assert "version:" in report["signatures"]["chrf"]
    ck = report["checkpoint"]
    assert ck["step"] == ckpt.read_meta(trained / "best")["step"] > 0
    assert ck["training_seconds"] > 0
    assert ck["training_seconds_source"] == "config.json:elapsed_seconds"
    assert ck["weights_dtype"] == "float32" and ck["parameters"] > 0
    assert report["decoding"]["method"] == "greedy" and report["decoding"]["max_len"] == 24
    assert report["speed"]["segments_per_s"] > 0 and report["speed"]["threads"] == 1
    assert report["by_kind"]["short"]["segments"] == 4
    sources, references = read_split(CORPUS, "test")
    samples = report["samples"]
    assert [s["line"] for s in samples] == [1, 3, 4]  # evenly spaced, not the first three
    assert [(s["source"], s["reference"]) for s in samples] == [
        (sources[i], references[i]) for i in (0, 2, 3)]
    hyps = out.with_suffix(".hyp").read_text().splitlines()
    assert [s["hypothesis"] for s in samples] == [hyps[i] for i in (0, 2, 3)]
    # The summary on stdout carries the same numbers, baseline beside the model.
    bleu = report["scores"]["model"]["bleu"], report["scores"]["copy_source"]["bleu"]
    assert f"{bleu[0]:.2f} / {bleu[1]:.2f}" in printed and "segments/s" in printed
    assert samples[1]["hypothesis"] in printed
    # Same command, same report (bar the timing).
    again = evaluate(trained / "best", CORPUS, "test", samples=3)
    for key in ("scores", "samples", "signatures", "by_kind", "decoding", "segments"):
        assert again[key] == report[key], key
    # backwards (--reverse): the split's targets are the sources, its sources the references
    back = evaluate(trained / "best", CORPUS, "test", samples=3, reverse=True)
    assert back["reverse"] is True and "reverse" not in report
    assert [(s["source"], s["reference"]) for s in back["samples"]] == [
        (references[i], sources[i]) for i in (0, 2, 3)]


def test_copy_source_baseline_is_perfect_when_source_is_target(trained: Path,
                                                               tmp_path: Path) -> None:
    data = tmp_path / "copy"
    data.mkdir()
    shutil.copyfile(CORPUS / "corpus.json", data / "corpus.json")
    shutil.copyfile(CORPUS / "test.tgt", data / "test.src")
    shutil.copyfile(CORPUS / "test.tgt", data / "test.tgt")
    (data / "test.kind").write_text("sentence\nsynopsis\nsentence\nsynopsis\n")
    report = evaluate(trained / "best", data, "test", samples=10)
    assert report["scores"]["copy_source"]["bleu"] == pytest.approx(100)
    assert report["scores"]["copy_source"]["chrf"] == pytest.approx(100)
    assert len(report["samples"]) == 4  # never more than the split has
    assert sorted(report["by_kind"]) == ["sentence", "synopsis"]
    assert report["by_kind"]["synopsis"]["copy_source"]["bleu"] == pytest.approx(100)
    only = evaluate(trained / "best", data, "test", samples=10, kind="synopsis")
    assert only["kind"] == "synopsis" and only["segments"] == 2
    assert [s["line"] for s in only["samples"]] == [2, 4]
    assert {s["kind"] for s in only["samples"]} == {"synopsis"}
    with pytest.raises(ValueError, match="no such segments"):
        evaluate(trained / "best", data, "test", kind="paragraph")
    # ROUGE's baseline on the same split, for the summarization card.
    refs = read_split(data, "test")[1]
    rouge, signatures = score_with_signatures("summarize", refs, refs)
    assert rouge == pytest.approx(dict.fromkeys(("rouge1", "rouge2", "rougeL"), 100.0))
    assert signatures["rougeL"].startswith("rouge-score:")


def test_sample_indices_are_spread_and_deterministic() -> None:
    assert sample_indices(1000, 10) == [50, 150, 250, 350, 450, 550, 650, 750, 850, 950]
    assert sample_indices(4, 10) == [0, 1, 2, 3]
    assert sample_indices(5, 0) == [] and sample_indices(0, 10) == []
    picked = sample_indices(1202, 10)
    assert picked == sample_indices(1202, 10) and len(set(picked)) == 10
    assert picked[0] > 0 and picked[-1] < 1201


def test_score_reads_float16_checkpoint_into_float32_model(trained: Path,
                                                           tmp_path: Path) -> None:
    model, meta, _ = ckpt.load_checkpoint(trained / "best")
    reserved = ("format", "format_version", "model", "weights", "tokenizer")
    half = ckpt.save_checkpoint(tmp_path / "half", model, trained / "best" / ckpt.TOKENIZER_FILE,
                                {k: v for k, v in meta.items() if k not in reserved},
                                save_dtype="float16")
    loaded, _, _ = ckpt.load_checkpoint(half)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    report = evaluate(half, CORPUS, "test")
    full = evaluate(trained / "best", CORPUS, "test")
    assert report["checkpoint"]["weights_dtype"] == "float16"
    assert report["segments"] == 4 and 0 <= report["scores"]["model"]["bleu"] <= 100
    # fp16 rounding may flip a rare argmax, not the model's behaviour.
    assert report["scores"]["model"]["chrf"] == pytest.approx(
        full["scores"]["model"]["chrf"], abs=15)


def test_resume_continues_where_it_stopped(tmp_path: Path) -> None:
    steps = 30
    first = tmp_path / "interrupted"
    assert train.run(train_args(first, "--max-steps", str(steps), "--eval-every", "10")) == 0
    assert ckpt.latest_checkpoint(first).name == ckpt.step_dir_name(steps)
    assert train.run(train_args(first, "--max-steps", str(2 * steps), "--eval-every",
                                "10")) == 0
    assert [r["step"] for r in read_log(first)] == [10, 20, 30, 40, 50, 60]
    latest = ckpt.latest_checkpoint(first)
    assert latest.name == ckpt.step_dir_name(2 * steps)
    assert ckpt.load_trainer_state(latest)["step"] == 2 * steps
    # Same data order, dropout masks and optimizer state as one uninterrupted run.
    straight = tmp_path / "straight"
    assert train.run(train_args(straight, "--max-steps", str(2 * steps), "--eval-every",
                                "10")) == 0
    resumed, _, _ = ckpt.load_checkpoint(latest)
    direct, _, _ = ckpt.load_checkpoint(ckpt.latest_checkpoint(straight))
    for (name, a), (_, b) in zip(resumed.state_dict().items(), direct.state_dict().items(),
                                 strict=True):
        torch.testing.assert_close(a, b, msg=name)
    # Nothing left to do: a third run returns at once without a new checkpoint.
    assert train.run(train_args(first, "--max-steps", str(2 * steps))) == 0
    assert len(ckpt.list_checkpoints(first)) == 2


def test_sigterm_saves_a_checkpoint_then_stops(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "signalled"
    before = signal.getsignal(signal.SIGTERM)
    calls = 0
    real_loss = train.loss_fn

    def loss_then_sigterm(*args: object, **kwargs: object) -> torch.Tensor:
        # Raised from inside the loop (not a timer) so the handler is surely installed.
        nonlocal calls
        calls += 1
        if calls == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(train, "loss_fn", loss_then_sigterm)
    code = train.run(train_args(out, "--max-steps", "1000", "--eval-every", "0"))
    assert code == 128 + signal.SIGTERM
    latest = ckpt.latest_checkpoint(out)
    assert latest is not None and ckpt.load_trainer_state(latest)["step"] == 5
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored


# -- fine-tuning with an extended vocabulary, and the release tools ------------------------


def test_finetune_with_extended_vocabulary_and_release(trained: Path, tmp_path: Path) -> None:
    from seq2serve.model.tokenizer import extend_vocabulary, unknown_characters
    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    old = Tokenizer(trained / "tokenizer.model")
    (tmp_path / "extra.txt").write_text("Ärger kostet €\n", encoding="utf-8")
    unknown = unknown_characters(old, [tmp_path / "extra.txt"])
    assert set(unknown) == {"Ä", "€"} and unknown["€"] == 1, unknown
    new = extend_vocabulary(trained / "tokenizer.model", tmp_path / "ext.model", unknown)
    assert new.vocab_size == old.vocab_size + 2
    sources, _ = read_split(CORPUS, "train")
    assert all(new.encode(s) == old.encode(s) for s in sources)  # every old id kept
    assert new.unk_id not in new.encode("Ärger kostet €")
    assert new.decode(new.encode("Ärger kostet €")) == "Ärger kostet €"

    # New rows start as <unk>'s: old logits unchanged, new ones equal <unk>'s.
    model, meta, _ = ckpt.load_checkpoint(trained / "best")
    grown_cfg = ModelConfig.from_dict({**meta["model"], "src_vocab_size": new.vocab_size,
                                       "tgt_vocab_size": new.vocab_size})
    grown = Seq2SeqTransformer(grown_cfg)
    assert ckpt.load_weights_growing(trained / "best", grown, grown_cfg.unk_id) == 2
    model.eval(), grown.eval()
    src = torch.tensor([old.encode(sources[0])])
    tgt = torch.tensor([[grown_cfg.decoder_start_id, *old.encode(sources[0])[:3]]])
    with torch.no_grad():
        before, after = model(src, torch.ones_like(src), tgt), grown(src, torch.ones_like(src),
                                                                    tgt)
    torch.testing.assert_close(after[..., :old.vocab_size], before, rtol=0, atol=1e-5)
    torch.testing.assert_close(after[..., old.vocab_size:],
                               after[..., grown_cfg.unk_id:grown_cfg.unk_id + 1].expand(
                                   -1, -1, 2), rtol=0, atol=1e-5)

    out = tmp_path / "ft"
    argv = ["train", *TINY, "--out", str(out), "--init-from", str(trained / "best"),
            "--tokenizer", str(tmp_path / "ext.model"), "--max-steps", "20",
            "--eval-every", "10"]
    assert main(argv) == 0
    log = read_log(out)
    assert [r["step"] for r in log] == [10, 20]
    # It starts from the trained model, not from scratch: far below scratch's first loss.
    assert log[0]["valid_loss"] < 0.5 * read_log(trained)[0]["valid_loss"]
    ft_meta = ckpt.read_meta(out / "best")
    assert ft_meta["model"]["tgt_vocab_size"] == new.vocab_size

    shipped = tmp_path / "shipped"
    released = release.release_checkpoint(out, shipped, "tiny")
    assert released["weights"]["dtype"] == "float16" and released["name"] == "tiny"
    base_step = ckpt.read_meta(trained / "best")["step"]  # the base run's best validation
    assert released["base"]["step"] == base_step
    assert released["elapsed_seconds"] == pytest.approx(
        released["base"]["elapsed_seconds"] + released["finetune_seconds"], abs=0.2)
    report = evaluate(shipped, CORPUS, split="train", max_sentences=4, samples=2)
    card = release.model_card(shipped, report, logs={"fine-tuning": log})
    assert f"fine-tuned from the base run's best checkpoint (step {base_step})" in card
    assert f"{report['scores']['model']['bleu']:.2f}" in card
    assert "release extend-vocab runs/tiny/tokenizer.model" in card
    assert "--init-from runs/tiny/best --tokenizer runs/tiny-vocab.model" in card



def test_decoder_grows_by_identity_layers_and_trains_them(tmp_path: Path) -> None:
    """--init-from with more --decoder-layers: the new layers go on top and start as the
    identity (the grown model computes what the checkpoint did), then they train."""
    from seq2serve.server.cli.main import main

    base = tmp_path / "base"
    assert main(["train", *TINY, "--pre-norm", "--out", str(base), "--max-steps", "30",
                 "--eval-every", "0"]) == 0
    model, meta, _ = ckpt.load_checkpoint(base / "best")
    grown_cfg = ModelConfig.from_dict({**meta["model"], "decoder_layers": 4})
    grown = Seq2SeqTransformer(grown_cfg)
    assert ckpt.load_weights_growing(base / "best", grown, grown_cfg.unk_id) == 0
    model.eval(), grown.eval()
    src = torch.tensor([[5, 9, 14, 2]])
    tgt = torch.tensor([[grown_cfg.decoder_start_id, 7, 11]])
    with torch.no_grad():
        torch.testing.assert_close(grown(src, torch.ones_like(src), tgt),
                                   model(src, torch.ones_like(src), tgt), rtol=0, atol=1e-5)

    out = tmp_path / "grown"
    assert main(["train", *TINY, "--out", str(out), "--init-from", str(base / "best"),
                 "--decoder-layers", "4", "--max-steps", "10", "--eval-every", "0",
                 "--vocab-size", "100"]) == 0
    after, after_meta, _ = ckpt.load_checkpoint(out / "best")
    assert after_meta["model"]["decoder_layers"] == 4
    # No --tokenizer: the fine-tune keeps the checkpoint's (not one of 100 pieces).
    assert (out / "tokenizer.model").read_bytes() == (base / "tokenizer.model").read_bytes()
    assert after_meta["model"]["encoder_layers"] == meta["model"]["encoder_layers"]
    for layer in after.decoder_layers[2:]:  # the new layers' output projections moved
        assert layer.ffn.fc2.weight.abs().sum() > 0
        assert layer.cross_attn.out_proj.weight.abs().sum() > 0
    with pytest.raises(SystemExit, match="a decoder only grows"):
        main(["train", *TINY, "--out", str(tmp_path / "shrunk"), "--init-from",
              str(base / "best"), "--decoder-layers", "1", "--max-steps", "1"])

    # The card says how the decoder grew and reproduces it; logs named by phase.
    from seq2serve.model.train import release

    shipped = tmp_path / "shipped"
    release.release_checkpoint(out, shipped, "tiny")
    report = tmp_path / "report.json"
    report.write_text(json.dumps(evaluate(shipped, CORPUS, split="train", max_sentences=4)))
    assert release.main(["card", str(shipped), "--report", str(report),
                         "--log", f"1:{base / 'log.jsonl'}", "--log",
                         f"2:{out / 'log.jsonl'}"]) == 0
    card = (shipped / release.CARD_FILE).read_text(encoding="utf-8")
    assert "with the decoder grown from 2 to 4 layers" in card
    assert "--init-from runs/tiny/checkpoints/step-000000030" in card
    assert card.count("--decoder-layers 4") == 1  # the second phase's command, not the first's
    assert "during training from scratch" in card and "during the second phase" in card


def test_vocabulary_grows_by_the_words_it_splits_most(trained: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Vocabulary adaptation: the words of a corpus that the tokenizer spells with the
    most pieces become pieces of their own, and their embedding rows start as the mean
    of the rows of the pieces that spelled them."""
    from seq2serve.model.tokenizer import extend_vocabulary, frequent_split_words, segmentation
    from seq2serve.server.cli.main import main

    old = Tokenizer(trained / "tokenizer.model")
    split = [CORPUS / "train.src", CORPUS / "train.tgt"]
    words = frequent_split_words(old, split, count=3)
    assert len(words) == 3
    spelled = {w: segmentation(old, w) for w in words}
    assert all(len(ids) > 1 for ids in spelled.values()), spelled
    text = " ".join(line for path in split for line in path.read_text().splitlines())
    for word in words:  # every one occurs in the split, and not inside a longer run
        assert word.lstrip(SPIECE_UNDERLINE) in text
    new = extend_vocabulary(trained / "tokenizer.model", tmp_path / "words.model", [], words)
    assert new.vocab_size == old.vocab_size + 3
    assert all(new.sp.id_to_piece(i) == old.sp.id_to_piece(i) for i in range(old.vocab_size))
    for word in words:
        assert segmentation(new, word) == [new.sp.piece_to_id(word)]
    sources, _ = read_split(CORPUS, "train")
    assert all(new.decode(new.encode(s)) == old.decode(old.encode(s)) for s in sources)
    assert sum(map(len, new.encode_batch(sources))) < sum(map(len, old.encode_batch(sources)))

    out = tmp_path / "ft"
    assert main(["train", *TINY, "--out", str(out), "--init-from", str(trained / "best"),
                 "--tokenizer", str(tmp_path / "words.model"), "--max-steps", "1",
                 "--eval-every", "1", "--lr", "1e-12", "--warmup", "1"]) == 0
    assert "3 new vocabulary rows: 3 start as the mean" in capsys.readouterr().err
    base = ckpt.load_checkpoint(trained / "best")[0].src_embed.weight.detach()
    grown = ckpt.load_checkpoint(out / "best")[0].src_embed.weight.detach()
    torch.testing.assert_close(grown[:old.vocab_size], base, rtol=0, atol=1e-6)
    for word, ids in spelled.items():  # a learning rate of 1e-12 leaves them as they began
        torch.testing.assert_close(grown[new.sp.piece_to_id(word)], base[ids].mean(0),
                                   rtol=0, atol=1e-6)


def test_card_of_a_phase_that_grew_the_vocabulary(trained: Path, tmp_path: Path) -> None:
    """`extend-vocab --words` leaves a record beside the tokenizer; the release of a
    phase trained with it keeps the record, and the card's commands grow the
    vocabulary the same way before that phase."""
    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    vocab = tmp_path / "vocab.model"
    assert release.main(["extend-vocab", str(trained / "tokenizer.model"), str(CORPUS),
                         str(vocab), "--words", "3"]) == 0
    record = json.loads(vocab.with_suffix(".json").read_text())
    assert record["words"] == 3 and record["vocab_size"] == Tokenizer(vocab).vocab_size
    out = tmp_path / "phase2"
    assert main(["train", *TINY, "--out", str(out), "--init-from", str(trained / "best"),
                 "--tokenizer", str(vocab), "--max-steps", "10", "--eval-every", "10"]) == 0
    shipped = tmp_path / "shipped"
    released = release.release_checkpoint(out, shipped, "tiny")
    assert released["vocabulary_extension"] == record
    report = evaluate(shipped, CORPUS, split="train", max_sentences=4, samples=1)
    card = release.model_card(shipped, report, logs={"the second phase": read_log(out)})
    assert (f"release extend-vocab runs/tiny/tokenizer.model {CORPUS} "
            "runs/tiny-2-vocab.model --words 3") in card
    assert "--tokenizer runs/tiny-2-vocab.model" in card
    assert f"the second phase added the 3 words of `{CORPUS}`" in card
    assert "single characters" not in card  # not the older character-only fine-tune


def test_continued_run_and_its_card_with_a_report_per_test_split(trained: Path,
                                                                 tmp_path: Path) -> None:
    """A second phase on other data with the same tokenizer (the DDTP-weighted
    mix): released with its base run's time, carded with every test split."""
    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    out = tmp_path / "phase2"
    assert main(["train", *TINY, "--out", str(out), "--init-from", str(trained / "best"),
                 "--tokenizer", str(trained / "tokenizer.model"), "--max-steps", "10",
                 "--eval-every", "10", "--lr", "0.0005", "--warmup", "5"]) == 0
    shipped = tmp_path / "shipped"
    released = release.release_checkpoint(out, shipped, "tiny")
    assert released["base"]["step"] == ckpt.read_meta(trained / "best")["step"]
    reports = [evaluate(shipped, CORPUS, split=split, max_sentences=4, samples=1)
               for split in ("train", "valid")]
    card = release.model_card(shipped, reports, logs={"the second phase": read_log(out)})
    assert f"continued from the base run's checkpoint at step {released['base']['step']}" \
        in card
    assert "extend-vocab" not in card  # the same vocabulary: nothing was extended
    # the reproduce commands follow what the tokenizer has, not the flags given
    assert ("--no-byte-fallback" in card) != release._has_byte_fallback(shipped)
    step = released["base"]["step"]
    assert f"--max-steps {step}" in card
    assert (f"--init-from runs/tiny/checkpoints/step-{step:09d} "
            "--tokenizer runs/tiny/tokenizer.model") in card
    for r in reports:
        assert f"{r['segments']} segments of the `{r['split']}` split" in card
        assert f"--split {r['split']} --score-out" in card
    assert card.count("samples from") == 2


def test_card_of_a_phase_on_the_three_corpus_mix(trained: Path, tmp_path: Path) -> None:
    """A phase on the DDTP + messages + everyday mix, trained under bfloat16 autocast:
    the card names the three corpora with their repeats, rebuilds them with one
    `seq2serve data` command, passes --autocast on, and gives the hand-written
    test set its own score file beside the everyday corpus's."""
    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    out = tmp_path / "everyday"
    assert main(["train", *TINY, "--out", str(out), "--init-from", str(trained / "best"),
                 "--tokenizer", str(trained / "tokenizer.model"), "--max-steps", "4",
                 "--eval-every", "4", "--lr", "0.0005", "--warmup", "2",
                 "--autocast", "bfloat16"]) == 0
    shipped = tmp_path / "shipped"
    release.release_checkpoint(out, shipped, "tiny")
    report = evaluate(shipped, CORPUS, split="train", max_sentences=2, samples=1)
    reports = [{**report, "data": f"data/{name}"} for name in (
        "ddtp/en-de", "messages/en-de", "everyday/en-de", "everyday/en-de-handwritten")]
    corpus = {"source": {"mix": ["data/ddtp/en-de", "data/messages/en-de",
                                 "data/everyday/en-de"]},
              "train_repeat": {"data/ddtp/en-de": 4, "data/messages/en-de": 1,
                               "data/everyday/en-de": 3}}
    card = release.model_card(shipped, reports, corpus=corpus)
    assert "training pairs appear DDTP x4, program messages x1, everyday x3" in card
    assert "docs/data-card-everyday.md" in card
    assert ("seq2serve data --corpora ddtp,messages,everyday --ddtp-repeat 4 "
            "--everyday-repeat 3") in card
    assert "--corpora mix" not in card
    assert "--out runs/tiny-2 --init-from runs/tiny/checkpoints/step-" in card
    assert card.count("--autocast bfloat16") == 1  # the phase that ran under it, only
    for name in ("ddtp", "messages", "everyday", "everyday-handwritten"):
        assert card.count(f"--score-out {shipped.as_posix()}/test-{name}.json") == 1


def test_a_third_phase_from_the_released_second_keeps_the_whole_chain(
        trained: Path, tmp_path: Path) -> None:
    """A phase that went on from a shipped (released) checkpoint of a second phase:
    the card reproduces all three, through the release the third started from."""
    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    def phase(out: Path, init: Path, steps: str, threads: str) -> None:
        assert main(["train", *TINY, "--out", str(out), "--init-from", str(init),
                     "--tokenizer", str(init / "tokenizer.model"), "--max-steps", steps,
                     "--eval-every", "5", "--lr", "0.0005", "--warmup", "5",
                     "--threads", threads]) == 0

    phase(tmp_path / "phase2", trained / "best", "10", "1")
    second = release.release_checkpoint(tmp_path / "phase2", tmp_path / "shipped2", "tiny")
    phase(tmp_path / "phase3", tmp_path / "shipped2", "10", "2")
    third = release.release_checkpoint(tmp_path / "phase3", tmp_path / "shipped3", "tiny")
    first = ckpt.read_meta(trained / "best")
    assert [p["step"] for p in third["earlier"]] == [first["step"]]
    assert third["base"]["step"] == second["step"] and third["base"]["released"]
    assert third["elapsed_seconds"] == pytest.approx(
        second["elapsed_seconds"] + third["finetune_seconds"], abs=0.2)
    report = evaluate(tmp_path / "shipped3", CORPUS, split="train", max_sentences=4, samples=1)
    card = release.model_card(tmp_path / "shipped3", report)
    assert "--out runs/tiny --threads 1" in card and f"--max-steps {first['step']}" in card
    assert (f"--init-from runs/tiny/checkpoints/step-{first['step']:09d}" in card
            and f"--max-steps {second['step']}" in card)
    assert "release checkpoint runs/tiny-2 runs/tiny-2-release --name tiny" in card
    assert ("--out runs/tiny-3 --init-from runs/tiny-2-release "
            "--tokenizer runs/tiny-2-release/tokenizer.model") in card
    assert "release checkpoint runs/tiny-3 " in card
    assert (f"then continued from the second phase's released checkpoint at step "
            f"{second['step']}") in card
    assert f"step {third['step']} of the third phase" in card
    assert "third phase)" in card and "threads by phase" in card

def test_card_rebuilds_the_mix_an_earlier_phase_trained_on(
        trained: Path, tmp_path: Path) -> None:
    """A phase on a DDTP + messages mix that the card's first `seq2serve data` does not
    write (DDTP x4 in a folder of its own): its release records the mix's repeats, and
    the card of a later phase rebuilds that mix just before that phase's command."""
    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    parts = {"data/ddtp/en-de": 4, "data/messages/en-de": 1}

    def corpus(folder: str, record: dict) -> Path:
        path = tmp_path / folder / "en-de"
        shutil.copytree(CORPUS, path)
        (path / "corpus.json").write_text(json.dumps(record), encoding="utf-8")
        return path

    ddtp4 = corpus("mixed-ddtp4", {"source": {"mix": list(parts)}, "ddtp_repeat": 4})
    everyday_parts = {**parts, "data/everyday/en-de": 3}
    everyday = corpus("mixed-everyday", {"source": {"mix": list(everyday_parts)},
                                         "train_repeat": everyday_parts})

    def phase(data: Path, out: Path, init: Path) -> None:
        assert main(["train", *TINY, "--data", str(data), "--out", str(out), "--init-from",
                     str(init), "--tokenizer", str(init / "tokenizer.model"),
                     "--max-steps", "4", "--eval-every", "4", "--lr", "0.0005",
                     "--warmup", "2"]) == 0

    phase(ddtp4, tmp_path / "phase2", trained / "best")
    second = release.release_checkpoint(tmp_path / "phase2", tmp_path / "shipped2", "tiny")
    assert second["train_repeat"] == parts
    phase(everyday, tmp_path / "phase3", tmp_path / "shipped2")
    third = release.release_checkpoint(tmp_path / "phase3", tmp_path / "shipped3", "tiny")
    assert third["base"]["train_repeat"] == parts and third["train_repeat"] == everyday_parts
    report = evaluate(tmp_path / "shipped3", CORPUS, split="train", max_sentences=2)
    card = release.model_card(tmp_path / "shipped3", report,
                              corpus=json.loads((everyday / "corpus.json").read_text()))
    lines = card.splitlines()
    assert lines[1 + lines.index(f"seq2serve data --corpora mix --mixed-out "
                                 f"{ddtp4.parent.as_posix()} --ddtp-repeat 4")].startswith(
        f"seq2serve train --data {ddtp4.as_posix()} --out runs/tiny-2 ")
    # The first phase trained on a corpus that is no mix; the last on the everyday mix,
    # which the first command writes.
    assert card.count("--corpora mix") == 1


def test_averaged_checkpoints_ship_and_card_their_steps(trained: Path, tmp_path: Path) -> None:
    """`release average`: the mean of a run's last resume checkpoints, shipped like a
    best/ and carded with the steps it averaged and how to get them again."""
    import torch

    from seq2serve.model.train import release
    from seq2serve.server.cli.main import main

    out = tmp_path / "phase2"
    assert main(["train", *TINY, "--out", str(out), "--init-from", str(trained / "best"),
                 "--tokenizer", str(trained / "tokenizer.model"), "--max-steps", "4",
                 "--eval-every", "4", "--lr", "0.0005", "--warmup", "2",
                 "--save-every-minutes", "0", "--keep", "0"]) == 0
    steps = [out / "checkpoints" / f"step-{s:09d}" for s in (2, 3, 4)]
    with pytest.raises(ValueError, match="two checkpoints or more"):
        release.average_checkpoints(steps[:1], tmp_path / "one")
    assert release.main(["average", str(out / "averaged"), *map(str, reversed(steps))]) == 0
    averaged = ckpt.read_meta(out / "averaged")
    assert averaged["averaged_steps"] == [2, 3, 4] and averaged["step"] == 4
    assert averaged["elapsed_seconds"] > 0 and "valid" not in averaged
    weights = [ckpt.load_checkpoint(s)[0].state_dict() for s in steps]
    mean = ckpt.load_checkpoint(out / "averaged")[0].state_dict()
    for name, value in mean.items():
        torch.testing.assert_close(value, torch.stack([w[name] for w in weights]).mean(0))
    assert any(not torch.equal(weights[0][name], value) for name, value in mean.items())

    released = release.release_checkpoint(out / "averaged", tmp_path / "shipped", "tiny")
    assert released["averaged_steps"] == [2, 3, 4] and released["base"]["step"] > 0
    report = evaluate(tmp_path / "shipped", CORPUS, split="train", max_sentences=4, samples=1)
    card = release.model_card(tmp_path / "shipped", report)
    assert "the mean of the weights at steps 2, 3 and 4 of the second phase" in card
    assert "--save-every-minutes" in card and " --keep 0" in card
    assert ("release average runs/tiny-2/averaged runs/tiny-2/checkpoints/step-000000002 "
            "runs/tiny-2/checkpoints/step-000000003 runs/tiny-2/checkpoints/step-000000004"
            ) in card
    assert "release checkpoint runs/tiny-2/averaged " in card

    # Moved toward the first phase's weights (WiSE-FT): (1 - w) * mean + w * ancestor.
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        release.average_checkpoints(steps, tmp_path / "bad", trained / "best", 1.0)
    assert release.main(["average", str(out / "toward"), *map(str, steps),
                         "--interpolate-weight", "0.25"]) == 2
    assert release.main(["average", str(out / "toward"), *map(str, steps),
                         "--interpolate-with", str(trained / "best"),
                         "--interpolate-weight", "0.25"]) == 0
    ancestor = ckpt.load_checkpoint(trained / "best")[0].state_dict()
    toward = ckpt.load_checkpoint(out / "toward")[0].state_dict()
    for name, value in toward.items():
        torch.testing.assert_close(value, 0.75 * mean[name] + 0.25 * ancestor[name])
    release.release_checkpoint(out / "toward", tmp_path / "shipped-toward", "tiny")
    card = release.model_card(tmp_path / "shipped-toward", report)
    # The base run's best step is the one its validation chose (which differs between
    # CPUs: float sums differ with the instruction set), as its meta records it.
    base_step = ckpt.read_meta(trained / "best")["step"]
    assert f"then moved toward the base run's checkpoint (step {base_step})" in card
    assert "0.75 × the mean + 0.25 × that checkpoint" in card
    assert "release checkpoint runs/tiny runs/tiny-release --name tiny" in card
    assert ("runs/tiny-2/checkpoints/step-000000004 --interpolate-with runs/tiny-release "
            "--interpolate-weight 0.25") in card


def test_languages_pick_and_check_the_corpus(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    info = json.loads((CORPUS / "corpus.json").read_text())
    matching = train_args(tmp_path, "--src", info["src_lang"], "--tgt", info["tgt_lang"])
    assert train.resolve_data(matching) == []
    assert train.resolve_data(train_args(tmp_path, "--tgt", "xx")) == [
        f"--tgt 'xx' does not match {CORPUS}, whose corpus.json says tgt_lang "
        f"{info['tgt_lang']!r}"]
    # Without --data, --src/--tgt name the corpus `seq2serve data` writes.
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    train.configure(parser)
    args = parser.parse_args(["--task", "translate", "--src", "en", "--tgt", "de",
                              "--out", "run", "--max-steps", "1"])
    assert train.run(args) == 2
    assert args.data == str(Path("data/ddtp/en-de"))
    assert "data/ddtp/en-de/corpus.json: missing" in capsys.readouterr().err
    summarize = parser.parse_args(["--task", "summarize", "--out", "run"])
    train.resolve_data(summarize)
    assert summarize.data == str(Path("data/ddtp/summarize-en"))


def test_bfloat16_autocast_trains_float32_weights(tmp_path: Path) -> None:
    """`--autocast bfloat16` computes the forward pass in bfloat16 (the weights
    come out different from a float32 run of the same steps), still learns, and
    keeps float32 weights in its checkpoints."""
    steps = ["--max-steps", "60", "--eval-every", "30"]
    assert train.run(train_args(tmp_path / "fp32", *steps)) == 0
    assert train.run(train_args(tmp_path / "bf16", *steps, "--autocast", "bfloat16")) == 0
    log = read_log(tmp_path / "bf16")
    assert log[-1]["train_loss"] < log[0]["train_loss"]
    bf16, meta, _ = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "bf16"))
    fp32, _, _ = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "fp32"))
    assert meta["train_args"]["autocast"] == "bfloat16"
    weights = bf16.state_dict()
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert any(not torch.equal(weights[name], other)
               for name, other in fp32.state_dict().items())


def test_a_resumed_finetune_keeps_naming_its_start(trained: Path, tmp_path: Path) -> None:
    """--init-from is ignored on resume (the run's own checkpoint is the start), so its
    later checkpoints still name the checkpoint the run was initialised from: what
    `release checkpoint` reads as the base (for the card and the total training time)."""
    from seq2serve.server.cli.main import main

    out = tmp_path / "phase2"
    common = [*TINY, "--out", str(out), "--tokenizer", str(trained / "tokenizer.model"),
              "--eval-every", "2", "--lr", "0.0005", "--warmup", "2"]
    assert main(["train", *common, "--init-from", str(trained / "best"),
                 "--max-steps", "2"]) == 0
    elsewhere = tmp_path / "another-start"
    shutil.copytree(trained / "best", elsewhere)
    assert main(["train", *common, "--init-from", str(elsewhere), "--max-steps", "4"]) == 0
    latest = ckpt.latest_checkpoint(out)
    assert latest.name == ckpt.step_dir_name(4)
    assert ckpt.read_meta(latest)["train_args"]["init_from"] == str(trained / "best")
