"""Helpers for fixpack's own tests (tests/) and benchmarks (bench/): synthetic packs and trees,
the CLI in a subprocess, fault injection, the reliability and hostile-input scenarios.

Not part of the fixpack package and not shipped; importable because pytest puts the repository
root on sys.path (`pythonpath` in pyproject.toml) and the subprocesses get it as PYTHONPATH."""
