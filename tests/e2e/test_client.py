"""The Python client and the translate/summarize commands against a fake in-process server."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterator
from concurrent import futures
from types import ModuleType

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.cli import summarize as summarize_cli
from seq2serve.server.cli import translate as translate_cli
from seq2serve.server.client import Hyp, Seq2ServeClient, StreamChunk


class FakeTranslator(pb_grpc.TranslatorServicer):
    """Upper-cases texts; n-best entries are suffixed with their rank; records requests."""

    def __init__(self) -> None:
        self.requests: list[object] = []

    def _nbest(self, text: str, options: pb.DecodingOptions) -> list[pb.Hypothesis]:
        count = options.num_hypotheses if options.HasField("num_hypotheses") else 1
        # A text that says "cut" stops at its length limit (others leave it unset).
        reason = pb.FINISH_REASON_LENGTH if "cut" in text else pb.FINISH_REASON_UNSPECIFIED
        return [pb.Hypothesis(text=text.upper() + ("" if i == 0 else f" #{i}"),
                              score=-0.5 * (i + 1) if options.return_scores else 0.0,
                              token_ids=[7, 8] if options.return_token_ids else [],
                              finish_reason=reason)
                for i in range(count)]

    def Translate(self, request: pb.TranslateRequest, context: grpc.ServicerContext
                  ) -> pb.TranslateResponse:
        self.requests.append(request)
        return pb.TranslateResponse(model=request.model or "fake", translations=[
            pb.Translation(hypotheses=self._nbest(t, request.options)) for t in request.texts])

    def TranslateStream(self, request: pb.TranslateRequest, context: grpc.ServicerContext
                        ) -> Iterator[pb.TranslateChunk]:
        self.requests.append(request)
        text = request.texts[0].upper()
        for start in range(0, len(text), 3):
            yield pb.TranslateChunk(text_delta=text[start:start + 3])
        yield pb.TranslateChunk(final=True, translation=pb.Translation(
            hypotheses=self._nbest(request.texts[0], request.options)))

    def Summarize(self, request: pb.SummarizeRequest, context: grpc.ServicerContext
                  ) -> pb.SummarizeResponse:
        self.requests.append(request)
        return pb.SummarizeResponse(model="sum", summaries=[
            pb.Summary(hypotheses=self._nbest(t.split(".")[0], request.options),
                       truncated=request.truncate and len(t) > 20)
            for t in request.texts])

    def ListModels(self, request: pb.ListModelsRequest, context: grpc.ServicerContext
                   ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[pb.ModelInfo(
            name="opus-mt-en-de", task="translate", source_language="en", target_language="de",
            precision="fp32", provider="CPUExecutionProvider", max_source_length=512,
            defaults=pb.DecodingOptions(beam_size=4, max_length_ratio=2.0))])


class RefusingTranslator(pb_grpc.TranslatorServicer):
    def Translate(self, request: pb.TranslateRequest, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "beam_size must be in [1, 16], got 0")

    def Summarize(self, request: pb.SummarizeRequest, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "texts[0] is 900 tokens; this model "
                      "reads at most 512 (set truncate to cut it)")


def _serve(servicer: pb_grpc.TranslatorServicer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_TranslatorServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("seq2serve.v1.Translator", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeTranslator, str]]:
    servicer = FakeTranslator()
    server, target = _serve(servicer)
    yield servicer, target
    server.stop(None)


@pytest.fixture(scope="module")
def refusing() -> Iterator[str]:
    server, target = _serve(RefusingTranslator())
    yield target
    server.stop(None)


def test_translate_sends_the_request_fields(fake: tuple[FakeTranslator, str]) -> None:
    servicer, target = fake
    with Seq2ServeClient(target, timeout=10) as client:
        result = client.translate(["open the file", "close it"], model="m",
                                  source_language="en", target_language="de",
                                  beam_size=0, num_hypotheses=2, length_penalty=None,
                                  return_scores=True)
    request = servicer.requests[-1]
    assert (request.model, list(request.texts), request.source_language,
            request.target_language) == ("m", ["open the file", "close it"], "en", "de")
    assert request.options.HasField("beam_size") and request.options.beam_size == 0
    assert not request.options.HasField("length_penalty")  # None = the model's default
    assert result == [[Hyp("OPEN THE FILE", -0.5), Hyp("OPEN THE FILE #1", -1.0)],
                      [Hyp("CLOSE IT", -0.5), Hyp("CLOSE IT #1", -1.0)]]


def test_unrequested_extras_are_none(fake: tuple[FakeTranslator, str]) -> None:
    _, target = fake
    with Seq2ServeClient(target) as client:
        [[plain]] = client.translate("hello")  # a lone string is one text
        [[with_ids]] = client.translate("hello", return_token_ids=True)
    assert plain == Hyp("HELLO")
    assert with_ids == Hyp("HELLO", token_ids=[7, 8])


def test_unknown_option_names_the_valid_ones(fake: tuple[FakeTranslator, str]) -> None:
    with Seq2ServeClient(fake[1]) as client, pytest.raises(TypeError, match="beam_size"):
        client.translate(["x"], beams=3)


def test_translate_stream(fake: tuple[FakeTranslator, str]) -> None:
    _, target = fake
    with Seq2ServeClient(target) as client:
        chunks = list(client.translate_stream("open the file", target_language="de"))
    assert "".join(c.text_delta for c in chunks) == "OPEN THE FILE"
    assert not any(c.final for c in chunks[:-1])
    assert chunks[-1] == StreamChunk("", [Hyp("OPEN THE FILE")])


def test_summarize_list_models_and_health(fake: tuple[FakeTranslator, str]) -> None:
    servicer, target = fake
    with Seq2ServeClient(target) as client:
        summaries = client.summarize(["A short one. More.", "A much longer text. And more."],
                                     model="sum", truncate=True, beam_size=2)
        assert servicer.requests[-1].truncate and servicer.requests[-1].options.beam_size == 2
        assert [(s.hypotheses[0].text, s.truncated) for s in summaries] == [
            ("A SHORT ONE", False), ("A MUCH LONGER TEXT", True)]
        [model] = client.list_models()
        assert (model.name, model.provider, model.max_source_length) == (
            "opus-mt-en-de", "CPUExecutionProvider", 512)
        assert model.defaults == {"beam_size": 4, "max_length_ratio": 2.0}
        assert client.health() == "SERVING"
        assert client.health("seq2serve.v1.Translator") == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as error:
            client.health("no.such.Service")
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


def _run(module: ModuleType, argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    module.configure(parser)
    return module.run(parser.parse_args(argv))


def test_translate_command(fake: tuple[FakeTranslator, str],
                           capsys: pytest.CaptureFixture[str]) -> None:
    servicer, target = fake
    assert _run(translate_cli, ["Open the file", "--from", "en", "--to", "de", "--beam", "3",
                                "--server", target, "--timeout", "10"]) == 0
    assert capsys.readouterr().out == "OPEN THE FILE\n"
    options = servicer.requests[-1].options
    assert options.beam_size == 3 and not options.HasField("num_hypotheses")
    assert not options.return_scores


def test_translate_command_n_best_with_scores_from_stdin(
        fake: tuple[FakeTranslator, str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    servicer, target = fake
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\nthree\n"))
    assert _run(translate_cli, ["-", "--n-best", "2", "--scores", "--batch-size", "2",
                                "--server", target]) == 0
    assert capsys.readouterr().out == (
        "-0.5000\tONE\n-1.0000\tONE #1\n\n-0.5000\tTWO\n-1.0000\tTWO #1\n\n"
        "-0.5000\tTHREE\n-1.0000\tTHREE #1\n")
    assert [list(r.texts) for r in servicer.requests[-2:]] == [["one", "two"], ["three"]]


def test_summarize_command(fake: tuple[FakeTranslator, str], tmp_path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    _, target = fake
    doc = tmp_path / "doc.txt"
    doc.write_text("A long document about files. It goes on.", encoding="utf-8")
    assert _run(summarize_cli, [str(doc), "--truncate", "--server", target]) == 0
    captured = capsys.readouterr()
    assert captured.out == "A LONG DOCUMENT ABOUT FILES\n"
    assert "was cut to the model's input limit" in captured.err


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_summarize_command_leaves_the_final_line_break_out(
        fake: tuple[FakeTranslator, str], tmp_path, ending: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's or standard input's final line break ends its last line; it is not part
    of the text (`echo "$TEXT" | seq2serve summarize -` sends $TEXT, as /summarize would
    get it). Only that one: the line breaks inside, and a blank line before it, stay."""
    servicer, target = fake
    text = f"First line.{ending}{ending}Last line."
    doc = tmp_path / "doc.txt"
    doc.write_bytes(f"{text}{ending}".encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{text}{ending}".encode()),
                                                        encoding="utf-8", newline=""))
    assert _run(summarize_cli, [str(doc), "-", "--server", target]) == 0
    assert list(servicer.requests[-1].texts) == [text, text]


