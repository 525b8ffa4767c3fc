"""Credentials the simulator issues and checks.

The admin token and the message-queue token are real JWTs (the client reads ``exp`` from them
unverified); the simulator signs them HS256 with a per-process secret so it can verify its own.
Registration and installation tokens are opaque random strings, as GitHub's are. Time is always
passed in (the simulator's clock can be advanced), never read here.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import jwt
import msgspec

VERIFIED_CACHE_SIZE = 4096  # verified tokens remembered (then forgotten all at once)


class TokenError(Exception):
    """A credential was rejected; ``expired`` tells expiry apart from garbage. Never holds the token."""

    def __init__(self, reason: str, *, expired: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expired = expired


class AdminClaims(msgspec.Struct):
    tenant: int
    exp: float


class QueueClaims(msgspec.Struct):
    session_id: str
    scale_set_id: int
    exp: float


class TokenIssuer:
    """Mints and verifies the simulator's JWTs. ``kind`` (the ``sub`` claim) keeps them apart."""

    def __init__(self, secret: str | None = None) -> None:
        self._secret = secret or secrets.token_urlsafe(32)
        # Tokens whose signature verified, with their claims: a token is immutable, so checking
        # its signature again (every queue and admin call) would give the same answer. Expiry is
        # still checked on every use, against the caller's clock.
        self._verified: dict[tuple[str, str], dict[str, Any]] = {}

    def _mint(self, kind: str, claims: dict[str, Any], *, now: float, ttl: float) -> str:
        payload = {
            "sub": kind,
            "iss": "actions-sim",
            "iat": int(now),
            "nbf": int(now) - 60,
            "exp": int(now + ttl),
            "jti": uuid.uuid4().hex,
            **claims,
        }
        return jwt.encode(payload, self._secret, algorithm="HS256")

    def _verify(self, token: str, kind: str, *, now: float) -> dict[str, Any]:
        claims = self._verified.get((token, kind))
        if claims is None:
            claims = self._decode(token, kind)
            if len(self._verified) >= VERIFIED_CACHE_SIZE:
                self._verified.clear()
            self._verified[(token, kind)] = claims
        if not isinstance(claims.get("exp"), (int, float)) or claims["exp"] <= now:
            raise TokenError(f"{kind} token expired", expired=True)
        return claims

    def _decode(self, token: str, kind: str) -> dict[str, Any]:
        """The claims of a token this issuer signed for ``kind``; TokenError otherwise."""
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=["HS256"],
                # Times are checked below against the simulator's clock, which tests can advance.
                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False},
            )
        except jwt.PyJWTError:
            raise TokenError(f"not a valid {kind} token") from None
        if claims.get("sub") != kind:
            raise TokenError(f"not a {kind} token")
        return dict(claims)

    def mint_admin(self, tenant: int, *, now: float, ttl: float) -> str:
        return self._mint("admin", {"tenant": tenant}, now=now, ttl=ttl)

    def verify_admin(self, token: str, *, now: float) -> AdminClaims:
        claims = self._verify(token, "admin", now=now)
        return msgspec.convert(claims, AdminClaims)

    def mint_queue(self, session_id: str, scale_set_id: int, *, now: float, ttl: float) -> str:
        return self._mint("queue", {"session_id": session_id, "scale_set_id": scale_set_id}, now=now, ttl=ttl)

    def verify_queue(self, token: str, *, now: float) -> QueueClaims:
        claims = self._verify(token, "queue", now=now)
        return msgspec.convert(claims, QueueClaims)


def verify_app_jwt(token: str, *, public_key_pem: str, app_ids: set[str], now: float) -> None:
    """Check a GitHub App JWT as GitHub does: RS256 signature, ``iss``, and a lifetime ≤ 10 min.

    Raises :class:`TokenError` naming the failed check.
    """
    try:
        claims = jwt.decode(
            token,
            public_key_pem,
            algorithms=["RS256"],
            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
        )
    except jwt.InvalidSignatureError:
        raise TokenError("app JWT signature does not verify with the app's public key") from None
    except jwt.PyJWTError:
        raise TokenError("app JWT is malformed or not RS256") from None
    iat, exp, iss = claims.get("iat"), claims.get("exp"), claims.get("iss")
    if not isinstance(iat, (int, float)) or not isinstance(exp, (int, float)):
        raise TokenError("app JWT needs numeric iat and exp claims")
    if str(iss) not in app_ids:
        raise TokenError("app JWT iss is not a known app id or client id")
    if exp - iat > 600:
        raise TokenError("app JWT lifetime exceeds 10 minutes")
    if exp <= now:
        raise TokenError("app JWT expired", expired=True)
    if iat > now + 60:
        raise TokenError("app JWT iat is in the future")


def opaque_token(prefix: str) -> str:
    return prefix + secrets.token_hex(20)
