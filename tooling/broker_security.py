"""The secured local broker: a local CA, the brokers' certificate, SCRAM users and the authorizer.

A secured broker home holds `security/`: `ca.pem` (the CA clients trust), `broker.pem`
(the brokers' key and certificate, signed by the CA, valid for 127.0.0.1 and localhost),
`ca-key.pem` and `security.json` (the administrator's SCRAM password), all readable by
the owner only. Clients connect with SASL_SSL and SCRAM-SHA-512; the brokers authorise
with KRaft's `StandardAuthorizer`, refuse what no ACL allows, and treat the administrator
(and the brokers themselves, on the mutual-TLS controller listener) as super users.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltacoord.schemas.errors import DeltaCoordError

#: The one SASL mechanism of the secured broker: SCRAM credentials live in the KRaft metadata.
MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
#: The brokers' certificate subject: its DN is the brokers' principal on the controller listener (mutual TLS).
BROKER_CN = "deltacoord-broker"
BROKER_PRINCIPAL = f"User:CN={BROKER_CN}"
_SCRAM_ITERATIONS = 8192


class SecurityError(DeltaCoordError, RuntimeError):
    """The secured broker's files or users could not be made."""


@dataclass(frozen=True)
class BrokerSecurity:
    """Where a secured broker's TLS files are and the administrator's credentials."""

    directory: str
    admin_password: str

    @property
    def ca_path(self) -> str:
        return str(Path(self.directory) / "ca.pem")

    @property
    def keystore_path(self) -> str:
        return str(Path(self.directory) / "broker.pem")

    def client_config(self, user: str, password: str) -> dict[str, str]:
        """librdkafka settings for `user` (the same keys every deltacoord client takes: docs/settings.md)."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM, "sasl.username": user,
                "sasl.password": password, "ssl.ca.location": self.ca_path}

    def admin_config(self) -> dict[str, str]:
        return self.client_config(ADMIN_USER, self.admin_password)

    def format_args(self) -> list[str]:
        """`kafka-storage format` arguments creating the administrator's SCRAM credential (inter-broker login)."""
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN_USER},password={self.admin_password}]"]

    def properties(self, client_listeners: list[str]) -> str:
        """Broker settings: SASL_SSL on `client_listeners` (the first is inter-broker), mutual TLS on CONTROLLER."""
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" '
                f'password="{self.admin_password}";')
        lines = [
            f"sasl.enabled.mechanisms={MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.keystore_path}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca_path}",
            "listener.name.controller.ssl.client.auth=required",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{ADMIN_USER};{BROKER_PRINCIPAL}",
            "allow.everyone.if.no.acl.found=false",
        ]
        lines += [f"listener.name.{name.lower()}.{MECHANISM.lower()}.sasl.jaas.config={jaas}" for name in client_listeners]
        return "\n".join(lines) + "\n"


def security_dir(home: Path) -> Path:
    return home / "security"


def load(home: Path) -> BrokerSecurity | None:
    """The security of the broker home `home`, or None when it is not secured."""
    try:
        doc = json.loads((security_dir(home) / "security.json").read_text())
        return BrokerSecurity(str(security_dir(home)), str(doc["admin_password"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare(home: Path) -> BrokerSecurity:
    """The home's security, made on first use: a CA, the brokers' certificate and the admin password."""
    existing = load(home)
    if existing is not None:
        return existing
    d = security_dir(home)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    ca_key, ca_cert = _make_ca()
    key_pem, cert_pem = _make_broker_cert(ca_key, ca_cert)
    from cryptography.hazmat.primitives import serialization

    _write_private(d / "ca-key.pem", ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    _write_private(d / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(d / "broker.pem", key_pem + cert_pem + ca_cert.public_bytes(serialization.Encoding.PEM))
    sec = BrokerSecurity(str(d), secrets.token_urlsafe(24))
    _write_private(d / "security.json", (json.dumps({"admin_user": ADMIN_USER, "admin_password": sec.admin_password,
                                                     "mechanism": MECHANISM}, indent=2) + "\n").encode())
    return sec


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _make_ca() -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "deltacoord local CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _make_broker_cert(ca_key: Any, ca_cert: Any) -> tuple[bytes, bytes]:
    """The brokers' key (PKCS#8, as Kafka's PEM keystore reads it) and certificate, for server and client auth."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_CN)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def new_password() -> str:
    return secrets.token_urlsafe(18)


def add_users(bootstrap_servers: str, sec: BrokerSecurity, users: dict[str, str], timeout_s: float = 30.0) -> None:
    """Create or reset the SCRAM-SHA-512 credential of each `user: password`, as the administrator."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._scram import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    if not users:
        return
    for name in users:
        if not name or any(c in name for c in ",=[] \t\n"):
            raise SecurityError(f"SCRAM user name {name!r} must be non-empty without spaces, commas, '=' or brackets")
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **sec.admin_config()})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, _SCRAM_ITERATIONS)
    alterations: list[UserScramCredentialAlteration] = [UserScramCredentialUpsertion(name, info, password.encode()) for name, password in users.items()]
    futures = admin.alter_user_scram_credentials(alterations, request_timeout=timeout_s)
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
        except Exception as e:
            raise SecurityError(f"could not set the SCRAM credential of user {name}: {e}") from e
