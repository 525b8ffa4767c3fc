"""Bus settings: from the environment, overridden by flags, validated once at start-up.

Every setting has one environment variable and one flag (declared on the field, loaded by
:mod:`shared.settings`); a bad value is a :class:`SettingsError` naming both. Secrets (password, token) are registered with the log
redactor on load and never appear in ``repr()``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, ClassVar
from urllib.parse import urlsplit

import msgspec

from shared import settings
from shared.log import register_secret
from shared.settings import InvalidSetting, SettingsError, option

__all__ = [
    "BusSettings",
    "SettingsError",
    "add_bus_arguments",
    "load_settings",
    "nkeys_available",
    "redact_url",
    "register_secrets",
    "validate",
]


class BusSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach NATS and how the bus's streams, buckets and leases are sized.

    Durations are seconds. The defaults give a shard hand-over bound of about
    ``lease_ttl + renew_interval`` = 12.5 s after a replica dies (see README "The bus (NATS JetStream)").
    """

    settings_title: ClassVar[str] = "NATS bus"

    nats_urls: Annotated[
        tuple[str, ...], option("--nats-url", "RUNNERSCALE_NATS_URL", "NATS server URL(s), comma-separated")
    ] = ("nats://127.0.0.1:4222",)
    # NATS decentralised-auth credentials (JWT + NKey seed)
    creds_file: Annotated[str, option("--nats-creds", "RUNNERSCALE_NATS_CREDS", "NATS credentials file (.creds)")] = ""
    user: Annotated[str, option("--nats-user", "RUNNERSCALE_NATS_USER", "NATS user name")] = ""
    password: Annotated[
        str, option("--nats-password", "RUNNERSCALE_NATS_PASSWORD", "NATS password (prefer the env var)", secret=True)
    ] = ""
    # the password read from a file (e.g. the Procfile's .runnerscale/nats-<component>.password)
    password_file: Annotated[
        str, option("--nats-password-file", "RUNNERSCALE_NATS_PASSWORD_FILE", "file holding the NATS password")
    ] = ""
    token: Annotated[
        str, option("--nats-token", "RUNNERSCALE_NATS_TOKEN", "NATS token (prefer the env var)", secret=True)
    ] = ""
    tls_ca: Annotated[
        str, option("--nats-tls-ca", "RUNNERSCALE_NATS_TLS_CA", "CA bundle to verify the NATS server")
    ] = ""
    tls_cert: Annotated[
        str, option("--nats-tls-cert", "RUNNERSCALE_NATS_TLS_CERT", "client certificate (mutual TLS)")
    ] = ""
    tls_key: Annotated[str, option("--nats-tls-key", "RUNNERSCALE_NATS_TLS_KEY", "client key (mutual TLS)")] = ""
    # 3 for a clustered JetStream
    stream_replicas: Annotated[
        int,
        option("--nats-stream-replicas", "RUNNERSCALE_NATS_STREAM_REPLICAS", "JetStream replicas per stream/bucket"),
    ] = 1
    # messages kept per subject on level streams (inspection only)
    history: Annotated[
        int, option("--bus-history", "RUNNERSCALE_BUS_HISTORY", "messages kept per subject on level streams")
    ] = 10
    job_retention: Annotated[
        float, option("--bus-job-retention", "RUNNERSCALE_BUS_JOB_RETENTION", "seconds job events are kept")
    ] = 24 * 3600.0
    duplicate_window: Annotated[
        float,
        option("--bus-duplicate-window", "RUNNERSCALE_BUS_DUPLICATE_WINDOW", "seconds of Nats-Msg-Id de-duplication"),
    ] = 120.0
    # KV TTL of shard/member/leader keys
    lease_ttl: Annotated[
        float, option("--bus-lease-ttl", "RUNNERSCALE_BUS_LEASE_TTL", "seconds a lease outlives its last renewal")
    ] = 10.0
    # 0 = lease_ttl / 4; must be < lease_ttl / 3
    renew_interval: Annotated[
        float,
        option("--bus-renew-interval", "RUNNERSCALE_BUS_RENEW_INTERVAL", "seconds between renewals (default ttl/4)"),
    ] = 0.0
    shards: Annotated[
        int, option("--bus-shards", "RUNNERSCALE_BUS_SHARDS", "number of shards resource keys hash to")
    ] = 16
    # first connection, per attempt
    connect_timeout: Annotated[
        float,
        option("--nats-connect-timeout", "RUNNERSCALE_NATS_CONNECT_TIMEOUT", "seconds to connect at start-up"),
    ] = 5.0
    # one JetStream API call or publish attempt
    request_timeout: Annotated[
        float, option("--nats-request-timeout", "RUNNERSCALE_NATS_REQUEST_TIMEOUT", "seconds per JetStream request")
    ] = 5.0
    # bounded retries of one publish, then PublishFailed
    publish_deadline: Annotated[
        float, option("--bus-publish-deadline", "RUNNERSCALE_BUS_PUBLISH_DEADLINE", "seconds a publish is retried")
    ] = 30.0
    # messages buffered while NATS is unreachable
    outbox_capacity: Annotated[
        int,
        option("--bus-outbox-capacity", "RUNNERSCALE_BUS_OUTBOX_CAPACITY", "messages buffered while NATS is down"),
    ] = 10_000
    # base pause between reconnect attempts (doubles up to 8x, jittered)
    reconnect_wait: Annotated[
        float,
        option(
            "--nats-reconnect-wait",
            "RUNNERSCALE_NATS_RECONNECT_WAIT",
            "base seconds between reconnect attempts (doubles, jittered)",
        ),
    ] = 1.0

    def __repr__(self) -> str:
        shown = {f: getattr(self, f) for f in self.__struct_fields__ if f not in ("password", "token")}
        shown["password"] = "[redacted]" if self.password else ""
        shown["token"] = "[redacted]" if self.token else ""
        return "BusSettings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def validate(self) -> None:
        _problems(self)

    @property
    def effective_password(self) -> str:
        """The password, from ``password`` or read from ``password_file`` (stripped)."""
        if self.password_file:
            return Path(self.password_file).read_text().strip()
        return self.password

    @property
    def effective_renew_interval(self) -> float:
        return self.renew_interval or self.lease_ttl / 4

    @property
    def lease_validity(self) -> float:
        """How long after sending a successful renew a replica still trusts its lease locally.

        Shorter than the TTL by a margin covering request latency and clock-rate differences, so
        the local belief ends before the server can expire the key and hand it to someone else.
        """
        return self.lease_ttl - max(0.2 * self.lease_ttl, 0.25)


