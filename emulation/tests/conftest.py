"""Puts the emulation package and its overlay tree (``habana_frameworks``) on sys.path."""

import sys
from pathlib import Path

import pytest

EMULATION = Path(__file__).resolve().parents[1]
OVERLAY = EMULATION / "hpu_emulation" / "overlay"
REPO = EMULATION.parent

for p in (str(EMULATION), str(OVERLAY)):
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture(params=["gaudi2", "gaudi3"])
def card_name(request, monkeypatch):
    """Runs a test once per emulated card (the e4m3 flavour and its range follow the card)."""
    monkeypatch.setenv("HPU_EMULATION_DEVICE", request.param)
    return request.param
