"""The source checkpoint: a BF16 glm_moe_dsa release, checked from its headers before anything is written.

Work units: one per decoder layer present in the index (the MTP layer, stored after the last
decoder layer, included), and "other" for every tensor outside `model.layers.N.`. Each unit
becomes one output file, so units never share a file and can run anywhere, in any order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from . import st
from .mxfp4 import BLOCK

MODEL_TYPE = "glm_moe_dsa"
ARCHITECTURE = "GlmMoeDsaForCausalLM"
INDEX = "model.safetensors.index.json"
QUANTIZED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
LAYER = re.compile(r"^model\.layers\.(\d+)\.")
# Files the output keeps from the release (it is a derivative and keeps the release's licence).
COPIED_FILES = re.compile(
    r"^(LICENSE.*|NOTICE.*|USE_POLICY.*|tokenizer\.json|tokenizer_config\.json|tokenizer\.model|"
    r"special_tokens_map\.json|added_tokens\.json|vocab\.json|merges\.txt|chat_template\.jinja|"
    r"chat_template\.json|generation_config\.json)$"
)


class InputError(Exception):
    """Refused input: the message names the file and the item."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unit_name(layer: int | None) -> str:
    return "other" if layer is None else f"layer-{layer}"


@dataclass(frozen=True)
class Tensor:
    name: str
    shard: str
    entry: st.Entry
    quantized: bool


