"""A tiny random Llama with a real tokenizer, for the accuracy tests (found through pytest's
pythonpath): transformers saves the weights, `tokenizers` a byte-level BPE of 256 tokens
and no merges, so every byte of the evaluation text is one token of the 256-token vocabulary.
"""

from __future__ import annotations

from pathlib import Path


def write_tiny_with_tokenizer(path: Path, seed: int = 0, *, num_layers: int = 2,
                              tie: bool = False, max_positions: int = 256,
                              random_norms: bool = False, hidden_size: int = 64,
                              intermediate_size: int = 128) -> Path:
    """random_norms: norm weights drawn from U(0.5, 1.5), so a wrong mapping cannot hide."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=hidden_size,
                         intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=tie)
    model = LlamaForCausalLM(config)
    if random_norms:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    return path
