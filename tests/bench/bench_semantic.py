"""semantic_equal / semantic_derivative against a naive normalise-then-compare baseline.

Inputs are the realistic runner pod template of tests/data/arc/runner-template.yaml (dind sidecar,
20 env vars, five volumes, resources) and the listener pod pair (desired vs server-defaulted live).
The baseline builds the canonical form of both trees (``shared.semantic.normalise``: empties
dropped, quantities parsed, booleans kept apart) and compares those with ``==`` (or a subset walk
for the derivative). Target: semantic_equal at least 3x faster than the baseline.

    python -m tests.bench semantic [--quick]
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from shared.semantic import normalise, semantic_derivative, semantic_equal
from tests.bench.table import Table

ARC_DATA = Path(__file__).resolve().parent.parent / "data" / "arc"


def _load(name: str) -> Any:
    return yaml.safe_load((ARC_DATA / name).read_text())


def _subset(desired: Any, live: Any) -> bool:
    if desired is None:
        return True
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) <= len(live)
            and all(_subset(d, v) for d, v in zip(desired, live, strict=False))
        )
    return bool(desired == live)


def naive_equal(a: Any, b: Any) -> bool:
    return bool(normalise(a) == normalise(b))


def naive_derivative(desired: Any, live: Any) -> bool:
    return _subset(normalise(desired), normalise(live))


def _drop_empties(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _drop_empties(v) for k, v in tree.items() if v not in (None, [], {})}
    if isinstance(tree, list):
        return [_drop_empties(v) for v in tree]
    return tree


def cases() -> list[tuple[str, str, Callable[[Any, Any], bool], Callable[[Any, Any], bool], Any, Any, bool]]:
    template = _load("runner-template.yaml")
    # What the scale-set worker compares on a reconcile where nothing changed: the desired spec
    # against the same spec read back from the server (a different object, same content).
    same = json.loads(json.dumps(template))
    # Same meaning, different spelling: explicit empties dropped by the server, quantities respelled.
    with_empties = copy.deepcopy(template)
    with_empties["spec"]["containers"][0]["args"] = []
    with_empties["spec"]["imagePullSecrets"] = []
    with_empties["spec"]["hostAliases"] = []
    with_empties["metadata"]["finalizers"] = []
    respelled = _drop_empties(copy.deepcopy(with_empties))
    respelled["spec"]["containers"][0]["resources"]["limits"]["memory"] = "8192Mi"
    respelled["spec"]["volumes"][3]["emptyDir"]["sizeLimit"] = "51200Mi"
    # A real change deep in the tree (last volume), the worst case for an early exit.
    changed = copy.deepcopy(template)
    changed["spec"]["volumes"][4]["persistentVolumeClaim"]["claimName"] = "tool-cache-v2"
    desired_pod, live_pod = _load("listener-pod-desired.yaml"), _load("listener-pod-live.yaml")
    # The runner pod as the server returns it: defaults on the pod and on every container.
    live_runner = json.loads(json.dumps(template))
    live_runner["spec"].update(
        nodeName="worker-7",
        dnsPolicy="ClusterFirst",
        schedulerName="default-scheduler",
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
    )
    live_runner["spec"]["tolerations"] += copy.deepcopy(live_pod["spec"]["tolerations"])
    live_runner["spec"]["volumes"].append(copy.deepcopy(live_pod["spec"]["volumes"][1]))
    for container in live_runner["spec"]["containers"] + live_runner["spec"]["initContainers"]:
        container.update(
            imagePullPolicy="IfNotPresent",
            terminationMessagePath="/dev/termination-log",
            terminationMessagePolicy="File",
        )
        container["volumeMounts"].append(copy.deepcopy(live_pod["spec"]["containers"][0]["volumeMounts"][1]))
    drifted_pod = copy.deepcopy(desired_pod)
    drifted_pod["spec"]["containers"][0]["image"] = "ghcr.io/actions/gha-runner-scale-set-controller:0.14.3"
    return [
        ("runner spec, unchanged (read back)", "semantic_equal", semantic_equal, naive_equal, template, same, True),
        (
            "runner spec, empties dropped + quantities respelled",
            "semantic_equal",
            semantic_equal,
            naive_equal,
            with_empties,
            respelled,
            True,
        ),
        ("runner spec, last volume changed", "semantic_equal", semantic_equal, naive_equal, template, changed, False),
        (
            "listener pod vs server-defaulted live pod",
            "semantic_derivative",
            semantic_derivative,
            naive_derivative,
            desired_pod,
            live_pod,
            True,
        ),
        (
            "listener pod, image changed",
            "semantic_derivative",
            semantic_derivative,
            naive_derivative,
            drifted_pod,
            live_pod,
            False,
        ),
        (
            "runner pod vs server-defaulted live runner pod",
            "semantic_derivative",
            semantic_derivative,
            naive_derivative,
            template,
            live_runner,
            True,
        ),
    ]


def _per_call_us(fn: Callable[[Any, Any], bool], a: Any, b: Any, budget_s: float) -> float:
    """Best-of-5 mean time per call, each round sized to about budget_s / 5."""
    calls = 1
    while True:  # calibrate
        start = time.perf_counter()
        for _ in range(calls):
            fn(a, b)
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s / 50 or calls >= 1 << 20:
            break
        calls *= 2
    per_round = max(1, int(calls * (budget_s / 5) / max(elapsed, 1e-9)))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(per_round):
            fn(a, b)
        best = min(best, (time.perf_counter() - start) / per_round)
    return best * 1e6


def run(quick: bool = False) -> Table:
    budget = 0.05 if quick else 1.0
    table = Table(
        title="Semantic comparison vs naive normalise-then-compare (microseconds per call)",
        headers=["case", "function", "result", "runnerscale µs", "naive µs", "speed-up"],
    )
    for name, fn_name, fn, naive, a, b, expected in cases():
        result = fn(a, b)
        if result is not expected or naive(a, b) is not expected:
            raise AssertionError(f"{name}: expected {expected}, got {result} / naive {naive(a, b)}")
        fast = _per_call_us(fn, a, b, budget)
        slow = _per_call_us(naive, a, b, budget)
        table.add(
            name, fn_name, "equal" if expected else "drift", round(fast, 1), round(slow, 1), f"{slow / fast:.1f}x"
        )
    return table


if __name__ == "__main__":
    print(run().render())
