"""The cards the cost model predicts for: Intel's published figures, each with where it is published,
and the few constants no datasheet gives (kept apart in :class:`Calibration`, each named with the
row of a seed page it was fitted on, or marked as an assumption).

Every figure a prediction uses is here; nothing else in ``hpu_emulation.cost`` holds a number about
the hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

TERA = 10**12
GIGA = 10**9
MIB = 2**20

#: Intel, "Intel Gaudi 3 AI Accelerator: Architected for Gen AI Training and Inference", Hot Chips
#: 2024 (R. Kaplan): the product table of Gaudi / Gaudi 2 / Gaudi 3 and the Gaudi 3 spec table.
HOT_CHIPS_2024 = "Intel, Gaudi 3 at Hot Chips 2024 (R. Kaplan), product and spec tables"
#: Intel Gaudi documentation, "Intel Gaudi Network Configuration" (docs.habana.ai, Management and
#: Monitoring): 21 of a Gaudi 3's 24 200 Gb/s ports are scale-up, 3 to each of the 7 peers of an
#: HLS-3 box, 525 GB/s unidirectional per card.
HABANA_NETWORK_DOC = "docs.habana.ai, Intel Gaudi Network Configuration"
#: Intel Gaudi documentation, "TPC User Guide": each TPC's 2048-bit SIMD unit does 64 fp32 or 128
#: 16-bit operations a cycle (so a TPC's fp32 rate is half its bf16 rate).
TPC_GUIDE = "docs.habana.ai, TPC User Guide (64 fp32 / 128 16-bit lanes a cycle)"
#: Habana, "Gaudi2 White Paper" (May 2022): 24 TPCs, 2 MMEs, 96 GB HBM2E, 24 x 100 GbE RoCE ports
#: of which 21 connect the 8 cards of an HLS-Gaudi2 box all-to-all (3 to each peer); FP8 in the MME.
GAUDI2_WHITE_PAPER = "Habana, Gaudi2 White Paper (May 2022)"


@dataclass(frozen=True)
class Figure:
    """One number about a card and where it comes from (a publication, or 'derived: how')."""

    value: float
    source: str


@dataclass(frozen=True)
class Card:
    """A card's published peaks. Rates in operations (FLOP) or bytes per second.

    ``mme`` and ``tpc`` map a dtype family ("fp8", "bf16", "fp32") to the engine's peak;
    ``hbm_reported_mib`` is the card memory as the runtime reports it (what vllm-gaudi sizes
    against), ``hbm_marketed`` the datasheet's."""

    name: str
    hbm_bandwidth: Figure
    hbm_marketed: Figure
    hbm_reported_mib: Figure
    mme: dict[str, Figure]
    tpc: dict[str, Figure]
    scale_up_bandwidth: Figure  # bytes/s a card sends to its peers at once, unidirectional

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_reported_mib.value) * MIB

    def mme_peak(self, family: str) -> float:
        return self.mme[family].value

    def tpc_peak(self, family: str) -> float:
        return self.tpc[family].value

    def sources(self) -> list[tuple[str, float, str]]:
        rows = [
            ("HBM bandwidth (B/s)", self.hbm_bandwidth.value, self.hbm_bandwidth.source),
            ("HBM, datasheet (B)", self.hbm_marketed.value, self.hbm_marketed.source),
            ("HBM, as the runtime reports it (MiB)", self.hbm_reported_mib.value, self.hbm_reported_mib.source),
        ]
        rows += [(f"MME {k} peak (FLOP/s)", f.value, f.source) for k, f in self.mme.items()]
        rows += [(f"TPC {k} peak (FLOP/s)", f.value, f.source) for k, f in self.tpc.items()]
        rows.append(
            ("scale-up bandwidth, unidirectional (B/s)", self.scale_up_bandwidth.value, self.scale_up_bandwidth.source)
        )
        return rows


GAUDI2 = Card(
    name="gaudi2",
    hbm_bandwidth=Figure(2.46 * TERA, HOT_CHIPS_2024 + ": Gaudi 2 peak HBM BW 2.46 TB/s"),
    hbm_marketed=Figure(96 * GIGA, HOT_CHIPS_2024 + ": Gaudi 2 HBM capacity 96 GB"),
    hbm_reported_mib=Figure(
        98_304,
        "hl-smi on HL-225 (Gaudi 2) cards reports 98304MiB total (public hl-smi outputs)",
    ),
    mme={
        "bf16": Figure(432 * TERA, HOT_CHIPS_2024 + ": Gaudi 2 peak compute BF16 432 TFLOPs"),
        "fp8": Figure(865 * TERA, GAUDI2_WHITE_PAPER + ": FP8 at twice the BF16 MME rate (865 TFLOPs)"),
        "fp32": Figure(
            432 * TERA / 4,
            "assumption: a quarter of the BF16 rate (no published Gaudi 2 FP32 matrix figure was found)",
        ),
    },
    tpc={
        "bf16": Figure(
            28.7 * TERA * 24 / 64,
            "derived: Gaudi 3's 28.7 BF16 vector TFLOPs over its 64 TPCs (" + HOT_CHIPS_2024 + "), times Gaudi 2's "
            "24 TPCs (" + GAUDI2_WHITE_PAPER + "), assuming the same rate per TPC",
        ),
        "fp32": Figure(28.7 * TERA * 24 / 64 / 2, "derived: half the BF16 vector rate (" + TPC_GUIDE + ")"),
    },
    scale_up_bandwidth=Figure(
        21 * 100 * GIGA / 8,
        GAUDI2_WHITE_PAPER + ": 21 of 24 100 GbE ports scale-up (3 to each of 7 peers) = 262.5 GB/s a direction",
    ),
)

