"""Building etcd, kube-apiserver and kube-controller-manager from the Go module proxy.

The two wrapper modules under ``go/`` pin the versions (their ``go.mod`` is the one place a
version is written). Binaries are cached per version outside the checkout, under
``${XDG_CACHE_HOME:-~/.cache}/runnerscale/controlplane/<key>/bin``; Go's own build cache makes a
rebuild after a cache wipe cheap. Concurrent builds (several checkouts testing at once) serialise
on a lock file, and a build only ever becomes visible by an atomic rename, so a half-written
binary is never used.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GO_DIR = Path(__file__).resolve().parent / "go"
KUBE_MODULE = GO_DIR / "kube"
ETCD_MODULE = GO_DIR / "etcd"
KUBE_COMMANDS = ("k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
GO_HINT = (
    "the real Kubernetes control plane is built from source and needs Go >= 1.26 on PATH "
    "(https://go.dev/doc/install, or your distribution's golang package); "
    "set RUNNERSCALE_GO to use a go binary that is not on PATH"
)
# A cold build of both kube binaries takes ~15-30 min on 2 busy cores; the deadline only guards
# against a hung toolchain.
BUILD_TIMEOUT_SECONDS = 90 * 60


class BuildError(RuntimeError):
    """The control plane cannot be built; the message says why and how to fix it."""


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str

    @property
    def label(self) -> str:
        return f"kube-{self.kubernetes}_etcd-{self.etcd}"


def required_version(go_mod: str, module: str) -> str:
    """The version ``go_mod`` requires of ``module`` (single-line or block ``require``)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise BuildError(f"go.mod does not require {module}")
    return match.group(1)


def pinned_versions() -> Versions:
    return Versions(
        kubernetes=required_version((KUBE_MODULE / "go.mod").read_text(), "k8s.io/kubernetes"),
        etcd=required_version((ETCD_MODULE / "go.mod").read_text(), "go.etcd.io/etcd/server/v3"),
    )


def commit_from_module_sum(module_sum: str) -> str:
    """A 40-hex-digit stand-in for the git commit: module zips from the proxy carry no git metadata,
    so the first 20 bytes of the module's content hash (``h1:<base64 sha256>``) identify the source."""
    if not module_sum.startswith("h1:"):
        raise BuildError(f"unexpected module checksum {module_sum!r}")
    return base64.b64decode(module_sum[3:])[:20].hex()


