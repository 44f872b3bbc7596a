"""The load-time entry of the quantization methods that calibrate on text: AWQ
(`model/awq.py`) and LLM.int8() (`model/llm_int8.py`), for `quant.method: awq|llm_int8`.

Both measure the float model on `quant.calibration_tokens` tokens of the calibration split
(`calibration.calibration_ids`) and replace the projections in place; the returned line
says what was chosen and goes into `LoadedModel.source`.
"""

from __future__ import annotations

from infbench.core.config import QuantConfig
from infbench.core.errors import ConfigError
from infbench.model.awq import awq_quantize
from infbench.model.calibration import calibration_ids
from infbench.model.llm_int8 import llm_int8_quantize
from infbench.model.tokenizer import Tokenizer
from infbench.model.transformer import Transformer

CALIBRATED_METHODS = ("awq", "llm_int8")


def quantize_with_calibration(model: Transformer, tokenizer: Tokenizer | None,
                              quant: QuantConfig, seed: int = 0) -> str:
    """Quantize `model` (a `Transformer`) by `quant.method`; returns the source note, e.g.
    "g64: awq x120, rtn x0; mean ... alpha; searched in 41.2 s on 1024 tokens of ..."."""
    if quant.method not in CALIBRATED_METHODS:
        raise ConfigError(f"quant.method={quant.method!r} does not calibrate; allowed here: "
                          f"{', '.join(CALIBRATED_METHODS)}")
    ids, what = calibration_ids(tokenizer, quant.calibration_tokens, model.config.vocab_size,
                                seed)
    if quant.method == "awq":
        awq = awq_quantize(model, quant, ids)
        return (f"g{quant.group_size}: {awq.summary()}; searched in {awq.seconds:.1f} s on "
                f"{what}")
    int8 = llm_int8_quantize(model, quant, ids)
    return f"{int8.summary()}; calibrated in {int8.seconds:.1f} s on {what}"
