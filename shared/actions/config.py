"""Parsing a GitHub config URL into its scope and the REST API base (github.com, GHE.com or GHES).

Pure functions only. The accepted shapes:

* ``https://github.com/<org>``                  organization scope
* ``https://github.com/<org>/<repo>``           repository scope
* ``https://github.com/enterprises/<ent>``      enterprise scope ("enterprises" case-insensitive)

Hosted hosts (``github.com``, ``www.github.com``, ``github.localhost``, ``*.ghe.com``) have their
REST API at ``<scheme>://api.<host>``; every other host is GitHub Enterprise Server with REST
under ``<scheme>://<host>/api/v3``. ``GITHUB_ACTIONS_FORCE_GHES`` (any value) forces the GHES form.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import msgspec

from shared.actions.errors import ConfigURLError

__all__ = ["ConfigScope", "GitHubConfig", "parse_config_url"]

_HOSTED_HOSTS = frozenset({"github.com", "www.github.com", "github.localhost"})


class ConfigScope(str, enum.Enum):
    REPOSITORY = "repository"
    ORGANIZATION = "organization"
    ENTERPRISE = "enterprise"


class GitHubConfig(msgspec.Struct, frozen=True):
    """A parsed config URL. ``url`` is the input with surrounding slashes trimmed: it is what the
    runner-registration exchange sends as ``url``."""

    url: str
    scope: ConfigScope
    scheme: str
    host: str  # host[:port] as given, lower-cased
    is_hosted: bool
    enterprise: str = ""
    organization: str = ""
    repository: str = ""

    @property
    def api_base(self) -> str:
        """The GitHub REST base, without a trailing slash."""
        if self.is_hosted:
            host = self.host
            if host == "www.github.com" or host.startswith("www.github.com:"):
                host = host[len("www.") :]
            return f"{self.scheme}://api.{host}"
        return f"{self.scheme}://{self.host}/api/v3"

    @property
    def registration_token_path(self) -> str:
        """The REST path (under :attr:`api_base`) that mints a runner registration token."""
        if self.scope is ConfigScope.ENTERPRISE:
            return f"/enterprises/{quote(self.enterprise, safe='')}/actions/runners/registration-token"
        if self.scope is ConfigScope.ORGANIZATION:
            return f"/orgs/{quote(self.organization, safe='')}/actions/runners/registration-token"
        return (
            f"/repos/{quote(self.organization, safe='')}/{quote(self.repository, safe='')}"
            "/actions/runners/registration-token"
        )


def is_hosted_host(host: str, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if "GITHUB_ACTIONS_FORCE_GHES" in env:
        return False
    name = host.lower().rsplit(":", 1)[0] if not host.startswith("[") else host.lower()
    return name in _HOSTED_HOSTS or name.endswith(".ghe.com")


def parse_config_url(config_url: str, environ: Mapping[str, str] | None = None) -> GitHubConfig:
    """Parse ``config_url``; raise :class:`ConfigURLError` naming what is wrong."""
    if not isinstance(config_url, str) or not config_url.strip():
        raise ConfigURLError("githubConfigUrl is empty")
    trimmed = config_url.strip().strip("/")
    try:
        parts = urlsplit(trimmed)
    except ValueError as exc:
        raise ConfigURLError(f"githubConfigUrl {trimmed!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigURLError(f"githubConfigUrl {trimmed!r} must start with https:// (or http://)")
    if not parts.netloc or not parts.hostname:
        raise ConfigURLError(f"githubConfigUrl {trimmed!r} has no host")
    if parts.username or parts.password:
        # Credentials belong in the secret, never in a URL that gets logged.
        raise ConfigURLError("githubConfigUrl must not contain user:password@")
    if parts.query or parts.fragment:
        raise ConfigURLError(f"githubConfigUrl {trimmed!r} must not have a query or fragment")
    host = parts.netloc.lower()
    segments = [s for s in parts.path.strip("/").split("/")] if parts.path.strip("/") else []
    if any(not s for s in segments):
        raise ConfigURLError(f"githubConfigUrl {trimmed!r} has an empty path segment")
    hosted = is_hosted_host(host, environ)
    common: dict[str, Any] = {"url": trimmed, "scheme": parts.scheme, "host": host, "is_hosted": hosted}
    if len(segments) == 1:
        return GitHubConfig(scope=ConfigScope.ORGANIZATION, organization=segments[0], **common)
    if len(segments) == 2:
        if segments[0].lower() == "enterprises":
            return GitHubConfig(scope=ConfigScope.ENTERPRISE, enterprise=segments[1], **common)
        return GitHubConfig(scope=ConfigScope.REPOSITORY, organization=segments[0], repository=segments[1], **common)
    raise ConfigURLError(
        f"githubConfigUrl {trimmed!r} must be https://<host>/<org>, https://<host>/<org>/<repo> "
        f"or https://<host>/enterprises/<enterprise> (got {len(segments)} path segments)"
    )
