"""KDA prefill benchmark: the port's chunk_kda against transformers' torch chunk function.

Not a test. fp32 on CPU, batch 1, 4 heads x 128, 1K / 4K / 8K tokens, two gates:
``saturating`` (-5 sigmoid(2 + N(0, 1)), about -4.4 per token: the within-chunk
cumulative gate reaches -300, as real GLM gates do) and ``mild`` (-5 sigmoid(-2 + N(0, 1))).

  PYTHONPATH=ports/glm-5-3-flash .venv/bin/python bench/bench_kda.py            # full table (about 5 minutes on 2 cores)
  PYTHONPATH=ports/glm-5-3-flash .venv/bin/python bench/bench_kda.py --lengths 1024 --gates mild

(the port's glm5_next_hpu package imports from its folder: PYTHONPATH)

Implementations: ``reference`` (transformers' torch fallback), ``port-default``
(``chunk_kda`` without ``use_scan``: the carry a caller gets when the switch is unset, the
sequential one on CPU) and ``port-scan`` (``use_scan=True``, the Hillis-Steele carry, the
default on HPU). The CPU model and whether it has AMX are printed first: how a CPU treats
subnormal floats and which matmul units it has both move these figures.

Method:
* wall time: in a fresh subprocess per (implementation, length); the first call is
  the memory measurement, then 3 timed calls; min and median reported.
* peak memory: in a fresh process with inputs allocated, the kernel's peak-RSS
  watermark is reset (``echo 5 > /proc/self/clear_refs``), then peak RSS after the
  first call (VmHWM) minus RSS before it (VmRSS). tracemalloc does not see torch
  allocations, and a plain ru_maxrss delta hides the call under import-time peaks.
* aten ops per call: every op that reaches a TorchDispatchMode (views included),
  counted in-process on one call. Decode: one fused_recurrent_kda step on a warm state.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

H, K = 4, 128


GATE_SHIFT = {"saturating": 2.0, "mild": -2.0}
IMPLS = ["reference", "port-default", "port-scan"]


def _inputs(T, gate="saturating", seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, H, K, generator=g) for _ in range(3))
    decay = -5 * torch.sigmoid(GATE_SHIFT[gate] + torch.randn(1, T, H, K, generator=g))
    beta = torch.rand(1, T, H, generator=g)
    return q, k, v, decay, beta


def cpu_description() -> str:
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    amx = sorted(f for f in flags if f.startswith("amx"))
    return f"CPU: {model}; AMX: {'yes (' + ', '.join(amx) + ')' if amx else 'no'}"


def _fn(impl):
    if impl == "reference":
        from transformers.models.glm5_next.modeling_glm5_next import chunk_kimi_delta_attention

        return lambda q, k, v, g, b: chunk_kimi_delta_attention(
            q, k, v, g=g, beta=b, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
    from glm5_next_hpu.kda import chunk_kda

    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    if impl == "port-scan":
        kw["use_scan"] = True
    return lambda q, k, v, g, b: chunk_kda(q, k, v, g, b, **kw)


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def child(impl, T, gate, threads):
    import torch

    torch.set_num_threads(threads)
    fn = _fn(impl)
    args = _inputs(T, gate)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS watermark
    before = _status_kb("VmRSS")
    with torch.no_grad():
        fn(*args)
        peak_kb = _status_kb("VmHWM") - before
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t)
    print(json.dumps(dict(impl=impl, T=T, gate=gate, peak_mb=peak_kb / 1024, t_min=min(times), t_med=statistics.median(times))))


def count_ops(impl, T):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    args = _inputs(T)
    if impl == "decode":
        from glm5_next_hpu.kda import fused_recurrent_kda

        state = torch.zeros(1, H, K, K)
        args = [a[:, :1] for a in args]
        with Count():
            fused_recurrent_kda(*args, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return Count.n
    fn = _fn(impl)
    with torch.no_grad(), Count():
        fn(*args)
    return Count.n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096, 8192])
    ap.add_argument("--gates", nargs="*", default=list(GATE_SHIFT), choices=list(GATE_SHIFT))
    ap.add_argument("--threads", type=int, default=2, help="torch/OpenMP threads per call (default 2)")
    ap.add_argument("--child", nargs=4)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), a.child[2], int(a.child[3]))
        return
    res, ops = {}, {}
    load_start = os.getloadavg()
    for gate in a.gates:
        for T in a.lengths:
            for impl in IMPLS:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", impl, str(T), gate, str(a.threads)], capture_output=True,
                    text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": str(a.threads)},
                )
                res[(gate, impl, T)] = json.loads(out.stdout.strip().splitlines()[-1])
    for T in a.lengths:  # the op count does not depend on the gate's values
        for impl in IMPLS:
            ops[(impl, T)] = count_ops(impl, T)
    decode_ops = count_ops("decode", 1)
    load_end = os.getloadavg()
    print(cpu_description())
    print(f"KDA prefill, fp32 CPU ({os.cpu_count()} cores, {a.threads} threads), batch 1, {H} heads x {K}")
    print("port-default: chunk_kda without use_scan, which is the sequential carry on CPU")
    # Other work on the machine inflates both sides' times (not always equally): say how much there was.
    print("load average (1/5/15 min): start " + " ".join(f"{x:.2f}" for x in load_start)
          + ", end " + " ".join(f"{x:.2f}" for x in load_end))
    hdr = "| gate | tokens | impl | time min / median (s) | peak RSS added (MB) | aten ops/call | time ratio (ref/port) | memory ratio (ref/port) |"
    print(hdr)
    print("|" + "---|" * 8)
    for gate in a.gates:
        for T in a.lengths:
            r = res[(gate, "reference", T)]
            for impl in IMPLS:
                m = res[(gate, impl, T)]
                tr = "" if impl == "reference" else f"{r['t_min'] / m['t_min']:.1f}x"
                mr = "" if impl == "reference" else f"{r['peak_mb'] / max(m['peak_mb'], 1e-9):.1f}x"
                print(f"| {gate} | {T} | {impl} | {m['t_min']:.3f} / {m['t_med']:.3f} | {m['peak_mb']:.0f} | {ops[(impl, T)]} | {tr} | {mr} |")
    print(f"aten ops per decode step (fused_recurrent_kda, 1 token): {decode_ops}")
    T = max(a.lengths)
    for gate in a.gates:
        r, d = res[(gate, "reference", T)], res[(gate, "port-default", T)]
        time_ratio, mem_ratio = r["t_min"] / d["t_min"], r["peak_mb"] / max(d["peak_mb"], 1e-9)
        print(f"goal at {T} tokens, {gate} gate: default path >= 10x faster: {time_ratio:.1f}x "
              f"({'met' if time_ratio >= 10 else 'NOT met'}); >= 20x less peak memory: {mem_ratio:.1f}x "
              f"({'met' if mem_ratio >= 20 else 'NOT met'})")
    print(f"goal at {T} tokens: scan <= 412 aten ops per call: {ops[('port-scan', T)]} "
          f"({'met' if ops[('port-scan', T)] <= 412 else 'NOT met'})")


if __name__ == "__main__":
    main()
