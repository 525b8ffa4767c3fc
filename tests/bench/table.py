"""A plain-text table for benchmark output."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[object]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append(list(cells))

    def render(self) -> str:
        cells = [self.headers] + [[_fmt(c) for c in row] for row in self.rows]
        widths = [max(len(str(r[i])) for r in cells) for i in range(len(self.headers))]

        def line(r: list[str]) -> str:
            return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))

        out = [self.title, "=" * len(self.title), line(cells[0]), line(["-" * w for w in widths])]
        out += [line(r) for r in cells[1:]]
        return "\n".join(out)


def _fmt(c: object) -> str:
    if isinstance(c, float):
        return f"{c:.3g}" if abs(c) < 1000 else f"{c:,.0f}"
    return str(c)
