"""``serviceaccounts/<name>/token`` (TokenRequest): what a kubelet asks for to fill a pod's
projected service-account token, and what node-sim asks for on either server.

The emulator does not authenticate requests, so the token only has to look and decode like the
real one: a JWT with the service-account claims, signed (HS256) with a key of this emulator.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

import jwt

from . import errors
from .errors import Cause

ISSUER = "https://kubernetes.default.svc"
MIN_EXPIRATION_SECONDS = 600
DEFAULT_EXPIRATION_SECONDS = 3600


class TokenIssuer:
    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def token_request(self, service_account: dict[str, Any], body: Any) -> dict[str, Any]:
        """The TokenRequest answer for ``body`` (a TokenRequest; only its spec is read)."""
        spec = (body.get("spec") if isinstance(body, dict) else None) or {}
        expiration = spec.get("expirationSeconds")
        expiration = DEFAULT_EXPIRATION_SECONDS if expiration is None else expiration
        if not isinstance(expiration, int) or expiration < MIN_EXPIRATION_SECONDS:
            raise errors.invalid(
                "authentication.k8s.io",
                "TokenRequest",
                "",
                [
                    Cause(
                        "FieldValueInvalid",
                        errors.invalid_value(expiration, "may not specify a duration less than 10 minutes"),
                        "spec.expirationSeconds",
                    )
                ],
            )
        audiences = list(spec.get("audiences") or [ISSUER])
        meta = service_account["metadata"]
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": audiences,
            "sub": f"system:serviceaccount:{meta['namespace']}:{meta['name']}",
            "iat": now,
            "nbf": now,
            "exp": now + expiration,
            "kubernetes.io": {
                "namespace": meta["namespace"],
                "serviceaccount": {"name": meta["name"], "uid": meta.get("uid", "")},
            },
        }
        token = jwt.encode(claims, self._key, algorithm="HS256")
        expires = datetime.fromtimestamp(now + expiration, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "creationTimestamp": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": {
                "audiences": audiences,
                "expirationSeconds": expiration,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {"token": token, "expirationTimestamp": expires},
        }
