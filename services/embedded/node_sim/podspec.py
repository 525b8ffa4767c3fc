"""Pure translation of a pod spec into what a local process needs: environment, volume files,
and a command line whose container paths point at the materialised volumes.

The async shell fetches the Secrets and ConfigMaps named by :func:`referenced_objects` into an
``objects`` map (``None`` = absent) and passes it in; these functions never do I/O. Errors carry
the kubelet's wording so that a pod status or event reads like a real one.
"""

from __future__ import annotations

import base64
import os
import re
import sys
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import msgspec

# SERVICE_ACCOUNT_DIR_ENV names the local directory of a pod's service-account mount: processes
# share this host's filesystem, so clients read the files there (runnerscale's loader does).
from shared.kube.client import SERVICE_ACCOUNT_DIR_ENV

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # ("secrets" | "configmaps", name)
Objects = dict[ObjKey, Obj | None]


class ConfigError(Exception):
    """The container cannot be configured (kubelet: CreateContainerConfigError)."""


class MountError(Exception):
    """A volume cannot be set up (kubelet event FailedMount; the pod stays ContainerCreating)."""


class StartError(Exception):
    """The container has nothing the node sim can run (kubelet: StartError, exit 128)."""


def _containers(pod: Obj) -> list[Obj]:
    s = pod.get("spec") or {}
    return [c for c in (s.get("initContainers") or []) + (s.get("containers") or []) if isinstance(c, dict)]


def referenced_objects(pod: Obj) -> set[ObjKey]:
    """Every Secret/ConfigMap the pod's env, envFrom and volumes name."""
    refs: set[ObjKey] = set()
    for c in _containers(pod):
        for e in c.get("env") or []:
            vf = (e or {}).get("valueFrom") or {}
            if (vf.get("secretKeyRef") or {}).get("name"):
                refs.add(("secrets", vf["secretKeyRef"]["name"]))
            if (vf.get("configMapKeyRef") or {}).get("name"):
                refs.add(("configmaps", vf["configMapKeyRef"]["name"]))
        for ef in c.get("envFrom") or []:
            if ((ef or {}).get("secretRef") or {}).get("name"):
                refs.add(("secrets", ef["secretRef"]["name"]))
            if ((ef or {}).get("configMapRef") or {}).get("name"):
                refs.add(("configmaps", ef["configMapRef"]["name"]))
    for v in (pod.get("spec") or {}).get("volumes") or []:
        for kind, src in _volume_sources(v):
            name = src.get("secretName") if kind == "secrets" else src.get("name")
            if name:
                refs.add((kind, name))
    return refs


def _volume_sources(v: Obj) -> list[tuple[str, Obj]]:
    out: list[tuple[str, Obj]] = []
    if isinstance(v.get("secret"), dict):
        out.append(("secrets", v["secret"]))
    if isinstance(v.get("configMap"), dict):
        out.append(("configmaps", v["configMap"]))
    for s in (v.get("projected") or {}).get("sources") or []:
        if isinstance((s or {}).get("secret"), dict):
            out.append(("secrets", s["secret"]))
        if isinstance((s or {}).get("configMap"), dict):
            out.append(("configmaps", s["configMap"]))
    return out


def object_data(kind: str, obj: Obj) -> dict[str, bytes]:
    """Decoded data of a Secret (base64 ``data``) or ConfigMap (``data`` + base64 ``binaryData``)."""
    out: dict[str, bytes] = {}
    if kind == "secrets":
        for k, v in (obj.get("data") or {}).items():
            try:
                out[k] = base64.b64decode(v or "")
            except ValueError:
                out[k] = b""
        for k, v in (obj.get("stringData") or {}).items():
            out[k] = str(v).encode()
    else:
        for k, v in (obj.get("data") or {}).items():
            out[k] = str(v).encode()
        for k, v in (obj.get("binaryData") or {}).items():
            try:
                out[k] = base64.b64decode(v or "")
            except ValueError:
                out[k] = b""
    return out


_KIND_WORD = {"secrets": ("secret", "Secret"), "configmaps": ("configmap", "ConfigMap")}