class Source:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.config = self._config()
        self.index_path = os.path.join(self.root, INDEX)
        self.index_sha256, weight_map = self._index()
        self.headers: dict[str, st.Header] = {}
        for shard in sorted(set(weight_map.values())):
            path = os.path.join(self.root, shard)
            if not os.path.isfile(path):
                raise InputError(
                    f"{self.index_path}: names shard {shard}, which is missing "
                    f"({path}; first tensor {min(k for k, v in weight_map.items() if v == shard)})"
                )
            try:
                self.headers[shard] = st.read_header(path)
            except st.FormatError as exc:
                raise InputError(str(exc)) from None
        self.tensors: dict[str, Tensor] = {}
        for name in sorted(weight_map):
            shard = weight_map[name]
            header = self.headers[shard]
            entry = header.entries.get(name)
            if entry is None:
                raise InputError(
                    f"{self.index_path}: tensor {name} is listed in {shard}, but {header.path} does not hold it"
                )
            self.tensors[name] = Tensor(name, shard, entry, bool(QUANTIZED.match(name)))
        for header in self.headers.values():
            extra = sorted(set(header.entries) - set(self.tensors))
            if extra:
                raise InputError(
                    f"{header.path}: holds tensor {extra[0]}, which {INDEX} does not name ({len(extra)} such)"
                )
        self._check_tensors()
        if not any(COPIED_FILES.match(f) and f.startswith("LICENSE") for f in os.listdir(self.root)):
            raise InputError(
                f"{self.root}: no LICENSE file; the converted checkpoint is a derivative "
                "and must carry the release's licence"
            )
        layers = sorted({int(m.group(1)) for n in self.tensors if (m := LAYER.match(n))})
        self.units: list[str] = [unit_name(None)] + [unit_name(layer) for layer in layers]
        self.layers = layers

    # -- checks -------------------------------------------------------------------------------
    def _config(self) -> dict:
        path = os.path.join(self.root, "config.json")
        if not os.path.isfile(path):
            raise InputError(f"{path}: missing (SRC must be a checkpoint folder)")
        try:
            with open(path) as f:
                config = json.load(f)
        except ValueError as exc:
            raise InputError(f"{path}: not JSON ({exc})") from None
        model_type = config.get("model_type")
        archs = config.get("architectures") or []
        if model_type != MODEL_TYPE or (archs and ARCHITECTURE not in archs):
            raise InputError(
                f"{path}: model_type {model_type!r}, architectures {archs}: this converter "
                f"takes a {MODEL_TYPE} ({ARCHITECTURE}) checkpoint"
            )
        if "quantization_config" in config:
            qc = config["quantization_config"]
            method = qc.get("quant_method") if isinstance(qc, dict) else qc
            raise InputError(
                f"{path}: has a quantization_config (quant_method {method!r}): this is a "
                "quantized checkpoint; quantize from the BF16 release (zai-org/GLM-5.3-BF16), "
                "not from FP8 or another quantized build"
            )
        return config

    def _index(self) -> tuple[str, dict[str, str]]:
        if not os.path.isfile(self.index_path):
            raise InputError(f"{self.index_path}: missing")
        try:
            with open(self.index_path) as f:
                index = json.load(f)
            weight_map = index["weight_map"]
            assert isinstance(weight_map, dict) and weight_map
        except (ValueError, KeyError, AssertionError):
            raise InputError(f"{self.index_path}: not an index with a non-empty weight_map") from None
        return sha256_file(self.index_path), weight_map

    def _check_tensors(self) -> None:
        for t in self.tensors.values():
            where = f"{self.headers[t.shard].path}: tensor {t.name}"
            if t.entry.dtype.startswith("F8"):
                raise InputError(
                    f"{where} has dtype {t.entry.dtype}: this is an FP8 checkpoint; quantize "
                    "from the BF16 release (zai-org/GLM-5.3-BF16)"
                )
            if t.quantized:
                if t.entry.dtype != "BF16":
                    raise InputError(f"{where} has dtype {t.entry.dtype}; routed experts must be BF16")
                if len(t.entry.shape) != 2 or t.entry.shape[-1] % BLOCK:
                    raise InputError(
                        f"{where} has shape {list(t.entry.shape)}: the block axis (last) must be a multiple of {BLOCK}"
                    )

    # -- plan ---------------------------------------------------------------------------------
    def unit_tensors(self, unit: str) -> list[Tensor]:
        """The unit's tensors in file order (shard, then offset), so reads are sequential."""
        if unit == "other":
            sel = [t for t in self.tensors.values() if not LAYER.match(t.name)]
        else:
            layer = int(unit.split("-", 1)[1])
            prefix = f"model.layers.{layer}."
            sel = [t for t in self.tensors.values() if t.name.startswith(prefix)]
        return sorted(sel, key=lambda t: (t.shard, t.entry.begin))

    def unit_bytes(self, unit: str) -> int:
        return sum(t.entry.nbytes for t in self.unit_tensors(unit))

    def unit_file(self, unit: str) -> str:
        i = self.units.index(unit)
        return f"model-{i + 1:05d}-of-{len(self.units):05d}.safetensors"

    def fingerprint(self, unit: str) -> dict:
        """What a unit's output depends on, cheap to recheck: each source shard's size and header."""
        shards = sorted({t.shard for t in self.unit_tensors(unit)})
        return {
            s: {"size": self.headers[s].size, "header_sha256": hashlib.sha256(self.headers[s].raw).hexdigest()}
            for s in shards
        }

    def layer_units(self, first: int, stop: int) -> list[str]:
        if not (0 <= first < stop):
            raise InputError(f"--layers {first}:{stop}: need 0 <= A < B")
        units = [unit_name(layer) for layer in self.layers if first <= layer < stop]
        if not units:
            raise InputError(
                f"--layers {first}:{stop}: no layer of {self.index_path} is in that range "
                f"(layers {self.layers[0]}..{self.layers[-1]})"
            )
        return units

    def tasks(self, count: int) -> list[list[str]]:
        """`count` tasks: contiguous layer ranges of about equal input bytes; "other" joins the lightest."""
        layers = [u for u in self.units if u != "other"]
        if not 1 <= count <= len(layers):
            raise InputError(f"--task-count/--workers {count}: must be between 1 and {len(layers)} (the layers)")
        sizes = [self.unit_bytes(u) for u in layers]
        total = sum(sizes)
        tasks: list[list[str]] = []
        cur: list[str] = []
        done = 0
        for unit, size in zip(layers, sizes, strict=True):
            remaining_tasks = count - len(tasks)
            remaining_units = len(layers) - layers.index(unit)
            if cur and (remaining_units < remaining_tasks or done >= total * (len(tasks) + 1) / count):
                tasks.append(cur)
                cur = []
            cur.append(unit)
            done += size
        tasks.append(cur)
        assert len(tasks) == count, (len(tasks), count)
        lightest = min(range(count), key=lambda i: (sum(self.unit_bytes(u) for u in tasks[i]), i))
        tasks[lightest] = ["other"] + tasks[lightest]
        return tasks
