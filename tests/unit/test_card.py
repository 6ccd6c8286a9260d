"""The model card's parts: commands from the trainer's own flags, the data prose
from the registry, the weighted mix."""

from __future__ import annotations

import argparse
import shlex

import pytest

from seq2serve.model.data import corpus as data_cli
from seq2serve.model.train import card

CFG = {"d_model": 256, "encoder_layers": 6, "decoder_layers": 2, "encoder_heads": 4,
       "encoder_ffn_dim": 1024, "pre_norm": True, "src_vocab_size": 8000}
ARGS = {"threads": 2, "vocab_size": 8000, "max_tokens": 4096, "warmup": 2000,
        "max_tgt_len": 128, "eval_every": 1000, "eval_max_sentences": 300,
        "max_minutes": 720.0, "autocast": "none", "lr": 0.0005, "seed": 1}


def _parse(command: str) -> argparse.Namespace:
    words = shlex.split(command.split("#")[0])
    assert words[:2] == ["seq2serve", "train"]
    return card.trainer_parser().parse_args(words[2:])


def test_trainer_flags_follow_the_parsers_definitions() -> None:
    assert card.trainer_flags({"pre_norm": True, "no_progress": False, "byte_fallback": False,
                               "lr": None, "d_model": 64},
                              ("pre_norm", "no_progress", "byte_fallback", "lr", "d_model")) \
        == "--pre-norm --no-byte-fallback --d-model 64"
    assert card.trainer_flags({"byte_fallback": True}, ("byte_fallback",)) == "--byte-fallback"
    assert card.trainer_flags({"autocast": "none"}, ("autocast",), if_changed=("autocast",)) == ""
    assert card.trainer_flags({"autocast": "bfloat16"}, ("autocast",),
                              if_changed=("autocast",)) == "--autocast bfloat16"
    with pytest.raises(KeyError):
        card.trainer_flags({"no_such_flag": 1}, ("no_such_flag",))


def test_train_commands_parse_back_to_the_runs_settings() -> None:
    command = card.train_command(ARGS, CFG, "data/mix/en-de", "runs/en-de", byte_fallback=False)
    assert command.startswith("seq2serve train --data data/mix/en-de --out runs/en-de --threads 2 "
                              "--vocab-size 8000 --d-model 256 --encoder-layers 6 "
                              "--decoder-layers 2 --heads 4 --ffn 1024 --pre-norm "
                              "--no-byte-fallback --max-tokens 4096")
    assert command.endswith("--max-minutes 720.0 --no-progress")  # autocast at its default
    ns = _parse(command)
    assert (ns.data, ns.out, ns.d_model, ns.encoder_layers, ns.decoder_layers, ns.heads,
            ns.ffn, ns.pre_norm, ns.byte_fallback, ns.max_minutes, ns.no_progress) == (
        "data/mix/en-de", "runs/en-de", 256, 6, 2, 4, 1024, True, False, 720.0, True)
    same = card.train_command(ARGS, {**CFG, "decoder_layers": 6}, "d", "r", byte_fallback=True)
    assert "--layers 6 " in same and "byte-fallback" not in same
    fine = card.finetune_command({**ARGS, "autocast": "bfloat16"}, "d/en-de", "runs/x-2",
                                 "runs/x-release", "runs/x-release/tokenizer.model",
                                 decoder_layers=4, max_steps=900)
    assert fine.endswith("--autocast bfloat16 --no-progress --decoder-layers 4 --max-steps 900")
    ns = _parse(fine)
    assert (ns.init_from.as_posix(), ns.lr, ns.decoder_layers, ns.max_steps) == (
        "runs/x-release", 0.0005, 4, 900)
    score = card.score_command("models/checkpoints/x", "data/ddtp/en-de", "test", "o.json")
    assert score == ("seq2serve train --score models/checkpoints/x --data data/ddtp/en-de "
                     "--split test --score-out o.json")
    back = card.score_command("models/checkpoints/x", "data/ddtp/en-de", "test", "o.json",
                              reverse=True)
    assert back == ("seq2serve train --score models/checkpoints/x --data data/ddtp/en-de "
                    "--split test --reverse --score-out o.json")
    assert _parse(back).reverse and not _parse(score).reverse


