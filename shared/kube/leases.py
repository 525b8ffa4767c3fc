"""Shard ownership held in one Kubernetes Lease per replica process (coordination.k8s.io/v1).

Why here and not in NATS KV: the writes ownership protects go to the Kubernetes API server, so
the membership record lives there too. A NATS outage then changes nothing about who owns what
(workers keep reconciling from Kubernetes, issue 5), and a replica cut off from the API server
loses its claims at the same moment it loses the ability to write. The protocol and its argument:
README "Shard ownership leases" and :mod:`shared.membership`. This module is only where the
record lives:

- ``runnerscale-<group>-member-<replica>-<instance>`` in ``namespace`` (default
  ``$POD_NAMESPACE``, else ``runnerscale-system``): one Lease per replica *process* (a restarted
  pod of the same name is another member; its predecessor's Lease counts until it expires and is
  then deleted by a peer). ``spec.holderIdentity`` is ``<replica>_<instance>``,
  ``spec.leaseDurationSeconds`` the duration, and the annotation ``runnerscale.io/shards`` the
  claimed shards (``0,5,11``).
- Writes: create, then merge patches carrying the last ``resourceVersion`` (409: the record
  changed under us); deletes carry the ``resourceVersion`` seen as a precondition.
"""

from __future__ import annotations

import os
import re
import secrets
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from shared import shards as sharding
from shared.kube.client import KubeClient
from shared.kube.errors import AlreadyExists, Conflict, Forbidden, NotFound
from shared.kube.objects import Lease, micro_time
from shared.kube.reader import ApiReader
from shared.kube.resources import LEASES, NAMESPACES, ObjectKey
from shared.kube.writer import ApiWriter
from shared.log import get_logger
from shared.membership import LeaseTiming, Member, Membership, StaleRecord

log = get_logger(__name__)

DEFAULT_NAMESPACE = "runnerscale-system"
DEFAULT_DURATION = LeaseTiming().duration
DEFAULT_SHARDS = 16
GROUP_LABEL = "runnerscale.io/lease-group"
ROLE_LABEL = "runnerscale.io/lease-role"
PART_OF_LABEL = "app.kubernetes.io/part-of"
SHARDS_ANNOTATION = "runnerscale.io/shards"

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_NAMESPACE",
    "SHARDS_ANNOTATION",
    "KubeMemberStore",
    "KubeShardOwnership",
    "LeaseTiming",
    "default_lease_namespace",
    "member_lease_name",
]


def _wall() -> str:
    return micro_time(datetime.now(UTC))


def default_lease_namespace(environ: Mapping[str, str] | None = None) -> str:
    """The worker's own namespace (``POD_NAMESPACE``, from the Downward API), else ``runnerscale-system``."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE


_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def _dns_part(text: str, limit: int) -> str:
    """``text`` as a DNS-1123 label fragment of at most ``limit`` characters (a hash keeps it unique)."""
    clean = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if clean == text and len(clean) <= limit:
        return clean
    digest = f"{zlib.crc32(text.encode()):08x}"
    return f"{clean[: max(1, limit - 9)].strip('-')}-{digest}"


def member_lease_name(group: str, replica_id: str, instance: str = "") -> str:
    """The Lease of one replica process (``instance``: random per process, lowercase hex)."""
    suffix = f"-{_dns_part(instance, 16)}" if instance else ""
    return f"runnerscale-{_dns_part(group, 120)}-member-{_dns_part(replica_id, 90)}{suffix}"


def _label_value(text: str) -> str:
    return _dns_part(text, 63)


def format_claims(claims: frozenset[int]) -> str:
    return ",".join(str(s) for s in sorted(claims))


def parse_claims(text: str, shards: int) -> frozenset[int]:
    """The annotation's shard numbers (anything unreadable or out of range is ignored)."""
    out: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if part.isdigit() and int(part) < shards:
            out.add(int(part))
    return frozenset(out)