def _key_value(pod: Obj, kind: str, ref: Obj, objects: Objects) -> str | None:
    ns = (pod.get("metadata") or {}).get("namespace", "")
    name, key = ref.get("name", ""), ref.get("key", "")
    lower, title = _KIND_WORD[kind]
    obj = objects.get((kind, name))
    if obj is None:
        if ref.get("optional"):
            return None
        raise ConfigError(f'{lower} "{name}" not found')
    data = object_data(kind, obj)
    if key not in data:
        if ref.get("optional"):
            return None
        raise ConfigError(f"couldn't find key {key} in {title} {ns}/{name}")
    return data[key].decode(errors="replace")


_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_value(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    m, s = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": m.get("name", ""),
        "metadata.namespace": m.get("namespace", ""),
        "metadata.uid": m.get("uid", ""),
        "spec.nodeName": s.get("nodeName", ""),
        "spec.serviceAccountName": s.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    idx = _FIELD_INDEX.match(path)
    if idx:
        return str((m.get(idx.group(1)) or {}).get(idx.group(2), ""))
    raise ConfigError(
        f"unsupported fieldRef fieldPath {path!r} (the node simulator resolves metadata.name/namespace/uid/labels/annotations, spec.nodeName/serviceAccountName, status.podIP/hostIP)"
    )


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined vars are substituted, ``$$`` escapes, others stay."""

    def sub(mo: re.Match[str]) -> str:
        if mo.group(0) == "$$":
            return "$"
        name = mo.group(1)
        return env[name] if name in env else mo.group(0)

    return _VAR_REF.sub(sub, value)


def resolve_env(pod: Obj, container: Obj, objects: Objects, pod_ip: str = "", host_ip: str = "") -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in order
    (later wins), values expanded against what is defined so far. Raises ConfigError."""
    env: dict[str, str] = {}
    for ef_or_none in container.get("envFrom") or []:
        ef = ef_or_none or {}
        prefix = str(ef.get("prefix") or "")
        for kind, key in (("secrets", "secretRef"), ("configmaps", "configMapRef")):
            ref = ef.get(key)
            if not isinstance(ref, dict):
                continue
            obj = objects.get((kind, ref.get("name", "")))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{_KIND_WORD[kind][0]} "{ref.get("name", "")}" not found')
            for k, v in object_data(kind, obj).items():
                env[prefix + k] = v.decode(errors="replace")
    for e in container.get("env") or []:
        if not isinstance(e, dict) or not e.get("name"):
            continue
        name = str(e["name"])
        vf = e.get("valueFrom")
        if not isinstance(vf, dict):
            env[name] = expand(str(e.get("value") or ""), env)
            continue
        value: str | None
        if isinstance(vf.get("secretKeyRef"), dict):
            value = _key_value(pod, "secrets", vf["secretKeyRef"], objects)
        elif isinstance(vf.get("configMapKeyRef"), dict):
            value = _key_value(pod, "configmaps", vf["configMapKeyRef"], objects)
        elif isinstance(vf.get("fieldRef"), dict):
            value = field_value(pod, str(vf["fieldRef"].get("fieldPath", "")), pod_ip, host_ip)
        elif isinstance(vf.get("resourceFieldRef"), dict):
            value = "0"  # no resource accounting in the simulator
        else:
            raise ConfigError(f"env {name}: unsupported valueFrom {sorted(vf)}")
        if value is not None:
            env[name] = value
    return env


# --- what in-cluster clients read --------------------------------------------------------------

# Where a pod's service-account token, CA and namespace are mounted (a fixed path in every client).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class TokenSource(msgspec.Struct, frozen=True):
    """A projected ``serviceAccountToken`` source: a TokenRequest to make for this file."""

    volume: str
    path: str
    audience: str
    expiration_seconds: int


def token_sources(pod: Obj) -> list[TokenSource]:
    out = []
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(v, dict) or not v.get("name"):
            continue
        for s in (v.get("projected") or {}).get("sources") or []:
            tok = (s or {}).get("serviceAccountToken")
            if isinstance(tok, dict):
                out.append(
                    TokenSource(
                        volume=str(v["name"]),
                        path=_safe_rel(str(tok.get("path") or "token")),
                        audience=str(tok.get("audience") or ""),
                        expiration_seconds=int(tok.get("expirationSeconds") or 3600),
                    )
                )
    return out


def token_request_body(source: TokenSource) -> Obj:
    spec: Obj = {"expirationSeconds": source.expiration_seconds}
    if source.audience:
        spec["audiences"] = [source.audience]
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def _downward_files(pod: Obj, items: list[Any], default_mode: int) -> list[tuple[str, bytes, int]]:
    """downwardAPI items with a fieldRef (labels and annotations as the kubelet writes them)."""
    m = pod.get("metadata") or {}
    files = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("fieldRef"), dict):
            continue  # resourceFieldRef: no container limits to report here
        path = str(it["fieldRef"].get("fieldPath") or "")
        if path in ("metadata.labels", "metadata.annotations"):
            pairs = sorted((m.get(path.split(".")[1]) or {}).items())
            value = "\n".join(f'{k}="{val}"' for k, val in pairs)
        else:
            value = field_value(pod, path, "", "")
        files.append((_safe_rel(str(it.get("path") or "")), value.encode(), int(it.get("mode") or default_mode)))
    return files


