"""End to end over real gRPC on 127.0.0.1: parity with Hugging Face, isolation
under concurrency, metrics, health, bad input, deadlines, cancellation, drain."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch
import transformers
from conftest import CORPUS
from serving import RunningServer, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc
from seq2serve.server.app import Server
from seq2serve.server.client import Seq2ServeClient


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, max_texts_per_request=8,
                                          max_text_chars=500, max_length_cap=64,
                                          max_message_bytes=64 * 1024))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[Seq2ServeClient]:
    with Seq2ServeClient(server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def hf(marian_dir: Path):  # noqa: ANN201
    return (transformers.MarianMTModel.from_pretrained(marian_dir).eval(),
            transformers.MarianTokenizer.from_pretrained(marian_dir))


def hf_generate(hf, texts: list[str], **kwargs: object) -> list[list[str]]:  # noqa: ANN001
    model, tok = hf
    batch = tok(texts, return_tensors="pt", padding=True)
    n = int(kwargs.get("num_return_sequences", 1))
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, forced_eos_token_id=None,
                             bad_words_ids=[[model.config.pad_token_id]], max_new_tokens=40,
                             **kwargs)
    decoded = tok.batch_decode(out, skip_special_tokens=True)
    return [decoded[i * n:(i + 1) * n] for i in range(len(texts))]


@pytest.mark.parametrize("settings", [
    dict(num_beams=1),
    dict(num_beams=4),
    dict(num_beams=5, num_return_sequences=3, length_penalty=0.6),
])
def test_outputs_equal_hf_generate(client: Seq2ServeClient, hf, settings: dict) -> None:  # noqa: ANN001
    texts = CORPUS[:4]
    options = dict(beam_size=settings["num_beams"], max_length=40,
                   num_hypotheses=settings.get("num_return_sequences", 1))
    if "length_penalty" in settings:
        options["length_penalty"] = settings["length_penalty"]
    got = client.translate(texts, model="opus-mt-en-de", **options)
    want = hf_generate(hf, texts, **settings)
    assert [[h.text for h in hyps] for hyps in got] == want


def test_concurrent_clients_get_their_own_results(server: RunningServer) -> None:
    texts = [f"{CORPUS[i % len(CORPUS)]} {i}" for i in range(24)]
    with Seq2ServeClient(server.target, timeout=120) as c:
        alone = [c.translate([t], beam_size=2, max_length=20)[0][0].text for t in texts]

    def call(i: int) -> str:
        with Seq2ServeClient(server.target, timeout=120) as c:
            return c.translate([texts[i]], beam_size=2, max_length=20)[0][0].text

    batches_before = sum(h.batches for h in server.server.registry.handles())
    with ThreadPoolExecutor(12) as pool:
        together = list(pool.map(call, range(len(texts))))
    batches = sum(h.batches for h in server.server.registry.handles()) - batches_before
    assert together == alone
    assert batches < len(texts)  # they really were batched together


def test_many_texts_in_one_request_keep_their_order(client: Seq2ServeClient) -> None:
    texts = CORPUS[:6]
    one_by_one = [client.translate([t], beam_size=1, max_length=20)[0][0].text for t in texts]
    together = [h[0].text for h in client.translate(texts, beam_size=1, max_length=20)]
    assert together == one_by_one


def test_texts_spread_over_batches_are_reassembled_in_order(models_dir: Path) -> None:
    running = RunningServer(server_config(models_dir, max_batch_size=2))
    try:
        texts = CORPUS[:7]
        with Seq2ServeClient(running.target, timeout=120) as c:
            one_by_one = [c.translate([t], beam_size=2, max_length=20)[0][0].text
                          for t in texts]
            [handle] = running.server.registry.handles()
            before = handle.batches
            together = [h[0].text for h in c.translate(texts, beam_size=2, max_length=20)]
        assert handle.batches - before >= 4  # 7 texts, at most 2 per batch
        assert together == one_by_one
    finally:
        running.stop()



@pytest.mark.parametrize("rows", [0, 64], ids=["request-level", "iteration-level"])
def test_engines_of_one_model_share_its_queue_and_answer_alike(
        models_dir: Path, client: Seq2ServeClient, rows: int) -> None:
    """Two engines (one intra-op thread each) take batches from the model's one
    queue in parallel; which engine ran a text changes nothing in its answer."""
    texts = [*CORPUS[:8], f"{CORPUS[8 % len(CORPUS)]} {CORPUS[0]}"] * 2
    alone = [client.translate([t], beam_size=2, max_length=20)[0][0].text for t in texts]
    running = RunningServer(server_config(models_dir, threads=2, engines=2, max_batch_size=2,
                                          max_running_rows=rows, max_running_beam=16))
    try:
        [handle] = running.server.registry.handles()
        assert [w.engine.runner.threads for w in handle.workers] == [1, 1]

        def call(i: int) -> str:
            with Seq2ServeClient(running.target, timeout=120) as c:
                return c.translate([texts[i]], beam_size=2, max_length=20)[0][0].text

        with ThreadPoolExecutor(len(texts)) as pool:
            together = list(pool.map(call, range(len(texts))))
        assert together == alone
        assert all(w.batches > 0 for w in handle.workers)  # both engines served
    finally:
        running.stop()

def test_long_text_is_segmented_and_whitespace_kept(client: Seq2ServeClient) -> None:
    text = f"  {CORPUS[0]} {CORPUS[1]}\n\n{CORPUS[2]}\n"
    [[whole]] = client.translate([text], beam_size=1, max_length=20)
    parts = [client.translate([t], beam_size=1, max_length=20)[0][0].text for t in CORPUS[:3]]
    assert whole.text == f"  {parts[0]} {parts[1]}\n\n{parts[2]}\n"


def test_alignment_and_token_ids_on_request(client: Seq2ServeClient, hf) -> None:  # noqa: ANN001
    tok = hf[1]
    sources = [len(tok(t)["input_ids"]) for t in CORPUS[:2]]  # source tokens, EOS included
    # One sentence, then two that the server segments and translates as two pieces.
    [[one]], [[two]] = (client.translate([t], beam_size=2, max_length=20, return_alignment=True,
                                         return_token_ids=True)
                        for t in (CORPUS[0], f"{CORPUS[0]} {CORPUS[1]}"))
    assert one.token_ids and len(one.alignment) == len(one.token_ids)
    assert all(0 <= a < sources[0] for a in one.alignment)
    # The second piece's positions continue after the first piece's source tokens.
    assert len(two.alignment) == len(two.token_ids)
    assert two.alignment[: len(one.alignment)] == one.alignment
    second = two.alignment[len(one.alignment):]
    assert second and all(sources[0] <= a < sum(sources) for a in second)
    [[plain]] = client.translate([CORPUS[0]], beam_size=2, max_length=20)
    assert plain.alignment is None and plain.text == one.text


def test_empty_text_gets_empty_translation(client: Seq2ServeClient) -> None:
    [[hyp]] = client.translate([""])
    assert hyp.text == ""


def test_stream_deltas_add_up_to_the_final_text(client: Seq2ServeClient) -> None:
    chunks = list(client.translate_stream(CORPUS[0], beam_size=1, max_length=20))
    assert chunks[-1].final
    assert len(chunks) > 2  # streamed token by token
    assert "".join(c.text_delta for c in chunks) == chunks[-1].hypotheses[0].text
    [[direct]] = client.translate([CORPUS[0]], beam_size=1, max_length=20)
    assert chunks[-1].hypotheses[0].text == direct.text


def test_list_models_and_health(client: Seq2ServeClient) -> None:
    [info] = client.list_models()
    assert (info.name, info.task, info.source_language, info.target_language) == (
        "opus-mt-en-de", "translate", "en", "de")
    assert info.provider == "CPUExecutionProvider"
    assert client.health() == "SERVING"
    assert client.health("seq2serve.v1.Translator") == "SERVING"


BAD = [
    (dict(texts=[]), "texts must hold at least one text"),
    (dict(options=dict(beam_size=0)), "beam_size must be in [1, 16], got 0"),
    (dict(options=dict(beam_size=17)), "beam_size must be in [1, 16], got 17"),
    (dict(options=dict(beam_size=2, num_hypotheses=3)), "num_hypotheses must be <= beam_size"),
    (dict(options=dict(beam_size=1, sampling_temperature=1.0, sampling_top_p=1.5)),
     "sampling_top_p must be in (0, 1], got 1.5"),
    (dict(options=dict(beam_size=1, sampling_temperature=1.0, sampling_top_p=0.0)),
     "sampling_top_p must be in (0, 1], got 0"),
    (dict(options=dict(sampling_temperature=-1.0)), "sampling_temperature must be >= 0"),
    (dict(options=dict(max_length=65)), "max_length must be in [1, 64], got 65"),
    (dict(options=dict(beam_size=4, length_penalty=-6)),
     "length_penalty must be in [-1, 10], got -6.0"),
    (dict(options=dict(beam_size=4, length_penalty=-20)),
     "length_penalty must be in [-1, 10], got -20.0"),
    (dict(texts=["a"] * 9), "at most 8 texts per request, got 9; the limit is the server's "
     "--max-texts-per-request (SEQ2SERVE_MAX_TEXTS_PER_REQUEST)"),
    (dict(texts=["a" * 501]), "texts[0] must be at most 500 characters, got 501; the limit is "
     "the server's --max-text-chars (SEQ2SERVE_MAX_TEXT_CHARS)"),
]


def assert_invalid_argument(target: str, method: str, request: object, message: str) -> None:
    """The call fails with INVALID_ARGUMENT naming the problem; the server stays up."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(getattr(stub, method)(request, timeout=30))  # list(): streams run too
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
        assert stub.ListModels(pb.ListModelsRequest(), timeout=30).models


