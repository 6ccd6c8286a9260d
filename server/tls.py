"""gRPC server credentials from PEM files, checked first so that a bad file fails
start-up with one line naming it (gRPC core would log several lines of its own and
say only "Failed to bind")."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc


class TLSError(Exception):
    """A certificate, key or CA file that cannot be used; the message names it."""


def server_credentials(cert: Path, key: Path,
                       client_ca: Path | None = None) -> grpc.ServerCredentials:
    """TLS for gRPC; with `client_ca`, clients must present a certificate it signed."""
    cert_pem, key_pem = _read("tls_cert", cert), _read("tls_key", key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # The password callback keeps an encrypted key from prompting on the terminal;
        # gRPC cannot use one anyway.
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as e:
        raise TLSError(f"tls_cert {str(cert)!r} and tls_key {str(key)!r} are not a PEM "
                       f"certificate chain and its unencrypted private key "
                       f"({_reason(e)})") from None
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
    return error.reason or error.strerror or str(error)