def kube_version_ldflags(version: str, module_sum: str, build_date: str) -> list[str]:
    """``-X`` flags that make ``/version`` complete, as Kubernetes' own release build sets them."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+.*", version)
    if match is None:
        raise BuildError(f"unexpected Kubernetes version {version!r}")
    values = {
        "gitVersion": version,
        "gitMajor": match.group(1),
        "gitMinor": match.group(2),
        "gitCommit": commit_from_module_sum(module_sum),
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    return [
        f"-X {package}.{key}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in values.items()
    ]


def go_binary() -> str:
    go = os.environ.get("RUNNERSCALE_GO") or shutil.which("go")
    if not go:
        raise BuildError(f"no `go` found: {GO_HINT}")
    return go


def go_version(go: str) -> str:
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"`{go} env GOVERSION` failed ({exc}): {GO_HINT}") from exc
    return out.strip()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runnerscale" / "controlplane"


def source_digest() -> str:
    """Changes whenever a wrapper module changes (go.mod, go.sum or Go source)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in GO_DIR.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(GO_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def cache_dir(versions: Versions, go_ver: str) -> Path:
    return cache_root() / f"{versions.label}_{go_ver}_{source_digest()}"


def cached_bin_dir(go: str | None = None) -> Path | None:
    """The cached binaries' directory if a complete build is there, else None (no build)."""
    go = go or go_binary()
    bin_dir = cache_dir(pinned_versions(), go_version(go)) / "bin"
    return bin_dir if all((bin_dir / name).is_file() for name in BINARIES) else None


@contextlib.contextmanager
def _locked(path: Path, cancel: threading.Event | None) -> Iterator[None]:
    """Exclusive use of one cache entry (another checkout may be building the same versions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is not None and cancel.is_set():
                    raise BuildError("build cancelled while waiting for another build of the same versions") from None
                time.sleep(1)  # another process holds the lock: its build takes minutes
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Static binaries: no C toolchain needed on a fresh machine (Kubernetes' releases build so too).
    env["CGO_ENABLED"] = "0"
    # The committed go.sum is the whole truth; the user's own GOFLAGS still apply.
    env["GOFLAGS"] = " ".join(filter(None, [env.get("GOFLAGS", ""), "-mod=readonly", "-buildvcs=false"]))
    # The local toolchain only: an older `go` fails with its own message instead of fetching one.
    env["GOTOOLCHAIN"] = "local"
    return env


def _run(argv: list[str], cwd: Path, log: Path, nice: int, cancel: threading.Event | None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}  (in {cwd})\n")
        out.flush()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=_go_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        if nice:
            # Lower priority for a build that runs beside tests; the compilers go starts inherit it.
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
        deadline = time.monotonic() + BUILD_TIMEOUT_SECONDS
        while True:
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    raise BuildError("build cancelled (Go's build cache keeps what was compiled)") from None
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"`{' '.join(argv)}` did not finish within {BUILD_TIMEOUT_SECONDS} s; log: {log}"
                    ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise BuildError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}; log: {log}\n{tail}")


def _module_info(go: str, module_dir: Path, module: str) -> tuple[str, str]:
    """(content checksum, publication time as RFC 3339) of ``module`` as the proxy serves it."""
    done = subprocess.run(
        [go, "mod", "download", "-json", module],
        cwd=module_dir,
        env=_go_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"`go mod download {module}` failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    info = json.loads(done.stdout)
    published = json.loads(Path(info["Info"]).read_text())["Time"]
    return info["Sum"], published


def build(*, nice: int = 0, echo: bool = False, cancel: threading.Event | None = None) -> Path:
    """Build (or find cached) binaries and return their directory. Raises BuildError."""
    go = go_binary()
    go_ver = go_version(go)
    versions = pinned_versions()
    target = cache_dir(versions, go_ver)
    bin_dir = target / "bin"
    with _locked(target.with_name(target.name + ".lock"), cancel):
        if all((bin_dir / name).is_file() for name in BINARIES):
            return bin_dir
        target.mkdir(parents=True, exist_ok=True)
        log = target / "build.log"
        staging = Path(tempfile.mkdtemp(prefix="bin-", dir=target))
        started = time.monotonic()
        if echo:
            print(f"building Kubernetes {versions.kubernetes} and etcd {versions.etcd} with {go_ver}; log: {log}")
        try:
            module_sum, published = _module_info(go, KUBE_MODULE, "k8s.io/kubernetes")
            ldflags = " ".join(["-s", "-w", *kube_version_ldflags(versions.kubernetes, module_sum, published)])
            # One invocation for both commands: they share most packages, so the work is shared too.
            _run(
                [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(staging) + "/", *KUBE_COMMANDS],
                KUBE_MODULE,
                log,
                nice,
                cancel,
            )
            etcd_sum, _ = _module_info(go, ETCD_MODULE, "go.etcd.io/etcd/server/v3")
            etcd_ldflags = f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA={commit_from_module_sum(etcd_sum)[:7]}"
            _run(
                [go, "build", "-trimpath", "-ldflags", etcd_ldflags, "-o", str(staging / "etcd"), "."],
                ETCD_MODULE,
                log,
                nice,
                cancel,
            )
            if bin_dir.exists():
                shutil.rmtree(bin_dir)
            staging.rename(bin_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if echo:
            print(f"built in {time.monotonic() - started:.0f} s: {bin_dir}")
        return bin_dir
