"""ServerConfig: flag > SEQ2SERVE_ variable > default, and errors that name field and range."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import seq2serve.server
from seq2serve.server import config as cfg
from seq2serve.server.app import document_limits
from seq2serve.server.assembly import batch_limits, option_limits
from seq2serve.server.config import ConfigError, ServerConfig
from seq2serve.server.core.documents import DEFAULT_LIMITS, Limits
from seq2serve.server.core.documents.limits import DEFAULT_IN_FLIGHT
from seq2serve.server.core.residency import Resource
from seq2serve.server.problems import Problem
from seq2serve.server.resources import usable_cores


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seq2serve serve")
    cfg.add_arguments(p)
    return p


def load(argv: list[str], env: dict[str, str]) -> ServerConfig:
    return cfg.from_args(parser().parse_args(argv), env)


def test_defaults(tmp_path: Path) -> None:
    c = load(["--models-dir", str(tmp_path)], {})
    assert (c.host, c.port, c.metrics_port, c.provider) == ("0.0.0.0", 50051, 8000, "auto")
    assert (c.max_batch_size, c.max_batch_tokens, c.max_queue_delay_ms) == (32, 8192, 0.0)
    assert (c.max_queue_size, c.max_texts_per_request, c.max_text_chars) == (1024, 64, 10000)
    assert (c.max_beam_size, c.max_length_cap, c.grace_period_s) == (16, 512, 30.0)
    assert (c.drain_delay_s, c.metrics_host, c.metrics_address) == (5.0, "", "0.0.0.0")
    assert (c.reflection, c.serve_valid_models, c.tls) == (True, False, False)
    assert c.max_message_bytes == 4 * 1024 * 1024 and c.log_level == "INFO"
    assert c.threads >= 1 and c.threads == usable_cores()
    # iteration-level batching for greedy and sampling, request-level for beams
    assert (c.max_running_rows, c.max_running_beam) == (256, 1)
    assert batch_limits(c).iterates(1) and not batch_limits(c).iterates(2)


def test_default_models_dir_is_the_shipped_folder() -> None:
    shipped = Path(seq2serve.server.__file__).resolve().parents[1] / "models"
    assert cfg.default_models_dir() == (shipped if shipped.is_dir() else None)
    assert ServerConfig().models_dir == cfg.default_models_dir()


def test_flag_beats_env_beats_default(tmp_path: Path) -> None:
    env_dir, flag_dir = tmp_path / "env", tmp_path / "flag"
    env_dir.mkdir()
    flag_dir.mkdir()
    env = {"SEQ2SERVE_MODELS_DIR": str(env_dir), "SEQ2SERVE_PORT": "6000",
           "SEQ2SERVE_MAX_QUEUE_DELAY_MS": "2.5", "SEQ2SERVE_LOG_LEVEL": "debug"}
    c = load([], env)
    assert (c.models_dir, c.port, c.max_queue_delay_ms, c.log_level) == (
        env_dir, 6000, 2.5, "DEBUG")
    assert c.metrics_port == 8000  # neither given: the default
    c = load(["--models-dir", str(flag_dir), "--port", "7000"], env)
    assert (c.models_dir, c.port, c.max_queue_delay_ms) == (flag_dir, 7000, 2.5)


def test_empty_env_counts_as_unset(tmp_path: Path) -> None:
    c = load(["--models-dir", str(tmp_path)], {"SEQ2SERVE_PORT": "", "SEQ2SERVE_HOST": " "})
    assert (c.port, c.host) == (50051, "0.0.0.0")


def test_bad_env_value_names_the_variable(tmp_path: Path) -> None:
    env = {"SEQ2SERVE_PORT": "fifty", "SEQ2SERVE_MAX_QUEUE_DELAY_MS": "inf",
           "SEQ2SERVE_MAX_BATCH_SIZE": "0"}
    with pytest.raises(ConfigError) as e:
        load(["--models-dir", str(tmp_path)], env)
    assert e.value.messages == [
        "SEQ2SERVE_PORT must be an integer, got 'fifty'",
        "SEQ2SERVE_MAX_QUEUE_DELAY_MS must be a finite number, got 'inf'",
        "max_batch_size must be >= 1, got 0 (from SEQ2SERVE_MAX_BATCH_SIZE)",
    ]
    # Each problem names its field: no parsing of the message needed.
    assert [p.field for p in e.value.problems] == ["port", "max_queue_delay_ms",
                                                   "max_batch_size"]


def test_bad_flag_value_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--port", "x"])
    assert "argument --port: must be an integer, got 'x'" in capsys.readouterr().err


def test_every_flag_names_its_env_var_and_default() -> None:
    text = " ".join(parser().format_help().split())
    for f in cfg.dataclasses.fields(ServerConfig):
        assert cfg.flag_name(f.name) in text
        assert f"(env {cfg.env_name(f.name)}; default" in text


BAD = {
    "port": (0, "port must be in [1, 65535], got 0"),
    "metrics_port": (70000, "metrics_port must be in [0, 65535] (0 = disabled), got 70000"),
    "provider": ("tpu", "provider must be one of auto, cpu, cuda, got 'tpu'"),
    "threads": (-1, "threads must be in [0, 1024] (0 = the usable cores), got -1"),
    "max_model_memory": (-1, "max_model_memory must be >= 0 (0 = no budget), got -1"),
    "max_device_memory": (-1, "max_device_memory must be >= 0 (0 = no budget), got -1"),
    "max_batch_size": (0, "max_batch_size must be >= 1, got 0"),
    "max_batch_tokens": (0, "max_batch_tokens must be >= 1, got 0"),
    "max_queue_delay_ms": (-1.0, "max_queue_delay_ms must be in [0, 60000], got -1.0"),
    "max_queue_size": (0, "max_queue_size must be >= 1, got 0"),
    "max_texts_per_request": (0, "max_texts_per_request must be >= 1, got 0"),
    "max_text_chars": (0, "max_text_chars must be >= 1, got 0"),
    "max_beam_size": (129, "max_beam_size must be in [1, 128], got 129"),
    "max_length_cap": (0, "max_length_cap must be >= 1, got 0"),
    "max_message_bytes": (10, "max_message_bytes must be in [1024, 2147483647], got 10"),
    "max_document_bytes": (0, "max_document_bytes must be >= 1, got 0"),
    "max_document_members": (0, "max_document_members must be >= 1, got 0"),
    "max_document_elements": (0, "max_document_elements must be >= 1, got 0"),
    "max_documents_in_flight": (0, "max_documents_in_flight must be >= 1, got 0"),
    "max_document_unpacked_bytes": (0, "max_document_unpacked_bytes must be >= 1, got 0"),
    "max_document_characters": (-1, "max_document_characters must be >= 1, got -1"),
    "max_document_paragraphs": (0, "max_document_paragraphs must be >= 1, got 0"),
    "jobs_max_bytes": (0, "jobs_max_bytes must be >= 1, got 0"),
    "job_ttl_s": (0.5, "job_ttl_s must be in [1, 604800], got 0.5"),
    "grace_period_s": (-5.0, "grace_period_s must be in [0, 3600], got -5.0"),
    "drain_delay_s": (3601.0, "drain_delay_s must be in [0, 3600], got 3601.0"),
    "log_level": ("LOUD", "log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, "
                  "got 'LOUD'"),
    "host": ("", "host must be a non-empty address, got ''"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_error_names_field_and_range(name: str, tmp_path: Path) -> None:
    value, message = BAD[name]
    with pytest.raises(ConfigError) as e:
        ServerConfig(models_dir=tmp_path, **{name: value}).validate()
    assert e.value.problems == [Problem(name, message)]


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    c = ServerConfig(models_dir=tmp_path / "missing", port=0, metrics_port=0, max_beam_size=0,
                     max_queue_size=8, max_texts_per_request=9)
    problems = c.problems()
    assert [(p.field, p.message) for p in problems] == [
        ("models_dir",
         f"models_dir must be an existing directory, got {str(tmp_path / 'missing')!r}"),
        ("port", "port must be in [1, 65535], got 0"),
        ("max_beam_size", "max_beam_size must be in [1, 128], got 0"),
        ("max_queue_size", "max_queue_size must be >= max_texts_per_request (9), got 8"),
    ]
    with pytest.raises(ConfigError, match="port must be in"):
        c.validate()


def test_cross_field_checks(tmp_path: Path) -> None:
    assert ServerConfig(models_dir=tmp_path, port=9000, metrics_port=9000).problems() == [
        Problem("metrics_port", "metrics_port must differ from port (9000), got 9000")]
    assert ServerConfig(models_dir=tmp_path, port=9000, metrics_port=0).problems() == []
    assert ServerConfig(models_dir=None).problems()[0].message.startswith(
        "models_dir is required (no shipped models/ folder was found): pass --models-dir or "
        "set SEQ2SERVE_MODELS_DIR")


def test_limits_for_scheduler_and_options(tmp_path: Path) -> None:
    c = ServerConfig(models_dir=tmp_path, max_batch_size=4, max_batch_tokens=100,
                     max_queue_delay_ms=7.5, max_queue_size=64, max_beam_size=8,
                     max_length_cap=64)
    limits = batch_limits(c)
    assert (limits.max_batch_size, limits.max_batch_tokens, limits.max_queue_size) == (4, 100, 64)
    assert limits.max_queue_delay_s == pytest.approx(0.0075)
    assert (option_limits(c).max_beam_size, option_limits(c).max_length) == (8, 64)
    assert c.to_dict()["models_dir"] == str(tmp_path)


def test_drain_delay_from_flag_and_env(tmp_path: Path) -> None:
    env = {"SEQ2SERVE_DRAIN_DELAY_S": "12.5"}
    assert load(["--models-dir", str(tmp_path)], env).drain_delay_s == 12.5
    assert load(["--models-dir", str(tmp_path), "--drain-delay-s", "0"], env).drain_delay_s == 0
    with pytest.raises(ConfigError) as e:
        load(["--models-dir", str(tmp_path)], {"SEQ2SERVE_DRAIN_DELAY_S": "-1"})
    assert e.value.problems == [Problem(
        "drain_delay_s", "drain_delay_s must be in [0, 3600], got -1.0 (from "
        "SEQ2SERVE_DRAIN_DELAY_S)")]


def test_engine_layout_shares_the_threads_among_the_engines() -> None:
    from seq2serve.server.assembly import MAX_AUTO_ENGINES, engine_layout
    from seq2serve.server.engine.runner import CPU, CUDA

    assert engine_layout(2, 0, CPU) == (2, 1)  # auto on CPU: one engine per thread
    assert engine_layout(1, 0, CPU) == (1, 1)
    assert engine_layout(16, 0, CPU) == (MAX_AUTO_ENGINES, 16 // MAX_AUTO_ENGINES)
    assert engine_layout(8, 0, CUDA) == (1, 8)  # one session per device
    assert engine_layout(4, 2, CPU) == (2, 2)
    assert engine_layout(1, 3, CPU) == (3, 1)  # never fewer than one thread each
    assert engine_layout(0, 1, CPU) == (1, usable_cores())
    problems = ServerConfig(engines=-1).problems()
    assert any(p.field == "engines" and "0 = auto" in p.message for p in problems)


def test_a_value_of_the_wrong_type_is_named() -> None:
    problems = ServerConfig(port="50051", host=None, reflection="yes").problems()  # type: ignore[arg-type]  # values as a careless caller passes them
    assert [(p.field, p.message) for p in problems if p.field != "models_dir"] == [
        ("host", "host must be a non-empty address, got None"),
        ("port", "port must be an integer, got '50051'"),
        ("reflection", "reflection must be true or false, got 'yes'"),
    ]


def test_prefer_model_repeats_in_order_from_flags_or_env(tmp_path: Path) -> None:
    models = str(tmp_path)
    assert load(["--models-dir", models], {}).preferred_models() == ()
    assert load(["--models-dir", models, "--prefer-model", "nllb", "--prefer-model", "m2m100"],
                {}).preferred_models() == ("nllb", "m2m100")
    assert load(["--models-dir", models], {"SEQ2SERVE_PREFER_MODEL": "m2m100, nllb"}
                ).preferred_models() == ("m2m100", "nllb")
    assert load(["--models-dir", models, "--prefer-model", "a"],  # the flag beats the variable
                {"SEQ2SERVE_PREFER_MODEL": "b"}).preferred_models() == ("a",)
    with pytest.raises(ConfigError) as err:
        load(["--models-dir", models], {"SEQ2SERVE_PREFER_MODEL": "nllb,nllb"})
    assert err.value.messages == ["prefer_model must name each model once, got nllb more than "
                                  "once (from SEQ2SERVE_PREFER_MODEL)"]
    assert [p.message for p in ServerConfig(models_dir=tmp_path, prefer_model=None  # type: ignore[arg-type]  # as a careless caller passes it
                                            ).problems()] == [
        "prefer_model must be model names, comma-separated, got None"]


def test_document_limits_from_flags_and_env_defaults_as_the_core_s(tmp_path: Path) -> None:
    # Declared once (document_settings.py): the server's settings and the core's Limits.
    assert document_limits(ServerConfig(models_dir=tmp_path)) == DEFAULT_LIMITS
    assert ServerConfig(models_dir=tmp_path).max_documents_in_flight == DEFAULT_IN_FLIGHT
    c = load(["--models-dir", str(tmp_path), "--max-document-paragraphs", "7"],
             {"SEQ2SERVE_MAX_DOCUMENT_CHARACTERS": "900",
              "SEQ2SERVE_MAX_DOCUMENT_BYTES": "65536",
              "SEQ2SERVE_MAX_DOCUMENT_ELEMENTS": "300",
              "SEQ2SERVE_MAX_DOCUMENT_UNPACKED_BYTES": "4096",
              "SEQ2SERVE_MAX_DOCUMENT_MEMBERS": "12"})
    assert document_limits(c) == Limits(file_bytes=65536, members=12, unpacked_bytes=4096,
                                         elements=300, characters=900, paragraphs=7)


def test_the_jobs_folder_must_be_a_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    problems = ServerConfig(models_dir=tmp_path, jobs_dir=tmp_path / "file").problems()
    assert [(p.field, p.message) for p in problems] == [
        ("jobs_dir", f"jobs_dir must be a directory (made if missing), got "
                     f"{str(tmp_path / 'file')!r}")]
    c = load(["--models-dir", str(tmp_path), "--jobs-dir", str(tmp_path / "jobs")],
             {"SEQ2SERVE_JOB_TTL_S": "60", "SEQ2SERVE_JOBS_MAX_BYTES": "4096"})
    assert (c.jobs_dir, c.job_ttl_s, c.jobs_max_bytes) == (tmp_path / "jobs", 60.0, 4096)


def test_the_device_budget_is_set_as_the_host_s_and_needs_a_device(tmp_path: Path) -> None:
    config = load(["--models-dir", str(tmp_path), "--max-device-memory", "2000000000"],
                  {"SEQ2SERVE_MAX_MODEL_MEMORY": "3000000000"})
    assert (config.max_device_memory, config.max_model_memory) == (2_000_000_000, 3_000_000_000)
    # The budgets' refusals name these flags.
    assert Resource.HOST.option == cfg.flag_name("max_model_memory")
    assert Resource.DEVICE.option == cfg.flag_name("max_device_memory")
    on_cpu = ServerConfig(models_dir=tmp_path, provider="cpu", max_device_memory=10**9)
    [problem] = on_cpu.problems()
    assert problem.field == "max_device_memory"
    assert "applies to models on a device (--provider cuda" in problem.message
    assert "got 1000000000" in problem.message
    for device in ({"provider": "cpu", "emulate_device": True}, {"provider": "cuda"},
                   {"provider": "auto"}):  # auto: known when the models load (a warning)
        assert ServerConfig(models_dir=tmp_path, max_device_memory=10**9,
                            **device).problems() == []


def test_the_usage_file_and_period_are_set_and_checked(tmp_path: Path) -> None:
    c = load(["--models-dir", str(tmp_path), "--usage-period", "monthly"],
             {"SEQ2SERVE_USAGE_FILE": str(tmp_path / "usage.json"),
              "SEQ2SERVE_USAGE_RESET_DAY": "15"})
    assert (c.usage_file, c.usage_period, c.usage_reset_day) == (
        tmp_path / "usage.json", "monthly", 15)
    default = load(["--models-dir", str(tmp_path)], {})
    assert (default.usage_file, default.usage_period) == (None, "never")  # in memory
    problems = ServerConfig(models_dir=tmp_path, usage_file=tmp_path / "no" / "u.json",
                            usage_period="weekly", usage_reset_day=29).problems()
    assert [(p.field, p.message) for p in problems] == [
        ("usage_file", f"usage_file's folder must exist, got "
                       f"{str(tmp_path / 'no' / 'u.json')!r}"),
        ("usage_period", "usage_period must be one of never, monthly, got 'weekly'"),
        ("usage_reset_day", problems[2].message), ("usage_reset_day", problems[3].message)]
    assert "29" in problems[2].message and "28" in problems[2].message
    # a reset day a period other than monthly would ignore is refused, not ignored
    [ignored] = ServerConfig(models_dir=tmp_path, usage_reset_day=15).problems()
    assert ignored.message == ("usage_reset_day applies only to usage_period monthly (got "
                               "usage_reset_day 15 with usage_period 'never')")
    assert [p.field for p in ServerConfig(models_dir=tmp_path,
                                          usage_file=tmp_path).problems()] == ["usage_file"]
    [off] = ServerConfig(models_dir=tmp_path, usage_file=tmp_path / "u.json",
                         http_port=0).problems()  # never read: said, not ignored
    assert off.message == ("usage_file needs the HTTP front door (DeepL's API); http_port "
                           "is 0 (disabled)")
    text = " ".join(parser().format_help().split())
    assert "--usage-file FILE" in text and "unset: counted in memory, from 0 at each start" \
        in text
