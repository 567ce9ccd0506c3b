"""A Gaudi time and memory model on the emulation's op trace (PREDICTIONS, never measurements).

* :mod:`.hardware`: the cards' published figures, each with its source, and the calibration
  constants no datasheet gives (named with the seed row each was fitted on).
* :mod:`.ops`: what one op costs: engine (MME or TPC), FLOPs, HBM bytes.
* :mod:`.trace`: :class:`OpTrace`, a ``TorchDispatchMode`` that records a forward's ops on meta
  tensors, with graph segments, collectives and the live-memory peak.
* :mod:`.roofline`: pointwise fusion, a roofline per kernel, host time (lazy recording or graph
  replay), collectives over the scale-up links: :func:`predict` gives a step's :class:`StepTime`.
* :mod:`.flash` / :mod:`.glm53`: the two ports' models traced at their recipes' real shapes;
  :mod:`.seeds`: every figure the seed pages publish; :mod:`hpu_emulation.plan`: the command.
"""

from .hardware import CARDS, GAUDI2, GAUDI3, Calibration, Card
from .roofline import LAZY, REPLAY, StepTime, kernels, predict
from .trace import OpRecord, OpTrace

__all__ = [
    "CARDS",
    "GAUDI2",
    "GAUDI3",
    "LAZY",
    "REPLAY",
    "Calibration",
    "Card",
    "OpRecord",
    "OpTrace",
    "StepTime",
    "kernels",
    "predict",
]
