"""What a Gaudi card refuses, refused on card tensors only (``hpu_emulation/refusals.py``), and the
emulated Gaudi 2's reading of stored e4m3fn bytes (``kernels/fp8.py``, ``card_read``).

Each rule has its negative control here (the emulation catches the defect, on card tensors only;
the same call on host tensors keeps the CPU's behaviour) and a positive one (what the bridge
allows, and the handling vllm-gaudi's own code applies, passes). vllm-gaudi's own functions on the
emulation: ``test_card_rules_vllm_gaudi.py``.
"""

import pytest
import torch

import hpu_emulation

hpu_emulation.activate()
import habana_frameworks.torch  # noqa: E402,F401

from hpu_emulation import counting, device, refusals  # noqa: E402
from hpu_emulation.kernels import fp8  # noqa: E402


def card(t: torch.Tensor) -> torch.Tensor:
    return t.to("hpu")


@pytest.fixture
def eager(monkeypatch):
    """The bridge's eager mode (PT_HPU_LAZY_MODE=0), where a host tensor in a card op raises."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")


# --------------------------------------------------------------------------- host and card mixed


@pytest.mark.parametrize(
    "name, call",
    [
        ("Tensor.add", lambda x, h: x + h),
        (
            "torch.nn.functional.linear",
            lambda x, h: torch.nn.functional.linear(x, card(torch.ones(4, 3)), h[0, :2].repeat(2)),
        ),
        ("torch.matmul", lambda x, h: torch.matmul(x, h.t())),
        ("torch.cat", lambda x, h: torch.cat([x, h])),
        ("Tensor.index_select", lambda x, h: x.index_select(0, torch.tensor([1]))),
        ("torch.where", lambda x, h: torch.where(x > 1, x, h)),
        ("torch.nn.functional.embedding", lambda x, h: torch.nn.functional.embedding(card(torch.tensor([0, 1])), h)),
        ("Tensor.__getitem__", lambda x, h: h[card(torch.tensor([0]))]),
    ],
)
def test_an_op_mixing_a_host_tensor_into_card_tensors_is_refused_naming_op_and_rule(eager, name, call):
    x, h = card(torch.arange(6.0).view(2, 3)), torch.ones(2, 3)
    with pytest.raises(refusals.CardRefusal) as info:
        call(x, h)
    text = str(info.value)
    assert text.startswith(f"{name}: Expected all tensors to be on the same device"), text
    assert "hpu:0 and cpu" in text and "eager_op.cpp" in text and "0-dim host tensors" in text
    assert "eager mode, PT_HPU_LAZY_MODE=0" in text
    assert isinstance(info.value, RuntimeError) and not isinstance(info.value, NotImplementedError)


def test_in_lazy_mode_a_host_tensor_is_copied_outside_a_captured_region_and_refused_inside(monkeypatch):
    """Lazy mode: the bridge copies a host input to the card at every call (lazy_kernels.h), so the op
    runs with the host's values; inside a region the runner captures as an HPU graph that copy would be
    recorded with the capture's host value, and the emulation refuses it."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    x, h = card(torch.arange(6.0).view(2, 3)), torch.ones(2, 3)
    assert torch.equal((x + h).cpu(), torch.arange(6.0).view(2, 3) + 1)
    with counting.graph_region(), pytest.raises(refusals.CardRefusal) as info:
        x + h
    assert str(info.value).startswith("Tensor.add: Expected all tensors") and "inside a region captured" in str(
        info.value
    )


def test_the_same_calls_on_host_tensors_keep_the_cpus_rules():
    x, h = torch.arange(6.0).view(2, 3), torch.ones(2, 3)
    assert torch.equal(x + h, torch.arange(6.0).view(2, 3) + 1)
    assert torch.cat([x, h]).shape == (4, 3) and x.index_select(0, torch.tensor([1])).shape == (1, 3)


