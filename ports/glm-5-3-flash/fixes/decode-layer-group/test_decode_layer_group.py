"""modify_model_layers (the VLLM_CONFIG_HIDDEN_LAYERS step marks) on a model whose decoder
layers group themselves in decode: GLM-5.3-Flash's port marks one graph per decode step
(GLM5_NEXT_DECODE_LAYER_GROUP=45) and one per layer in prefill. The real hook runs on a real
forward; only htorch.core.mark_step (the lazy-mode bridge) is counted instead of called."""

import pytest
import torch
import torch.nn as nn


class GroupedDecoderLayer(nn.Module):
    """Marks after every layer in prefill, after every `group`-th layer in decode."""

    def __init__(self, idx: int, group: int):
        super().__init__()
        self.idx, self.group = idx, group
        self.decode = False
        self.lin = nn.Linear(4, 4)

    @property
    def hpu_mark_step(self) -> bool:
        return (not self.decode) or (self.idx + 1) % self.group == 0

    def forward(self, x):
        return self.lin(x)


class PlainDecoderLayer(nn.Module):
    """A stock decoder layer: no hpu_mark_step attribute."""

    def __init__(self, idx: int, group: int):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


def run(runner_mod, layers, decode, monkeypatch):
    marks = []
    monkeypatch.setattr(runner_mod.htorch.core, "mark_step", lambda: marks.append(1), raising=False)
    model = nn.Sequential(*layers)
    for layer in layers:
        layer.decode = decode
    model(torch.zeros(1, 4))
    return len(marks)


@pytest.fixture()
def runner(tree):
    from vllm_gaudi.v1.worker import hpu_model_runner

    return hpu_model_runner


def test_decode_marks_once_per_layer_group(runner, monkeypatch):
    layers = [GroupedDecoderLayer(i, group=45) for i in range(45)]
    runner.modify_model_layers(nn.Sequential(*layers), ["DecoderLayer"], 1)
    assert run(runner, layers, decode=False, monkeypatch=monkeypatch) == 45  # prefill: one graph per layer
    assert run(runner, layers, decode=True, monkeypatch=monkeypatch) == 1  # decode: one graph per step


def test_layers_without_the_attribute_mark_as_before(runner, monkeypatch):
    layers = [PlainDecoderLayer(i, group=45) for i in range(6)]
    runner.modify_model_layers(nn.Sequential(*layers), ["DecoderLayer"], 2)
    assert (
        run(runner, layers, decode=True, monkeypatch=monkeypatch) == 3
    )  # every 2nd layer, VLLM_CONFIG_HIDDEN_LAYERS=2
