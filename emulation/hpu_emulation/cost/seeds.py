"""Every performance figure the seed pages publish, as data: the rows the planning command sets its
predictions beside. ``fit`` marks the four rows the calibration constants were fitted on
(:mod:`.calibrate`); every other row is a prediction.

Sources: 000 = the GLM-5.3-Flash serving page ("Performance": single stream, warm, decode 512
tokens, switches on = the recipe, off = the reference path); 001 = the GLM-5.3-Flash write-up
("Performance" and the text: the before/after of the prefill scan and of the Sinkhorn kernel with
one graph per decode step); 003 = the GLM-5.3 MXFP4 serving page ("Performance": greedy, 256
output tokens, median of 3; columns: the launch as written, GLM_MXK_PREFILL=0, and also the three
decode levers off).
"""

from __future__ import annotations

from dataclasses import dataclass

FLASH, GLM53 = "GLM-5.3-Flash", "GLM-5.3"


@dataclass(frozen=True)
class Row:
    key: str
    model: str
    page: str
    what: str
    published: float
    unit: str
    fit: bool = False


ROWS: tuple[Row, ...] = (
    Row("flash.decode.2k.on", FLASH, "000", "decode, 2K prompt, switches on", 43.5, "tokens/s"),
    Row("flash.decode.128k.on", FLASH, "000", "decode, 128K prompt, switches on", 38.6, "tokens/s"),
    Row("flash.decode.2k.off", FLASH, "000", "decode, 2K prompt, switches off", 30.8, "tokens/s"),
    Row("flash.decode.128k.off", FLASH, "000", "decode, 128K prompt, switches off", 28.7, "tokens/s"),
    Row("flash.ttft.16k.on", FLASH, "000", "TTFT, 16K prompt, switches on", 2.6, "s"),
    Row("flash.ttft.64k.on", FLASH, "000", "TTFT, 64K prompt, switches on", 10.3, "s"),
    Row("flash.ttft.128k.on", FLASH, "000", "TTFT, 128K prompt, switches on", 23.8, "s"),
    Row("flash.ttft.16k.off", FLASH, "000", "TTFT, 16K prompt, switches off", 5.4, "s"),
    Row("flash.ttft.64k.off", FLASH, "000", "TTFT, 64K prompt, switches off", 22.3, "s"),
    Row("flash.ttft.128k.off", FLASH, "000", "TTFT, 128K prompt, switches off", 42.7, "s"),
    Row("flash.step.before", FLASH, "001", "decode step, 1 stream, 2K: torch Sinkhorn, graph per layer", 32.5, "ms"),
    Row(
        "flash.step.after", FLASH, "001", "decode step, 1 stream, 2K: Sinkhorn kernel, one graph", 24.5, "ms", fit=True
    ),
    Row("flash.chunk.before", FLASH, "001", "8,192-token prompt chunk, sequential carry", 2207, "ms"),
    Row("flash.chunk.after", FLASH, "001", "8,192-token prompt chunk, scan", 975, "ms", fit=True),
    Row("flash.kda_ops.before", FLASH, "001", "aten ops per KDA call, sequential carry", 2121, "ops"),
    Row("flash.kda_ops.after", FLASH, "001", "aten ops per KDA call, scan", 412, "ops"),
    Row("flash.kda_host.before", FLASH, "001", "host recording per KDA call, sequential carry", 31.8, "ms", fit=True),
    Row("flash.kda_host.after", FLASH, "001", "host recording per KDA call, scan", 5.0, "ms"),
    Row("flash.sinkhorn.before", FLASH, "001", "mhc_pre + mhc_post at one row, torch loop", 198, "us", fit=True),
    Row("flash.sinkhorn.after", FLASH, "001", "mhc_pre + mhc_post at one row, kernel", 75, "us"),
    Row("glm53.decode1.cmd", GLM53, "003", "decode, 1 stream, ~2K prompt, as launched", 68.6, "tokens/s"),
    Row("glm53.decode1.nomxkp", GLM53, "003", "decode, 1 stream, GLM_MXK_PREFILL=0", 67.5, "tokens/s"),
    Row("glm53.decode1.levers", GLM53, "003", "decode, 1 stream, also the three levers off", 61.0, "tokens/s"),
    Row("glm53.decode4.cmd", GLM53, "003", "decode, 4 streams aggregate, as launched", 116.1, "tokens/s"),
    Row("glm53.decode4.nomxkp", GLM53, "003", "decode, 4 streams, GLM_MXK_PREFILL=0", 110.2, "tokens/s"),
    Row("glm53.decode4.levers", GLM53, "003", "decode, 4 streams, also the three levers off", 97.9, "tokens/s"),
    Row("glm53.ttft2k.cmd", GLM53, "003", "TTFT, uncached 2K prompt, as launched", 0.52, "s"),
    Row("glm53.ttft2k.nomxkp", GLM53, "003", "TTFT, 2K, GLM_MXK_PREFILL=0", 0.64, "s"),
    Row("glm53.ttft2k.levers", GLM53, "003", "TTFT, 2K, also the three levers off", 0.65, "s"),
    Row("glm53.ttft8k.cmd", GLM53, "003", "TTFT, uncached 8K prompt, as launched", 1.76, "s"),
    Row("glm53.ttft8k.nomxkp", GLM53, "003", "TTFT, 8K, GLM_MXK_PREFILL=0", 1.96, "s"),
    Row("glm53.ttft8k.levers", GLM53, "003", "TTFT, 8K, also the three levers off", 1.97, "s"),
)

#: the serving page's gates for the Flash recipe (000 "Verified": decode floors, 128K TTFT bound)
FLASH_FLOORS = {"decode_2k_min": 15.0, "decode_128k_min": 10.0, "ttft_128k_max": 120.0}


def rows(model: str | None = None) -> list[Row]:
    return [r for r in ROWS if model is None or r.model == model]
