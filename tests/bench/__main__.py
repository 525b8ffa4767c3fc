"""Run every benchmark in tests/bench/ and print one table each: `make bench`.

A benchmark is a module ``tests/bench/bench_<name>.py`` with ``run() -> Table``. They are not
collected by pytest (timing targets live here, not in unit tests); each module may also have a
small smoke test under tests/ that calls ``run(quick=True)``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys

import tests.bench as pkg
from tests.bench.table import Table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench")
    parser.add_argument(
        "names",
        nargs="*",
        help="benchmark names (default: all), e.g. semantic bus; numbers are sizes for the benchmarks"
        " that take them (`burst 1000` runs the burst at N = 1,000 only)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    wanted = [a for a in args.names if not a.isdigit()]
    sizes = tuple(int(a) for a in args.names if a.isdigit())
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_")]
    if wanted or sizes:
        names = [n for n in names if n.removeprefix("bench_") in wanted]
    if not names:
        parser.error(f"no benchmark named {' '.join(wanted) or '(sizes need a benchmark name)'}")
    for name in sorted(names):
        module = importlib.import_module(f"tests.bench.{name}")
        kwargs: dict[str, object] = {"quick": args.quick}
        if sizes:
            if "sizes" not in inspect.signature(module.run).parameters:
                parser.error(f"{name.removeprefix('bench_')} takes no sizes")
            kwargs["sizes"] = sizes
        table: Table = module.run(**kwargs)
        print(table.render())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
