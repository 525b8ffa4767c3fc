"""The listener's configuration file: the content of the listener config secret.

JSON, decoded straight into typed structs. Key names follow ARC's listener ``config.json``
(``configure_url``, ``github_token``, ``runner_scale_set_id`` ...) so an ARC-shaped secret reads
unchanged; runnerscale's additions (``nats``, ``health_addr``, ``ha``, ``proxy``) are nested
structs. Unknown keys are rejected so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from shared.actions import ActionsError, AppCredentials, PersonalAccessToken, parse_config_url
from shared.bus.errors import SettingsError
from shared.bus.settings import BusSettings, load_settings
from shared.bus.settings import validate as validate_bus_settings
from shared.http import listen_enabled, parse_listen_addr  # re-exported for the listener
from shared.log import register_secret
from shared.settings import options_of

#: The largest value the service accepts for X-ScaleSetMaxCapacity, and ARC's "unbounded" max.
MAX_INT32 = 2**31 - 1

NonNegInt32 = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT32)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]


class ConfigError(Exception):
    """The configuration file is unreadable or invalid; the message names the field."""


class NatsSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How to reach NATS. Empty fields fall back to the bus environment (RUNNERSCALE_NATS_*)."""

    #: Server URLs; the client fails over between them.
    servers: list[str] = msgspec.field(default_factory=list)
    #: Path of a NATS credentials (.creds) file.
    credentials_file: str = ""
    user: str = ""
    password: str = ""
    token: str = ""
    #: CA bundle to verify the NATS server.
    tls_ca: str = ""
    #: Seconds for one JetStream call or publish attempt.
    request_timeout_seconds: PositiveFloat | None = None
    #: Seconds a publish is retried before the listener gives the message back (unacknowledged).
    publish_deadline_seconds: PositiveFloat | None = None


class HASettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Leader election between listener replicas of one scale set (a lease in NATS KV).

    A standby takes over within ``lease_ttl_seconds + renew_interval`` after the leader dies
    (12.5 s with the defaults). The TTL is the bus-wide lease TTL: every worker sharing the lease
    bucket must use the same value (the bus refuses a mismatch rather than re-timing leases).
    """

    lease_ttl_seconds: PositiveFloat | None = None
    #: 0/absent = lease_ttl / 4; must be below lease_ttl / 3.
    renew_interval_seconds: Annotated[float, msgspec.Meta(ge=0)] | None = None


class SessionSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    #: First wait after a 409 "session already exists"; doubles up to the max, with jitter.
    conflict_backoff_initial_seconds: PositiveFloat = 2.0
    conflict_backoff_max_seconds: PositiveFloat = 30.0
    #: Give up (exit non-zero) if the stale session is still there after this long.
    conflict_give_up_seconds: PositiveFloat = 600.0
    #: Wait between attempts after a poll/publish failure before re-creating the session.
    error_backoff_seconds: PositiveFloat = 2.0
    #: /readyz turns unready when the last successful poll is older than this (> long-poll hold).
    poll_staleness_seconds: PositiveFloat = 120.0


class ProxySettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Proxy for the Actions service; empty fields fall back to the process environment."""

    http_proxy: str = ""
    https_proxy: str = ""
    no_proxy: str = ""


class ListenerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    configure_url: str = ""
    runner_scale_set_id: int = 0
    runner_scale_set_name: str = ""
    ephemeral_runner_set_namespace: str = ""
    ephemeral_runner_set_name: str = ""
    min_runners: NonNegInt32 = 0
    #: Absent means unbounded (ARC's default 2147483647); an explicit 0 means no runners.
    max_runners: NonNegInt32 = MAX_INT32
    # Credentials: a PAT, or a GitHub App (id or client id, installation id, PEM private key).
    github_token: str = ""
    github_app_id: str | int = ""
    github_app_installation_id: int = 0
    github_app_private_key: str = ""
    #: PEM of an extra root CA for the Actions service (added to the system roots, as ARC does).
    server_root_ca: str = ""
    proxy: ProxySettings = ProxySettings()
    nats: NatsSettings = NatsSettings()
    ha: HASettings = HASettings()
    session: SessionSettings = SessionSettings()
    #: host:port for /metrics; port 0 picks a free port; empty or ``"0"`` (ARC) disables metrics.
    metrics_addr: str = ":8080"
    metrics_endpoint: str = "/metrics"
    #: host:port for /healthz and /readyz; port 0 picks a free port; empty or ``"0"`` disables them.
    #: Equal to metrics_addr: one server for all three paths.
    health_addr: str = ":8081"
    log_level: str = "info"
    #: Accepted for ARC compatibility; runnerscale always logs JSON.
    log_format: str = "json"

    @property
    def uses_github_app(self) -> bool:
        return not self.github_token

    @property
    def app_id(self) -> str:
        return str(self.github_app_id)


_LOG_LEVELS = ("debug", "info", "warn", "warning", "error")


