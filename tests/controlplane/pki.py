"""Certificates and keys for a loopback control plane: one CA, the API server's serving cert, client
certs for the admin (``system:masters``) and kube-controller-manager, and the service-account key
pair. ECDSA P-256 throughout: every component accepts it and a key takes microseconds to make."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)
# Names a client may use for the API server: loopback, and the in-cluster names of the
# `kubernetes` Service (its ClusterIP is the first address of --service-cluster-ip-range).
SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
SERVING_IPS = ("127.0.0.1", "10.0.0.1")


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Pair
    apiserver: Pair
    admin: Pair
    controller_manager: Pair
    service_account_key: Path
    service_account_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        ).add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server:
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVING_DNS]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path) -> Pki:
    """Write a fresh PKI into ``directory`` (created) and return where each file is."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("runnerscale-controlplane-ca")
    ca_cert = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)

    def write(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
        pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair

    def leaf(stem: str, subject: x509.Name, *, server: bool = False) -> Pair:
        key = _key()
        return write(stem, _issue(subject, key, ca_name, ca_key, server=server), key)

    ca = write("ca", ca_cert, ca_key)
    sa_key = _key()
    sa_private = directory / "sa.key"
    sa_public = directory / "sa.pub"
    _write_key(sa_private, sa_key)
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return Pki(
        ca=ca,
        apiserver=leaf("apiserver", _name("kube-apiserver"), server=True),
        admin=leaf("admin", _name("runnerscale-admin", "system:masters")),
        controller_manager=leaf("controller-manager", _name("system:kube-controller-manager")),
        service_account_key=sa_private,
        service_account_pub=sa_public,
    )
