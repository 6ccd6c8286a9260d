"""A small Python client for library users, on the generated stub.

    with Seq2ServeClient("127.0.0.1:50051") as client:
        [[best]] = client.translate(["Open the file"], source_language="en",
                                    target_language="de")
        print(best.text)

It depends only on grpcio and the generated code (not on the server's
modules), so it stays light for programs that only call a server. Decoding
options are passed as keyword arguments named as in the contract's
`DecodingOptions` (`beam_size=4, num_hypotheses=2, return_scores=True`); the
server validates them and answers a bad one with INVALID_ARGUMENT.

The shared pieces of the `seq2serve translate` and `seq2serve summarize`
commands live here too (their modules are server/cli/translate.py and server/cli/summarize.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
_OPTION_FIELDS = tuple(f.name for f in pb.DecodingOptions.DESCRIPTOR.fields)
_LIMIT_FIELDS = ("max_length", "max_positions", "max_beam_size", "max_texts_per_request",
                 "max_text_chars", "min_length_penalty", "max_length_penalty")
_FINISH_PREFIX = "FINISH_REASON_"
_SPLITTING_PREFIX = "SENTENCE_SPLITTING_"

# A replica that is draining (SIGTERM) or restarting answers UNAVAILABLE before it
# runs anything, and every Translator method is a pure function of its request, so
# gRPC may send the call again, through a balancer or a round-robin channel to
# another replica. CANCELLED too: a call that reaches a replica in the instant its
# gRPC server shuts down, before the client has read the GOAWAY, is cancelled by
# gRPC before any handler sees it (grpc/grpc#41785); a caller's own cancellation is
# never retried (gRPC's rule). Any other status is the answer. Health is left out
# so a check reports what the server says, at once. A streamed call is retried only
# until its first message has arrived (gRPC's rule).
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
}
# round_robin: a target that resolves to many addresses (a headless Kubernetes
# Service, `ipv4:host1:port,host2:port`) gets calls spread over all of them; gRPC's
# default (pick_first) would send everything to the first. Retry throttling (gRPC's
# token bucket, per channel): when most calls fail, as in an outage of the whole
# fleet, retries stop until answers come back, so they do not multiply the load.
SERVICE_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
        "name": [{"service": pb.DESCRIPTOR.services_by_name["Translator"].full_name}],
        "retryPolicy": RETRY_POLICY,
    }],
    "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
}
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
]


@dataclass(frozen=True)
class Hyp:
    """One hypothesis; the extras are None unless the request asked for them."""

    text: str
    score: float | None = None
    token_ids: list[int] | None = None
    alignment: list[int] | None = None
    finish_reason: str = ""  # "eos" (complete) or "length" (cut at the length limit)


@dataclass(frozen=True)
class SoftwareText:
    """A translation request's software-text fields (docs/placeholders.md):
    placeholder protection (None: the server's default, on), a glossary of the
    server's --glossary-dir by name, term pairs and do-not-translate terms."""

    protect_placeholders: bool | None = None
    glossary: str = ""
    terms: tuple[tuple[str, str], ...] = ()
    do_not_translate: tuple[str, ...] = ()


@dataclass(frozen=True)
class Summary:
    hypotheses: list[Hyp]
    truncated: bool  # the input was cut to the model's limit (the request allowed it)


@dataclass(frozen=True)
class StreamChunk:
    """`text_delta` is the text added since the previous chunk; the last chunk
    has `hypotheses` (the whole result) and `final` True."""

    text_delta: str
    hypotheses: list[Hyp] | None = None

    @property
    def final(self) -> bool:
        return self.hypotheses is not None


@dataclass(frozen=True)
class ModelInfo:
    name: str
    task: str
    source_language: str
    target_language: str
    precision: str
    provider: str
    max_source_length: int
    defaults: dict[str, Any] = field(default_factory=dict)  # only the fields the model sets
    # The limits the server applies (ListModels' max_length ... max_length_penalty).
    limits: dict[str, float] = field(default_factory=dict)
    languages: tuple[str, ...] = ()  # a multilingual model's (every pair served)
    # generation_config keys exported without being applied (outputs may differ
    # from generate()'s)
    ignored_generation_keys: tuple[str, ...] = ()
    # Its state on the server ("available", "loading", "ready", "unloading", "failed":
    # `error` says why), the bytes of host and device memory it holds once loaded, and
    # whether an operator unloaded it (UnloadModel; loaded again only by LoadModel).
    state: str = ""
    error: str = ""
    memory_bytes: int = 0
    device_memory_bytes: int = 0
    held_out: bool = False


class Seq2ServeClient:
    """Calls a seq2serve server over one insecure channel; `timeout` (seconds)
    is each call's deadline, None for none. Translator calls that meet
    UNAVAILABLE or CANCELLED are retried (`RETRY_POLICY`) within that deadline."""

    def __init__(self, target: str = DEFAULT_TARGET, timeout: float | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.TranslatorStub(self._channel)  # type: ignore[no-untyped-call]  # grpc_tools generates it unannotated
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def translate(self, texts: str | Sequence[str], model: str | None = None,
                  source_language: str | None = None, target_language: str | None = None,
                  software: SoftwareText | None = None, sentence_splitting: str = "on",
                  **options: Any) -> list[list[Hyp]]:
        """One n-best list (best first) per text, in input order; `software`: the
        placeholder protection, glossary and terms (the server's defaults: None);
        `sentence_splitting`: "on", "no_newlines" or "off" (each text one piece)."""
        request = _translate_request(texts, model, source_language, target_language, options,
                                     software, sentence_splitting)
        response = self._stub.Translate(request, timeout=self.timeout)
        return [_hyps(t.hypotheses, request.options) for t in response.translations]

    def translate_stream(self, text: str, model: str | None = None,
                         source_language: str | None = None,
                         target_language: str | None = None, sentence_splitting: str = "on",
                         **options: Any) -> Iterator[StreamChunk]:
        """Text deltas as the translation grows, then a final chunk with the result."""
        request = _translate_request([text], model, source_language, target_language, options,
                                     sentence_splitting=sentence_splitting)
        for chunk in self._stub.TranslateStream(request, timeout=self.timeout):
            hyps = _hyps(chunk.translation.hypotheses, request.options) if chunk.final else None
            yield StreamChunk(chunk.text_delta, hyps)

    def summarize(self, texts: str | Sequence[str], model: str | None = None,
                  truncate: bool = False, **options: Any) -> list[Summary]:
        """One summary per text; `truncate` cuts inputs above the model's limit
        instead of failing the call with INVALID_ARGUMENT."""
        request = pb.SummarizeRequest(model=model or "", texts=_texts(texts),
                                      options=_options_pb(options), truncate=truncate)
        response = self._stub.Summarize(request, timeout=self.timeout)
        return [Summary(_hyps(s.hypotheses, request.options), s.truncated)
                for s in response.summaries]

    def list_models(self) -> list[ModelInfo]:
        response = self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        return [ModelInfo(m.name, m.task, m.source_language, m.target_language, m.precision,
                          m.provider, m.max_source_length, _options_dict(m.defaults),
                          {name: getattr(m, name) for name in _LIMIT_FIELDS},
                          tuple(m.languages), tuple(m.ignored_generation_keys),
                          state=m.state, error=m.error, memory_bytes=m.memory_bytes,
                          device_memory_bytes=m.device_memory_bytes, held_out=m.held_out)
                for m in response.models]

    def list_routes(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """Every translation pair served, as (source, target, models): one model, or
        two through English (ListModels' routes)."""
        response = self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        return [(r.source_language, r.target_language, tuple(r.models))
                for r in response.routes]

    def health(self, service: str = "") -> str:
        """The serving status by name ("SERVING", "NOT_SERVING", ...) of the whole
        server ("") or of one service ("seq2serve.v1.Translator"); an unknown
        service raises grpc.RpcError with NOT_FOUND."""
        response = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                      timeout=self.timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def wait_until_serving(self, timeout: float) -> None:
        """Poll health until SERVING; raise the last RpcError or TimeoutError after
        `timeout` seconds (a server that is starting refuses connections at first)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.health() == "SERVING":
                    return
                error: Exception = TimeoutError(f"server not SERVING after {timeout:g}s")
            except grpc.RpcError as e:
                error = e
            if time.monotonic() >= deadline:
                raise error
            time.sleep(0.25)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Seq2ServeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _texts(texts: str | Sequence[str]) -> list[str]:
    # A lone string is one text, not a sequence of one-character texts.
    return [texts] if isinstance(texts, str) else list(texts)


def _translate_request(texts: str | Sequence[str], model: str | None,
                       source_language: str | None, target_language: str | None,
                       options: dict[str, Any],
                       software: SoftwareText | None = None,
                       sentence_splitting: str = "on") -> pb.TranslateRequest:
    names = [v.name.removeprefix(_SPLITTING_PREFIX).lower()
             for v in pb.SentenceSplitting.DESCRIPTOR.values if v.number]
    if sentence_splitting not in names:
        raise ValueError(f"sentence_splitting must be one of {', '.join(names)}, "
                         f"got {sentence_splitting!r}")
    request = pb.TranslateRequest(model=model or "", texts=_texts(texts),
                                  options=_options_pb(options),
                                  source_language=source_language or "",
                                  target_language=target_language or "",
                                  sentence_splitting=pb.SentenceSplitting.Value(
                                      _SPLITTING_PREFIX + sentence_splitting.upper()))
    if software is not None:
        if software.protect_placeholders is not None:
            request.protect_placeholders = software.protect_placeholders
        request.glossary = software.glossary
        request.terms.extend(pb.Term(source=a, target=b) for a, b in software.terms)
        request.do_not_translate.extend(software.do_not_translate)
    return request


def _options_pb(options: dict[str, Any]) -> pb.DecodingOptions:
    unknown = sorted(set(options) - set(_OPTION_FIELDS))
    if unknown:
        raise TypeError(f"unknown decoding options {unknown}; valid: {', '.join(_OPTION_FIELDS)}")
    # None means "the model's default", which is what leaving the field unset says.
    return pb.DecodingOptions(**{k: v for k, v in options.items() if v is not None})


def _options_dict(options: pb.DecodingOptions) -> dict[str, Any]:
    return {f.name: value for f, value in options.ListFields()}


def _hyps(hypotheses: Iterable[pb.Hypothesis], options: pb.DecodingOptions) -> list[Hyp]:
    # The server leaves unrequested extras at their zero values; None says "not asked".
    return [Hyp(h.text,
                h.score if options.return_scores else None,
                list(h.token_ids) if options.return_token_ids else None,
                list(h.alignment) if options.return_alignment else None,
                _finish_reason(h.finish_reason))
            for h in hypotheses]


def _finish_reason(value: int) -> str:
    name = pb.FinishReason.Name(value)  # FINISH_REASON_EOS -> "eos"; unset -> ""
    return "" if value == pb.FINISH_REASON_UNSPECIFIED else name[len(_FINISH_PREFIX):].lower()


# --- the shared half of `seq2serve translate` and `seq2serve summarize` ---

def add_call_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the commands that print hypotheses: the model, how to decode and
    print, where the server is."""
    add_model_arguments(parser)
    parser.add_argument("--n-best", type=int, metavar="N",
                        help="hypotheses to print per input (at most the beam size)")
    parser.add_argument("--scores", action="store_true",
                        help="print each hypothesis's score before it, tab separated")
    add_server_arguments(parser)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model name (see the server's ListModels)")
    parser.add_argument("--beam", type=int, metavar="N", help="beam size (1 = greedy)")


WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def default_target(environ: Mapping[str, str] = os.environ) -> str:
    """Where `serve` listens by the same SEQ2SERVE_HOST/SEQ2SERVE_PORT variables (a
    wildcard host is reached on loopback): the client commands find a server started
    in the same environment."""
    port = environ.get("SEQ2SERVE_PORT", "").strip()
    host = environ.get("SEQ2SERVE_HOST", "").strip()
    if host in WILDCARDS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    if not port:
        return DEFAULT_TARGET if host == "127.0.0.1" else f"{host}:{DEFAULT_TARGET.split(':')[1]}"
    return f"{host}:{port}"


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the server is, each call's deadline, how long to wait for SERVING."""
    target = default_target()
    parser.add_argument("--server", default=target, metavar="HOST:PORT",
                        help=f"the seq2serve server (default {target}, from $SEQ2SERVE_HOST "
                        "and $SEQ2SERVE_PORT when set)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="deadline per call in seconds (default none)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds for the server to report SERVING (it "
                        "may still be starting or loading models) before calling")


def add_software_arguments(parser: argparse.ArgumentParser) -> None:
    """The software-text flags of the translating commands."""
    parser.add_argument("--no-protect", dest="protect_placeholders", action="store_false",
                        default=None, help="translate placeholders and inline markup as text "
                        "(by default they are masked and restored)")
    parser.add_argument("--glossary", default="", metavar="NAME",
                        help="a glossary of the server's --glossary-dir")
    parser.add_argument("--term", action="append", default=[], metavar="SOURCE=TARGET",
                        help="translate SOURCE as TARGET (repeatable)")
    parser.add_argument("--keep", action="append", default=[], metavar="TERM",
                        help="leave TERM untranslated, e.g. a product name (repeatable)")


def software_text(args: argparse.Namespace) -> SoftwareText:
    """The flags of add_software_arguments; a --term without '=' is a usage error."""
    terms = []
    for term in args.term:
        source, sep, target = term.partition("=")
        if not sep or not source.strip() or not target.strip():
            raise ValueError(f"--term must be SOURCE=TARGET, got {term!r}")
        terms.append((source.strip(), target.strip()))
    return SoftwareText(args.protect_placeholders, args.glossary, tuple(terms),
                        tuple(args.keep))


def decoding_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"beam_size": args.beam, "num_hypotheses": args.n_best,
            "return_scores": args.scores}


def hypothesis_lines(hyps: Sequence[Hyp], n_best: bool, scores: bool) -> list[str]:
    """The best hypothesis, or with `n_best` all of them; score first when asked
    (tab separated, so `cut -f2` leaves the text)."""
    if not hyps:
        return [""]  # keeps one output line per input line
    return [f"{hyp.score:.4f}\t{hyp.text}" if scores else hyp.text
            for hyp in (hyps if n_best else hyps[:1])]


def report_rpc_error(prog: str, error: grpc.RpcError) -> int:
    """`seq2serve translate: error: INVALID_ARGUMENT: <details>` on stderr; exit status 1."""
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    status = code.name if code is not None else "UNKNOWN"
    print(f"{prog}: error: {status}: {details}", file=sys.stderr)
    return 1
