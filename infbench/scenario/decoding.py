"""The scenario's `decoding:` section: autoregressive (the default) or masked diffusion.

```yaml
decoding:
  kind: diffusion            # autoregressive (default) | diffusion
  steps: 16                  # S refinement steps for the workload's gen_len L tokens
  block_length: 8            # B: L is filled block by block, S / (L / B) steps each
  remasking: low_confidence  # low_confidence | random
  prefix_cache: false        # Fast-dLLM's block-wise prefix K/V cache (an approximation)
  mask_token_id: 255         # the mask token of a random-weights preset (a LLaDA dir has one)
```

Validated once, with the scenario; the S / L / B arithmetic is checked per point (gen_len
may be swept) by `DecodingSection.resolved`, so a bad combination is one line before the
first point runs.  Torch-free; the kinds and the S / L / B rule live in `core.decoding`;
docs/diffusion.md has the loop.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from infbench.core.decoding import DecodingKind, DiffusionConfig, Remasking, check_diffusion_plan
from infbench.core.errors import ConfigError

_Pos = Annotated[int, Field(gt=0, le=2**24, strict=True)]


def _llada_mask(path: str) -> int | None:
    from infbench.checkpoint.llada import is_llada_dir, read_llada_config

    return read_llada_config(path)[1] if is_llada_dir(path) else None


class DecodingSection(BaseModel):
    """How the tokens are generated: one per step (autoregressive) or L in S steps."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: DecodingKind = "autoregressive"
    """autoregressive: the engine, one token per sequence per step | diffusion: a
    masked-diffusion LM (bidirectional attention) refining L masked positions in S steps."""
    steps: _Pos | None = None
    """Diffusion: refinement steps S for the workload's gen_len L (S <= L)."""
    block_length: _Pos | None = None
    """Diffusion: block length B (divides L; default L, one block)."""
    remasking: Remasking = "low_confidence"
    """Diffusion: commit the most confident predictions (low_confidence) or seeded random ones."""
    prefix_cache: StrictBool = False
    """Diffusion: reuse the prompt's and finished blocks' K/V within a block (Fast-dLLM)."""
    mask_token_id: Annotated[int, Field(ge=0, le=2**24, strict=True)] | None = None
    """Diffusion: the mask token id (required for a preset; a LLaDA config.json has one)."""

    def resolved(self, gen_len: int,
                 model_source: dict[str, str] | None = None) -> DiffusionConfig | None:
        """The point's decoding settings (None: autoregressive), S / L / B checked, and a
        mask token known: decoding.mask_token_id, or the one of a LLaDA directory."""
        if self.kind == "autoregressive":
            set_keys = sorted(self.model_fields_set - {"kind"})
            if set_keys:
                raise ConfigError(f"decoding.{set_keys[0]} applies to kind: diffusion only "
                                  "(decoding.kind is autoregressive)")
            return None
        if self.steps is None:
            raise ConfigError("decoding.steps: required with kind: diffusion")
        block = gen_len if self.block_length is None else self.block_length
        check_diffusion_plan(gen_len, self.steps, block)
        path = (model_source or {}).get("path")
        if self.mask_token_id is None and not (path and _llada_mask(path) is not None):
            name = next(iter((model_source or {}).values()), "the model")
            raise ConfigError(f"model {name!r} has no mask token: decoding.kind diffusion needs "
                              "decoding.mask_token_id (or a LLaDA directory whose config.json "
                              "has mask_token_id)")
        return DiffusionConfig(self.steps, block, self.remasking, self.prefix_cache,
                               self.mask_token_id)
