# The device gates run against a server on a card (run_gates.sh), not under pytest; the
# scripts in gates/ are the fix pack's device checks, run by gates.py.
collect_ignore_glob = ["gates/*.py", "gates.py"]
