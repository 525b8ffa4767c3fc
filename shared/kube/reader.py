"""The authoritative reader: uncached GET and LIST straight from the API server.

Use it for every decision that leads to a write (README "Kubernetes access layer"): the informer cache may lag.
"""

from __future__ import annotations

import builtins  # ApiReader.list shadows the builtin inside the class
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from shared.kube.client import KubeClient
from shared.kube.codec import decode_object, split_list
from shared.kube.resources import ObjectKey, Resource

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 500


@dataclass(frozen=True)
class Listed(Generic[T]):
    """A consistent list: the items and the resourceVersion to watch from."""

    items: list[T]
    resource_version: str


class ApiReader:
    """Uncached reads. ``get`` returns the typed object (its ``metadata.resource_version`` is the
    version to lock a later write on); ``list`` returns all pages as one :class:`Listed`."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def get(self, resource: Resource[T], key: ObjectKey | str, *, timeout: float | None = None) -> T:
        """The object now, or :class:`NotFound`."""
        key = ObjectKey.of(key)
        what = resource.describe("GET", key)
        data = await self.client.request("GET", resource.object_path(key), what=what, timeout=timeout)
        return decode_object(resource, data, what)

    async def get_or_none(
        self, resource: Resource[T], key: ObjectKey | str, *, timeout: float | None = None
    ) -> T | None:
        from shared.kube.errors import NotFound

        try:
            return await self.get(resource, key, timeout=timeout)
        except NotFound:
            return None

    async def list(
        self,
        resource: Resource[T],
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = DEFAULT_PAGE_SIZE,
        timeout: float | None = None,
    ) -> Listed[T]:
        """Every matching object (following ``continue`` tokens) and the list's resourceVersion.

        All pages share the first page's snapshot. A continue token that expired mid-way raises
        :class:`Gone`; list again.
        """
        what = resource.describe("LIST", namespace=namespace)
        raw_items, list_rv = await self.list_raw(
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            page_size=page_size,
            timeout=timeout,
        )
        return Listed([decode_object(resource, raw, what) for raw in raw_items], list_rv)

    async def list_raw(
        self,
        resource: Resource[Any],
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = DEFAULT_PAGE_SIZE,
        timeout: float | None = None,
    ) -> tuple[builtins.list[msgspec.Raw], str]:
        """Like :meth:`list` but the items stay undecoded JSON (the informer decodes them itself)."""
        what = resource.describe("LIST", namespace=namespace)
        path = resource.collection_path(namespace)
        items: builtins.list[msgspec.Raw] = []
        list_rv = ""
        cont = ""
        while True:
            query = [("limit", str(page_size))]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if cont:
                query.append(("continue", cont))
            data = await self.client.request("GET", path, what=what, query=query, timeout=timeout)
            raw_items, rv, cont = split_list(data, what)
            list_rv = list_rv or rv
            items.extend(raw_items)
            if not cont:
                return items, list_rv