def test_a_0dim_host_tensor_is_a_scalar_as_the_bridge_takes_it_but_not_inside_a_tensor_list(eager):
    x = card(torch.arange(6.0).view(2, 3))
    two = torch.tensor(2.0)
    assert torch.equal((x * two).cpu(), torch.arange(6.0).view(2, 3) * 2)
    assert torch.equal(
        torch.where(x > 2, x, two).cpu(),
        torch.where(torch.arange(6.0).view(2, 3) > 2, torch.arange(6.0).view(2, 3), 2.0),
    )
    assert torch.equal(x.masked_fill(x > 3, torch.tensor(-1.0)).cpu()[1], torch.tensor([3.0, -1.0, -1.0]))
    # habana_eager/eager_exec.cpp: every element of a tensor list must be on the card
    with pytest.raises(refusals.CardRefusal, match=r"^torch.stack: .*an element of a tensor list"):
        torch.stack([x[0, 0], two])


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
def test_host_indices_and_values_in_indexing_and_transfers_are_allowed():
    """index (a CPU fallback on the card: hpu_ops/eager/index_gen.cpp), index_put_ (host indices and
    values copied to the card: habana_eager/ops/index_put.cpp), copy_ and .to both ways."""
    x = card(torch.arange(6.0))
    idx = torch.tensor([4, 1])
    assert x[idx].cpu().tolist() == [4.0, 1.0]
    x[idx] = torch.tensor([40.0, 10.0])
    x.index_put_((torch.tensor([0]),), torch.tensor([7.0]))
    assert x.cpu().tolist() == [7.0, 10.0, 2.0, 3.0, 40.0, 5.0]
    y = card(torch.zeros(3))
    y.copy_(torch.tensor([1.0, 2.0, 3.0]))
    host = torch.zeros(3)
    host.copy_(y)
    host[1:] = y[1:]  # a copy to the host through basic indexing (copy_)
    assert host.tolist() == [1.0, 2.0, 3.0] and y.to("cpu").tolist() == [1.0, 2.0, 3.0]
    assert y.new_tensor(torch.ones(2)).device.type == "hpu" and y.expand_as(torch.ones(2, 3)).shape == (2, 3)


def test_a_card_kernel_given_a_host_tensor_is_refused(eager):
    x = card(torch.randn(2, 8))
    with pytest.raises(refusals.CardRefusal, match="rms_norm"):
        torch.ops.hpu.rms_norm(x, torch.ones(8), 1e-6)
    assert torch.ops.hpu.rms_norm(x, card(torch.ones(8)), 1e-6).device.type == "hpu"


# --------------------------------------------------------------------------- float64 and complex


@pytest.mark.parametrize(
    "name, call",
    [
        ("torch.zeros", lambda: torch.zeros(3, dtype=torch.float64, device="hpu")),
        ("torch.tensor", lambda: torch.tensor([1.0, 2.0], dtype=torch.float64, device="hpu")),
        ("Tensor.to", lambda: torch.ones(3, dtype=torch.float64).to("hpu")),
        ("Tensor.double", lambda: card(torch.ones(3)).double()),
        ("Tensor.to", lambda: card(torch.ones(3)).to(torch.float64)),
        ("torch.rand", lambda: torch.rand(4, dtype=torch.float64, device="hpu")),
    ],
)
def test_float64_on_the_card_is_refused_naming_op_and_the_support_matrix(name, call):
    with pytest.raises(refusals.CardRefusal) as info:
        call()
    text = str(info.value)
    assert text.startswith(f"{name}: float64 on hpu") and "support matrix" in text, text


@pytest.mark.parametrize(
    "name, call",
    [
        ("torch.view_as_complex", lambda: torch.view_as_complex(card(torch.ones(3, 2)))),
        ("torch.polar", lambda: torch.polar(card(torch.ones(3)), card(torch.zeros(3)))),
        ("Tensor.to", lambda: torch.ones(2, dtype=torch.complex64).to("hpu")),
    ],
)
def test_complex_on_the_card_is_refused_with_the_bridges_message(name, call):
    with pytest.raises(refusals.CardRefusal) as info:
        call()
    assert str(info.value).startswith(f"{name}: Complex datatype is not supported on HPU device."), str(info.value)


