"""The one gate runner: selects a port's gates, runs them against a server, reports them.

A port's gate module (port.yaml ``gates.module``, importable from ``gates.path``) declares:

* ``GATES``: {name: gate(client, opts) -> Result or list[Result]}, in the order they run;
* ``DEFAULT``: the names run without --only (default: every gate);
* ``NO_SERVER``: the names that need no server (their client is None when only they run);
* ``add_arguments(parser)``: the gates' own options;
* optionally ``check(opts) -> str | None``: a usage error in those options (exit 2);
* optionally ``STRICT = True``: a gate that is not measured, not run or missing fails the run
  without --strict too.

Every gate gets the same common options (--base-url, --model, --api-key, --only, --json,
--strict, --timeout), the same result record (client.Result), the same report (a line per gate
on stderr as it finishes, the table on stdout, --json) and the same exit code: 0 when every
selected gate passed (or recorded), 1 when one failed or errored (with --strict also when one
was not measured, not run or missing), 2 bad usage. A gate that raises is an "error" result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from types import ModuleType

from fixpack.gates.client import FAILED, PENDING, Client, Result, table


def parser(module: ModuleType, prog: str | None = None) -> argparse.ArgumentParser:
    doc = (module.__doc__ or "").strip()
    p = argparse.ArgumentParser(
        prog=prog, description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", default=os.environ.get("GATE_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument(
        "--only", help=f"comma-separated gates of {', '.join(module.GATES)} (default: {', '.join(default(module))})"
    )
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--strict", action="store_true", help="'not measured', 'not run' and 'missing' fail too")
    p.add_argument("--timeout", type=float, default=getattr(module, "TIMEOUT", 1800.0), help="seconds per request")
    module.add_arguments(p)
    return p


def default(module: ModuleType) -> list[str]:
    return list(getattr(module, "DEFAULT", module.GATES))


class UsageError(Exception):
    """Options the gates cannot run with (exit 2)."""


def selected(module: ModuleType, opts) -> list[str]:
    names = [g.strip() for g in opts.only.split(",") if g.strip()] if opts.only else default(module)
    unknown = [g for g in names if g not in module.GATES]
    if unknown or not names:
        raise UsageError(f"unknown gate(s) {', '.join(unknown) or '(none named)'}; known: {', '.join(module.GATES)}")
    return names


def run_gates(module: ModuleType, opts) -> list[Result]:
    """Run the selected gates in order; a gate that raises gives an "error" result."""
    names = selected(module, opts)
    check = getattr(module, "check", None)
    problem = check(opts) if check is not None else None
    if problem:
        raise UsageError(problem)
    no_server = set(getattr(module, "NO_SERVER", ()))
    needs_server = any(n not in no_server for n in names)
    client = Client(opts.base_url, opts.model, opts.timeout, getattr(opts, "api_key", None)) if needs_server else None
    results: list[Result] = []
    for name in names:
        t0 = time.perf_counter()
        try:
            got = module.GATES[name](client, opts)
        except Exception as exc:  # a gate's failure to run is its result, never the run's end
            got = Result(name, "error", f"{type(exc).__name__}: {exc}"[:200], {"error": f"{type(exc).__name__}: {exc}"})
        if client is not None and client._model is not None:
            opts.model = client._model
        for r in got if isinstance(got, list) else [got]:
            r.seconds = round(time.perf_counter() - t0, 1)
            results.append(r)
            print(f"{r.gate}: {r.result}  {r.figures}", file=sys.stderr, flush=True)
    return results


def exit_code(module: ModuleType, results: list[Result], strict: bool) -> int:
    bad = set(FAILED) | (set(PENDING) if strict or getattr(module, "STRICT", False) else set())
    return 1 if any(r.result in bad for r in results) else 0


def main(module: ModuleType, argv: list[str] | None = None, prog: str | None = None) -> int:
    opts = parser(module, prog).parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        results = run_gates(module, opts)
    except UsageError as exc:
        print(f"gates: {exc}", file=sys.stderr)
        return 2
    print(table(results))
    if opts.json:
        report = {
            "server": opts.base_url,
            "model": opts.model,
            "started": started,
            "gates": [asdict(r) for r in results],
        }
        with open(opts.json, "w") as f:
            f.write(json.dumps(report, indent=1) + "\n")
    return exit_code(module, results, opts.strict)