@pytest.mark.parametrize(("fields", "message"), BAD)
def test_bad_input_is_invalid_argument(server: RunningServer, fields: dict,
                                       message: str) -> None:
    options = pb.DecodingOptions(**fields.get("options", {}))
    request = pb.TranslateRequest(model="opus-mt-en-de", texts=fields.get("texts", ["Hello"]),
                                  options=options)
    assert_invalid_argument(server.target, "Translate", request, message)


OPTION_ERRORS = [(fields["options"], message) for fields, message in BAD if "options" in fields]


@pytest.mark.parametrize(("options", "message"), OPTION_ERRORS)
def test_bad_options_on_stream_are_invalid_argument(server: RunningServer, options: dict,
                                                    message: str) -> None:
    request = pb.TranslateRequest(model="opus-mt-en-de", texts=["Hello"],
                                  options=pb.DecodingOptions(**options))
    assert_invalid_argument(server.target, "TranslateStream", request, message)


def test_unknown_model_is_not_found_listing_models(server: RunningServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Translate(pb.TranslateRequest(model="nope", texts=["x"]), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "opus-mt-en-de" in err.value.details()


def test_message_above_size_limit(server: RunningServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Translate(pb.TranslateRequest(texts=["x" * 100_000]), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_invalid_utf8_is_invalid_argument(server: RunningServer) -> None:
    # proto3 strings must be UTF-8; the raw bytes are sent past the client's encoder.
    bad = b"\x12\x02\xff\xfe"  # field 2 (texts), length 2, invalid UTF-8
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary("/seq2serve.v1.Translator/Translate",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            call(bad, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in err.value.details()


def test_deadline_and_cancellation_leave_the_server_serving(server: RunningServer) -> None:
    long = pb.TranslateRequest(model="opus-mt-en-de", texts=CORPUS[:8],
                               options=pb.DecodingOptions(beam_size=8, max_length=64))
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Translate(long, timeout=0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        future = stub.Translate.future(long, timeout=60)
        time.sleep(0.05)
        future.cancel()
        assert future.cancelled()
        ok = stub.Translate(pb.TranslateRequest(texts=["Hello"]), timeout=60)
        assert len(ok.translations) == 1
    metrics = server.server.metrics.render().decode()
    assert 'seq2serve_cancelled_total{model="opus-mt-en-de"' in metrics


def test_metrics_count_what_was_sent(models_dir: Path) -> None:
    running = RunningServer(server_config(models_dir, metrics_port=0))
    try:
        port = running.server.metrics.start_http(0, "127.0.0.1").port
        with Seq2ServeClient(running.target, timeout=60) as c:
            for _ in range(3):
                c.translate([CORPUS[0], CORPUS[1]], beam_size=1, max_length=10)
            with pytest.raises(grpc.RpcError):
                c.translate(["x"], beam_size=0)
            with pytest.raises(grpc.RpcError):
                c.translate(["x"], model="no-such-model")
            c.list_models()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        # A client-chosen model name never becomes a label: failures before a model is
        # chosen count under "(none)".
        assert ('seq2serve_requests_total{code="NOT_FOUND",method="Translate",'
                'model="(none)"} 1.0') in text
        assert "no-such-model" not in text
        assert 'seq2serve_requests_total{code="OK",method="ListModels",model="(none)"} 1.0' in text
        # 3 calls x 2 texts were generated for; the in-flight gauge is back to 0
        assert 'seq2serve_in_flight_requests{model="opus-mt-en-de"} 0.0' in text
        [handle] = running.server.registry.handles()
        sent = 3 * sum(len(handle.tokenizer.encode(t)) for t in CORPUS[:2])
        assert f'seq2serve_input_tokens_total{{model="opus-mt-en-de"}} {float(sent)}' in text
        assert ('seq2serve_requests_total{code="OK",method="Translate",model="opus-mt-en-de"} '
                '3.0') in text
        assert ('seq2serve_requests_total{code="INVALID_ARGUMENT",method="Translate",'
                'model="opus-mt-en-de"} 1.0') in text
        assert "seq2serve_request_duration_seconds_bucket" in text
        assert 'seq2serve_model_info{' in text
    finally:
        running.stop()


def test_drain_goes_not_serving_refuses_new_calls_and_finishes_in_flight(
        models_dir: Path) -> None:
    from grpc_health.v1 import health_pb2

    running = RunningServer(server_config(models_dir, grace_period_s=30.0))
    channel = grpc.insecure_channel(running.target)
    stub = pb_grpc.TranslatorStub(channel)
    in_flight = stub.Translate.future(pb.TranslateRequest(
        texts=CORPUS[:8], options=pb.DecodingOptions(beam_size=6, max_length=48)), timeout=60)
    time.sleep(0.2)
    stopping = asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop)

    async def status(service: str) -> int:  # the health servicer itself: the port is closing
        request = health_pb2.HealthCheckRequest(service=service)
        return (await running.server.health.Check(request, None)).status

    deadline = time.monotonic() + 10
    while running.call(status("")) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline, "health did not go NOT_SERVING"
        time.sleep(0.01)
    assert running.call(status("seq2serve.v1.Translator")) == (
        health_pb2.HealthCheckResponse.NOT_SERVING)
    # Then the listener closes and the open connection gets a GOAWAY. A call sent on
    # that connection before the client has read the GOAWAY is cancelled by gRPC's
    # own shutdown before any handler sees it: CANCELLED, not UNAVAILABLE
    # (grpc/grpc#41785, open). So wait until new connections are refused and the
    # client's channel has left READY (it has read the GOAWAY): a new call then
    # tries a new connection, which is refused.
    host, port = running.target.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "the listener did not close"
        time.sleep(0.01)
    states: list[grpc.ChannelConnectivity] = []
    watch = states.append
    channel.subscribe(watch, try_to_connect=False)
    while not states or states[-1] == grpc.ChannelConnectivity.READY:
        assert time.monotonic() < deadline, "the client did not see the GOAWAY"
        time.sleep(0.01)
    channel.unsubscribe(watch)
    with pytest.raises(grpc.RpcError) as err:  # a new call during the drain
        stub.Translate(pb.TranslateRequest(texts=["Hello"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(in_flight.result().translations) == 8  # the call in flight still finishes
    stopping.result(60)
    channel.close()
    running.loop.call_soon_threadsafe(running.loop.stop)
    running.thread.join(10)


def add_package(models_dir: Path, source: Path, name: str, **manifest_fields: object) -> None:
    """A copy of a package under another name/task (manifest.json itself is not hashed)."""
    import json

    target = models_dir / name
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest.update(name=name, **manifest_fields)
    (target / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def multi_server(marian_package: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("multi")
    add_package(root, marian_package, "tiny-en-de")
    add_package(root, marian_package, "tiny-en-fr", target_language="fr")
    add_package(root, marian_package, "tiny-summarize", task="summarize", target_language="en",
                max_source_length=12)
    running = RunningServer(server_config(root))
    yield running
    running.stop()


def test_models_are_picked_by_name_or_languages(multi_server: RunningServer) -> None:
    with Seq2ServeClient(multi_server.target, timeout=60) as c:
        assert len(c.list_models()) == 3
        by_lang = c.translate(["Hello"], source_language="en", target_language="fr", beam_size=1)
        by_name = c.translate(["Hello"], model="tiny-en-fr", beam_size=1)
        assert by_lang == by_name
        with pytest.raises(grpc.RpcError) as err:
            c.translate(["Hello"])  # two translation models: ambiguous
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tiny-en-de" in err.value.details() and "tiny-en-fr" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            c.translate(["Hello"], source_language="en", target_language="xx")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            c.summarize(["Hello"], model="tiny-en-de")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_summarize_refuses_or_truncates_long_input(multi_server: RunningServer) -> None:
    long = " ".join(CORPUS)
    with Seq2ServeClient(multi_server.target, timeout=60) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.summarize([long], beam_size=1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 12" in err.value.details() and "truncate" in err.value.details()
        [cut, empty, short] = c.summarize([long, "", "Open it."], truncate=True, beam_size=1)
        assert cut.truncated and not short.truncated
        assert cut.hypotheses[0].text and empty.hypotheses[0].text == ""


@pytest.mark.parametrize(("fields", "message"), [
    (dict(texts=[]), "texts must hold at least one text"),
    (dict(options=dict(beam_size=0)), "beam_size must be in [1, 16], got 0"),
    (dict(options=dict(beam_size=2, num_hypotheses=3)), "num_hypotheses must be <= beam_size"),
    (dict(options=dict(sampling_temperature=-1.0)), "sampling_temperature must be >= 0"),
    (dict(texts=["a"] * 65), "at most 64 texts per request, got 65"),  # the default cap
    (dict(texts=["a" * 10_001]), "texts[0] must be at most 10000 characters, got 10001; the "
     "limit is the server's --max-text-chars (SEQ2SERVE_MAX_TEXT_CHARS)"),
    (dict(options=dict(length_penalty=-20)), "length_penalty must be in [-1, 10], got -20.0"),
])
def test_bad_summarize_input_is_invalid_argument(multi_server: RunningServer, fields: dict,
                                                 message: str) -> None:
    request = pb.SummarizeRequest(model="tiny-summarize", texts=fields.get("texts", ["Hello"]),
                                  options=pb.DecodingOptions(**fields.get("options", {})))
    assert_invalid_argument(multi_server.target, "Summarize", request, message)


def test_queue_full_is_resource_exhausted(marian_package: Path, tmp_path: Path) -> None:
    add_package(tmp_path, marian_package, "tiny-en-de")
    running = RunningServer(server_config(tmp_path, max_queue_size=2, max_texts_per_request=2,
                                          max_batch_size=1))
    try:
        request = pb.TranslateRequest(texts=CORPUS[:2],
                                      options=pb.DecodingOptions(beam_size=8, max_length=64))
        with grpc.insecure_channel(running.target) as channel:
            stub = pb_grpc.TranslatorStub(channel)
            calls = [stub.Translate.future(request, timeout=120) for _ in range(6)]
            codes = []
            for call in calls:
                try:
                    call.result()
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    codes.append(e.code())
                    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        assert "queue is full" in e.details()
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and grpc.StatusCode.OK in codes
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        # One text that segments into more pieces than the queue holds can never run:
        # INVALID_ARGUMENT saying why, not a "queue full" to retry forever.
        long_text = " ".join(CORPUS[:3])
        with Seq2ServeClient(running.target, timeout=60) as c, \
                pytest.raises(grpc.RpcError) as err:
            c.translate([long_text])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at most 2 (the queue size)" in err.value.details()
    finally:
        running.stop()


def test_health_is_not_serving_while_models_load(models_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from seq2serve.server import assembly

    release = threading.Event()
    original = assembly.load_models

    def slow_load(registry, config, metrics):  # noqa: ANN001, ANN202
        release.wait(30)
        return original(registry, config, metrics)

    monkeypatch.setattr(assembly, "load_models", slow_load)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def create() -> Server:
        return Server(server_config(models_dir))

    server = asyncio.run_coroutine_threadsafe(create(), loop).result(30)
    started = asyncio.run_coroutine_threadsafe(server.start(), loop)
    try:
        with Seq2ServeClient(f"127.0.0.1:{server.port}", timeout=30) as c:
            deadline = time.monotonic() + 30
            while True:  # the port opens before the models are loaded
                try:
                    status = c.health()
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert status == "NOT_SERVING"
            with pytest.raises(grpc.RpcError) as err:
                c.translate(["Hello"])
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            release.set()
            started.result(60)
            assert c.health() == "SERVING"
    finally:
        release.set()
        asyncio.run_coroutine_threadsafe(server.stop(1), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_reflection_describes_the_services(server: RunningServer) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(server.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        translator = database.FindFileContainingSymbol("seq2serve.v1.Translator")
    assert {"seq2serve.v1.Translator", "grpc.health.v1.Health"} <= services
    methods = {m.name for s in translator.service for m in s.method}
    assert {"Translate", "TranslateStream", "Summarize", "ListModels"} <= methods


def test_iteration_level_beam_search_streams_each_sentence_when_it_is_done(
        models_dir: Path) -> None:
    """Beam search has no stable prefix to stream token by token, but a finished
    sentence is final: it goes out before the rest of the text is done."""
    running = RunningServer(server_config(models_dir, max_running_rows=64, max_running_beam=16))
    text = f"Tools. {CORPUS[3]} {CORPUS[1]}"
    # The ratio ends the short sentence early (a Hugging Face folder's package has
    # none by default, as generate() has none).
    options = dict(beam_size=2, max_length=40, max_length_ratio=2.0)
    try:
        with Seq2ServeClient(running.target, timeout=60) as c:
            chunks = list(c.translate_stream(text, **options))
            [[direct]] = c.translate([text], **options)
    finally:
        running.stop()
    deltas = [chunk.text_delta for chunk in chunks if chunk.text_delta]
    assert "".join(deltas) == chunks[-1].hypotheses[0].text == direct.text
    assert len(deltas) >= 2 and not chunks[0].final