def in_cluster_env(api_url: str, mounts: list[tuple[str, str]]) -> dict[str, str]:
    """What a kubelet tells a container about the API server, plus the local directory of its
    service-account mount. The service variables only for an HTTPS server: in-cluster clients
    always speak HTTPS to ``KUBERNETES_SERVICE_HOST:PORT``."""
    env: dict[str, str] = {}
    url = urlsplit(api_url)
    if url.scheme == "https" and url.hostname:
        port = str(url.port or 443)
        host = url.hostname
        shown = f"[{host}]" if ":" in host else host
        env.update(
            {
                "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port,
                "KUBERNETES_PORT": f"tcp://{shown}:{port}",
            }
        )
    local = rewrite_path(SERVICE_ACCOUNT_DIR, mounts)
    if local != SERVICE_ACCOUNT_DIR:
        env[SERVICE_ACCOUNT_DIR_ENV] = local
    return env


def volume_files(
    pod: Obj, objects: Objects, tokens: dict[tuple[str, str], bytes] | None = None
) -> dict[str, list[tuple[str, bytes, int]]]:
    """Files of every volume the node sim can materialise (secret, configMap, downwardAPI,
    projected with secret/configMap/downwardAPI/serviceAccountToken sources, emptyDir; others are
    skipped), by volume name. ``tokens`` holds the fetched token of each (volume, path) of
    :func:`token_sources` (None: token files are left out, for pods whose files are not written).
    Raises MountError."""
    out: dict[str, list[tuple[str, bytes, int]]] = {}
    for v in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(v, dict) or not v.get("name"):
            continue
        vname = str(v["name"])
        if isinstance(v.get("emptyDir"), dict):
            out[vname] = []
            continue
        default_mode = int(
            (v.get("projected") or v.get("secret") or v.get("configMap") or v.get("downwardAPI") or {}).get(
                "defaultMode"
            )
            or 0o644
        )
        if isinstance(v.get("downwardAPI"), dict):
            out[vname] = _downward_files(pod, v["downwardAPI"].get("items") or [], default_mode)
            continue
        extra: list[tuple[str, bytes, int]] = []
        for s in (v.get("projected") or {}).get("sources") or []:
            if isinstance((s or {}).get("downwardAPI"), dict):
                extra += _downward_files(pod, s["downwardAPI"].get("items") or [], default_mode)
            tok = (s or {}).get("serviceAccountToken")
            if isinstance(tok, dict) and tokens is not None:
                path = _safe_rel(str(tok.get("path") or "token"))
                if (vname, path) not in tokens:
                    raise MountError(f'MountVolume.SetUp failed for volume "{vname}" : no service account token yet')
                extra.append((path, tokens[(vname, path)], default_mode))
        sources = _volume_sources(v)
        if not sources and not extra:
            continue
        files: list[tuple[str, bytes, int]] = list(extra)
        for kind, src in sources:
            name = str(src.get("secretName") if kind == "secrets" else src.get("name") or "")
            obj = objects.get((kind, name))
            if obj is None:
                if src.get("optional"):
                    continue
                raise MountError(
                    f'MountVolume.SetUp failed for volume "{vname}" : {_KIND_WORD[kind][0]} "{name}" not found'
                )
            data = object_data(kind, obj)
            items = src.get("items")
            if items:
                for it in items:
                    key = it.get("key", "")
                    if key not in data:
                        if src.get("optional"):
                            continue
                        raise MountError(
                            f'MountVolume.SetUp failed for volume "{vname}" : configmap references non-existent config key: {key}'
                            if kind == "configmaps"
                            else f'MountVolume.SetUp failed for volume "{vname}" : references non-existent secret key: {key}'
                        )
                    files.append((_safe_rel(it.get("path") or key), data[key], int(it.get("mode") or default_mode)))
            else:
                files.extend((_safe_rel(k), val, default_mode) for k, val in data.items())
        out[vname] = files
    return out


