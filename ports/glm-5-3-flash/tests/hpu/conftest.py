# The device gates run against a server on a card (run_gates.sh, python -m gates), not under
# pytest; the package's own logic is tested from ../test_gates_client.py.
collect_ignore_glob = ["gates/*.py"]
