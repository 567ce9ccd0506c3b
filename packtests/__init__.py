"""Helpers shared by the pack's fix tests (fixes/<id>/test_*.py): harnesses specific to vLLM and
vllm-gaudi that drive the real release modules. They belong to the pack, not to the engine
package, and are imported as `packtests.<module>` (pytest puts the repository root on sys.path)."""
