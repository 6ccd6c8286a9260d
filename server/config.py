"""`seq2serve serve` configuration: one validated dataclass from flags and environment.

Every field has a flag (`--max-batch-size`) and an environment variable
(`SEQ2SERVE_MAX_BATCH_SIZE`); a flag beats the variable, which beats the default.
Containers are configured by environment, people at a shell by flags, so both
must reach the same object. An empty variable counts as unset (`docker run -e X=`).
How settings are read is settings.py's; the document limits are declared in
document_settings.py, which `seq2serve translate-file` reads with too.

`validate()` reports every problem at once, each a `Problem` naming the field
and its valid range (vLLM / CTranslate2 style), so one failed start shows
everything to fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.model.package.session import ARENA_STRATEGIES, CudaSettings
from seq2serve.server import settings
from seq2serve.server.document_settings import DocumentLimitSettings, declared
from seq2serve.server.problems import Problem, float_problem, int_problem, is_int
from seq2serve.server.resources import PROVIDERS, Provider, usable_cores
from seq2serve.server.settings import ENV_PREFIX, SettingsError, env_name, flag_name
from seq2serve.server.settings import meta as _meta

__all__ = ["ENV_PREFIX", "ConfigError", "ServerConfig", "add_arguments", "env_name",
           "flag_name", "from_args", "setting_names"]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_PORT = 65535
MAX_BEAM_SIZE = 128  # the widest beam max_beam_size may allow
# gRPC keeps message sizes in a signed 32-bit int.
MAX_MESSAGE_BYTES = 2**31 - 1
TLS_FILES = ("tls_cert", "tls_key", "tls_client_ca")
# DeepL usage counts (core/usage.py): the counting periods, the latest reset day every
# month has, and how often the counts file is written (a crash loses at most that).
USAGE_PERIODS = ("never", "monthly")
USAGE_MAX_RESET_DAY = 28
USAGE_FLUSH_INTERVAL_S = 1.0
PATH_FIELDS = ("models_dir", "api_keys", "admin_keys", "glossary_dir", "glossary_store",
               "jobs_dir", "usage_file", *TLS_FILES)
# Settings a flag may repeat, each time adding to a comma-separated list.
REPEATED_FIELDS = ("prefer_model",)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(SettingsError):
    """One or more configuration problems; `problems` lists each on its own."""

    title = "invalid server configuration"


def default_models_dir() -> Path | None:
    """The `models/` folder shipped at the repository root, when there is one."""
    import seq2serve.server

    shipped = Path(seq2serve.server.__file__).resolve().parents[1] / "models"
    return shipped if shipped.is_dir() else None


@dataclass
class ServerConfig:
    models_dir: Path | None = field(default_factory=default_models_dir, metadata=_meta(
        "directory of model packages to serve: each non-hidden subdirectory holding a file "
        "is a package", "DIR"))
    serve_valid_models: bool = field(default=False, metadata=_meta(
        "start even when some package directories are broken, serving the valid ones (each "
        "broken one is logged as an error); without it a broken package stops the start"))
    load_only: str = field(default="", metadata=_meta(
        "serve only these packages: comma-separated model names, or language codes (as "
        "LibreTranslate's LT_LOAD_ONLY) choosing the translation packages whose languages "
        "are all among them (summarizers of them too); empty = every package", "NAMES"))
    lazy: bool = field(default=False, metadata=_meta(
        "find and verify the packages at start (manifest, files, hashes) but load each "
        "at its first request, which waits while it loads (--load-wait-s)"))
    load_wait_s: float = field(default=60.0, metadata=_meta(
        "longest a request waits for its model to load; past it: UNAVAILABLE / 503 with "
        "Retry-After (other models answer meanwhile)", "SECONDS"))
    max_model_memory: int = field(default=0, metadata=_meta(
        "bytes the loaded models may hold, by each package's cost (its graphs, tokenizer "
        "and engines; ListModels shows it): loading past it unloads the least recently "
        "used idle models, and is refused (RESOURCE_EXHAUSTED / 503) when the models "
        "holding it are busy; 0 = no budget", "BYTES"))
    max_device_memory: int = field(default=0, metadata=_meta(
        "bytes the loaded models may hold on the device (--device-id), for models on a "
        "device (--provider cuda, or the CPU emulating one: --emulate-device), by each "
        "model's device cost (its graphs' weights and its engines' buffers; not the "
        "decoding's caches, which --gpu-mem-limit-mb bounds): kept as --max-model-memory "
        "is, least recently used idle models unloaded first; 0 = no budget", "BYTES"))
    admin_keys: Path | None = field(default=None, metadata=_meta(
        "keys of the model-control calls (LoadModel, UnloadModel; POST /v1/models/NAME/"
        "load and /unload), one per line, separate from --api-keys; without it the "
        "control calls are refused", "FILE"))
    poll_models_s: float = field(default=0.0, metadata=_meta(
        "rescan --models-dir this often: new packages are served, removed or changed ones "
        "unloaded once their requests finish; 0 = only at start and on LoadModel of an "
        "unknown name", "SECONDS"))
    prefer_multilingual: bool = field(default=False, metadata=_meta(
        "where a multilingual model (NLLB-200, M2M100, mBART-50) and a model of one pair "
        "both serve a pair, the multilingual one serves it (default: the one-pair model)"))
    prefer_model: str = field(default="", metadata=_meta(
        "where several models of the preferred kind (--prefer-multilingual) serve a pair, "
        "this one serves it; repeat the flag (or comma-separate the names) for an order, "
        "the first named first; otherwise a model that has both codes exactly, then the "
        "first by name", "NAME"))
    host: str = field(default="0.0.0.0", metadata=_meta(
        "address the gRPC server listens on", "HOST"))
    port: int = field(default=50051, metadata=_meta("gRPC port", "PORT"))
    metrics_host: str = field(default="", metadata=_meta(
        "address of the Prometheus /metrics endpoint; empty = the same as --host", "HOST"))
    metrics_port: int = field(default=8000, metadata=_meta(
        "port of the Prometheus /metrics endpoint; 0 disables it", "PORT"))
    http_port: int = field(default=5000, metadata=_meta(
        "port of the HTTP front door on --host (LibreTranslate's API, the .proto's JSON, "
        "the translation page); 0 disables it", "PORT"))
    http_timeout_s: float = field(default=120.0, metadata=_meta(
        "longest an HTTP request may take, queue included (a stream: until its first "
        "event): past it the work leaves the queue and its batch and the client gets 504 "
        "(HTTP has no deadline of its own, as a gRPC call has); 0 = no limit", "SECONDS"))
    cache_mb: float = field(default=64.0, metadata=_meta(
        "exact response cache shared by both front doors, in MiB (a text's answer never "
        "depends on its batch, so a hit is the same answer bit for bit); 0 disables it",
        "MIB"))
    api_keys: Path | None = field(default=None, metadata=_meta(
        "HTTP API keys, one per line (# comments); a request with a key not in the file "
        "gets 403; without this file a request's key is ignored, as LibreTranslate does",
        "FILE"))
    glossary_dir: Path | None = field(default=None, metadata=_meta(
        "named glossaries a request chooses with its glossary field: NAME.tsv (source<TAB>"
        "target per line; a source alone is never translated), NAME.SRC-TGT.tsv for one "
        "language pair, or NAME.tbx (TBX)", "DIR"))
    glossary_store: Path | None = field(default=None, metadata=_meta(
        "where glossaries created through DeepL's API (/v2/glossaries) are kept, so they "
        "survive a restart (created if missing); unset: a temporary directory, emptied "
        "when the server stops", "DIR"))
    # DeepL's /v2/usage and its 456 quota (core/usage.py).
    usage_file: Path | None = field(default=None, metadata=_meta(
        "file keeping the characters each DeepL API key has used, so a restart neither "
        "forgets nor resets them (callers without a key are counted in memory only; "
        f"written at most every {USAGE_FLUSH_INTERVAL_S:g}s and at stop: a crash loses at "
        "most that last interval's counts; one file per server, its folder must exist); "
        "unset: counted in memory, "
        "from 0 at each start", "FILE"))
    usage_period: str = field(default="never", metadata=_meta(
        "when DeepL usage counts start again at 0: never, or monthly (on --usage-reset-"
        "day, UTC), as DeepL's billing period", "PERIOD"))
    usage_reset_day: int = field(default=1, metadata=_meta(
        f"day of the month (1-{USAGE_MAX_RESET_DAY}) a monthly --usage-period begins", "DAY"))
    require_api_key: bool = field(default=False, metadata=_meta(
        "HTTP requests without a key get 400, as LibreTranslate answers them (needs "
        "--api-keys)"))
    rate_limit: int = field(default=0, metadata=_meta(
        "HTTP requests per minute per API key, or per client address without one (a list "
        "of texts costs its length; moving window); 0 = unlimited", "N"))
    trusted_proxies: str = field(default="", metadata=_meta(
        "comma-separated networks (CIDR) of proxies whose X-Forwarded-For names the HTTP "
        "client; empty = the peer address is the client", "CIDRS"))
    cors_origins: str = field(default="*", metadata=_meta(
        "comma-separated origins allowed to call the HTTP API from a browser (* = any, as "
        "LibreTranslate)", "ORIGINS"))
    tls_cert: Path | None = field(default=None, metadata=_meta(
        "PEM certificate chain of the gRPC server; with --tls-key, gRPC is served over TLS "
        "only", "FILE"))
    tls_key: Path | None = field(default=None, metadata=_meta(
        "PEM private key of --tls-cert", "FILE"))
    tls_client_ca: Path | None = field(default=None, metadata=_meta(
        "PEM CA bundle: clients must present a certificate it signed (mutual TLS)", "FILE"))
    reflection: bool = field(default=True, metadata=_meta(
        "serve gRPC reflection (lists the services and their messages to any client)"))
    provider: str = field(default="auto", metadata=_meta(
        "ONNX Runtime execution provider: auto (CUDA when available), cpu or cuda", "NAME"))
    allow_cpu_nodes: bool = field(default=False, metadata=_meta(
        "with a device provider (cuda), serve a package even where the provider has no "
        "kernel for some of its nodes (`seq2serve check-package`): ONNX Runtime runs those "
        "on the CPU, with copies around each, and each is logged as a warning; without it "
        "such a package is refused, naming the nodes and the precision to export instead"))
    device_id: int = field(default=0, metadata=_meta(
        "the CUDA device the sessions run on (--provider cuda)", "N"))
    gpu_mem_limit_mb: int = field(default=0, metadata=_meta(
        "the most MiB the CUDA arena may hold; 0 = no limit", "MIB"))
    arena_extend_strategy: str = field(default="next_power_of_two", metadata=_meta(
        f"how the CUDA arena grows: {' or '.join(ARENA_STRATEGIES)} (ONNX Runtime's "
        "kNextPowerOfTwo, kSameAsRequested)", "NAME"))
    shared_arena: bool = field(default=True, metadata=_meta(
        "one CUDA arena per device for every session of the process (ONNX Runtime's "
        "environment allocator), not one per session of each engine of each model"))
    allow_tf32: bool = field(default=False, metadata=_meta(
        "let fp32 packages' MatMuls run in TF32 on CUDA (Ampere and later; faster, about "
        "3 decimal digits): off, fp32 computes fp32 as on the CPU"))
    emulate_device: bool = field(default=False, metadata=_meta(
        "for tests, on the CPU provider: the CPU takes every branch a GPU device takes "
        "(tensors kept apart "
        "from the host, log-probs reduced to candidates in a graph) and counts the bytes "
        "that would cross (seq2serve_host_device_bytes_total); slower than plain CPU"))
    threads: int = field(default_factory=usable_cores, metadata=_meta(
        "ONNX Runtime intra-op threads per model, shared out among its engines (0 = "
        "the usable cores: the physical cores of the CPU affinity mask, within the cgroup "
        "CPU quota)", "N"))
    engines: int = field(default=0, metadata=_meta(
        "engines per model: each runs its own batches on its own ONNX Runtime sessions, "
        "in parallel, from the model's one queue; 0 = auto: on CPU one per thread of "
        "--threads up to 4, on CUDA 1", "N"))
    max_batch_size: int = field(default=32, metadata=_meta(
        "most source texts in one batch (1 turns batching off)", "N"))
    max_batch_tokens: int = field(default=8192, metadata=_meta(
        "most padded source tokens x beam width in one batch", "N"))
    # 0: an idle engine takes what is queued at once. Under load the queue fills
    # while the engines run, so batches form anyway; waiting only delays a lone
    # text. Measured (docs/benchmarks.md, "No queue delay"): beam 4, 1 client,
    # p50 34-35 ms instead of 41-43 ms; 32 clients, requests/s within the noise.
    max_queue_delay_ms: float = field(default=0.0, metadata=_meta(
        "longest wait for more work after the oldest queued text arrived", "MS"))
    # Measured on 2 CPU cores (docs/benchmarks.md, "Iteration-level by default for
    # greedy and sampling"): iteration-level serves greedy 1.1-1.3x request-level's
    # throughput with a 2.5-5x lower time to first token, but beam 4 (the shipped
    # models' default decoding) 0.8-1.0x with a 1.3-2.5x higher p99; so it is on for
    # beam width 1 and wider beams run request-level batches.
    max_running_rows: int = field(default=256, metadata=_meta(
        "iteration-level batching: most decoder rows (texts x beam width) in the running "
        "batch, which queued texts join at every decoder step while they fit; 0 = "
        "request-level batches for every decoding, each run to its end", "N"))
    max_running_beam: int = field(default=1, metadata=_meta(
        "iteration-level batching for beam widths up to this (1: greedy and sampling); "
        "wider beams run request-level batches", "N"))
    max_cache_tokens: int = field(default=131072, metadata=_meta(
        "iteration-level batching: most self-attention cache slots the running batch may "
        "reach (rows x the longest output limit among them)", "N"))
    # Measured on 2 CPU cores (docs/benchmarks.md, "Batch-mates of similar length"):
    # beam 4 on mixed traffic, 96 clients: +8.5% requests/s (median of 3), p99 +10%.
    batch_similar_lengths: bool = field(default=True, metadata=_meta(
        "a new batch takes, after the oldest queued text, the queued texts whose source "
        "lengths are nearest its own (false: the next ones in arrival order)"))
    max_queue_size: int = field(default=1024, metadata=_meta(
        "queued texts per model before requests get RESOURCE_EXHAUSTED", "N"))
    max_texts_per_request: int = field(default=64, metadata=_meta(
        "most texts in one request", "N"))
    max_text_chars: int = field(default=10000, metadata=_meta(
        "most characters in one text", "N"))
    max_beam_size: int = field(default=16, metadata=_meta("largest beam_size accepted", "N"))
    max_length_cap: int = field(default=512, metadata=_meta(
        "largest max_length (new tokens) accepted", "N"))
    max_message_bytes: int = field(default=4 * 1024 * 1024, metadata=_meta(
        "largest gRPC message received or sent, and largest HTTP body (except a "
        "/translate_file upload's: --max-document-bytes)", "BYTES"))
    # The limits on one file of /translate_file and the document jobs, declared in
    # document_settings.py (which translate-file reads with too). Past one: HTTP 413.
    max_document_bytes: int = declared("max_document_bytes")
    max_document_members: int = declared("max_document_members")
    max_document_unpacked_bytes: int = declared("max_document_unpacked_bytes")
    max_document_elements: int = declared("max_document_elements")
    max_document_characters: int = declared("max_document_characters")
    max_document_paragraphs: int = declared("max_document_paragraphs")
    max_documents_in_flight: int = field(default=4, metadata=_meta(
        "most document jobs (/translate_file, /v1/jobs, DeepL's /v2/document) read or "
        "translated at once (each holds up to about 100 MB while read); the others wait "
        "in the jobs queue", "N"))
    # Documents are jobs whose state is on disk (core/documents/jobs.py): a restart runs
    # the jobs in progress again from their uploads.
    jobs_dir: Path | None = field(default=None, metadata=_meta(
        "folder of the document jobs (each job's upload, state and output), so that a "
        "restart loses none; one folder per server; empty = a temporary folder removed at "
        "stop (jobs do not survive a restart)", "DIR"))
    job_ttl_s: float = field(default=3600.0, metadata=_meta(
        "how long a document job is kept after it ended (its translated file downloadable, "
        "its state answered)", "SECONDS"))
    jobs_max_bytes: int = field(default=1024 * 1024 * 1024, metadata=_meta(
        "most bytes the jobs folder may hold (uploads, room for their outputs, outputs "
        "until they expire); a document past it: HTTP 429 until jobs end or expire",
        "BYTES"))
    drain_delay_s: float = field(default=5.0, metadata=_meta(
        "on SIGTERM, how long health says NOT_SERVING while new calls are still served, so "
        "load balancers stop routing here before the port closes", "SECONDS"))
    grace_period_s: float = field(default=30.0, metadata=_meta(
        "after the drain delay, how long in-flight calls may take to finish", "SECONDS"))
    log_level: str = field(default="INFO", metadata=_meta(
        f"logging level: one of {', '.join(LOG_LEVELS)}", "LEVEL"))

    def problems(self) -> list[Problem]:
        """Every problem at once, each naming the field and its valid range."""
        found = [
            self._models_dir_problem(),
            _text_problem("host", self.host, "a non-empty address", allow_empty=False),
            _text_problem("metrics_host", self.metrics_host, "an address or empty"),
            int_problem("port", self.port, 1, MAX_PORT),
            int_problem("metrics_port", self.metrics_port, 0, MAX_PORT, note="0 = disabled"),
            self._metrics_port_clash(),
            int_problem("http_port", self.http_port, 0, MAX_PORT, note="0 = disabled"),
            self._http_port_clash(),
            float_problem("cache_mb", self.cache_mb, 0.0, 1_048_576.0),
            int_problem("rate_limit", self.rate_limit, 0, note="0 = unlimited"),
            self._trusted_proxies_problem(),
            self._prefer_model_problem(),
            self._api_keys_problem(),
            self._usage_file_problem(),
            _choice_problem("usage_period", self.usage_period, USAGE_PERIODS),
            int_problem("usage_reset_day", self.usage_reset_day, 1, USAGE_MAX_RESET_DAY),
            self._usage_reset_day_problem(),
            _text_problem("load_only", self.load_only, "model names or language codes, "
                          "comma-separated"),
            float_problem("load_wait_s", self.load_wait_s, 0.0, 86400.0),
            int_problem("max_model_memory", self.max_model_memory, 0, note="0 = no budget"),
            int_problem("max_device_memory", self.max_device_memory, 0, note="0 = no budget"),
            self._device_budget_problem(),
            float_problem("poll_models_s", self.poll_models_s, 0.0, 86400.0),
            self._admin_keys_problem(),
            self._glossary_dir_problem(),
            _choice_problem("provider", self.provider, PROVIDERS),
            int_problem("device_id", self.device_id, 0, 1023),
            int_problem("gpu_mem_limit_mb", self.gpu_mem_limit_mb, 0, note="0 = no limit"),
            _choice_problem("arena_extend_strategy", self.arena_extend_strategy,
                            tuple(ARENA_STRATEGIES)),
            int_problem("threads", self.threads, 0, 1024, note="0 = the usable cores"),
            int_problem("engines", self.engines, 0, 64, note="0 = auto"),
            int_problem("max_running_rows", self.max_running_rows, 0,
                        note="0 = request-level batching"),
            int_problem("max_running_beam", self.max_running_beam, 1, MAX_BEAM_SIZE),
            *(int_problem(name, getattr(self, name), 1) for name in (
                "max_batch_size", "max_batch_tokens", "max_queue_size", "max_cache_tokens",
                "max_texts_per_request", "max_text_chars", "max_length_cap")),
            *self.document_limits().problems(),
            *(int_problem(name, getattr(self, name), 1)
              for name in ("max_documents_in_flight", "jobs_max_bytes")),
            float_problem("job_ttl_s", self.job_ttl_s, 1.0, 7 * 86400.0),
            self._jobs_dir_problem(),
            int_problem("max_beam_size", self.max_beam_size, 1, MAX_BEAM_SIZE),
            float_problem("max_queue_delay_ms", self.max_queue_delay_ms, 0.0, 60_000.0),
            float_problem("drain_delay_s", self.drain_delay_s, 0.0, 3600.0),
            float_problem("grace_period_s", self.grace_period_s, 0.0, 3600.0),
            float_problem("http_timeout_s", self.http_timeout_s, 0.0, 86400.0),
            int_problem("max_message_bytes", self.max_message_bytes, 1024, MAX_MESSAGE_BYTES),
            self._queue_fits_a_request(),
            _choice_problem("log_level", self.log_level, LOG_LEVELS, upper=True),
            *(_bool_problem(name, getattr(self, name))
              for name in ("serve_valid_models", "reflection", "require_api_key",
                           "batch_similar_lengths", "lazy", "allow_cpu_nodes",
                           "shared_arena", "allow_tf32")),
            *self._tls_problems(),
        ]
        return [p for p in found if p is not None]

    def _models_dir_problem(self) -> Problem | None:
        if self.models_dir is None:
            return Problem("models_dir", "models_dir is required (no shipped models/ folder "
                           f"was found): pass --models-dir or set {env_name('models_dir')}")
        if not Path(self.models_dir).is_dir():
            return Problem("models_dir", "models_dir must be an existing directory, got "
                           f"{str(self.models_dir)!r}")
        return None

    def _device_budget_problem(self) -> Problem | None:
        """A device budget on a server that runs every model on the host is a mistake
        (with --provider auto the device is known only when the models load: the
        assembly warns there)."""
        if (is_int(self.max_device_memory) and self.max_device_memory > 0
                and self.provider == Provider.CPU and not self.emulate_device):
            return Problem("max_device_memory", "max_device_memory applies to models on a "
                           "device (--provider cuda, or auto where CUDA is found, or "
                           "--emulate-device); with --provider cpu no model is on one: set "
                           "--max-model-memory for host memory, or 0 here, got "
                           f"{self.max_device_memory!r}")
        return None

    def _metrics_port_clash(self) -> Problem | None:
        if self.metrics_port and self.metrics_port == self.port:
            return Problem("metrics_port", f"metrics_port must differ from port ({self.port}), "
                           f"got {self.metrics_port}")
        return None

    def _http_port_clash(self) -> Problem | None:
        if self.http_port and self.http_port in (self.port, self.metrics_port):
            return Problem("http_port", f"http_port must differ from port ({self.port}) and "
                           f"metrics_port ({self.metrics_port}), got {self.http_port}")
        return None

    def _trusted_proxies_problem(self) -> Problem | None:
        try:
            self.trusted_networks()
        except ValueError as e:
            return Problem("trusted_proxies", "trusted_proxies must be comma-separated "
                           f"networks such as 10.0.0.0/8: {e}")
        return None

    def preferred_models(self) -> tuple[str, ...]:
        """--prefer-model's names, in order."""
        return tuple(name.strip() for name in self.prefer_model.split(",") if name.strip())

    def _prefer_model_problem(self) -> Problem | None:
        wrong = _text_problem("prefer_model", self.prefer_model, "model names, comma-separated")
        if wrong is not None:
            return wrong
        names = self.preferred_models()
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            return Problem("prefer_model", f"prefer_model must name each model once, got "
                           f"{', '.join(twice)} more than once")
        return None

    def _api_keys_problem(self) -> Problem | None:
        if self.api_keys is not None and not Path(self.api_keys).is_file():
            return Problem("api_keys", f"api_keys must be an existing file, got "
                           f"{str(self.api_keys)!r}")
        if self.require_api_key is True and self.api_keys is None:
            return Problem("require_api_key", "require_api_key needs api_keys (a file of keys)")
        return None

    def _usage_reset_day_problem(self) -> Problem | None:
        """A reset day with no monthly period would be ignored: said, not silent."""
        if self.usage_reset_day != 1 and self.usage_period != "monthly":
            return Problem("usage_reset_day", f"usage_reset_day applies only to "
                           f"usage_period monthly (got usage_reset_day "
                           f"{self.usage_reset_day} with usage_period {self.usage_period!r})")
        return None

    def _usage_file_problem(self) -> Problem | None:
        if self.usage_file is None:
            return None
        path = Path(self.usage_file)
        if self.http_port == 0:  # the counts are DeepL's API's, which only HTTP serves
            return Problem("usage_file", "usage_file needs the HTTP front door (DeepL's "
                           "API); http_port is 0 (disabled)")
        if path.is_dir():
            return Problem("usage_file", f"usage_file must be a file (created if missing), "
                           f"got the directory {str(path)!r}")
        if not path.parent.is_dir():
            return Problem("usage_file", f"usage_file's folder must exist, got "
                           f"{str(path)!r}")
        return None

    def load_only_names(self) -> tuple[str, ...]:
        """--load-only's names (models or language codes), in order."""
        return tuple(name.strip() for name in self.load_only.split(",") if name.strip())

    def _admin_keys_problem(self) -> Problem | None:
        if self.admin_keys is not None and not Path(self.admin_keys).is_file():
            return Problem("admin_keys", f"admin_keys must be an existing file, got "
                           f"{str(self.admin_keys)!r}")
        return None

    def _glossary_dir_problem(self) -> Problem | None:
        if self.glossary_dir is None:
            return None
        if not Path(self.glossary_dir).is_dir():
            return Problem("glossary_dir", "glossary_dir must be an existing directory, got "
                           f"{str(self.glossary_dir)!r}")
        return None  # its files are read once, at start-up (app.py): a broken one stops it

    def _jobs_dir_problem(self) -> Problem | None:
        if self.jobs_dir is not None and Path(self.jobs_dir).exists() and \
                not Path(self.jobs_dir).is_dir():
            return Problem("jobs_dir", "jobs_dir must be a directory (made if missing), got "
                           f"{str(self.jobs_dir)!r}")
        return None

    def trusted_networks(self) -> tuple[Network, ...]:
        return tuple(ipaddress.ip_network(spec.strip(), strict=False)
                     for spec in self.trusted_proxies.split(",") if spec.strip())

    def _queue_fits_a_request(self) -> Problem | None:
        # Otherwise a request at the per-request cap could never be queued whole.
        if (is_int(self.max_queue_size) and is_int(self.max_texts_per_request)
                and 1 <= self.max_queue_size < self.max_texts_per_request):
            return Problem("max_queue_size", "max_queue_size must be >= max_texts_per_request "
                           f"({self.max_texts_per_request}), got {self.max_queue_size}")
        return None

    def _tls_problems(self) -> list[Problem]:
        """Which files are given and whether they exist; their contents are checked
        when the server loads them (tls.py), with the same one-line messages."""
        out: list[Problem] = []
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else (
                "tls_key", "tls_cert")
            out.append(Problem(missing, f"{missing} is required with {given} (TLS needs both "
                               f"the certificate and its key): pass {flag_name(missing)} or "
                               f"set {env_name(missing)}"))
        if self.tls_client_ca is not None and self.tls_cert is None:
            out.append(Problem("tls_client_ca", "tls_client_ca needs tls_cert and tls_key "
                               "(mutual TLS is TLS with client certificates)"))
        for name in TLS_FILES:
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                out.append(Problem(name, f"{name} must be an existing file, got {str(path)!r}"))
        return out

    def document_limits(self) -> DocumentLimitSettings:
        """What one file of /translate_file or a document job may hold."""
        return DocumentLimitSettings.of(self)

    def cuda_settings(self) -> CudaSettings:
        """The CUDA provider's session settings of this config."""
        return CudaSettings(allow_tf32=self.allow_tf32, gpu_mem_limit=self.gpu_mem_limit_mb * 2**20,
                            arena_extend_strategy=self.arena_extend_strategy,
                            shared_arena=self.shared_arena)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @property
    def metrics_address(self) -> str:
        """Where /metrics binds: its own host when given, else the gRPC host."""
        return self.metrics_host or self.host

    def validate(self) -> ServerConfig:
        """This config, or ConfigError listing every problem."""
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        return self

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in PATH_FIELDS:
            out[name] = None if getattr(self, name) is None else str(getattr(self, name))
        return out


