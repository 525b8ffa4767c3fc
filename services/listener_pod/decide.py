"""Pure decisions of the listener-pod worker: has what is live drifted from what an
AutoscalingListener should own (built by :mod:`services.listener_pod.build`), in what state is
the listener pod, and when may a failing pod be created again.

Nothing here does I/O. The async shell (``reconciler.py``) reads the inputs, calls these
functions, and writes what they return.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar

import msgspec

from shared.api.constants import ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION, LISTENER_CONTAINER_NAME
from shared.backoff import Backoff
from shared.semantic import container_port_counts_differ, first_drift, semantic_derivative, semantic_equal
from shared.settings import InvalidSetting, option

Json = dict[str, Any]


# --- settings (from the worker's flags) -----------------------------------------------------------


class ListenerPodSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The listener-pod worker's own settings: what its flags contribute to every listener pod and
    config (README "listener-pod worker")."""

    settings_title: ClassVar[str] = "listener pods"

    #: Image used when the AL's ``spec.image`` is empty.
    image: Annotated[
        str,
        option(
            "--listener-image",
            "RUNNERSCALE_LISTENER_IMAGE",
            "listener image when the AL's spec.image is empty",
        ),
    ] = "ghcr.io/runnerscale/runnerscale:latest"
    #: Listener ``/metrics`` address; ``""`` or ``"0"`` disables (ARC's ``--listener-metrics-addr``).
    metrics_addr: Annotated[
        str,
        option(
            "--listener-metrics-addr",
            "RUNNERSCALE_LISTENER_METRICS_ADDR",
            "listener /metrics address; '0' disables (no port, empty metrics_addr)",
        ),
    ] = ":8080"
    metrics_endpoint: Annotated[
        str, option("--listener-metrics-endpoint", "RUNNERSCALE_LISTENER_METRICS_ENDPOINT", "listener metrics path")
    ] = "/metrics"
    #: Listener ``/healthz`` + ``/readyz`` address; ``""`` or ``"0"`` disables the probes.
    health_addr: Annotated[
        str,
        option(
            "--listener-health-addr",
            "RUNNERSCALE_LISTENER_HEALTH_ADDR",
            "listener /healthz /readyz address (liveness/readiness probes); '0' disables",
        ),
    ] = ":8081"
    log_level: Annotated[
        str,
        option("--listener-log-level", "RUNNERSCALE_LISTENER_LOG_LEVEL", "log level written into the listener config"),
    ] = "info"
    #: NATS URLs for the listener config; empty: this worker's own ``--nats-url``.
    nats_urls: Annotated[
        tuple[str, ...],
        option(
            "--listener-nats-url",
            help="NATS URL(s) written into the listener config (default: this worker's --nats-url)",
            metavar="URL",
        ),
    ] = ()
    #: The NATS user listener pods connect as (README "Authentication and permissions"); empty:
    #: this worker's own credentials are written into the listener config.
    nats_user: Annotated[
        str,
        option(
            "--listener-nats-user",
            "RUNNERSCALE_LISTENER_NATS_USER",
            "NATS user written into the listener config (default: this worker's own credentials)",
        ),
    ] = ""
    #: The file holding that user's password (read at start-up, never logged).
    nats_password_file: Annotated[
        str,
        option(
            "--listener-nats-password-file",
            "RUNNERSCALE_LISTENER_NATS_PASSWORD_FILE",
            "file holding the password of --listener-nats-user",
            metavar="PATH",
        ),
    ] = ""
    #: Label key prefixes never copied from user metadata onto derived objects (ARC's
    #: ``--exclude-label-propagation-prefix``).
    exclude_label_prefixes: Annotated[
        tuple[str, ...],
        option(
            "--exclude-label-propagation-prefix",
            help="label key prefix not copied to derived objects (repeatable)",
            metavar="PREFIX",
        ),
    ] = ()
    #: Re-reconcile every AL this often (picks up GitHub secret rotation; secrets are not watched, as in ARC).
    resync_seconds: Annotated[
        float,
        option(
            "--resync-period",
            "RUNNERSCALE_LISTENER_RESYNC_SECONDS",
            "seconds between re-reconciles of every AL (GitHub secret rotation)",
        ),
    ] = 60.0
    restart_backoff: Annotated[
        float,
        option(
            "--listener-restart-backoff",
            help="base seconds of the backoff between recreations of a failing listener pod",
        ),
    ] = 1.0
    restart_backoff_max: Annotated[float, option("--listener-restart-backoff-max", help="cap of that backoff")] = 60.0
    #: Put ``runnerscale.dev/node-sim-exec: "true"`` on the pod (harmless on a real cluster).
    node_sim_exec: Annotated[
        bool,
        option(
            "--node-sim-exec",
            help="annotate pods runnerscale.dev/node-sim-exec=true (the embedded node simulator runs them as processes)",
        ),
    ] = True
    #: The container command; ``--config <path>`` is appended.
    command: tuple[str, ...] = ("runnerscale", "listener")
    #: Liveness/readiness probe timing.
    probe_period_seconds: int = 10
    liveness_failure_threshold: int = 6
    readiness_failure_threshold: int = 3
    #: Requeue while the deletion chain waits for objects to go.
    cleanup_requeue_seconds: float = 1.0
    #: How long a listener container must have been running before its failure count is forgotten.
    stable_run_seconds: float = 60.0

    def validate(self) -> None:
        for field_name in ("resync_seconds", "restart_backoff", "restart_backoff_max"):
            if getattr(self, field_name) <= 0:
                raise InvalidSetting(field_name, f"must be > 0, got {getattr(self, field_name)}")
        if bool(self.nats_user) != bool(self.nats_password_file):
            raise InvalidSetting(
                "nats_user", "--listener-nats-user and --listener-nats-password-file go together (both or neither)"
            )
        for field_name in ("metrics_addr", "health_addr"):
            addr = getattr(self, field_name)
            if enabled_addr(addr) and not addr_port(addr) and not addr.endswith(":0"):
                raise InvalidSetting(field_name, f"{addr!r} is not a host:port address")

    @property
    def restart(self) -> Backoff:
        """The backoff between recreations of a failing listener pod (see :func:`restart_delay`)."""
        return Backoff(base=self.restart_backoff, cap=self.restart_backoff_max)


