"""Credentials and token arithmetic: PAT or GitHub App, the App JWT, admin-token refresh. Pure, no I/O.

Two credential kinds, exactly one per client: a personal access token, or a GitHub App (id,
installation id, RSA private key). The App signs a short RS256 JWT to mint installation tokens.
Tokens returned by the service are registered with the log redactor as soon as they are seen.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping

import msgspec

from shared.actions.errors import CredentialsError
from shared.log import register_secret

__all__ = [
    "AppCredentials",
    "Credentials",
    "PersonalAccessToken",
    "app_jwt",
    "credentials_from_secret",
    "jwt_expiry",
    "needs_refresh",
]

# GitHub rejects App JWTs living longer than 10 minutes; back-date iat for clock skew.
_JWT_BACKDATE = dt.timedelta(seconds=60)
_JWT_LIFETIME = dt.timedelta(minutes=9)


class PersonalAccessToken(msgspec.Struct, frozen=True):
    token: str

    def __post_init__(self) -> None:
        if not self.token or not self.token.strip():
            raise CredentialsError("github_token is empty")
        register_secret(self.token)

    def __repr__(self) -> str:
        return "PersonalAccessToken(token='[redacted]')"


class AppCredentials(msgspec.Struct, frozen=True, kw_only=True):
    """A GitHub App. ``app_id`` may be the numeric App ID or the client ID (both work as ``iss``).
    ``installation_id`` 0 means "look it up from the config URL's org or repository"."""

    app_id: str
    private_key: str
    installation_id: int = 0

    def __post_init__(self) -> None:
        if not str(self.app_id).strip():
            raise CredentialsError("github_app_id is empty")
        if self.installation_id < 0:
            raise CredentialsError("github_app_installation_id must be a positive integer")
        if "PRIVATE KEY-----" not in self.private_key:
            raise CredentialsError("github_app_private_key is not a PEM private key")
        register_secret(self.private_key)
        for line in self.private_key.splitlines():
            register_secret(line.strip() if len(line.strip()) > 20 else None)

    def __repr__(self) -> str:
        return (
            f"AppCredentials(app_id={self.app_id!r}, installation_id={self.installation_id}, private_key='[redacted]')"
        )


Credentials = PersonalAccessToken | AppCredentials


def credentials_from_secret(data: Mapping[str, str | bytes]) -> Credentials:
    """Build credentials from an ARC-style secret's data: ``github_token``, or
    ``github_app_id`` + ``github_app_installation_id`` + ``github_app_private_key``.

    Values may be ``bytes`` (already base64-decoded). Exactly one kind must be present.
    """

    def text(key: str) -> str:
        value = data.get(key, "")
        if isinstance(value, bytes):
            try:
                value = value.decode()
            except UnicodeDecodeError:
                raise CredentialsError(f"{key} is not UTF-8 text") from None
        return value.strip()

    token = text("github_token")
    app_id = text("github_app_id")
    if token and app_id:
        raise CredentialsError("set either github_token or the github_app_* keys, not both")
    if token:
        return PersonalAccessToken(token)
    if not app_id:
        raise CredentialsError("no credentials: set github_token or github_app_id/_installation_id/_private_key")
    raw_installation = text("github_app_installation_id")
    try:
        installation_id = int(raw_installation) if raw_installation else 0
    except ValueError:
        raise CredentialsError("github_app_installation_id must be an integer") from None
    key = text("github_app_private_key")
    if not key:
        raise CredentialsError("github_app_private_key is missing")
    return AppCredentials(app_id=app_id, installation_id=installation_id, private_key=key)


def app_jwt(credentials: AppCredentials, *, now: dt.datetime | None = None) -> str:
    """The RS256 App JWT: ``iat`` = now - 60 s, ``exp`` = iat + 9 min, ``iss`` = the app id."""
    issued = (now or dt.datetime.now(dt.UTC)) - _JWT_BACKDATE
    claims = {
        "iat": int(issued.timestamp()),
        "exp": int((issued + _JWT_LIFETIME).timestamp()),
        "iss": str(credentials.app_id),
    }
    # Imported here, not at module level: PyJWT pulls in cryptography (~10 MB RSS per process),
    # which only a GitHub App credential needs (issue 10; a PAT never signs anything).
    import jwt

    try:
        token = jwt.encode(claims, credentials.private_key, algorithm="RS256")
    except (ValueError, TypeError, jwt.PyJWTError) as exc:
        # The library's message may quote key material; keep only the kind of failure.
        raise CredentialsError(f"github_app_private_key cannot sign an RS256 JWT ({type(exc).__name__})") from None
    register_secret(token)
    return token


def jwt_expiry(token: str) -> dt.datetime | None:
    """``exp`` of a JWT, read without verifying the signature (the service signs, we only plan
    the refresh). ``None`` if ``token`` is not a JWT with a numeric ``exp``."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = msgspec.json.decode(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return None
    try:
        return dt.datetime.fromtimestamp(exp, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def needs_refresh(expires_at: dt.datetime | None, *, now: dt.datetime, margin: float) -> bool:
    """Refresh when the token was never fetched or expires within ``margin`` seconds."""
    return expires_at is None or now + dt.timedelta(seconds=margin) >= expires_at
