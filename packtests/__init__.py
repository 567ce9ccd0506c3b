"""The one helper package of the project's tests and benchmarks. Not part of the fixpack package
and not shipped; it imports as `packtests.<module>` because the repository root is the tests'
import root (`pythonpath` in pyproject.toml; subprocesses get it as PYTHONPATH).

- for the pack's fix tests (fixes/<id>/test_*.py, ports/<port>/fixes/<id>/test_*.py):
  `sampling_runner` (the real HPU sampling path of a release tree), `glm_tokenizer`;
- for the engine's tests (tests/) and bench/: `builders` (synthetic packs and trees, the CLI in a
  subprocess), `faultwrap` (fault injection), `reliability_lib`, `hostile_cases`,
  `sandbox_cases`, `codemods`, `recipes`, `vllm_e2e`;
- for the ports' tests: `flash_reference` and `flash_checkpoint` (GLM-5.3-Flash's tiny
  transformers reference and checkpoint), `glm_moe_dsa_tiny` and `mxfp4_blocks` (GLM-5.3's tiny
  checkpoint, MXFP4 test blocks).
"""