def enabled_addr(addr: str) -> str:
    """``""`` and ARC's ``"0"`` mean disabled."""
    addr = (addr or "").strip()
    return "" if addr in ("", "0") else addr


def addr_port(addr: str) -> int:
    """The port of ``host:port`` / ``:port``; 0 when disabled, unparsable or ephemeral."""
    addr = enabled_addr(addr)
    _, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        return 0
    value = int(port)
    return value if 0 < value <= 65535 else 0


# --- drift of live objects -------------------------------------------------------------------------


def metadata_patch(
    desired: Mapping[str, Mapping[str, str]], live_labels: Mapping[str, str], live_annotations: Mapping[str, str]
) -> Json | None:
    """A merge patch adding/updating the desired labels and annotations on a live object, or None
    when the live object already carries them all (a subset check: foreign keys added by admission
    or users are kept and never cause a patch loop). Desired keys are never removed (ARC merges)."""
    patch: Json = {}
    for field_name, live in (("labels", live_labels), ("annotations", live_annotations)):
        wanted = desired.get(field_name) or {}
        diff = {k: v for k, v in wanted.items() if live.get(k) != v}
        if diff:
            patch[field_name] = diff
    return {"metadata": patch} if patch else None


def rules_differ(desired_rules: list[Json], live_rules: Any) -> bool:
    return not semantic_equal(desired_rules, msgspec.to_builtins(live_rules))


def subjects_differ(desired_subjects: list[Json], live_subjects: Any) -> bool:
    return not semantic_equal(desired_subjects, msgspec.to_builtins(live_subjects))


def config_data_differs(desired_bytes: bytes, live_bytes: bytes | None) -> bool:
    """True when the live ``config.json`` means something else than the desired one (compared as
    JSON, so key order or whitespace written by another tool is not a change)."""
    if live_bytes is None:
        return True
    try:
        return bool(json.loads(live_bytes) != json.loads(desired_bytes))
    except ValueError:
        return True


