"""Client of the emulator's ``/_emulator/`` control endpoint, sync (urllib) and async (aiohttp).

Usable from tests and from other processes (end-to-end tests point it at a subprocess emulator).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import msgspec

from .faults import FaultRule


class ControlError(RuntimeError):
    """The control endpoint refused a request (bad rule, unknown path) or could not be reached."""


def _obj(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ControlError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _items(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ControlError(f"expected a JSON array, got {type(value).__name__}")
    return value


class EmulatorControl:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    # --- sync --------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ControlError(
                f"{method} {path}: HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            ) from None
        except OSError as exc:
            raise ControlError(f"{method} {path}: {exc}") from None

    def add_fault(self, rule: FaultRule | None = None, **fields: Any) -> int:
        """Add a fault rule (a FaultRule or its fields as keywords); returns the rule id."""
        rule = rule or FaultRule(**fields)
        return int(self._call("POST", "/_emulator/faults", msgspec.to_builtins(rule))["id"])

    def faults(self) -> list[FaultRule]:
        return msgspec.convert(self._call("GET", "/_emulator/faults"), list[FaultRule])

    def remove_fault(self, rule_id: int) -> None:
        self._call("DELETE", f"/_emulator/faults/{rule_id}")

    def clear_faults(self) -> None:
        self._call("DELETE", "/_emulator/faults")

    def compact(self, resource_version: int | None = None) -> int:
        return int(
            self._call("POST", "/_emulator/compact", {"resource_version": resource_version})["compacted_revision"]
        )

    def cut_watches(self, abrupt: bool = False) -> int:
        """End open watches: cleanly (EOF) or ``abrupt`` (connection dropped mid-stream)."""
        return int(self._call("POST", "/_emulator/cut-watches", {"abrupt": abrupt})["cut"])

    def settings(self, **changes: Any) -> dict[str, Any]:
        """Read (no arguments) or change settings: watch_lag_seconds, bookmark_interval_seconds,
        gc_delay_seconds, gc_paused."""
        if not changes:
            return _obj(self._call("GET", "/_emulator/settings"))
        return _obj(self._call("PUT", "/_emulator/settings", changes))

    def state(self) -> dict[str, Any]:
        return _obj(self._call("GET", "/_emulator/state"))

    def request_counts(self) -> list[dict[str, Any]]:
        return _items(self._call("GET", "/_emulator/requests"))

    def reset_request_counts(self) -> None:
        self._call("DELETE", "/_emulator/requests")

    def run_gc(self) -> bool:
        return bool(self._call("POST", "/_emulator/gc", {})["changed"])

    # --- async -------------------------------------------------------------------------------

    async def _acall(self, method: str, path: str, body: Any = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, self.base_url + path, json=body) as resp,
        ):
            text = await resp.text()
            if resp.status >= 400:
                raise ControlError(f"{method} {path}: HTTP {resp.status}: {text[:300]}")
            return json.loads(text or "null")

    async def add_fault_async(self, rule: FaultRule | None = None, **fields: Any) -> int:
        rule = rule or FaultRule(**fields)
        return int((await self._acall("POST", "/_emulator/faults", msgspec.to_builtins(rule)))["id"])

    async def clear_faults_async(self) -> None:
        await self._acall("DELETE", "/_emulator/faults")

    async def compact_async(self, resource_version: int | None = None) -> int:
        return int(
            (await self._acall("POST", "/_emulator/compact", {"resource_version": resource_version}))[
                "compacted_revision"
            ]
        )

    async def cut_watches_async(self, abrupt: bool = False) -> int:
        return int((await self._acall("POST", "/_emulator/cut-watches", {"abrupt": abrupt}))["cut"])

    async def settings_async(self, **changes: Any) -> dict[str, Any]:
        if not changes:
            return _obj(await self._acall("GET", "/_emulator/settings"))
        return _obj(await self._acall("PUT", "/_emulator/settings", changes))

    async def state_async(self) -> dict[str, Any]:
        return _obj(await self._acall("GET", "/_emulator/state"))

    async def request_counts_async(self) -> list[dict[str, Any]]:
        return _items(await self._acall("GET", "/_emulator/requests"))
