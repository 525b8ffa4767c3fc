"""API requests by component: the emulator counts them by User-Agent (``/_emulator/requests``
rows' ``agents``), and runnerscale's clients name their component there (``runnerscale-runner/…``,
``runnerscale-node-sim/…``), so the benches split what each process sends (issue 10)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


def component(agent: str) -> str:
    """``runnerscale-runner/0.1.0 (linux/amd64) …`` → ``runner``; another client → its program."""
    program = agent.split("/", 1)[0].strip()
    return program.removeprefix("runnerscale-") or "(no agent)"


def by_component(rows: Iterable[Mapping[str, Any]], verbs: Iterable[str] | None = None) -> Counter[str]:
    """Requests per component in ``/_emulator/requests`` rows (only ``verbs`` when given)."""
    wanted = set(verbs) if verbs is not None else None
    out: Counter[str] = Counter()
    for row in rows:
        if wanted is None or row["verb"] in wanted:
            for agent, count in row.get("agents", {}).items():
                out[component(agent)] += int(count)
    return out


def split(counts: Mapping[str, int], scale: float, digits: int = 1) -> str:
    """``runner 3.1, runner-set 3.5, node-sim 4.0``: largest first, each count times ``scale``."""
    return ", ".join(f"{k} {c * scale:.{digits}f}" for k, c in sorted(counts.items(), key=lambda kv: -kv[1]))