def add_bus_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every bus flag to ``parser`` (default None: unset flags fall back to the environment)."""
    settings.add_arguments(parser, BusSettings)


def load_settings(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> BusSettings:
    """Build and validate settings: defaults < environment < flags."""
    loaded = settings.load(BusSettings, args, environ)
    register_secrets(loaded)
    return loaded


def register_secrets(s: BusSettings) -> None:
    """Mask the bus credentials in every later log line."""
    register_secret(s.password)
    if s.password_file and Path(s.password_file).is_file():
        register_secret(s.effective_password)
    register_secret(s.token)
    for url in s.nats_urls:  # nats://user:password@host also carries a secret
        register_secret(urlsplit(url).password)


def _problems(s: BusSettings) -> None:
    """Raise :class:`InvalidSetting` for the first bad setting."""

    def bad(field: str, problem: str) -> InvalidSetting:
        return InvalidSetting(field, problem)

    if not s.nats_urls:
        raise bad("nats_urls", "at least one URL is required")
    for url in s.nats_urls:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise bad("nats_urls", f"{redact_url(url)!r} has an invalid port") from None
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
            raise bad("nats_urls", f"{redact_url(url)!r} is not a nats://, tls://, ws:// or wss:// URL with a host")
    has_password = bool(s.password or s.password_file)
    auth_modes = [m for m, on in (("creds", s.creds_file), ("user", s.user or has_password), ("token", s.token)) if on]
    if len(auth_modes) > 1:
        raise bad("creds_file", f"choose one authentication method, got {' + '.join(auth_modes)}")
    if s.password and s.password_file:
        raise bad("password_file", "give the password or a password file, not both")
    if bool(s.user) != has_password:
        raise bad("user" if not s.user else "password", "user and password must be given together")
    for field in ("creds_file", "password_file", "tls_ca", "tls_cert", "tls_key"):
        path = getattr(s, field)
        if path and not Path(path).is_file():
            raise bad(field, f"file {path!r} does not exist")
    if s.creds_file and not nkeys_available():
        # nats-py signs with the optional ``nkeys`` package, imported only when connecting: without
        # it the first connect dies with ModuleNotFoundError instead of a settings error.
        raise bad(
            "creds_file",
            "a credentials file needs the 'nkeys' package (pip install 'nats-py[nkeys]'), which is not installed",
        )
    if bool(s.tls_cert) != bool(s.tls_key):
        raise bad("tls_cert" if not s.tls_cert else "tls_key", "client certificate and key must be given together")
    if not 1 <= s.stream_replicas <= 5:
        raise bad("stream_replicas", f"must be 1..5, got {s.stream_replicas}")
    if not 1 <= s.history <= 64:
        raise bad("history", f"must be 1..64, got {s.history}")
    for field in (
        "job_retention",
        "duplicate_window",
        "lease_ttl",
        "connect_timeout",
        "request_timeout",
        "publish_deadline",
        "reconnect_wait",
    ):
        if getattr(s, field) <= 0:
            raise bad(field, f"must be > 0, got {getattr(s, field)}")
    if s.duplicate_window > s.job_retention:
        raise bad("duplicate_window", "must not exceed the job retention")
    if s.lease_ttl < 1.0:
        raise bad("lease_ttl", f"must be >= 1 second (the server expires keys about once a second), got {s.lease_ttl}")
    if s.renew_interval < 0 or s.effective_renew_interval >= s.lease_ttl / 3:
        raise bad("renew_interval", f"must be below lease_ttl/3 = {s.lease_ttl / 3:.2f}s, got {s.renew_interval}")
    if not 1 <= s.shards <= 4096:
        raise bad("shards", f"must be 1..4096, got {s.shards}")
    if s.outbox_capacity < 1:
        raise bad("outbox_capacity", f"must be >= 1, got {s.outbox_capacity}")


def validate(s: BusSettings) -> None:
    """Raise :class:`SettingsError` naming the first bad setting (flag and environment variable)."""
    settings.check(s)


def nkeys_available() -> bool:
    """Whether nats-py can sign with NKeys (needed for ``.creds`` files)."""
    try:
        import nkeys  # noqa: F401
    except ImportError:
        return False
    return True


def redact_url(url: str) -> str:
    """The URL without ``user:password@`` (error messages must not carry credentials)."""
    netloc = urlsplit(url).netloc
    return url.replace(netloc, netloc.rsplit("@", 1)[-1], 1) if "@" in netloc else url
