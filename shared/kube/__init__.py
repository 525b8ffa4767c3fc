"""Kubernetes access layer and controller runtime (see README "Kubernetes access layer").

async with await KubeClient.connect(kubeconfig) as kube:
    reader, writer = ApiReader(kube), ApiWriter(kube)
    ers = await reader.get(EPHEMERAL_RUNNER_SETS, "ns/name")
    await writer.patch_status(EPHEMERAL_RUNNER_SETS, "ns/name", {"status": {...}},
                              resource_version=ers.metadata.resource_version)
"""

from shared.kube.client import DEFAULT_REQUEST_TIMEOUT, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeClient
from shared.kube.controller import Controller, For, Owns, Result, Source, WakeUps, Watches, controller_owner_key
from shared.kube.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    ConnectionFailed,
    DecodeFailed,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    LocklessWrite,
    NotFound,
    ServerError,
    StatusCause,
    Throttled,
    Timeout,
    translate_status,
)
from shared.kube.events import EventRecorder, EventType, InvolvedObject
from shared.kube.informer import Change, ChangeType, Informer
from shared.kube.metrics import ControllerMetrics, controller_metrics
from shared.kube.reader import ApiReader, Listed
from shared.kube.resources import (
    ALL_RESOURCES,
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    EVENTS,
    LEASES,
    NAMESPACES,
    PODS,
    RESOURCE_BY_KIND,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    InvalidKey,
    ObjectKey,
    Resource,
)
from shared.kube.selectors import LabelSelector, SelectorError, parse_label_selector
from shared.kube.workqueue import QueueShutDown, WorkQueue, backoff_delay
from shared.kube.writer import ApiWriter, PropagationPolicy, best_effort_writes, retry_on_conflict

__all__ = [
    "ALL_RESOURCES",
    "AUTOSCALING_LISTENERS",
    "AUTOSCALING_RUNNER_SETS",
    "DEFAULT_REQUEST_TIMEOUT",
    "EPHEMERAL_RUNNERS",
    "EPHEMERAL_RUNNER_SETS",
    "EVENTS",
    "JSON_PATCH",
    "LEASES",
    "MERGE_PATCH",
    "NAMESPACES",
    "PODS",
    "RESOURCE_BY_KIND",
    "ROLES",
    "ROLE_BINDINGS",
    "SECRETS",
    "SERVICE_ACCOUNTS",
    "STRATEGIC_MERGE_PATCH",
    "AlreadyExists",
    "ApiReader",
    "ApiWriter",
    "BadRequest",
    "Change",
    "ChangeType",
    "Conflict",
    "ConnectionFailed",
    "Controller",
    "ControllerMetrics",
    "DecodeFailed",
    "EventRecorder",
    "EventType",
    "For",
    "Forbidden",
    "Gone",
    "Informer",
    "Invalid",
    "InvalidKey",
    "InvolvedObject",
    "KubeClient",
    "KubeError",
    "LabelSelector",
    "Listed",
    "LocklessWrite",
    "NotFound",
    "ObjectKey",
    "Owns",
    "PropagationPolicy",
    "QueueShutDown",
    "Resource",
    "Result",
    "SelectorError",
    "ServerError",
    "Source",
    "StatusCause",
    "Throttled",
    "Timeout",
    "WakeUps",
    "Watches",
    "WorkQueue",
    "backoff_delay",
    "best_effort_writes",
    "controller_metrics",
    "controller_owner_key",
    "parse_label_selector",
    "retry_on_conflict",
    "translate_status",
]
