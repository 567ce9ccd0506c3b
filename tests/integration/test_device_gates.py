"""The fix pack's device gates on CPU: where they are, and their own decision logic.

A gate runs on a card; what it decides from its measurements is plain code, shown here to
pass on measurements that justify a fix and to fail on ones that do not (the defect absent,
outputs different, the fix slower). The gather-logprobs-int32 gate also runs whole on the CPU
against the pristine release tree, and is shown to catch a wrong id.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from packtests.builders import REPO


def load(rel: str):
    path = REPO / rel
    spec = importlib.util.spec_from_file_location("gate_" + path.parent.name.replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_device_gate_sits_beside_its_fix_and_one_command_finds_them_all():
    from fixpack.pack.pack import Pack

    run = load("gates/run.py")
    found = run.device_gates(REPO)
    assert set(found) == {"mm-merge-idxcopy", "moe-explicit-overload", "seeded-sampling", "gather-logprobs-int32"}
    pack = Pack(REPO)
    for e in pack.profile("v0.26.0").entries:
        fix = pack.fix(e.id)
        if not fix.cpu_demonstrable:
            gate = fix.meta["device_gate"]["gate"]
            assert gate == f"fixes/{fix.id}/device_gate.py" and (REPO / gate).is_file(), fix.id
            assert found[fix.id] == REPO / gate
    # gather-logprobs-int32 has no fix, only its gate
    assert not (REPO / "fixes" / "gather-logprobs-int32").exists()
    assert run.main(["--list"]) == 0
    assert run.main(["--only", "no-such-gate"]) == 2


def test_mm_merge_gate_needs_the_defect_to_show():
    gate = load("fixes/mm-merge-idxcopy/device_gate.py")
    good = dict(tokens=8192, images=4, identical=True, masked_ms=2.0, index_ms=1.0, masked_cold_ms=900.0, index_cold_ms=700.0)
    assert gate.verdict([good]) == (True, [])
    ok, why = gate.verdict([dict(good, index_ms=1.95)])  # as fast as the stock path: no defect
    assert not ok and "not 5 % faster" in why[0]
    ok, why = gate.verdict([dict(good, identical=False)])
    assert not ok and "differ" in why[0]
    ok, why = gate.verdict([dict(good, index_cold_ms=1000.0)])  # a recompile per image-token count
    assert not ok and "compile" in why[0]
    assert gate.verdict([]) == (False, ["no case measured"])


def test_moe_overload_gate_needs_the_packet_to_read_back():
    gate = load("fixes/moe-explicit-overload/device_gate.py")
    times = {"packet": 0.20, "named": 0.12}
    assert gate.verdict(True, {"packet": 48, "named": 0}, times) == (True, [])
    ok, why = gate.verdict(True, {"packet": 0, "named": 0}, times)
    assert not ok and "defect does not show" in why[0]
    ok, why = gate.verdict(True, {"packet": 48, "named": 2}, times)
    assert not ok and "named overload reads back 2" in why[0]
    ok, why = gate.verdict(False, {"packet": 48, "named": 0}, {"packet": 0.1, "named": 0.2})
    assert not ok and len(why) == 2


def test_seeded_sampling_gate_needs_every_stream_equal():
    gate = load("fixes/seeded-sampling/device_gate.py")
    assert gate.verdict([[[1, 2, 3], [1, 2, 3]], [[1, 2, 3], [1, 2, 3]]])
    assert not gate.verdict([[[1, 2, 3], [1, 2, 4]], [[1, 2, 3], [1, 2, 3]]])
    assert not gate.verdict([])


def test_gather_logprobs_gate_compares_every_id_rank_and_value():
    torch = pytest.importorskip("torch")
    gate = load("gates/gather-logprobs-int32/device_gate.py")
    logprobs, ids = gate.tie_free_logprobs(3, 4096, seed=1)
    assert all(len(set(row.tolist())) == 4096 for row in logprobs)  # no ties: topk is defined
    assert int(ids[0]) == 4095
    top_v, top_i = torch.topk(logprobs, 4, dim=-1)
    tok = logprobs.gather(-1, ids.unsqueeze(-1))
    ref = (torch.cat((ids.unsqueeze(-1), top_i), 1).to(torch.int32), torch.cat((tok, top_v), 1), (logprobs >= tok).sum(-1))
    assert gate.compare("x", ref, ref) == []
    bad_ids = ref[0].clone()
    bad_ids[2, 3] += 1
    assert gate.compare("x", ref, (bad_ids, ref[1], ref[2])) == [f"x: row 2 id 3: {int(bad_ids[2, 3])}, expected {int(ref[0][2, 3])}"]
    assert "not int32" in gate.compare("x", ref, (ref[0].to(torch.int64), ref[1], ref[2]))[0]
    assert "rank" in gate.compare("x", ref, (ref[0], ref[1], ref[2] + 1))[0]
    assert "differ by up to" in gate.compare("x", ref, (ref[0], ref[1] + 1e-3, ref[2]))[0]


GATHER_RUN = """
import json, runpy, sys
from fixpack.proofs.release_tree import tree_from_env, use_tree
use_tree(tree_from_env())
if sys.argv[1] == "corrupt":
    import vllm_gaudi.patches as p
    real = p._hpu_gather_logprobs
    def wrong(logprobs, k, token_ids):
        out = real(logprobs, k, token_ids)
        out.logprob_token_ids[-1, -1] += 1
        return out
    p._hpu_gather_logprobs = wrong
sys.argv = ["device_gate.py", "--device", "cpu", "--no-compile"]
runpy.run_path(%r, run_name="__main__")
"""


@pytest.mark.release
@pytest.mark.parametrize("mode", ["as-released", "corrupt"])
def test_gather_logprobs_gate_runs_on_cpu_against_the_release(tmp_path, mode):
    from packtests.release_check import release_tree

    tree, _ = release_tree(tmp_path)
    script = GATHER_RUN % str(REPO / "gates" / "gather-logprobs-int32" / "device_gate.py")
    env = {"FIXPACK_TREE": str(tree), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=600, env=env)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    res = json.loads(last)
    assert res["runs"] == 10
    if mode == "as-released":
        assert r.returncode == 0 and res["pass"], res
    else:
        assert r.returncode == 1 and not res["pass"]
        assert any("sampled" in p and "expected" in p for p in res["problems"]), res["problems"]