def test_float64_and_complex_stay_usable_on_the_host_and_float32_on_the_card():
    h = torch.arange(4, dtype=torch.float64)
    assert torch.view_as_complex(h.view(2, 2).float()).dtype == torch.complex64
    assert (h * 2).dtype == torch.float64
    # the handling: compute on the host in float64, move float32 to the card
    assert torch.equal(h.float().to("hpu").cpu(), torch.arange(4.0))
    assert card(torch.ones(2)).sum().item() == 2.0


# --------------------------------------------------------------------------- stored e4m3fn bytes


def _decode(code: int, gaudi2: bool) -> float:
    """Independent of PyTorch's cast: E4M3, bias 7; OCP (448, NaN at S.1111.111) or, on Gaudi 2,
    IEEE-754's special values (exponent 1111: inf with mantissa 000, else NaN; 240 the largest)."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and (gaudi2 or man == 0x7):
        return sign * float("inf") if gaudi2 and man == 0 else float("nan")
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


ALL_CODES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)


def _want(name: str) -> torch.Tensor:
    return torch.tensor([_decode(c, name == "gaudi2") for c in range(256)], dtype=torch.float32)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(torch.nan_to_num(got.float(), nan=12345.0), torch.nan_to_num(want, nan=12345.0))


@pytest.mark.parametrize(
    "how",
    ["float", "to_bf16", "to_hpu_fp32", "type_as", "copy_", "setitem", "cast_from_fp8", "fp8_gemm_v2"],
)
def test_each_e4m3fn_code_reads_on_the_card_as_the_card_reads_it(card_name, how):
    """All 256 codes: on Gaudi 2 the 16 codes of the top exponent (256 to 448 in float8_e4m3fn) read
    as +-inf / NaN and 240 is the largest finite value; on Gaudi 3 every code reads as OCP E4M3."""
    w = card(ALL_CODES)
    if how == "float":
        got = w.float()
    elif how == "to_bf16":
        got = w.to(torch.bfloat16)
    elif how == "to_hpu_fp32":
        got = w.to("hpu", torch.float32)
    elif how == "type_as":
        got = w.type_as(card(torch.zeros(1)))
    elif how == "copy_":
        got = card(torch.zeros(256)).copy_(w)
    elif how == "setitem":
        got = card(torch.zeros(256, dtype=torch.bfloat16))
        got[:] = w
    elif how == "cast_from_fp8":
        got = torch.ops.hpu.cast_from_fp8(w, None, torch.float32)
    else:
        got = torch.ops.hpu.fp8_gemm_v2(
            w.view(16, 16), False, card(torch.eye(16).to(torch.float8_e4m3fn)), False, None, torch.float32
        ).flatten()
    assert got.device.type == "hpu"
    want = _want(card_name)
    if how == "fp8_gemm_v2":  # a NaN or inf in a row's sums spreads along the row: compare finite rows
        rows = torch.isfinite(want.view(16, 16)).all(1)
        assert _same(got.cpu().view(16, 16)[rows], want.view(16, 16)[rows])
        assert torch.isfinite(got.cpu().view(16, 16)[rows]).all()
        assert (~torch.isfinite(got.cpu().view(16, 16)[~rows])).any(1).all()
        return
    assert _same(got.cpu(), want), (card_name, how)
    n_top = int((~torch.isfinite(want)).sum())
    assert n_top == (16 if card_name == "gaudi2" else 2)


def test_the_bytes_themselves_move_exactly_on_both_cards(card_name):
    """Views, copies, indexing and the move to the host keep the bytes: per_tensor_dequantize reads
    them on the host."""
    w = card(ALL_CODES)
    assert torch.equal(w.view(torch.uint8).cpu(), torch.arange(256, dtype=torch.uint8))
    assert torch.equal(w.cpu().view(torch.uint8), torch.arange(256, dtype=torch.uint8))
    moved = torch.cat([w[128:], w[:128]]).clone()[torch.arange(256).roll(128)]
    assert torch.equal(moved.to("cpu").view(torch.uint8), torch.arange(256, dtype=torch.uint8))
    assert _same(w.to("cpu").float(), _want("gaudi3"))  # the host reads float8_e4m3fn as OCP


def test_gaudi2_halving_with_doubled_scale_reads_exactly_where_the_raw_bytes_overflow(monkeypatch):
    """Negative: the raw bytes of an e4m3fn weight quantized for 448 give inf / NaN on the emulated
    Gaudi 2. Positive: vllm-gaudi's handling (gaudi_weight_wrapper: the e4m3fn value halved on the
    host, its scale doubled) gives the exact values for every code whose half is representable."""
    monkeypatch.setenv("HPU_EMULATION_DEVICE", "gaudi2")
    finite = torch.isfinite(_want("gaudi3"))
    raw = ALL_CODES[finite]
    scale = torch.tensor(0.01)
    exact = raw.float() * scale
    assert not torch.isfinite(card(raw).float().cpu() * scale).all()
    halved = (raw.float() * 0.5).to(torch.float8_e4m3fn)
    got = card(halved).float() * card(scale * 2.0)
    # halving is exact but for the 16 codes of the two lowest exponents with an odd mantissa (|w| < 2**-5)
    representable = (raw.float() * 0.5) == halved.float()
    assert int((~representable).sum()) == 16 and raw.float()[~representable].abs().max() < 2**-5
    assert torch.equal(got.cpu()[representable], exact[representable])
    assert torch.isfinite(got.cpu()).all()


def test_the_refusal_is_a_card_rule_not_a_skip():
    # the unit-test harness turns NotEmulated (a NotImplementedError) into skips; a refusal is a failure
    assert issubclass(refusals.CardRefusal, RuntimeError)
    assert not issubclass(refusals.CardRefusal, NotImplementedError)
    assert fp8.card_reads_differently(torch.float8_e5m2) is False
    assert isinstance(card(torch.ones(1)), device.HPUTensor)


# --------------------------------------------------------------------------- the device gate


@pytest.mark.parametrize("lazy", ["0", "1"])
@pytest.mark.parametrize("name", ["gaudi2", "gaudi3"])
def test_the_device_gate_checks_each_modelled_rule_and_the_emulation_passes_it(name, lazy):
    """``device_gate.py --emulated`` (the script's logic; the gate itself has never run on a card)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    gate = Path(__file__).resolve().parents[1] / "device_gate.py"
    env = dict(os.environ, HPU_EMULATION_DEVICE=name, PT_HPU_LAZY_MODE=lazy)
    proc = subprocess.run(
        [sys.executable, str(gate), "--emulated"], capture_output=True, text=True, env=env, timeout=300
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and result["passed"] and result["card"] == name, proc.stdout + proc.stderr[-2000:]
    assert result["lazy"] == (lazy == "1")
    assert set(result["results"]) == {
        "index_select",
        "embedding",
        "index_copy_",
        "index_reduce_",
        "one_hot",
        "mixed_devices",
        "mixed_devices_allowed",
        "host_tensor_list",
        "complex",
        "float64",
        "e4m3fn_read",
        "e4m3fn_bytes_to_host",
        "e4m3fn_halved_read",
        "cast_to_fp8_saturates",
    }


def test_the_device_gate_fails_a_card_that_reads_fp8_otherwise(card_name, monkeypatch):
    """The gate's FP8 checks see a card whose reading differs: the other card's expectations fail."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import device_gate

    other = device_gate.run(gaudi2=card_name != "gaudi2", lazy=False, emulated=True)
    assert other["e4m3fn_read"] is False and other["cast_to_fp8_saturates"] is False
    assert other["e4m3fn_bytes_to_host"] is True and other["index_select"] is True
    # the eager expectation (a raise) in lazy mode, where the emulation copies as the bridge does
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    wrong = device_gate.run(gaudi2=card_name == "gaudi2", lazy=False, emulated=True)
    assert wrong["mixed_devices"] is not True and wrong["host_tensor_list"] is not True