def pod_drift(
    desired: Mapping[str, Any], live_spec: Mapping[str, Any], live_annotations: Mapping[str, str]
) -> str | None:
    """Why the live pod must be deleted and recreated, or None when it is what ``desired`` asks for.

    - The config Secret revision: a desired annotation that differs from the live one — including a
      live pod that has none (a pod started before the annotation existed: README "listener-pod worker" explains why
      ignoring an absent live annotation would record a config the listener never read). An empty
      desired annotation is not compared (nothing to compare against).
    - The spec, as a *derivative*: every field the desired pod sets must mean the same in the live
      pod; what the server, admission or scheduler added (nodeName, dnsPolicy, tolerations, the
      kube-api-access volume and mounts, imagePullPolicy, port protocol ...) is ignored. Strict
      equality here would delete and recreate a healthy listener on every reconcile.
    - Container port counts, separately: a port the desired pod stopped setting (metrics turned
      off) is invisible to the derivative.
    """
    want_rv = (
        (desired.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION, "")
    )
    have_rv = live_annotations.get(ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION, "")
    if want_rv and want_rv != have_rv:
        return f"config secret changed (pod started with resourceVersion {have_rv or 'none'}, now {want_rv})"
    desired_spec = desired.get("spec") or {}
    if not semantic_derivative(desired_spec, live_spec):
        return f"pod spec drifted at {first_drift(desired_spec, live_spec) or '$'}"
    if container_port_counts_differ(desired_spec, live_spec):
        return "container ports changed"
    return None


def pod_metadata_patch(
    desired: Mapping[str, Any], live_labels: Mapping[str, str], live_annotations: Mapping[str, str]
) -> Json | None:
    """Labels/annotations to merge onto a live pod that is otherwise current. The config revision
    annotation is excluded on purpose: it may only ever be written by creating the pod, so that it
    always names a config the running listener actually read."""
    meta = desired.get("metadata") or {}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k != ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION
    }
    return metadata_patch(
        {"labels": meta.get("labels") or {}, "annotations": annotations}, live_labels, live_annotations
    )


# --- the live pod's state ----------------------------------------------------------------------------


class PodState(StrEnum):
    RUNNING = "Running"  # the listener container runs
    STARTING = "Starting"  # scheduled / pulling / no container status yet
    TERMINATING = "Terminating"  # deletionTimestamp set: wait for it to go
    FAILED = "Failed"  # terminated or evicted: delete and recreate (with backoff)


@dataclass(frozen=True)
class PodVerdict:
    state: PodState
    reason: str = ""  # for FAILED: evicted | terminated | pod-failed | pod-succeeded
    detail: str = ""


def pod_verdict(pod: Any) -> PodVerdict:
    """Classify a live pod (a ``shared.kube.objects.Pod``) as ARC's step 12 does, plus phase checks."""
    if pod.metadata.deletion_timestamp is not None:
        return PodVerdict(PodState.TERMINATING)
    status = pod.status
    if status.reason == "Evicted":
        return PodVerdict(PodState.FAILED, "evicted", status.message or "the pod was evicted")
    cs = status.container(LISTENER_CONTAINER_NAME)
    if cs is not None and cs.state.terminated is not None:
        t = cs.state.terminated
        return PodVerdict(
            PodState.FAILED,
            "terminated",
            f"listener container exited with code {t.exit_code}{' (' + t.reason + ')' if t.reason else ''}",
        )
    if status.phase == "Failed":
        return PodVerdict(PodState.FAILED, "pod-failed", status.message or status.reason or "pod phase Failed")
    if status.phase == "Succeeded":
        return PodVerdict(PodState.FAILED, "pod-succeeded", "pod phase Succeeded")
    if cs is not None and cs.state.running is not None:
        return PodVerdict(PodState.RUNNING)
    return PodVerdict(PodState.STARTING)


# --- restart backoff ---------------------------------------------------------------------------------


def restart_delay(failures: int, backoff: Backoff) -> float:
    """Delay before recreating a listener pod that failed ``failures`` times in a row: the first
    failure is recreated at once, then base, 2·base, ... up to the cap."""
    return 0.0 if failures <= 1 else backoff.delay(failures - 2)


@dataclass
class RestartRecord:
    failures: int = 0
    last_failure: float = 0.0  # monotonic


def next_create_at(record: RestartRecord | None, backoff: Backoff) -> float:
    """Monotonic time before which the pod must not be created again (0: now)."""
    if record is None or record.failures == 0:
        return 0.0
    return record.last_failure + restart_delay(record.failures, backoff)