def validate(cfg: ListenerConfig) -> ListenerConfig:
    """Cross-field checks the types cannot express; raise ConfigError naming the field."""
    if not cfg.configure_url.strip():
        raise ConfigError("configure_url: is required (the GitHub config URL of the scale set)")
    try:
        parse_config_url(cfg.configure_url)
    except ActionsError as exc:
        raise ConfigError(f"configure_url: {exc}") from None
    if cfg.runner_scale_set_id <= 0:
        raise ConfigError(f"runner_scale_set_id: must be a positive scale set id, got {cfg.runner_scale_set_id}")
    if not cfg.ephemeral_runner_set_namespace:
        raise ConfigError("ephemeral_runner_set_namespace: is required")
    if not cfg.ephemeral_runner_set_name:
        raise ConfigError("ephemeral_runner_set_name: is required")
    if cfg.min_runners > cfg.max_runners:
        raise ConfigError(f"min_runners: {cfg.min_runners} cannot be greater than max_runners {cfg.max_runners}")
    has_app = bool(cfg.app_id or cfg.github_app_installation_id or cfg.github_app_private_key)
    if cfg.github_token and has_app:
        raise ConfigError("github_token: both a PAT and GitHub App credentials are set; set exactly one")
    if not cfg.github_token:
        if not has_app:
            raise ConfigError("github_token: no credentials set (need github_token or the github_app_* fields)")
        for name, value in (
            ("github_app_id", cfg.app_id),
            ("github_app_installation_id", cfg.github_app_installation_id),
            ("github_app_private_key", cfg.github_app_private_key),
        ):
            if not value:
                raise ConfigError(f"{name}: is required for GitHub App credentials")
    try:
        credentials_of(cfg)
    except ActionsError as exc:
        raise ConfigError(str(exc)) from None  # the text names the github_* field
    if cfg.log_level.lower() not in _LOG_LEVELS:
        raise ConfigError(f"log_level: must be one of debug, info, warn, error; got {cfg.log_level!r}")
    try:
        bus_settings(cfg)
    except SettingsError as exc:
        raise ConfigError(f"{_bus_field(exc.setting)}: {exc.problem}") from None
    for field, addr in (("metrics_addr", cfg.metrics_addr), ("health_addr", cfg.health_addr)):
        if listen_enabled(addr):
            try:
                parse_listen_addr(addr)
            except ValueError as exc:
                raise ConfigError(f"{field}: {exc}") from None
    return cfg


_BUS_FIELD_NAMES = {
    "nats_urls": "nats.servers",
    "creds_file": "nats.credentials_file",
    "user": "nats.user",
    "password": "nats.password",
    "token": "nats.token",
    "tls_ca": "nats.tls_ca",
    "request_timeout": "nats.request_timeout_seconds",
    "publish_deadline": "nats.publish_deadline_seconds",
    "lease_ttl": "ha.lease_ttl_seconds",
    "renew_interval": "ha.renew_interval_seconds",
}


def _bus_field(setting_label: str) -> str:
    """Map the bus's "ENV / --flag" label back to the config field that set it."""
    for field, option in options_of(BusSettings).items():
        if option.label == setting_label:
            return _BUS_FIELD_NAMES.get(field, setting_label)
    return setting_label


def bus_settings(cfg: ListenerConfig, environ: Mapping[str, str] | None = None) -> BusSettings:
    """Bus settings: the bus environment (RUNNERSCALE_NATS_*), overridden by the config file."""
    base = load_settings(None, environ)
    n, ha = cfg.nats, cfg.ha
    overrides: dict[str, object] = {}
    if n.servers:
        overrides["nats_urls"] = tuple(n.servers)
    for field, value in (
        ("creds_file", n.credentials_file),
        ("user", n.user),
        ("password", n.password),
        ("token", n.token),
        ("tls_ca", n.tls_ca),
        ("request_timeout", n.request_timeout_seconds),
        ("publish_deadline", n.publish_deadline_seconds),
        ("lease_ttl", ha.lease_ttl_seconds),
        ("renew_interval", ha.renew_interval_seconds),
    ):
        if value:
            overrides[field] = value
    settings = msgspec.structs.replace(base, **overrides)
    validate_bus_settings(settings)
    return settings


def parse_config(data: bytes | str) -> ListenerConfig:
    """Decode and validate; a malformed document is a ConfigError naming the JSON path."""
    try:
        cfg = msgspec.json.decode(data, type=ListenerConfig)
    except msgspec.ValidationError as exc:
        # msgspec names the path (`$.nats.servers[0]`); strip the `$.` for a plain field name.
        raise ConfigError(_readable_validation_error(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc}") from None
    cfg = validate(cfg)
    for secret in (cfg.github_token, cfg.github_app_private_key, cfg.nats.password, cfg.nats.token):
        register_secret(secret)
    return cfg


def load_config(path: str | os.PathLike[str]) -> ListenerConfig:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    return parse_config(data)


def _readable_validation_error(text: str) -> str:
    # "Expected `int`, got `str` - at `$.min_runners`" -> "min_runners: Expected `int`, got `str`"
    msg, sep, where = text.rpartition(" - at ")
    if not sep:
        msg, where = text, "$"
    path = where.strip("`").removeprefix("$").removeprefix(".")
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", msg)
    if unknown:
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        msg = "unknown field (not a listener setting)"
    return f"{path or '(document)'}: {msg}"


def credentials_of(cfg: ListenerConfig) -> PersonalAccessToken | AppCredentials:
    """The Actions client credentials the config names (validated by :func:`validate`)."""
    if cfg.github_token:
        return PersonalAccessToken(cfg.github_token)
    return AppCredentials(
        app_id=cfg.app_id, installation_id=cfg.github_app_installation_id, private_key=cfg.github_app_private_key
    )


def owner_name() -> str:
    """Session owner: the pod name (env POD_NAME), else the hostname, as ARC does."""
    return os.environ.get("POD_NAME") or socket.gethostname() or "runnerscale-listener"


def actions_environ(cfg: ListenerConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the Actions client reads its proxy from: the process environment with the
    config's ``proxy.*`` fields on top (set in both cases; the lower-case names win, as in curl)."""
    env = dict(os.environ if environ is None else environ)
    for key, value in (
        ("http_proxy", cfg.proxy.http_proxy),
        ("https_proxy", cfg.proxy.https_proxy),
        ("no_proxy", cfg.proxy.no_proxy),
    ):
        if value:
            env[key] = env[key.upper()] = value
    return env