def test_the_commands_say_when_an_answer_stopped_at_its_length_limit(
        fake: tuple[FakeTranslator, str], tmp_path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, target = fake
    assert _run(translate_cli, ["whole", "cut short", "--server", target]) == 0
    captured = capsys.readouterr()
    assert captured.out == "WHOLE\nCUT SHORT\n"
    assert captured.err == ("seq2serve translate: note: text 2 stopped at its length limit "
                            "(max_length): its translation is cut\n")
    doc = tmp_path / "doc.txt"
    doc.write_text("It was cut. More.", encoding="utf-8")
    assert _run(summarize_cli, [str(doc), "--server", target]) == 0
    assert capsys.readouterr().err == (f"seq2serve summarize: note: {doc}'s summary stopped "
                                       "at its length limit (max_length)\n")


def test_summarize_command_missing_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(summarize_cli, [str(tmp_path / "nope.txt")]) == 1
    assert "seq2serve summarize: error: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, prog, message", [
    (translate_cli, ["Open the file", "--beam", "0"], "seq2serve translate",
     "beam_size must be in [1, 16], got 0"),
    (summarize_cli, ["-"], "seq2serve summarize", "reads at most 512"),
])
def test_rpc_errors_print_status_and_exit_1(
        refusing: str, module: ModuleType, argv: list[str], prog: str, message: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("some text"))
    assert _run(module, [*argv, "--server", refusing]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{prog}: error: INVALID_ARGUMENT: ")
    assert message in captured.err


def test_unreachable_server_is_an_error_too(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 on loopback: nothing listens, so the call fails fast with UNAVAILABLE.
    assert _run(translate_cli, ["x", "--server", "127.0.0.1:1", "--timeout", "5"]) == 1
    assert capsys.readouterr().err.startswith("seq2serve translate: error: UNAVAILABLE: ")
