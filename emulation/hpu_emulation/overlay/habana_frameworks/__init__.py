"""``habana_frameworks`` served by the CPU emulation (hpu_emulation), not Intel's bridge."""

__hpu_emulation__ = True
