"""TLS and mutual TLS for gRPC, certificate errors at start-up, reflection off,
/metrics on its own address. Certificates are made here, for 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509  # the `test` extra
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from serving import RunningServer, ServeProcess, free_port, serve_env, server_config

from seq2serve.protos import translator_pb2 as pb
from seq2serve.protos import translator_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path

    def pair(self) -> tuple[bytes, bytes]:
        return self.key.read_bytes(), self.cert.read_bytes()


def _issue(out: Path, name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
           | None, *, ca: bool = False, server: bool = False) -> tuple[x509.Certificate,
                                                                     ec.EllipticCurvePrivateKey,
                                                                     Pem]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_cert, issuer_key = issuer if issuer is not None else (None, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert is not None else subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    pem = Pem(out / f"{name}.crt", out / f"{name}.key")
    pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key, pem


@dataclass(frozen=True)
class Certificates:
    ca: Pem
    server: Pem
    client: Pem
    stranger: Pem  # a client certificate from another CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    out = tmp_path_factory.mktemp("certs")
    ca_cert, ca_key, ca = _issue(out, "ca", None, ca=True)
    _, _, server = _issue(out, "server", (ca_cert, ca_key), server=True)
    _, _, client = _issue(out, "client", (ca_cert, ca_key))
    other_cert, other_key, _ = _issue(out, "other-ca", None, ca=True)
    _, _, stranger = _issue(out, "stranger", (other_cert, other_key))
    return Certificates(ca, server, client, stranger)


def translate(channel: grpc.Channel) -> pb.TranslateResponse:
    return pb_grpc.TranslatorStub(channel).Translate(
        pb.TranslateRequest(texts=["Hello"], options=pb.DecodingOptions(beam_size=1)),
        timeout=60)


@pytest.fixture(scope="module")
def tls_server(models_dir: Path, certs: Certificates) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, tls_cert=certs.server.cert,
                                          tls_key=certs.server.key))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def mtls_server(models_dir: Path, certs: Certificates) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, tls_cert=certs.server.cert,
                                          tls_key=certs.server.key,
                                          tls_client_ca=certs.ca.cert, reflection=False))
    yield running
    running.stop()


def test_a_tls_client_is_served(tls_server: RunningServer, certs: Certificates) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=certs.ca.cert.read_bytes())
    with grpc.secure_channel(tls_server.target, credentials) as channel:
        assert len(translate(channel).translations) == 1


def test_a_plaintext_client_fails_cleanly(tls_server: RunningServer) -> None:
    with grpc.insecure_channel(tls_server.target) as channel, \
            pytest.raises(grpc.RpcError) as err:
        translate(channel)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_that_does_not_trust_the_server_fails(tls_server: RunningServer,
                                                       certs: Certificates) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=certs.stranger.cert.read_bytes())
    with grpc.secure_channel(tls_server.target, credentials) as channel, \
            pytest.raises(grpc.RpcError) as err:
        translate(channel)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_serves_only_clients_with_a_certificate_from_the_ca(
        mtls_server: RunningServer, certs: Certificates) -> None:
    root = certs.ca.cert.read_bytes()
    with grpc.secure_channel(mtls_server.target, grpc.ssl_channel_credentials(
            root, *certs.client.pair())) as channel:
        assert len(translate(channel).translations) == 1
    for client in (grpc.ssl_channel_credentials(root),  # no certificate at all
                   grpc.ssl_channel_credentials(root, *certs.stranger.pair())):
        with grpc.secure_channel(mtls_server.target, client) as channel, \
                pytest.raises(grpc.RpcError) as err:
            translate(channel)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_no_reflection_turns_the_reflection_service_off(mtls_server: RunningServer,
                                                       certs: Certificates) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    credentials = grpc.ssl_channel_credentials(certs.ca.cert.read_bytes(), *certs.client.pair())
    with grpc.secure_channel(mtls_server.target, credentials) as channel, \
            pytest.raises(grpc.RpcError) as err:
        ProtoReflectionDescriptorDatabase(channel).get_services()
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def start_failure(models_dir: Path, **settings: object) -> tuple[int, list[str]]:
    proc = ServeProcess(serve_env(models_dir, free_port(), **settings))
    try:
        return proc.finish(), proc.lines
    finally:
        proc.kill()


def test_a_bad_certificate_fails_the_start_in_one_line(models_dir: Path, certs: Certificates,
                                                       tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    code, lines = start_failure(models_dir, tls_cert=garbage, tls_key=certs.server.key)
    assert code == 1
    assert lines == [f"seq2serve serve: error: tls_cert {str(garbage)!r} holds no PEM "
                     "certificate (-----BEGIN CERTIFICATE-----)"]
    # A key that does not belong to the certificate.
    code, lines = start_failure(models_dir, tls_cert=certs.server.cert, tls_key=certs.client.key)
    assert code == 1
    assert lines == [f"seq2serve serve: error: tls_cert {str(certs.server.cert)!r} and tls_key "
                     f"{str(certs.client.key)!r} are not a certificate chain and its private "
                     "key ([X509: KEY_VALUES_MISMATCH] key values mismatch)"]
    code, lines = start_failure(models_dir, tls_cert=certs.server.cert,
                                tls_key=certs.server.key, tls_client_ca=garbage)
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith(f"seq2serve serve: error: tls_client_ca {str(garbage)!r} is not "
                               "a PEM CA certificate bundle (")


def test_a_missing_certificate_file_fails_the_start_naming_it(models_dir: Path,
                                                              certs: Certificates,
                                                              tmp_path: Path) -> None:
    missing = tmp_path / "missing.key"
    code, lines = start_failure(models_dir, tls_cert=certs.server.cert, tls_key=missing)
    assert code == 2
    assert lines == ["seq2serve serve: error: invalid server configuration:",
                     f"  tls_key must be an existing file, got {str(missing)!r} (from "
                     "SEQ2SERVE_TLS_KEY)"]
    code, lines = start_failure(models_dir, tls_cert=certs.server.cert)
    assert code == 2
    assert lines[1] == ("  tls_key is required with tls_cert (TLS needs both the certificate "
                        "and its key): pass --tls-key or set SEQ2SERVE_TLS_KEY")


def test_metrics_bind_their_own_address(models_dir: Path) -> None:
    running = RunningServer(server_config(models_dir, host="localhost",
                                          metrics_host="127.0.0.1", metrics_port=free_port()))
    try:
        assert running.server.metrics_server is not None
        assert running.server.metrics_server.address == ("127.0.0.1",
                                                         running.server.config.metrics_port)
    finally:
        running.stop()
