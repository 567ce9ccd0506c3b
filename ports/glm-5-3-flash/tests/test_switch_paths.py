"""Every accepted spelling of a switch reaches the code path it names, shown by what ran.

A switch value is parsed from an environment mapping by the plugin's parser
(``switches.read_switches``), handed to the parity model as the vLLM model hands it to
its layers, and one decoder layer is run under a TorchDispatchMode that counts aten ops.
The count is compared with the count of the same layer built with the path chosen
directly; the two paths' counts differ, so the count says which one ran.
"""

import pytest
import torch

from glm5_next_hpu.reference import Glm5NextReference
from glm5_next_hpu.switches import Switches, read_switches
from packtests.flash_reference import OpCount as _Count
from packtests.flash_reference import tiny_config

TRUE = ["1", "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", " 1 "]
FALSE = ["0", "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"]
T = 320  # five 64-token chunks: the sequential carry's op count grows with them, the scan's barely


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    cfg = tiny_config()
    text = cfg.text_config
    X = torch.randn(1, T, text.hc_mult, text.hidden_size)
    mask = torch.ones(1, T, dtype=torch.bool)
    return cfg, X, mask


def _ops_of_first_layer(cfg, X, mask, switches) -> int:
    torch.manual_seed(0)
    layer = Glm5NextReference(cfg, switches=switches).model.language_model.layers[0]
    assert layer.is_kda
    with torch.no_grad(), _Count() as c:
        layer(X, mask, None)
    return c.n


def _explicit(**changes) -> Switches:
    base = dict(
        vision=True, image_max_tokens=2048, kda_scan=None, decode_layer_group=45, mhc_sinkhorn="torch", moe_op="exact"
    )
    return Switches(**{**base, **changes})


@pytest.fixture(scope="module")
def counts(setup):
    cfg, X, mask = setup
    out = {
        "scan": _ops_of_first_layer(cfg, X, mask, _explicit(kda_scan=True)),
        "sequential": _ops_of_first_layer(cfg, X, mask, _explicit(kda_scan=False)),
        "tpc": _ops_of_first_layer(cfg, X, mask, _explicit(kda_scan=False, mhc_sinkhorn="kernel")),
    }
    assert len(set(out.values())) == 3, out  # the count tells the paths apart
    return out


@pytest.mark.parametrize("spelling", TRUE + FALSE)
def test_every_spelling_of_kda_scan_runs_the_carry_it_names(setup, counts, spelling):
    cfg, X, mask = setup
    s = read_switches({"GLM5_NEXT_KDA_SCAN": spelling, "GLM5_NEXT_MHC_SINKHORN": "torch"})
    want = "scan" if spelling in TRUE else "sequential"
    assert _ops_of_first_layer(cfg, X, mask, s) == counts[want]


@pytest.mark.parametrize(
    "env", [{}, {"GLM5_NEXT_KDA_SCAN": ""}, {"GLM5_NEXT_KDA_SCAN": "auto"}, {"GLM5_NEXT_KDA_SCAN": "AUTO"}]
)
def test_kda_scan_unset_runs_the_sequential_carry_on_cpu(setup, counts, env):
    cfg, X, mask = setup
    s = read_switches({**env, "GLM5_NEXT_MHC_SINKHORN": "torch"})
    assert s.kda_scan is None
    assert _ops_of_first_layer(cfg, X, mask, s) == counts["sequential"]


@pytest.mark.parametrize("value, want", [("kernel", "tpc"), ("torch", "sequential")])
def test_mhc_sinkhorn_runs_the_order_it_names(setup, counts, value, want):
    cfg, X, mask = setup
    s = read_switches({"GLM5_NEXT_KDA_SCAN": "0", "GLM5_NEXT_MHC_SINKHORN": value})
    assert _ops_of_first_layer(cfg, X, mask, s) == counts[want]


@pytest.mark.parametrize("spelling", TRUE + FALSE)
def test_every_spelling_of_vision_parses_to_what_it_names(spelling):
    # What it builds (the tower, or none and its checkpoint keys skipped) is checked in the
    # vLLM end-to-end run, where GLM5_NEXT_VISION=Off builds no tower.
    assert read_switches({"GLM5_NEXT_VISION": spelling}).vision is (spelling in TRUE)