def _safe_rel(path: str) -> str:
    """A volume item path, never escaping the volume directory."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("", ".", "..", "/")]
    return "/".join(parts) or "_"


def container_mounts(container: Obj, volume_dirs: dict[str, str]) -> list[tuple[str, str]]:
    """(mountPath, local path) for each of the container's mounts of a materialised volume,
    longest mountPath first so that nested mounts win."""
    mounts: list[tuple[str, str]] = []
    for vm in container.get("volumeMounts") or []:
        if not isinstance(vm, dict):
            continue
        local = volume_dirs.get(str(vm.get("name", "")))
        mount_path = str(vm.get("mountPath") or "").rstrip("/")
        if local is None or not mount_path:
            continue
        sub = str(vm.get("subPath") or "")
        mounts.append((mount_path, os.path.join(local, _safe_rel(sub)) if sub else local))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    return mounts


def rewrite_path(value: str, mounts: list[tuple[str, str]]) -> str:
    """``/etc/gha-listener/config.json`` → ``<pod dir>/volumes/listener-config/config.json`` when a
    volume is mounted at ``/etc/gha-listener``; only whole path components match."""
    for mount_path, local in mounts:
        if value == mount_path:
            return local
        if value.startswith(mount_path + "/"):
            return local + value[len(mount_path) :]
    return value


# Executables of the project's images, run with this interpreter (no PATH or image needed).
# ``/ghalistener`` is the command of ARC's listener pod: an ARC-shaped listener pod runs ours
# (it reads LISTENER_CONFIG_PATH as ARC's does).
COMMAND_ALIASES: dict[str, list[str]] = {"runnerscale": [], "ghalistener": ["listener"]}


def build_command(
    container: Obj, env: dict[str, str], mounts: list[tuple[str, str]], python: str = sys.executable
) -> list[str]:
    """The argv to run: command + args, ``$(VAR)`` expanded, mount paths rewritten, and a leading
    ``runnerscale`` (or ARC's ``/ghalistener``) mapped to this interpreter's ``-m shared.cli``.
    Raises StartError when there is nothing to run (the image's entrypoint is unknown here)."""
    command = [str(x) for x in container.get("command") or []]
    args = [str(x) for x in container.get("args") or []]
    argv = command + args
    if not command:
        raise StartError(
            "the node simulator cannot run image entrypoints: the container needs `command` (image "
            f"{container.get('image', '')!r})"
        )
    argv = [rewrite_path(expand(a, env), mounts) for a in argv]
    alias = COMMAND_ALIASES.get(os.path.basename(argv[0]))
    if alias is not None:
        argv = [python, "-m", "shared.cli", *alias, *argv[1:]]
    return argv


def rewrite_env(env: dict[str, str], mounts: list[tuple[str, str]]) -> dict[str, str]:
    return {k: rewrite_path(v, mounts) for k, v in env.items()}
