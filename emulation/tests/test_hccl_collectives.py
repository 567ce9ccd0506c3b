"""``hccl`` on the emulation: a gloo group, two processes, collectives on card tensors (the
results stay on the card), object broadcast; and the two fixes TP 2 needed (a bare int
``device=`` is the card; ``torch.compile(backend="hpu_backend")`` runs the function as it is)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
EMULATION = Path(__file__).resolve().parents[1]
OVERLAY = EMULATION / "hpu_emulation" / "overlay"

WORKER = textwrap.dedent(
    """
    import sys, torch
    import habana_frameworks.torch  # registers hpu and hccl
    import torch.distributed as dist
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("hccl", init_method="file://" + store, rank=rank, world_size=2)
    assert dist.get_backend() == "hccl"
    x = torch.full((4,), float(rank + 1), device="hpu")
    dist.all_reduce(x)
    assert x.device.type == "hpu" and x.to("cpu").tolist() == [3.0] * 4, x
    out = torch.empty(8, device="hpu")
    dist.all_gather_into_tensor(out, torch.full((4,), float(rank), device="hpu"))
    assert out.device.type == "hpu" and out.to("cpu").tolist() == [0.0] * 4 + [1.0] * 4
    parts = [torch.empty(2, device="hpu") for _ in range(2)]
    dist.all_gather(parts, torch.full((2,), float(rank), device="hpu"))
    assert [p.to("cpu").tolist() for p in parts] == [[0.0, 0.0], [1.0, 1.0]]
    y = torch.arange(3.0, device="hpu") if rank == 0 else torch.zeros(3, device="hpu")
    dist.broadcast(y, src=0)
    assert y.to("cpu").tolist() == [0.0, 1.0, 2.0]
    objs = [{"from": rank}] if rank == 0 else [None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [{"from": 0}]
    rs = torch.empty(2, device="hpu")
    dist.reduce_scatter_tensor(rs, torch.arange(4.0, device="hpu"))
    assert rs.to("cpu").tolist() == [[0.0, 2.0], [4.0, 6.0]][rank]
    dist.barrier()
    dist.destroy_process_group()
    print("OK", rank)
    """
)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(OVERLAY), str(EMULATION)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def test_hccl_collectives_on_card_tensors_in_two_processes(tmp_path):
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), store],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0 and f"OK {r}" in out, err[-3000:]


FIXES = textwrap.dedent(
    """
    import torch
    import habana_frameworks.torch
    from hpu_emulation.device import HPUTensor
    t = torch.empty(3, device=torch.hpu.current_device())  # vLLM: device=current_platform.current_device()
    assert isinstance(t, HPUTensor) and t.device.type == "hpu"
    def f(x):
        return x + 1
    assert torch.compile(f, backend="hpu_backend") is f
    assert torch.compile(backend="hpu_backend", dynamic=True)(f) is f
    assert torch.compile(f, backend="eager") is not f  # other backends: torch's own
    print("OK")
    """
)


def test_int_device_and_hpu_backend_compile():
    proc = subprocess.run([sys.executable, "-c", FIXES], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
