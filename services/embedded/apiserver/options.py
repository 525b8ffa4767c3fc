"""Request options from the query string, checked as the server checks them (``ListOptions``,
``CreateOptions`` …): the same order, the same 400/422 bodies. Pure functions."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from . import errors
from .errors import Cause

# Which options kind a write's query parameters decode into, by HTTP method.
OPTIONS_KIND = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions", "DELETE": "DeleteOptions"}
_INT = re.compile(r"^[+-]?[0-9]+$")
_UINT = re.compile(r"^[0-9]+$")


def parse_int(text: str) -> int:
    """Go's ``strconv.ParseInt`` for integer query parameters (``limit``, ``timeoutSeconds``,
    ``gracePeriodSeconds``); a malformed one is a 400 with Go's text."""
    if not _INT.match(text):
        raise errors.bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax')
    return int(text)


def parse_resource_version(text: str) -> int:
    """A ``resourceVersion`` query value; "" and "0" mean "any" (0)."""
    if text in ("", "0"):
        return 0
    if not _UINT.match(text):
        raise errors.bad_request(f"invalid resource version: {rv_parse_error(text)}")
    return int(text)


def rv_parse_error(text: str) -> str:
    return f'resourceVersion: Invalid value: "{text}": strconv.ParseUint: parsing "{text}": invalid syntax'


def dry_run(values: list[str], options_kind: str) -> bool:
    """``dryRun`` may only be ``All`` (repeatable); anything else is a 422 on the options kind."""
    if any(v != "All" for v in values):
        shown = json.dumps(values, separators=(",", ":"))
        raise errors.options_invalid(
            options_kind,
            [Cause("FieldValueNotSupported", f'Unsupported value: {shown}: supported values: "All"', "dryRun")],
        )
    return bool(values)


def field_validation(value: str | None, options_kind: str) -> str:
    fv = value or ""
    if fv not in ("", "Ignore", "Warn", "Strict"):
        raise errors.options_invalid(
            options_kind,
            [
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{fv}": supported values: "", "Ignore", "Strict", "Warn"',
                    "fieldValidation",
                )
            ],
        )
    return fv or "Warn"


@dataclass
class ListRequest:
    """A list's options after the server's checks."""

    resource_version: int  # 0 = any
    exact: bool  # resourceVersionMatch=Exact
    limit: int
    continue_token: str


def list_options(query: Any) -> ListRequest:
    """``ValidateListOptions`` (422 on ``ListOptions``), then the storage layer's 400s."""
    rv_text = query.get("resourceVersion") or ""
    match = query.get("resourceVersionMatch") or ""
    token = query.get("continue") or ""
    causes: list[Cause] = []
    if match:
        if not rv_text:
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                    "resourceVersionMatch",
                )
            )
        if token:
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                    "resourceVersionMatch",
                )
            )
        if match not in ("Exact", "NotOlderThan"):
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan", ""',
                    "resourceVersionMatch",
                )
            )
        if match == "Exact" and rv_text == "0":
            causes.append(
                Cause(
                    "FieldValueForbidden",
                    'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    "resourceVersionMatch",
                )
            )
    if causes:
        raise errors.options_invalid("ListOptions", causes)
    limit = parse_int(query["limit"]) if query.get("limit") else 0
    if query.get("timeoutSeconds"):
        parse_int(query["timeoutSeconds"])
    rv = parse_resource_version(rv_text)
    if token and rv_text not in ("", "0"):
        raise errors.bad_request("specifying resource version is not allowed when using continue")
    return ListRequest(rv, match == "Exact", max(limit, 0), token)


def force_only_for_apply(query: Any, is_apply: bool) -> None:
    if query.get("force") is not None and not is_apply:
        raise errors.options_invalid(
            "PatchOptions",
            [Cause("FieldValueForbidden", "Forbidden: may not be specified for non-apply patch", "force")],
        )


def apply_field_manager_required(manager: str) -> None:
    if not manager:
        raise errors.options_invalid(
            "PatchOptions",
            [Cause("FieldValueRequired", "Required value: is required for apply patch", "fieldManager")],
        )
