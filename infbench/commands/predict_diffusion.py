"""`infbench predict --diffusion-steps S --gen L`: masked-diffusion decoding priced.

One row per (batch, S): the step shapes, their arithmetic intensity and bound, the decode
time and tokens/s, beside the same model decoding the L tokens autoregressively
(`roofline/diffusion.py` has the rules).  No torch: a LLaDA directory is read by
`checkpoint/llada.py`.
"""

from __future__ import annotations

import json
import sys

from infbench.checkpoint.metadata import config_from_source
from infbench.core.config import ModelConfig


def diffusion_config(source: dict[str, str]) -> ModelConfig:
    """The ModelConfig of a LLaDA directory, else `config_from_source`'s (preset, HF dir, GGUF)."""
    from infbench.checkpoint.llada import is_llada_dir, read_llada_config

    if "path" in source and is_llada_dir(source["path"]):
        return read_llada_config(source["path"])[0]
    return config_from_source(source)


def run_predict_diffusion(source: dict[str, str], hardware: str, batches: list[int],
                          prompt_len: int, gen_len: int, steps: list[int],
                          block_length: int | None, prefix_cache: bool, dtype: str,
                          as_json: bool) -> None:
    from infbench.hardware.spec import get_hardware
    from infbench.roofline.diffusion import diffusion_dict, predict_diffusion

    cfg = diffusion_config(source)
    hw = get_hardware(hardware)
    preds = [predict_diffusion(cfg, hw, batch=b, prompt_len=prompt_len, gen_len=gen_len,
                               steps=s, block_length=block_length, prefix_cache=prefix_cache,
                               dtype=dtype)
             for b in batches for s in steps]  # bad S / L / B: a ConfigError, one line
    if as_json:
        sys.stdout.write(json.dumps([diffusion_dict(p) for p in preds], indent=2) + "\n")
        return
    first = preds[0]
    cache = "prefix cache" if prefix_cache else "no cache"
    print(f"{cfg.name} on {hw.name}, {dtype}: prompt {prompt_len}, gen {gen_len}, "
          f"block {first.block_length}, {cache}")
    head = (f"{'batch':>5} {'S':>5} {'step ms':>9} {'FLOP/B':>8} {'bound':>8} "
            f"{'diff tok/s':>11} {'AR tok/s':>10} {'AR FLOP/B':>10} {'AR bound':>8}")
    print(head)
    for p in preds:
        bounds = {s.bound for s in p.step_prices}
        bound = bounds.pop() if len(bounds) == 1 else "mixed"
        print(f"{p.batch:>5} {p.steps:>5} {p.mean_step_time_s * 1e3:>9.3f} "
              f"{p.intensity:>8.1f} {bound:>8} {p.tokens_per_s:>11.1f} "
              f"{p.ar_tokens_per_s:>10.1f} {p.ar_decode_intensity:>10.2f} "
              f"{p.ar_decode_bound:>8}")
    sys.stdout.flush()
