"""Certificates the TLS tests and the load benchmark make for themselves (``cryptography``): a CA, a server certificate for
localhost and 127.0.0.1 signed by it, a client certificate, and the wrong ones (another CA's, an
expired one), written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(common_name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(_NOW - datetime.timedelta(days=1))
            .not_valid_after(_NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))  # fmt: skip
    return key, cert


def _issued(ca, common_name: str, usage, expired: bool = False):
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = (_NOW - datetime.timedelta(days=10), _NOW - datetime.timedelta(days=1)) if expired else (_NOW - datetime.timedelta(days=1), _NOW + datetime.timedelta(days=30))
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))  # fmt: skip
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                        critical=False)  # fmt: skip
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(folder: str, name: str, key, cert) -> tuple[str, str]:
    cert_path, key_path = os.path.join(folder, f"{name}.pem"), os.path.join(folder, f"{name}.key")
    with open(cert_path, "wb") as file:
        file.write(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        with open(key_path, "wb") as file:
            file.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def make_certificates(folder: str) -> dict[str, str]:
    """PEM files under ``folder``: ``ca``; ``server``/``server_key`` (localhost, 127.0.0.1) and
    ``client``/``client_key`` signed by it; ``expired_server``/``expired_server_key`` and
    ``expired_client``/``expired_client_key`` (by the same CA, expired yesterday); ``other_ca`` and
    ``stranger``/``stranger_key`` (a client certificate of that other CA); ``token`` and
    ``wrong_token`` (files holding a token each)."""
    os.makedirs(folder, exist_ok=True)
    ca, other = _ca("tfhash test CA"), _ca("another CA")
    paths = {"ca": _write(folder, "ca", None, ca[1])[0], "other_ca": _write(folder, "other_ca", None, other[1])[0]}
    for name, issuer, usage, expired in (("server", ca, ExtendedKeyUsageOID.SERVER_AUTH, False),
                                         ("expired_server", ca, ExtendedKeyUsageOID.SERVER_AUTH, True),
                                         ("client", ca, ExtendedKeyUsageOID.CLIENT_AUTH, False),
                                         ("expired_client", ca, ExtendedKeyUsageOID.CLIENT_AUTH, True),
                                         ("stranger", other, ExtendedKeyUsageOID.CLIENT_AUTH, False)):  # fmt: skip
        paths[name], paths[f"{name}_key"] = _write(folder, name, *_issued(issuer, name, usage, expired))
    for name in ("token", "wrong_token"):
        paths[name] = os.path.join(folder, name)
        with open(paths[name], "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
    return paths
