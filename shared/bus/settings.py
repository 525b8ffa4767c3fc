"""Bus settings: from the environment, overridden by flags, validated once at start-up.

Every setting has one environment variable and one flag (see :data:`OPTIONS`); a bad value is a
:class:`SettingsError` naming both. Secrets (password, token) are registered with the log
redactor on load and never appear in ``repr()``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from shared.bus.errors import SettingsError
from shared.log import register_secret


class BusSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach NATS and how the bus's streams, buckets and leases are sized.

    Durations are seconds. The defaults give a shard hand-over bound of about
    ``lease_ttl + renew_interval`` = 12.5 s after a replica dies (see README "The bus (NATS JetStream)").
    """

    nats_urls: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    creds_file: str = ""  # NATS decentralised-auth credentials (JWT + NKey seed)
    user: str = ""
    password: str = ""
    token: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    stream_replicas: int = 1  # 3 for a clustered JetStream
    history: int = 10  # messages kept per subject on level streams (inspection only)
    job_retention: float = 24 * 3600.0  # how long job events stay in their stream
    duplicate_window: float = 120.0  # JetStream de-duplication window for Nats-Msg-Id
    lease_ttl: float = 10.0  # KV TTL of shard/member/leader keys
    renew_interval: float = 0.0  # 0 = lease_ttl / 4; must be < lease_ttl / 3
    shards: int = 16
    connect_timeout: float = 5.0  # first connection, per attempt
    request_timeout: float = 5.0  # one JetStream API call or publish attempt
    publish_deadline: float = 30.0  # bounded retries of one publish, then PublishFailed
    outbox_capacity: int = 10_000  # messages buffered while NATS is unreachable
    reconnect_wait: float = 1.0  # base pause between reconnect attempts (doubles up to 8x, jittered)

    def __repr__(self) -> str:
        shown = {f: getattr(self, f) for f in self.__struct_fields__ if f not in ("password", "token")}
        shown["password"] = "[redacted]" if self.password else ""
        shown["token"] = "[redacted]" if self.token else ""
        return "BusSettings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

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


@dataclass(frozen=True)
class Option:
    field: str
    env: str
    flag: str
    parse: Callable[[str], Any]
    help: str

    @property
    def label(self) -> str:
        return f"{self.env} / {self.flag}"


def _urls(raw: str) -> tuple[str, ...]:
    return tuple(u.strip() for u in raw.split(",") if u.strip())