WEIGHTED = {"task": "translate", "src_lang": "en", "tgt_lang": "de",
            "parts": [{"corpus": "data/ddtp/en-de", "source": "ddtp", "weight": 4},
                      {"corpus": "data/messages/en-de", "source": "messages", "weight": 1},
                      {"corpus": "data/everyday/en-de", "source": "everyday", "weight": 2},
                      {"corpus": "data/general/en-de", "source": "general", "weight": 3}],
            "counts": {"test": {"synopsis": 2}, "valid": {"message": 3},
                       "train": {"synopsis": 8, "message": 1}}}


def test_a_weighted_mix_in_the_card_data_and_commands() -> None:
    td = card.training_data("data/mix/en-de", WEIGHTED)
    assert td.weighted and td.mixed and td.listed
    assert td.repeats == {"ddtp": 4, "messages": 1, "everyday": 2, "general": 3}
    text = card.data_section(td, None)
    assert "DDTP x4, program messages x1, everyday x2, general x3 (repeated when the trainer " \
        "reads them)" in text
    assert "[docs/data-card-general.md](../../../docs/data-card-general.md)" in text
    assert text.endswith("train 9 (8 synopsis, 1 message).")
    [command] = card.data_commands(td)
    assert command.startswith("seq2serve data --corpora ddtp,messages,everyday,general "
                              "--ddtp-repeat 4 --everyday-repeat 2 --general-repeat 3   #")
    parser = argparse.ArgumentParser()
    data_cli.configure(parser)
    ns = parser.parse_args(shlex.split(command.split("#")[0])[2:])
    assert (ns.ddtp_repeat, ns.messages_repeat, ns.everyday_repeat, ns.general_repeat) == (
        4, 1, 2, 3)
    elsewhere = card.data_commands(card.training_data("data/mix-two/en-de", {
        **WEIGHTED, "parts": WEIGHTED["parts"][:2]}))
    assert elsewhere[-1] == ("seq2serve data --corpora weighted-mix --mix-of ddtp,messages "
                             "--mix-out data/mix-two --ddtp-repeat 4")
    assert card._corpus_repeats(WEIGHTED)["data/general/en-de"] == 3
    assert "read backwards" not in text
    back = card.training_data("data/mix/de-en", {**WEIGHTED, "src_lang": "de", "tgt_lang": "en",
                                                 "reverse": True})
    assert ", every pair read backwards (de->en from the en-de corpora)" in \
        card.data_section(back, None)
    assert card.data_commands(back) == card.data_commands(td)  # the build writes de-en too


def test_a_written_four_corpus_mix_gets_the_command_that_writes_it() -> None:
    corpus = {"task": "translate", "counts": {},
              "source": {"mix": [p["corpus"] for p in WEIGHTED["parts"]]},
              "train_repeat": {p["corpus"]: p["weight"] for p in WEIGHTED["parts"]}}
    td = card.training_data("data/mixed-general/en-de", corpus)
    assert not td.weighted and td.listed
    assert card.data_commands(td)[1:] == [
        "seq2serve data --corpora general-mix --ddtp-repeat 4 --everyday-repeat 2 "
        "--general-repeat 3"]
    elsewhere = card.data_commands(card.training_data("data/mg/en-de", corpus))
    assert elsewhere[1].startswith("seq2serve data --corpora general-mix --general-mix-out "
                                   "data/mg --ddtp-repeat 4")
    three = {**corpus, "source": {"mix": corpus["source"]["mix"][:3]},
             "train_repeat": dict(list(corpus["train_repeat"].items())[:3])}
    assert len(card.data_commands(card.training_data("data/mixed-everyday/en-de", three))) == 1


