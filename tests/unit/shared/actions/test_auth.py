"""Credentials, the App JWT, unverified expiry reading and the refresh rule (README "Actions service client")."""

from __future__ import annotations

import datetime as dt

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from shared.actions import AppCredentials, CredentialsError, PersonalAccessToken, credentials_from_secret
from shared.actions.auth import app_jwt, jwt_expiry, needs_refresh


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def pem(rsa_key: rsa.RSAPrivateKey) -> str:
    return rsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()


def test_app_jwt_claims_and_signature(rsa_key: rsa.RSAPrivateKey, pem: str) -> None:
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    token = app_jwt(AppCredentials(app_id="12345", installation_id=7, private_key=pem), now=now)
    claims = jwt.decode(
        token, rsa_key.public_key(), algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False}
    )
    assert claims == {"iat": int(now.timestamp()) - 60, "exp": int(now.timestamp()) - 60 + 540, "iss": "12345"}
    assert jwt.get_unverified_header(token)["alg"] == "RS256"


def test_bad_private_key_is_a_credentials_error_without_key_material() -> None:
    fake = "-----BEGIN RSA PRIVATE KEY-----\nAAAAnotarealkeyAAAAAAAAAAAAAAAAAAAA\n-----END RSA PRIVATE KEY-----"
    with pytest.raises(CredentialsError) as info:
        app_jwt(AppCredentials(app_id="1", private_key=fake))
    assert "notarealkey" not in str(info.value)


def test_jwt_expiry_is_read_without_verification() -> None:
    token = jwt.encode({"exp": 4102444800}, "any-signing-secret-of-sufficient-length", algorithm="HS256")
    assert jwt_expiry(token) == dt.datetime(2100, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "token", ["", "opaque-token", "a.b.c", "a.eyJmb28iOjF9.c", "a.eyJleHAiOiJzb29uIn0.c", "a.eyJleHAiOnRydWV9.c"]
)
def test_jwt_expiry_of_non_jwt_is_none(token: str) -> None:
    assert jwt_expiry(token) is None


def test_refresh_rule_margin() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert needs_refresh(None, now=now, margin=60)
    assert needs_refresh(now + dt.timedelta(seconds=59), now=now, margin=60)
    assert needs_refresh(now + dt.timedelta(seconds=60), now=now, margin=60)
    assert not needs_refresh(now + dt.timedelta(seconds=61), now=now, margin=60)


def test_credentials_from_arc_secret(pem: str) -> None:
    assert credentials_from_secret({"github_token": b"ghp_abcdefabcdef\n"}) == PersonalAccessToken("ghp_abcdefabcdef")
    app = credentials_from_secret(
        {"github_app_id": "42", "github_app_installation_id": "7", "github_app_private_key": pem}
    )
    assert isinstance(app, AppCredentials) and (app.app_id, app.installation_id) == ("42", 7)
    lookup = credentials_from_secret({"github_app_id": "42", "github_app_private_key": pem})
    assert isinstance(lookup, AppCredentials) and lookup.installation_id == 0


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({}, "no credentials"),
        ({"github_token": "ghp_x123456", "github_app_id": "1"}, "not both"),
        (
            {"github_app_id": "1", "github_app_installation_id": "seven", "github_app_private_key": "k"},
            "github_app_installation_id",
        ),
        ({"github_app_id": "1", "github_app_installation_id": "7"}, "github_app_private_key"),
        ({"github_app_id": "1", "github_app_private_key": "not a pem"}, "github_app_private_key"),
        ({"github_token": b"\xff\xfe"}, "github_token"),
    ],
)
def test_bad_secret_data_names_the_key(data: dict[str, str | bytes], fragment: str) -> None:
    with pytest.raises(CredentialsError) as info:
        credentials_from_secret(data)
    assert fragment in str(info.value)


def test_reprs_hide_secrets(pem: str) -> None:
    assert "ghp_hiddentoken" not in repr(PersonalAccessToken("ghp_hiddentoken"))
    assert "PRIVATE KEY" not in repr(AppCredentials(app_id="1", private_key=pem))
