"""The gates' HTTP client, result record and script runner: fixpack's one gate client
(fixpack/gates/client.py), which every port's gates use."""

from fixpack.gates.client import Client, GateError, Result, run_script, table

__all__ = ["Client", "GateError", "Result", "run_script", "table"]
