"""The Prometheus metrics runnerscale's deployed processes export, found by reading their code, and
the metric names a PromQL expression uses, found by parsing it.

Exported: every ``Counter``/``Gauge``/``Histogram``/``Summary`` constructor (and the listener's
``gauge(...)`` helper) under ``shared/`` and ``services/`` — without ``services/embedded/`` (the
embedded default's doubles, never deployed) — expanded to the series names prometheus_client
exposes (``_total`` for counters; ``_bucket``, ``_sum``, ``_count`` for histograms; ``_created``).
``tests/deploy/test_workers_run.py`` checks this reading against what running workers serve.

Used: ``promql_parser`` (the Python binding of the GreptimeDB PromQL parser) parses each expression
— a syntax or type error fails the caller — and every vector selector's name is collected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import promql_parser

ROOT = Path(__file__).resolve().parents[2]
# prometheus_client's default collectors (process, Python runtime, platform): not runnerscale's
# metrics; every Kubernetes monitoring stack already shows a pod's CPU and memory.
PROCESS_COLLECTORS = ("process_", "python_")
_CONSTRUCTOR = re.compile(r"\b(Counter|Gauge|Histogram|Summary|gauge)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")
# Grafana's built-in range variables, replaced by a duration so that the expression parses.
_GRAFANA_RANGES = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")


@dataclass(frozen=True)
class Family:
    name: str  # as exposed: counters with their _total suffix
    kind: str  # counter, gauge, histogram, summary
    source: Path

    @property
    def series(self) -> tuple[str, ...]:
        if self.kind == "counter":
            base = self.name.removesuffix("_total")
            return (self.name, f"{base}_created")
        if self.kind == "histogram":
            return tuple(f"{self.name}{s}" for s in ("_bucket", "_sum", "_count", "_created"))
        if self.kind == "summary":
            return (self.name, *(f"{self.name}{s}" for s in ("_sum", "_count", "_created")))
        return (self.name,)


def source_files() -> list[Path]:
    files = [*(ROOT / "shared").rglob("*.py"), *(ROOT / "services").rglob("*.py")]
    return sorted(p for p in files if "embedded" not in p.relative_to(ROOT).parts)


def exported_families() -> dict[str, Family]:
    """Family name (counters as ``<base>_total``) → Family."""
    out: dict[str, Family] = {}
    for path in source_files():
        for constructor, declared in _CONSTRUCTOR.findall(path.read_text()):
            kind = "gauge" if constructor == "gauge" else constructor.lower()
            # prometheus_client exposes a counter as <name>_total whether or not it was declared so
            name = f"{declared.removesuffix('_total')}_total" if kind == "counter" else declared
            out[name] = Family(name, kind, path.relative_to(ROOT))
    return out


def exported_series() -> dict[str, str]:
    """Series name → the family it belongs to."""
    return {series: family.name for family in exported_families().values() for series in family.series}


def family_of(series: str) -> str | None:
    return exported_series().get(series)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (``{__name__="x"}`` included). Raises ValueError
    when the expression is not valid PromQL."""
    text = _GRAFANA_RANGES.sub("5m", expr)
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)

    promql_parser.walk(promql_parser.parse(text), visit)
    return names
