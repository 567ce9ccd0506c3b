"""``habana_frameworks.torch.hpu.metrics``: bridge metrics. The emulation compiles no graph, so
``graph_compilation`` reports zero compilations and no recipes (the shape vllm-gaudi's profiler
reads: ``stats()[0][1]`` the count, ``stats()[3][1]`` the recipes)."""

import contextlib


class _Metric:
    def __init__(self, name: str):
        self.name = name

    def stats(self):
        if self.name != "graph_compilation":
            raise NotImplementedError(f"hpu metric {self.name!r} is not emulated (hpu_emulation)")
        return [("TotalNumber", 0), ("TotalTime", 0), ("AvgTime", 0), ("TotalCompiledRecipes", [])]


@contextlib.contextmanager
def metric_localcontext(name: str):
    yield _Metric(name)


def metric_global(name: str):
    return _Metric(name)
