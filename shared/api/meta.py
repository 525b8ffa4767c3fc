"""Kubernetes object metadata as typed structs (the subset of meta/v1 every resource carries).

Every ObjectMeta field Kubernetes defines is modelled, so reading an object and writing it back
never drops metadata. Fields the server manages and that runnerscale never interprets
(``managedFields``) stay JSON trees.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from shared.api import presence


class _Meta(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel", dict=True):
    # dict=True: room for the decode record (shared.api.presence), kept by copy and deepcopy.
    __copy__ = presence.copy_struct
    __deepcopy__ = presence.deepcopy_struct


class OwnerReference(_Meta, kw_only=True):
    """A controller or owner link from a child object to its parent."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(_Meta, kw_only=True):
    """Standard object metadata (metadata.*)."""

    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    self_link: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    owner_references: list[OwnerReference] = []
    finalizers: list[str] = []
    managed_fields: list[dict[str, Any]] = []

    def controller_reference(self) -> OwnerReference | None:
        """The owner reference marked ``controller: true``, if any."""
        for ref in self.owner_references:
            if ref.controller:
                return ref
        return None

    @property
    def is_deleting(self) -> bool:
        return self.deletion_timestamp is not None


class LocalObjectReference(_Meta, kw_only=True):
    """A reference to an object in the same namespace (e.g. an image pull Secret)."""

    name: str = ""


class ListMeta(_Meta):
    """Metadata of a list response: the resourceVersion to watch from, and pagination."""

    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")
    remaining_item_count: int | None = None
    self_link: str = ""
