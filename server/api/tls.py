"""gRPC server credentials from PEM files, checked first so that a bad file fails
start-up with one line naming it (gRPC core would log several lines of its own and
say only "Failed to bind")."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import grpc


class TLSError(Exception):
    """A certificate, key or CA file that cannot be used; the message names it."""


def server_credentials(cert: Path, key: Path,
                       client_ca: Path | None = None) -> grpc.ServerCredentials:
    """TLS for gRPC; with `client_ca`, clients must present a certificate it signed."""
    cert_pem, key_pem = _read("tls_cert", cert), _read("tls_key", key)
    if b"-----BEGIN CERTIFICATE-----" not in cert_pem:
        raise TLSError(f"tls_cert {str(cert)!r} holds no PEM certificate "
                       "(-----BEGIN CERTIFICATE-----)")
    if not re.search(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----", key_pem):
        raise TLSError(f"tls_key {str(key)!r} holds no PEM private key "
                       "(-----BEGIN PRIVATE KEY-----)")
    if b"ENCRYPTED" in key_pem:
        raise TLSError(f"tls_key {str(key)!r} is encrypted; gRPC needs it unencrypted "
                       "(protect the file instead: readable by the server's user only)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # The password callback keeps an encrypted key from prompting on the terminal;
        # gRPC cannot use one anyway.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as e:
        raise TLSError(f"tls_cert {str(cert)!r} and tls_key {str(key)!r} are not a "
                       f"certificate chain and its private key ({_reason(e)})") from None
    ca_pem = None
    if client_ca is not None:
        ca_pem = _read("tls_client_ca", client_ca)
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except ssl.SSLError as e:
            raise TLSError(f"tls_client_ca {str(client_ca)!r} is not a PEM CA certificate "
                           f"bundle ({_reason(e)})") from None
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem,
                                       require_client_auth=ca_pem is not None)


def _read(name: str, path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TLSError(f"{name} {str(path)!r} cannot be read: {e.strerror}") from None


def _reason(error: ssl.SSLError) -> str:
    # "[X509: KEY_VALUES_MISMATCH] key values mismatch (_ssl.c:3905)": keep the words.
    text = error.strerror or str(error)
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text)