OPTIONS: tuple[Option, ...] = (
    Option("nats_urls", "RUNNERSCALE_NATS_URL", "--nats-url", _urls, "NATS server URL(s), comma-separated"),
    Option("creds_file", "RUNNERSCALE_NATS_CREDS", "--nats-creds", str, "NATS credentials file (.creds)"),
    Option("user", "RUNNERSCALE_NATS_USER", "--nats-user", str, "NATS user name"),
    Option("password", "RUNNERSCALE_NATS_PASSWORD", "--nats-password", str, "NATS password (prefer the env var)"),
    Option("token", "RUNNERSCALE_NATS_TOKEN", "--nats-token", str, "NATS token (prefer the env var)"),
    Option("tls_ca", "RUNNERSCALE_NATS_TLS_CA", "--nats-tls-ca", str, "CA bundle to verify the NATS server"),
    Option("tls_cert", "RUNNERSCALE_NATS_TLS_CERT", "--nats-tls-cert", str, "client certificate (mutual TLS)"),
    Option("tls_key", "RUNNERSCALE_NATS_TLS_KEY", "--nats-tls-key", str, "client key (mutual TLS)"),
    Option(
        "stream_replicas",
        "RUNNERSCALE_NATS_STREAM_REPLICAS",
        "--nats-stream-replicas",
        int,
        "JetStream replicas per stream/bucket",
    ),
    Option("history", "RUNNERSCALE_BUS_HISTORY", "--bus-history", int, "messages kept per subject on level streams"),
    Option(
        "job_retention", "RUNNERSCALE_BUS_JOB_RETENTION", "--bus-job-retention", float, "seconds job events are kept"
    ),
    Option(
        "duplicate_window",
        "RUNNERSCALE_BUS_DUPLICATE_WINDOW",
        "--bus-duplicate-window",
        float,
        "seconds of Nats-Msg-Id de-duplication",
    ),
    Option(
        "lease_ttl", "RUNNERSCALE_BUS_LEASE_TTL", "--bus-lease-ttl", float, "seconds a lease outlives its last renewal"
    ),
    Option(
        "renew_interval",
        "RUNNERSCALE_BUS_RENEW_INTERVAL",
        "--bus-renew-interval",
        float,
        "seconds between renewals (default ttl/4)",
    ),
    Option("shards", "RUNNERSCALE_BUS_SHARDS", "--bus-shards", int, "number of shards resource keys hash to"),
    Option(
        "connect_timeout",
        "RUNNERSCALE_NATS_CONNECT_TIMEOUT",
        "--nats-connect-timeout",
        float,
        "seconds to connect at start-up",
    ),
    Option(
        "request_timeout",
        "RUNNERSCALE_NATS_REQUEST_TIMEOUT",
        "--nats-request-timeout",
        float,
        "seconds per JetStream request",
    ),
    Option(
        "publish_deadline",
        "RUNNERSCALE_BUS_PUBLISH_DEADLINE",
        "--bus-publish-deadline",
        float,
        "seconds a publish is retried",
    ),
    Option(
        "outbox_capacity",
        "RUNNERSCALE_BUS_OUTBOX_CAPACITY",
        "--bus-outbox-capacity",
        int,
        "messages buffered while NATS is down",
    ),
    Option(
        "reconnect_wait",
        "RUNNERSCALE_NATS_RECONNECT_WAIT",
        "--nats-reconnect-wait",
        float,
        "base seconds between reconnect attempts (doubles, jittered)",
    ),
)
_BY_FIELD = {o.field: o for o in OPTIONS}


def add_bus_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every bus flag to ``parser`` (default None: unset flags fall back to the environment)."""
    group = parser.add_argument_group("NATS bus")
    for o in OPTIONS:
        group.add_argument(o.flag, dest=f"bus_{o.field}", default=None, metavar=o.env, help=f"{o.help} [env {o.env}]")


def load_settings(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> BusSettings:
    """Build and validate settings: defaults < environment < flags."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for o in OPTIONS:
        raw = getattr(args, f"bus_{o.field}", None) if args is not None else None
        if raw is None:
            raw = env.get(o.env)
        if raw is None or raw == "":
            continue
        try:
            values[o.field] = o.parse(raw)
        except ValueError:
            raise SettingsError(o.label, f"cannot parse {o.field.replace('_', ' ')} from {_shown(o, raw)!r}") from None
    settings = BusSettings(**values)
    validate(settings)
    register_secret(settings.password)
    register_secret(settings.token)
    for url in settings.nats_urls:  # nats://user:password@host also carries a secret
        register_secret(urlsplit(url).password)
    return settings


def _shown(o: Option, raw: str) -> str:
    return "[redacted]" if o.field in ("password", "token") else raw


def validate(s: BusSettings) -> None:
    """Raise :class:`SettingsError` naming the first bad setting."""

    def bad(field: str, problem: str) -> SettingsError:
        return SettingsError(_BY_FIELD[field].label, problem)

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
    auth_modes = [m for m, on in (("creds", s.creds_file), ("user", s.user or s.password), ("token", s.token)) if on]
    if len(auth_modes) > 1:
        raise bad("creds_file", f"choose one authentication method, got {' + '.join(auth_modes)}")
    if bool(s.user) != bool(s.password):
        raise bad("user" if not s.user else "password", "user and password must be given together")
    for field in ("creds_file", "tls_ca", "tls_cert", "tls_key"):
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