def setting_names(name: str) -> str:
    """How an operator sets the field `name`, for a message about a limit it imposes:
    "the server's --max-text-chars (SEQ2SERVE_MAX_TEXT_CHARS)"."""
    return f"the server's {flag_name(name)} ({env_name(name)})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field (settings.py)."""
    settings.add_arguments(parser, dataclasses.fields(ServerConfig), _parser_for,
                           default_text=_default_text, repeated=REPEATED_FIELDS)


def from_args(args: argparse.Namespace | None = None,
              environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flag > `SEQ2SERVE_…` variable > default, validated. Raises ConfigError
    listing bad variables and out-of-range values together."""
    got = settings.read(dataclasses.fields(ServerConfig), args,
                        os.environ if environ is None else environ, _parser_for)
    config = ServerConfig(**got.values)
    if isinstance(config.log_level, str):
        config.log_level = config.log_level.upper()
    problems = got.all_problems(config.problems())
    if problems:
        raise ConfigError(problems)
    return config


def _default_text(f: dataclasses.Field[Any]) -> Any:
    default = settings.default_of(f)
    if f.name == "threads":
        return f"the usable cores, here {default}"
    if f.name == "models_dir" and default is None:
        return "the shipped models/ folder, not found here"
    if f.name == "metrics_host":
        return "the --host address"
    return default


def _parser_for(f: dataclasses.Field[Any]) -> Callable[[str], Any]:
    return settings.parser_for(f, PATH_FIELDS)


def _text_problem(name: str, value: object, what: str,
                  allow_empty: bool = True) -> Problem | None:
    if isinstance(value, str) and (allow_empty or value):
        return None
    return Problem(name, f"{name} must be {what}, got {value!r}")


def _choice_problem(name: str, value: object, choices: tuple[str, ...],
                    upper: bool = False) -> Problem | None:
    if isinstance(value, str) and (value.upper() if upper else value) in choices:
        return None
    return Problem(name, f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _bool_problem(name: str, value: object) -> Problem | None:
    if isinstance(value, bool):
        return None
    return Problem(name, f"{name} must be true or false, got {value!r}")
