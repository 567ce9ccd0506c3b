"""The one device-gate client and runner, for every port's gates (port.yaml ``gates``).

``client.py`` is the OpenAI-API HTTP client the gates talk to a server with, the result record
and the runner of a gate's own script; ``runner.py`` selects, runs and reports a port's gates.
Standard library only (PyYAML to read a port.yaml): the gates run inside a port image.

    python3 -m fixpack.gates --port glm-5-mxfp4 [--pack DIR] [gate options...]
"""

from fixpack.gates.client import Client, GateError, Result, run_script, table

__all__ = ["Client", "GateError", "Result", "run_script", "table"]