def test_the_curve_of_a_resumed_run_shows_each_step_once() -> None:
    """A run resumed from a checkpoint older than its last evaluation logs that step
    again: the card's curve keeps the run that went on."""
    log = [{"step": 500, "elapsed_s": 654.0, "valid_loss": 1.5, "bleu": 30.0},
           {"step": 500, "elapsed_s": 660.0, "valid_loss": 1.4, "bleu": 31.0},
           {"step": 1000, "elapsed_s": 1300.0, "valid_loss": 1.3, "bleu": 32.0}]
    rows = card._curve(log, "bleu")[2:]
    assert rows == ["| 500 | 0 h 11 min | 1.400 | 31.00 |",
                    "| 1000 | 0 h 21 min | 1.300 | 32.00 |"]


def test_each_phase_on_another_weighted_mix_gets_the_command_that_writes_it() -> None:
    def phase(data: str, weights: list[int], step: int, **more: object) -> dict[str, object]:
        return {"step": step, "elapsed_seconds": 60.0 * step, "model": {**CFG},
                "train_args": {**ARGS, "data": data}, "released": True,
                "train_repeat": dict(sorted(  # as a release's meta keeps it
                    (p["corpus"], w) for p, w in zip(WEIGHTED["parts"], weights, strict=True))),
                **more}

    first = phase("data/mixed/en-de", [1, 1, 1, 1], 100)  # a written mix: no weighted-mix
    second = phase("data/mix-a/en-de", [4, 2, 2, 4], 200, train_weighted=True)
    third = phase("data/mix/en-de", [8, 1, 1, 1], 300, train_weighted=True)  # overwritten
    final = {**phase("data/mix/en-de", [6, 2, 2, 4], 400, train_weighted=True),
             "base": third, "earlier": [first, second]}
    td = card.training_data("data/mix/en-de", {
        **WEIGHTED, "parts": [{**p, "weight": w} for p, w in zip(WEIGHTED["parts"], [6, 2, 2, 4],
                                                                 strict=True)]})
    lin = card.lineage(final, "en-de", "data/mix/en-de", 1)
    commands, _, _ = card.reproduce_commands(lin, td, "models/checkpoints/en-de", False, [])
    trains = [k for k, c in enumerate(commands) if c.startswith("seq2serve train")]
    assert len(trains) == 4
    mixes = [(k, c) for k, c in enumerate(commands) if "--corpora weighted-mix" in c]
    assert mixes == [
        (trains[1] - 1, "seq2serve data --corpora weighted-mix --mix-of ddtp,messages,everyday,"
                        "general --mix-out data/mix-a --ddtp-repeat 4 --messages-repeat 2 "
                        "--everyday-repeat 2 --general-repeat 4"),
        (trains[2] - 1, "seq2serve data --corpora weighted-mix --mix-of ddtp,messages,everyday,"
                        "general --mix-out data/mix --ddtp-repeat 8 --everyday-repeat 1 "
                        "--general-repeat 1 --force"),
        (trains[3] - 1, "seq2serve data --corpora weighted-mix --mix-of ddtp,messages,everyday,"
                        "general --mix-out data/mix --ddtp-repeat 6 --messages-repeat 2 "
                        "--everyday-repeat 2 --general-repeat 4 --force")]
    parser = argparse.ArgumentParser()
    data_cli.configure(parser)
    ns = parser.parse_args(shlex.split(mixes[0][1])[2:])
    assert (ns.mix_of, ns.mix_out.as_posix(), ns.ddtp_repeat, ns.general_repeat) == (
        "ddtp,messages,everyday,general", "data/mix-a", 4, 4)
    assert all(_parse(commands[k]).data.startswith(d) for k, d in zip(
        trains, ["data/mixed/", "data/mix-a/", "data/mix/", "data/mix/"], strict=True))
