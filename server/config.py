"""`seq2serve serve` configuration: one validated dataclass from flags and environment.

Every field has a flag (`--max-batch-size`) and an environment variable
(`SEQ2SERVE_MAX_BATCH_SIZE`); a flag beats the variable, which beats the default.
Containers are configured by environment, people at a shell by flags, so both
must reach the same object. An empty variable counts as unset (`docker run -e X=`).

`validate()` reports every problem at once, each naming the field and its valid
range (vLLM / CTranslate2 style), so one failed start shows everything to fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.server.batching.scheduler import BatchLimits
from seq2serve.server.engine.options import OptionLimits

ENV_PREFIX = "SEQ2SERVE_"
PROVIDERS = ("auto", "cpu", "cuda")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_PORT = 65535
MAX_BEAM_SIZE = 128  # the widest beam max_beam_size may allow
# gRPC keeps message sizes in a signed 32-bit int.
MAX_MESSAGE_BYTES = 2**31 - 1
TLS_FILES = ("tls_cert", "tls_key", "tls_client_ca")
PATH_FIELDS = ("models_dir", *TLS_FILES)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """One or more configuration problems; `problems` lists each on its own."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid server configuration:\n  " + "\n  ".join(self.problems))


def default_models_dir() -> Path | None:
    """The `models/` folder shipped at the repository root, when there is one."""
    import seq2serve.server

    shipped = Path(seq2serve.server.__file__).resolve().parents[1] / "models"
    return shipped if shipped.is_dir() else None