GAUDI3 = Card(
    name="gaudi3",
    hbm_bandwidth=Figure(3.67 * TERA, HOT_CHIPS_2024 + ": Gaudi 3 HBM bandwidth 3.67 TB/s"),
    hbm_marketed=Figure(128 * GIGA, HOT_CHIPS_2024 + ": Gaudi 3 HBM capacity 128 GB"),
    hbm_reported_mib=Figure(
        131_072,
        "assumption: 128 GiB, by analogy with Gaudi 2's 96 GB datasheet and 98304MiB runtime report "
        "(no Gaudi 3 hl-smi output was read)",
    ),
    mme={
        "bf16": Figure(1835 * TERA, HOT_CHIPS_2024 + ": Gaudi 3 BF16 matrix TFLOPs 1835"),
        "fp8": Figure(1835 * TERA, HOT_CHIPS_2024 + ": Gaudi 3 FP8 matrix TFLOPs 1835"),
        "fp32": Figure(1835 * TERA / 4, "assumption: a quarter of the BF16 rate (no published figure)"),
    },
    tpc={
        "bf16": Figure(28.7 * TERA, HOT_CHIPS_2024 + ": Gaudi 3 BF16 vector TFLOPs 28.7"),
        "fp32": Figure(28.7 * TERA / 2, "derived: half the BF16 vector rate (" + TPC_GUIDE + ")"),
    },
    scale_up_bandwidth=Figure(
        21 * 200 * GIGA / 8, HABANA_NETWORK_DOC + ": 21 x 200 Gb/s scale-up ports = 525 GB/s unidirectional"
    ),
)

CARDS = {c.name: c for c in (GAUDI2, GAUDI3)}


def dtype_family(dtype: torch.dtype) -> str:
    """The engine rate a dtype runs at: fp8 (both e4m3 flavours, e5m2), bf16 (and fp16, the
    integer types the vector units handle at 16-bit width or narrower), fp32 (and wider)."""
    if dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz):
        return "fp8"
    if dtype.is_floating_point and dtype.itemsize >= 4:
        return "fp32"
    if not dtype.is_floating_point and dtype.itemsize >= 4:
        return "fp32"  # int32/int64 lanes are 32-bit wide on the TPC
    return "bf16"


@dataclass(frozen=True)
class Constant:
    """A constant no datasheet gives. ``fitted_on`` names the seed row it was fitted on (None: an
    assumption, with ``why``)."""

    value: float
    unit: str
    fitted_on: str | None
    why: str


@dataclass(frozen=True)
class Calibration:
    """The model's non-datasheet constants. The defaults are the fitted values (see each
    ``fitted_on``); ``plan --fit`` recomputes them from the traces and prints the fit.

    * ``host_op``: host time to record one aten op in lazy mode (the bridge builds the graph
      op by op on the host; a cached graph is still re-recorded each step when not replayed).
    * ``kernel_floor``: the least time a kernel occupies the card (launch, pipeline fill): an op
      whose roofline is shorter still costs this.
    * ``graph_launch``: host time to launch one recorded graph (replay or compiled-cache hit).
    * ``step_host``: the runner's host time per step that no device work hides (input
      preparation, sampling, output processing), at one stream.
    * ``efficiency``: the fraction of the peak rates (MME, TPC, HBM) a kernel achieves; the
      roofline divides its compute and memory times by it (not the kernel floor).
    * ``collective_latency``: fixed cost of one collective over the scale-up links, beside its
      bytes over the link bandwidth.
    """

    host_op: Constant = field(
        default_factory=lambda: Constant(
            1.77e-5, "s/op", "write-up: host recording 31.8 ms per KDA call, sequential carry (8,192 tokens)", ""
        )
    )
    kernel_floor: Constant = field(
        default_factory=lambda: Constant(
            2.357e-6, "s/kernel", "write-up: mhc_pre + mhc_post pair 198 us at one row, torch Sinkhorn loop", ""
        )
    )
    graph_launch: Constant = field(
        default_factory=lambda: Constant(
            0.0,
            "s/graph",
            None,
            "launches taken as free: fitted on the write-up's decode step with a graph per layer (32.5 ms) it comes "
            "out negative (the model's Sinkhorn saving alone exceeds the measured 8 ms)",
        )
    )
    step_host: Constant = field(
        default_factory=lambda: Constant(
            0.01806, "s/step", "write-up: decode step 24.5 ms, 1 stream, 2K, Sinkhorn kernel, one graph a step", ""
        )
    )
    efficiency: Constant = field(
        default_factory=lambda: Constant(
            0.5126, "of peak", "write-up: 8,192-token prompt chunk 975 ms, scan (fused FP8 experts)", ""
        )
    )
    collective_latency: Constant = field(
        default_factory=lambda: Constant(
            10e-6,
            "s/collective",
            None,
            "a small-message all-reduce over the scale-up RoCE links; no published HCCL latency was found",
        )
    )

    def rows(self) -> list[tuple[str, Constant]]:
        return [
            (name, getattr(self, name))
            for name in ("host_op", "kernel_floor", "graph_launch", "step_host", "efficiency", "collective_latency")
        ]