class KubeMemberStore:
    """Membership records as Leases (see the module docstring); every request has ``timeout``."""

    def __init__(
        self, kube: KubeClient, group: str, *, replica_id: str, shards: int, namespace: str, timing: LeaseTiming
    ) -> None:
        instance = secrets.token_hex(4)
        self.identity = f"{replica_id}_{instance}"
        self.own_name = member_lease_name(group, replica_id, instance)
        self.group = group
        self.shards = shards
        self.namespace = namespace
        self.timing = timing
        self.reader = ApiReader(kube)
        self.writer = ApiWriter(kube)
        self._labels = {GROUP_LABEL: _label_value(group), PART_OF_LABEL: "runnerscale", ROLE_LABEL: "member"}
        self._selector = f"{GROUP_LABEL}={_label_value(group)},{ROLE_LABEL}=member"

    async def list(self) -> list[Member]:
        try:
            listed = await self.reader.list(
                LEASES, namespace=self.namespace, label_selector=self._selector, timeout=self.timing.timeout
            )
        except Forbidden as exc:
            log.error(
                "lease list forbidden: grant get, list, create, patch and delete on coordination.k8s.io leases in the lease namespace",
                group=self.group,
                namespace=self.namespace,
                error=str(exc),
            )
            raise
        return [self._member(lease) for lease in listed.items]

    def _member(self, lease: Lease) -> Member:
        return Member(
            name=lease.metadata.name,
            version=lease.metadata.resource_version,
            identity=lease.spec.holder_identity or "",
            claims=parse_claims(lease.metadata.annotations.get(SHARDS_ANNOTATION, ""), self.shards),
            duration=float(lease.spec.lease_duration_seconds or 0),
        )

    async def write(self, claims: frozenset[int], version: str | None) -> str:
        stamp = _wall()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.timing.duration_seconds,
            "renewTime": stamp,
        }
        annotations = {SHARDS_ANNOTATION: format_claims(claims)}
        if version is None:
            body = {
                "metadata": {
                    "name": self.own_name,
                    "namespace": self.namespace,
                    "labels": self._labels,
                    "annotations": annotations,
                },
                "spec": {**spec, "acquireTime": stamp},
            }
            try:
                stored = await self._create(body)
            except AlreadyExists:
                raise StaleRecord(self.own_name) from None
            return stored.metadata.resource_version
        try:
            stored = await self.writer.patch_merge(
                LEASES,
                ObjectKey(self.namespace, self.own_name),
                {"metadata": {"annotations": annotations}, "spec": spec},
                resource_version=version,
                timeout=self.timing.timeout,
            )
        except (Conflict, NotFound):
            raise StaleRecord(self.own_name) from None
        return stored.metadata.resource_version

    async def delete(self, name: str, version: str) -> None:
        with suppress(Conflict):  # it changed: alive again
            await self.writer.delete(
                LEASES,
                ObjectKey(self.namespace, name),
                resource_version=version,
                missing_ok=True,
                timeout=self.timing.timeout,
            )

    async def _create(self, body: dict[str, Any]) -> Lease:
        try:
            return await self.writer.create(LEASES, body, namespace=self.namespace, timeout=self.timing.timeout)
        except NotFound:
            await self._ensure_namespace()
            return await self.writer.create(LEASES, body, namespace=self.namespace, timeout=self.timing.timeout)

    async def _ensure_namespace(self) -> None:
        try:
            await self.writer.create(NAMESPACES, {"metadata": {"name": self.namespace}}, timeout=self.timing.timeout)
            log.info("created the lease namespace", namespace=self.namespace)
        except AlreadyExists:
            pass
        except Forbidden as exc:
            log.error(
                "lease namespace is missing and cannot be created: create it or set the lease namespace",
                namespace=self.namespace,
                error=str(exc),
            )
            raise


class KubeShardOwnership(Membership):
    """This replica's share of a group's shards, its membership in a Kubernetes Lease; use :meth:`join`."""

    store: KubeMemberStore

    @classmethod
    @asynccontextmanager
    async def join(
        cls,
        kube: KubeClient,
        group: str,
        *,
        replica_id: str,
        shards: int | None = None,
        namespace: str | None = None,
        timing: LeaseTiming | None = None,
        on_change: sharding.ChangeCallback | None = None,
    ) -> AsyncIterator[KubeShardOwnership]:
        """Join ``group`` and keep listing/claiming/renewing until the block exits, then leave."""
        if not replica_id:
            raise ValueError("replica_id must not be empty")
        timing = timing or LeaseTiming()
        count = shards or DEFAULT_SHARDS
        store = KubeMemberStore(
            kube,
            group,
            replica_id=replica_id,
            shards=count,
            namespace=namespace or default_lease_namespace(),
            timing=timing,
        )
        self = cls(store, group, replica_id=replica_id, shards=count, timing=timing, on_change=on_change)
        async with self.running():
            yield self

    @property
    def namespace(self) -> str:
        return self.store.namespace