def default_threads() -> int:
    """Physical cores this process may use: ONNX Runtime's intra-op threads gain
    nothing from SMT siblings, and more threads than a container's CPU quota
    only get throttled."""
    logical = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    cores: set[tuple[str, str]] = set()
    try:
        physical = ""
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "physical id":
                    physical = value.strip()
                elif key.strip() == "core id":
                    cores.add((physical, value.strip()))
    except OSError:
        pass
    per_core = max(1, logical // len(cores)) if cores else 1
    threads = max(1, usable // per_core)
    try:  # cgroup v2 quota, e.g. a Kubernetes CPU limit: "200000 100000" = 2 CPUs
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            threads = min(threads, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return threads


def _meta(help_text: str, metavar: str | None = None) -> dict[str, Any]:
    return {"help": help_text, "metavar": metavar}


@dataclass
class ServerConfig:
    models_dir: Path | None = field(default_factory=default_models_dir, metadata=_meta(
        "directory of model packages to serve: each non-hidden subdirectory holding a file "
        "is a package", "DIR"))
    serve_valid_models: bool = field(default=False, metadata=_meta(
        "start even when some package directories are broken, serving the valid ones (each "
        "broken one is logged as an error); without it a broken package stops the start"))
    host: str = field(default="0.0.0.0", metadata=_meta(
        "address the gRPC server listens on", "HOST"))
    port: int = field(default=50051, metadata=_meta("gRPC port", "PORT"))
    metrics_host: str = field(default="", metadata=_meta(
        "address of the Prometheus /metrics endpoint; empty = the same as --host", "HOST"))
    metrics_port: int = field(default=8000, metadata=_meta(
        "port of the Prometheus /metrics endpoint; 0 disables it", "PORT"))
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
    threads: int = field(default_factory=default_threads, metadata=_meta(
        "ONNX Runtime intra-op threads per model, shared out among its engines (0 = "
        "physical cores, as the runner counts them)", "N"))
    engines: int = field(default=0, metadata=_meta(
        "engines per model: each runs its own batches on its own ONNX Runtime sessions, "
        "in parallel, from the model's one queue; 0 = auto: on CPU one per thread of "
        "--threads up to 4, on CUDA 1", "N"))
    max_batch_size: int = field(default=32, metadata=_meta(
        "most source texts in one batch (1 turns batching off)", "N"))
    max_batch_tokens: int = field(default=8192, metadata=_meta(
        "most padded source tokens x beam width in one batch", "N"))
    max_queue_delay_ms: float = field(default=5.0, metadata=_meta(
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
        "largest gRPC message received or sent", "BYTES"))
    drain_delay_s: float = field(default=5.0, metadata=_meta(
        "on SIGTERM, how long health says NOT_SERVING while new calls are still served, so "
        "load balancers stop routing here before the port closes", "SECONDS"))
    grace_period_s: float = field(default=30.0, metadata=_meta(
        "after the drain delay, how long in-flight calls may take to finish", "SECONDS"))
    log_level: str = field(default="INFO", metadata=_meta(
        f"logging level: one of {', '.join(LOG_LEVELS)}", "LEVEL"))

    def problems(self) -> list[str]:
        """Every problem at once, each naming the field and its valid range."""
        out: list[str] = []
        if self.models_dir is None:
            out.append("models_dir is required (no shipped models/ folder was found): pass "
                       f"--models-dir or set {env_name('models_dir')}")
        elif not Path(self.models_dir).is_dir():
            out.append(f"models_dir must be an existing directory, got {str(self.models_dir)!r}")
        if not isinstance(self.host, str) or not self.host:
            out.append(f"host must be a non-empty address, got {self.host!r}")
        if not isinstance(self.metrics_host, str):
            out.append(f"metrics_host must be an address or empty, got {self.metrics_host!r}")
        _int_in(out, "port", self.port, 1, MAX_PORT)
        _int_in(out, "metrics_port", self.metrics_port, 0, MAX_PORT, "0 = disabled")
        if self.metrics_port and self.metrics_port == self.port:
            out.append(f"metrics_port must differ from port ({self.port}), got {self.metrics_port}")
        if self.provider not in PROVIDERS:
            out.append(f"provider must be one of {', '.join(PROVIDERS)}, got {self.provider!r}")
        _int_in(out, "threads", self.threads, 0, 1024, "0 = physical cores")
        _int_in(out, "engines", self.engines, 0, 64, "0 = auto")
        _int_in(out, "max_running_rows", self.max_running_rows, 0, None,
                "0 = request-level batching")
        _int_in(out, "max_running_beam", self.max_running_beam, 1, MAX_BEAM_SIZE)
        for name in ("max_batch_size", "max_batch_tokens", "max_queue_size", "max_cache_tokens",
                     "max_texts_per_request", "max_text_chars", "max_length_cap"):
            _int_in(out, name, getattr(self, name), 1, None)
        _int_in(out, "max_beam_size", self.max_beam_size, 1, MAX_BEAM_SIZE)
        _float_in(out, "max_queue_delay_ms", self.max_queue_delay_ms, 0.0, 60_000.0)
        _float_in(out, "drain_delay_s", self.drain_delay_s, 0.0, 3600.0)
        _float_in(out, "grace_period_s", self.grace_period_s, 0.0, 3600.0)
        _int_in(out, "max_message_bytes", self.max_message_bytes, 1024, MAX_MESSAGE_BYTES)
        if (_is_int(self.max_queue_size) and _is_int(self.max_texts_per_request)
                and 1 <= self.max_queue_size < self.max_texts_per_request):
            # Otherwise a request at the per-request cap could never be queued whole.
            out.append(f"max_queue_size must be >= max_texts_per_request "
                       f"({self.max_texts_per_request}), got {self.max_queue_size}")
        if not isinstance(self.log_level, str) or self.log_level.upper() not in LOG_LEVELS:
            out.append(f"log_level must be one of {', '.join(LOG_LEVELS)}, "
                       f"got {self.log_level!r}")
        for name in ("serve_valid_models", "reflection"):
            if not isinstance(getattr(self, name), bool):
                out.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        out.extend(self._tls_problems())
        return out

    def _tls_problems(self) -> list[str]:
        """Which files are given and whether they exist; their contents are checked
        when the server loads them (tls.py), with the same one-line messages."""
        out: list[str] = []
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else (
                "tls_key", "tls_cert")
            out.append(f"{missing} is required with {given} (TLS needs both the certificate "
                       f"and its key): pass {flag_name(missing)} or set {env_name(missing)}")
        if self.tls_client_ca is not None and self.tls_cert is None:
            out.append("tls_client_ca needs tls_cert and tls_key (mutual TLS is TLS with "
                       "client certificates)")
        for name in TLS_FILES:
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                out.append(f"{name} must be an existing file, got {str(path)!r}")
        return out

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @property
    def metrics_address(self) -> str:
        """Where /metrics binds: its own host when given, else the gRPC host."""
        return self.metrics_host or self.host

    def validate(self) -> ServerConfig:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        return self

    def batch_limits(self) -> BatchLimits:
        """What the scheduler of each model enforces."""
        return BatchLimits(max_batch_size=self.max_batch_size,
                           max_batch_tokens=self.max_batch_tokens,
                           max_queue_delay_s=self.max_queue_delay_ms / 1000.0,
                           max_queue_size=self.max_queue_size,
                           max_running_rows=self.max_running_rows,
                           max_cache_tokens=self.max_cache_tokens,
                           max_running_beam=self.max_running_beam)

    def option_limits(self) -> OptionLimits:
        """The caps `DecodingOptions.resolve()` checks requests against."""
        return OptionLimits(max_beam_size=self.max_beam_size, max_length=self.max_length_cap)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in PATH_FIELDS:
            out[name] = None if getattr(self, name) is None else str(getattr(self, name))
        return out


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field. Flags default to None so `from_args` can tell a flag
    given on the command line from one left to the environment or the default."""
    for f in dataclasses.fields(ServerConfig):
        parse = _parser_for(f.name)
        default = _default_of(f)
        if f.name == "threads":
            default = f"physical cores, here {default}"
        elif f.name == "models_dir" and default is None:
            default = "the shipped models/ folder, not found here"
        elif f.name == "metrics_host":
            default = "the --host address"
        help_text = f"{f.metadata['help']} (env {env_name(f.name)}; default {default})"
        if f.type == "bool":
            # --reflection / --no-reflection; the variable takes true/false, 1/0, yes/no.
            parser.add_argument(flag_name(f.name), dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=help_text)
            continue
        parser.add_argument(
            flag_name(f.name), dest=f.name, default=None, metavar=f.metadata["metavar"],
            type=_for_argparse(parse), help=help_text)


def from_args(args: argparse.Namespace | None = None,
              environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Flag > `SEQ2SERVE_…` variable > default, validated. Raises ConfigError
    listing bad variables and out-of-range values together."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[str] = []
    env_bad: set[str] = set()
    from_env: set[str] = set()
    for f in dataclasses.fields(ServerConfig):
        flag_value = getattr(args, f.name, None) if args is not None else None
        raw = environ.get(env_name(f.name), "")
        if flag_value is not None:
            values[f.name] = flag_value
        elif raw.strip():
            from_env.add(f.name)
            try:
                values[f.name] = _parser_for(f.name)(raw.strip())
            except ValueError as e:
                problems.append(f"{env_name(f.name)} {e}")
                env_bad.add(f.name)
    config = ServerConfig(**values)
    if isinstance(config.log_level, str):
        config.log_level = config.log_level.upper()
    # A variable that failed to parse already has its message; its default
    # standing in for it must not add a second, misleading one.
    for problem in config.problems():
        name = problem.split(" ", 1)[0]
        if name in env_bad:
            continue
        problems.append(f"{problem} (from {env_name(name)})" if name in from_env else problem)
    if problems:
        raise ConfigError(problems)
    return config


def _for_argparse(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    # argparse words a ValueError as "invalid _parse_int value"; keep ours instead.
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _parser_for(name: str) -> Callable[[str], Any]:
    kind = {f.name: f.type for f in dataclasses.fields(ServerConfig)}[name]
    if name in PATH_FIELDS:
        return Path
    if kind == "bool":
        return _parse_bool
    if kind == "int":
        return _parse_int
    if kind == "float":
        return _parse_float
    return str


def _parse_int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"must be an integer, got {text!r}") from None


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"must be true or false (1/0, yes/no, on/off), got {text!r}")


def _parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {text!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(out: list[str], name: str, value: Any, low: int, high: int | None,
            note: str | None = None) -> None:
    extra = f" ({note})" if note else ""
    if high is None:
        ok, rng = _is_int(value) and value >= low, f"must be >= {low}"
    else:
        ok, rng = _is_int(value) and low <= value <= high, f"must be in [{low}, {high}]"
    if not ok:
        out.append(f"{name} {rng}{extra}, got {value!r}")


def _float_in(out: list[str], name: str, value: Any, low: float, high: float) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and low <= value <= high):
        out.append(f"{name} must be in [{low:g}, {high:g}], got {value!r}")
