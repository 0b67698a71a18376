"""pyftpdlib servers (``ftpbc.embedded``) for the conformance and FTP tests.

``pyftpdlib_server``: plain FTP.  ``pyftpdlib_ftps_server``: explicit FTPS with a certificate
signed by a throw-away CA generated here with ``cryptography``; the handle's options carry
``ca_file``, so certificate verification stays ON in every test.

Both are session-scoped, run in this process on a loopback port with a random password, and
have the controls ``drop_connections`` (close every client control connection server-side) and
``restart`` (stop, then listen again on the same port).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ftpbc.embedded import EmbeddedFTPServer
from tests.servers.handle import ServerHandle

USER = "ftpbc"


@dataclass(frozen=True)
class TLSMaterial:
    """A CA certificate and a server certificate/key it signed (for 127.0.0.1 and localhost)."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def make_tls_material(directory: Path, *, common_name: str = "ftpbc test CA") -> TLSMaterial:
    """Write ``ca.pem``, ``server.pem`` and ``server.key`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    material = TLSMaterial(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    material.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    material.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    material.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    material.key_file.chmod(0o600)
    return material


def handle_for(srv: EmbeddedFTPServer, kind: str, password: str,
               options: dict[str, object] | None = None) -> ServerHandle:
    """A ServerHandle for a running embedded server (used by fixtures and FTP-only tests)."""
    return ServerHandle(kind=kind, root=srv.root, url=srv.url, password=password,
                        options=dict(options or {}),
                        controls={"drop_connections": srv.drop_connections, "restart": srv.restart})


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def pyftpdlib_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    password = secrets.token_urlsafe(12)
    root = tmp_path_factory.mktemp("pyftpdlib-root")
    # No delay after a failed login: the wrong-password tests would wait 3 s each.
    with EmbeddedFTPServer(root, user=USER, password=password, auth_failed_delay=0) as srv:
        yield handle_for(srv, "pyftpdlib", password)


@pytest.fixture(scope="session")
def pyftpdlib_ftps_server(tmp_path_factory: pytest.TempPathFactory,
                          tls_material: TLSMaterial) -> Iterator[ServerHandle]:
    password = secrets.token_urlsafe(12)
    root = tmp_path_factory.mktemp("pyftpdlib-ftps-root")
    with EmbeddedFTPServer(root, user=USER, password=password, auth_failed_delay=0,
                           certfile=tls_material.cert_file, keyfile=tls_material.key_file) as srv:
        yield handle_for(srv, "pyftpdlib_ftps", password, {"ca_file": tls_material.ca_file})
