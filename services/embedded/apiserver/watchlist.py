"""Streaming lists ("WatchList"): the ListOptions rules of ``sendInitialEvents`` watches.

client-go's reflectors (WatchListClient, on by default since 0.35) open every informer with
``watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true``
and count the cache as synced only at the BOOKMARK annotated ``k8s.io/initial-events-end``.
Pure functions: query parsing and validation with the real server's messages and order.
"""

from __future__ import annotations

from typing import Any

from . import errors
from .errors import ApiError, Cause

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
NOT_OLDER_THAN = "NotOlderThan"


def parse_send_initial_events(query: Any) -> bool | None:
    """``None`` when absent; otherwise false only for ``0``/``false`` (any case), as the
    apiserver's query-parameter conversion reads booleans (an empty value is true)."""
    if "sendInitialEvents" not in query:
        return None
    value = query.get("sendInitialEvents") or ""
    return not (value == "0" or value.lower() == "false")


def parse_resource_version(text: str) -> int | None:
    """``None`` for "" (most recent); a number otherwise. A malformed value is the storage
    layer's 500 without a reason, before any stream starts."""
    if text == "":
        return None
    if not text.isdigit():
        raise ApiError(
            500, "", f'resourceVersion: Invalid value: "{text}": strconv.ParseUint: parsing "{text}": invalid syntax'
        )
    return int(text)


def list_options_causes(query: Any, watch: bool) -> list[Cause]:
    """The ``sendInitialEvents``/``resourceVersionMatch`` rules of ListOptions validation."""
    send_initial = parse_send_initial_events(query)
    match = query.get("resourceVersionMatch") or ""
    causes: list[Cause] = []
    if not watch:
        if send_initial is not None:
            causes.append(
                Cause("FieldValueForbidden", "Forbidden: sendInitialEvents is forbidden for list", "sendInitialEvents")
            )
        return causes
    if send_initial is not None and match != NOT_OLDER_THAN:
        causes.append(
            Cause(
                "FieldValueForbidden",
                f"Forbidden: sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}",
                "resourceVersionMatch",
            )
        )
    if match:
        if send_initial is None:
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    "resourceVersionMatch",
                )
            )
        if match != NOT_OLDER_THAN:
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{match}": supported values: "{NOT_OLDER_THAN}"',
                    "resourceVersionMatch",
                )
            )
        if query.get("continue"):
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                    "resourceVersionMatch",
                )
            )
    return causes


def check_list_options(query: Any, watch: bool) -> None:
    causes = list_options_causes(query, watch)
    if causes:
        raise errors.invalid("meta.k8s.io", "ListOptions", "", causes)


def initial_events_end_bookmark(kind: str, api_version: str, rv: int) -> dict[str, Any]:
    """The BOOKMARK that ends a streaming list's initial events (the list's resourceVersion)."""
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"resourceVersion": str(rv), "annotations": {INITIAL_EVENTS_END: "true"}},
    }
