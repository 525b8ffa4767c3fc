"""HTTP → API operations: path parsing, query parsing, content negotiation, response shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import yaml
from aiohttp import web

from . import discovery, errors, options, protobuf, watchlist
from .api import parse_delete_options
from .errors import ApiError
from .resources import APPLY_PATCH, ResourceType
from .selectors import parse_field_selector, parse_label_selector, parse_query_bool
from .store import OBJECT_FORM, Obj, Store, WatchFilter
from .watch import WatchRequest, serve_watch

if TYPE_CHECKING:
    from .server import Emulator

_enc = msgspec.json.Encoder()
PROTOBUF = "application/vnd.kubernetes.protobuf"
# Protobuf bodies are decoded for every built-in kind served (protobuf.py); no CBOR.
BODY_TYPES = ["application/json", "application/yaml", PROTOBUF]


@dataclass
class RequestInfo:
    """What a request addresses, for routing, fault matching and the request counter."""

    verb: str
    group: str = ""
    version: str = ""
    namespace: str = ""
    plural: str = ""
    name: str = ""
    subresource: str = ""
    is_resource: bool = False


def parse_request_info(method: str, path: str, query: Any, emu: Emulator) -> RequestInfo:
    parts = [p for p in path.split("/") if p]
    verb_by_method = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    verb = verb_by_method.get(method, method.lower())
    if not parts or parts[0] not in ("api", "apis"):
        return RequestInfo(verb=verb)
    if parts[0] == "api":
        if len(parts) < 3:
            return RequestInfo(verb=verb)
        group, version, rest = "", parts[1], parts[2:]
    else:
        if len(parts) < 4:
            return RequestInfo(verb=verb, group=parts[1] if len(parts) > 1 else "")
        group, version, rest = parts[1], parts[2], parts[3:]
    info = RequestInfo(verb=verb, group=group, version=version, is_resource=True)
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and emu.registry.lookup(group, version, rest[2]) is not None
        and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        info.namespace = rest[1]
        rest = rest[2:]
    info.plural = rest[0]
    if len(rest) > 1:
        info.name = rest[1]
    if len(rest) > 2:
        info.subresource = rest[2]
    if len(rest) > 3:
        info.subresource = "/".join(rest[2:])
    if not info.name:
        if method == "GET":
            info.verb = "watch" if parse_query_bool(query.get("watch")) else "list"
        elif method == "DELETE":
            info.verb = "deletecollection"
    return info


def json_response(body: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    headers = {"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    return _with_warnings(web.Response(body=_enc.encode(body), status=status, headers=headers), warnings)


def _with_warnings(resp: web.Response, warnings: list[str] | None) -> web.Response:
    for w in warnings or []:
        resp.headers.add("Warning", '299 - "' + w.replace('"', '\\"') + '"')
    return resp


def raw_json_response(body: bytes, status: int = 200) -> web.Response:
    """``json_response`` for a body already encoded."""
    headers = {"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
    return web.Response(body=body, status=status, headers=headers)


def object_response(
    store: Store, rt: ResourceType, obj: Obj, status: int = 200, warnings: list[str] | None = None
) -> web.Response:
    """``json_response(obj)`` for an object read or written: the stored version's JSON is encoded
    once and shared by every read of it and by its watch events (issue 10: CPU per request)."""
    return _with_warnings(raw_json_response(store.encoded(rt.key, OBJECT_FORM, obj, _enc.encode), status), warnings)


def error_response(err: ApiError) -> web.Response:
    if err.plain_text:
        return web.Response(
            text=err.message,
            status=err.code,
            headers={"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"},
        )
    resp = json_response(err.status_body(), err.code)
    if err.retry_after_seconds:
        resp.headers["Retry-After"] = str(err.retry_after_seconds)
    return resp


def _decode_body(raw: bytes, content_type: str, kind: str = "") -> Any:
    ctype = content_type.split(";", maxsplit=1)[0].strip().lower()
    if ctype in ("application/json", ""):  # no Content-Type is taken as JSON
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            why = errors.go_json_error(raw, _TYPE_SNIFF) or "unexpected end of JSON input"
            raise errors.unrecognized_object(kind, f"couldn't get version/kind; json parse error: {why}", raw) from None
        if body is not None and not isinstance(body, dict):
            why = f"json: cannot unmarshal {errors.json_kind(body)} into Go value of type {_TYPE_SNIFF}"
            raise errors.unrecognized_object(kind, f"couldn't get version/kind; json parse error: {why}", raw)
        return body
    if ctype == PROTOBUF:
        try:
            return protobuf.decode_object(raw)
        except protobuf.ProtobufError as exc:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: {', '.join(BODY_TYPES)} ({exc})",
            ) from None
    if ctype == "application/yaml":
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"couldn't get version/kind; yaml parse error: {exc}") from None
    raise errors.unsupported_media_type(BODY_TYPES)


# The struct the server sniffs apiVersion/kind with; named in its decode errors.
_TYPE_SNIFF = 'struct { APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }'


async def _delete_options_body(request: web.BaseRequest) -> bytes:
    """A DELETE's body as JSON: client-go and controller-runtime send DeleteOptions as protobuf
    for built-in kinds."""
    raw = await request.read()
    ctype = request.headers.get("Content-Type", "").split(";", maxsplit=1)[0].strip().lower()
    if ctype != PROTOBUF or not raw:
        return raw
    try:
        return _enc.encode(protobuf.decode_options(raw))
    except protobuf.ProtobufError as exc:
        raise errors.bad_request(f"error decoding DeleteOptions: {exc}") from None


def _strip_type_meta(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _encode_stripped(obj: dict[str, Any]) -> bytes:
    """A built-in list item: the object without its type meta (as the real list shows them)."""
    return _enc.encode(_strip_type_meta(obj))


def _write_options(request: web.BaseRequest) -> tuple[bool, str]:
    """``(dryRun, fieldValidation)`` of a write, checked before its body is read."""
    kind = options.OPTIONS_KIND.get(request.method, "CreateOptions")
    q = request.query
    return options.dry_run(q.getall("dryRun", []), kind), options.field_validation(q.get("fieldValidation"), kind)


def _accept_ok(accept: str) -> bool:
    if not accept:
        return True
    return any(t in accept for t in ("json", "*/*", "application/*"))


def _not_served(emu: Emulator, group: str) -> ApiError:
    """What a path the emulator does not serve gets: built-in groups answer a NotFound Status;
    other groups (custom resources' included) fall through to the plain-text catch-all."""
    if any(rt.group == group and not rt.is_custom for rt in emu.registry.all()):
        return errors.resource_not_found()
    return errors.page_not_found()


async def _await_resource_version(emu: Emulator, rv: int) -> None:
    """Reads at a resourceVersion the store has not reached wait up to 3 s (as the watch cache
    does), then fail with 504."""
    if not await emu.store.wait_for_rv(rv, 3.0):
        raise errors.too_large_resource_version(rv, emu.store.rv)


async def handle_resource(
    request: web.BaseRequest, info: RequestInfo, emu: Emulator, drop_after: int | None
) -> web.StreamResponse:
    rt = emu.registry.lookup(info.group, info.version, info.plural)
    if rt is None:
        raise _not_served(emu, info.group)
    if info.subresource == "binding" and rt.kind == "Pod" and not rt.group and info.name:
        if request.method != "POST":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        dry, _ = _write_options(request)
        body = _decode_body(await request.read(), request.headers.get("Content-Type", ""), "Binding")
        with emu.api.dry_run(dry):
            return json_response(emu.api.bind_pod(rt, info.namespace, info.name, body), 201)
    if info.subresource == "token" and rt.kind == "ServiceAccount" and not rt.group and info.name:
        if request.method != "POST":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        body = _decode_body(await request.read(), request.headers.get("Content-Type", ""))
        sa = emu.api.get(rt, info.namespace, info.name)
        return json_response(emu.tokens.token_request(sa, body), 201)
    if info.subresource and not (info.subresource == "status" and rt.status_subresource):
        if rt.is_custom and info.name:
            raise errors.not_found(rt.group, rt.plural, info.name)  # the CR handler's answer
        raise errors.resource_not_found()
    if (info.namespace and not rt.namespaced) or (rt.namespaced and not info.namespace and info.name):
        raise errors.page_not_found() if rt.is_custom else errors.resource_not_found()
    accept = request.headers.get("Accept", "")
    if not _accept_ok(accept):
        raise ApiError(
            406, "NotAcceptable", "the server was unable to respond with a content type that the client supports"
        )
    query = request.query
    api = emu.api
    method = request.method
    table = discovery.wants_table(accept)
    include_object = query.get("includeObject") or "Metadata"
    if not info.name:
        # Collection.
        ns_scope: str | None = info.namespace if rt.namespaced and info.namespace else None
        if rt.namespaced and not info.namespace and method in ("POST",):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if method == "GET":
            watchlist.check_list_options(query, info.verb == "watch")
            if info.verb == "watch":
                watchlist.parse_resource_version(query.get("resourceVersion", ""))
                flt = WatchFilter(
                    rt.key,
                    ns_scope,
                    parse_label_selector(query.get("labelSelector")),
                    parse_field_selector(query.get("fieldSelector"), rt.selectable_fields),
                )
                ts = query.get("timeoutSeconds")
                timeout = float(options.parse_int(ts)) if ts else None
                rv_text = query.get("resourceVersion", "")
                if rv_text not in ("", "0") and not rv_text.isdigit():
                    raise errors.internal(options.rv_parse_error(rv_text))
                wr = WatchRequest(
                    rt,
                    ns_scope,
                    flt,
                    rv_text,
                    timeout,
                    parse_query_bool(query.get("allowWatchBookmarks")),
                    table,
                    include_object,
                    watchlist.parse_send_initial_events(query),
                )
                return await serve_watch(request, emu, wr, drop_after)
            lr = options.list_options(query)
            if lr.resource_version:
                await _await_resource_version(emu, lr.resource_version)
            unpaged = query.get("resourceVersion") == "0" and not lr.continue_token  # served whole, as from a cache
            res = api.list(
                rt,
                ns_scope,
                query.get("labelSelector"),
                query.get("fieldSelector"),
                0 if unpaged else lr.limit,
                lr.continue_token,
                exact_rv=lr.resource_version if lr.exact else None,
            )
            list_meta: dict[str, Any] = {"resourceVersion": str(res.resource_version)}
            if res.continue_token or rt.is_custom:
                list_meta["continue"] = res.continue_token  # custom resource lists always carry it
            if res.remaining is not None:
                list_meta["remainingItemCount"] = res.remaining
            if table:
                return json_response(discovery.to_table(rt, res.items, list_meta, include_object))
            store = emu.api.store
            item_form = _enc.encode if rt.is_custom else _encode_stripped
            items = [store.encoded(rt.key, f"list-item {rt.api_version}", o, item_form) for o in res.items]
            head = _enc.encode({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": list_meta})
            return raw_json_response(head[:-1] + b',"items":[' + b",".join(items) + b"]}")
        if method == "POST":
            dry, fv = _write_options(request)
            raw = await request.read()
            body = _decode_body(raw, request.headers.get("Content-Type", ""), rt.kind)
            with api.dry_run(dry):
                created = api.create(rt, info.namespace, body, fv, raw=raw)
            return object_response(api.store, rt, created.obj, created.code, created.warnings)
        if method == "DELETE":
            options.list_options(query)
            opts = parse_delete_options(await _delete_options_body(request), query)
            with api.dry_run(opts.dry_run):
                return json_response(
                    api.delete_collection(rt, ns_scope, query.get("labelSelector"), query.get("fieldSelector"), opts)
                )
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    # Single object.
    ns = info.namespace if rt.namespaced else ""
    if method == "GET":
        rv = options.parse_resource_version(query.get("resourceVersion") or "")
        if rv:
            await _await_resource_version(emu, rv)
        obj = api.get(rt, ns, info.name)
        if table:
            return json_response(
                discovery.to_table(
                    rt, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")}, include_object
                )
            )
        return object_response(api.store, rt, obj)
    if method == "PUT":
        dry, fv = _write_options(request)
        raw = await request.read()
        body = _decode_body(raw, request.headers.get("Content-Type", ""), rt.kind)
        with api.dry_run(dry):
            written = api.update(rt, ns, info.name, body, info.subresource, fv, raw=raw)
        return object_response(api.store, rt, written.obj, written.code, written.warnings)
    if method == "PATCH":
        dry, fv = _write_options(request)
        ctype = request.headers.get("Content-Type", "")
        options.force_only_for_apply(query, ctype.split(";", 1)[0].strip().lower() == APPLY_PATCH)
        raw = await request.read()
        with api.dry_run(dry):
            written = api.patch(
                rt,
                ns,
                info.name,
                ctype,
                raw,
                info.subresource,
                fv,
                field_manager=query.get("fieldManager") or "",
            )
        return object_response(api.store, rt, written.obj, written.code, written.warnings)
    if method == "DELETE":
        if info.subresource:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        opts = parse_delete_options(await _delete_options_body(request), query)
        with api.dry_run(opts.dry_run):
            deleted = api.delete(rt, ns, info.name, opts)
        return json_response(deleted.obj, deleted.code)
    raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def handle_discovery(path: str, emu: Emulator, host: str) -> web.Response:
    parts = [p for p in path.split("/") if p]
    reg = emu.registry
    if parts == ["api"]:
        return json_response(discovery.api_versions(host))
    if parts == ["api", "v1"]:
        doc = discovery.api_resource_list(reg, "", "v1")
        return json_response(doc)
    if parts == ["apis"]:
        return json_response(discovery.api_group_list(reg))
    if len(parts) == 2 and parts[0] == "apis":
        doc = discovery.api_group(reg, parts[1])
        if doc:
            return json_response(doc)
    if len(parts) == 3 and parts[0] == "apis":
        doc = discovery.api_resource_list(reg, parts[1], parts[2])
        if doc:
            return json_response(doc)
    if len(parts) >= 2 and parts[0] == "apis":
        raise _not_served(emu, parts[1])
    raise errors.resource_not_found()


def handle_openapi(path: str, emu: Emulator) -> web.Response:
    parts = [p for p in path.split("/") if p]
    if parts == ["openapi", "v3"]:
        return json_response(discovery.openapi_index(emu.registry))
    if len(parts) >= 4 and parts[:2] == ["openapi", "v3"]:
        if parts[2] == "api" and len(parts) == 4:
            group, version = "", parts[3]
        elif parts[2] == "apis" and len(parts) == 5:
            group, version = parts[3], parts[4]
        else:
            raise errors.resource_not_found()
        if not emu.registry.in_group_version(group, version):
            raise errors.resource_not_found()
        return json_response(discovery.openapi_group_version(emu.registry, group, version))
    raise errors.resource_not_found()
