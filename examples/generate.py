"""Offline batched generation with the Python API (the example of docs/engine.md).

Run: .venv/bin/python examples/generate.py
"""

from infbench import LLM, SamplingParams

# The packaged SmolLM2-135M; a preset name, an HF directory or a .gguf path work too.
# A short max_model_len and few sequences keep the KV pool small on a CPU; float32 prints
# the same text on every CPU (dtype="auto" picks bfloat16 where the CPU has native bf16).
llm = LLM("smollm2-135m", dtype="float32", max_model_len=128, max_num_seqs=4)
prompts = ["The capital of France is", "def fibonacci(n):"]
greedy = SamplingParams(max_tokens=8)  # temperature 0: greedy
for out in llm.generate(prompts, greedy):
    print(f"{out.prompt!r} -> {out.outputs[0].text!r} ({out.outputs[0].finish_reason}, "
          f"{len(out.prompt_token_ids)} prompt tokens)")

# n samples of one prompt; a seed makes them reproducible.
sampled = SamplingParams(max_tokens=6, temperature=0.8, top_p=0.95, n=2, seed=0)
for sample in llm.generate("Once upon a time", sampled)[0].outputs:
    print(f"sample {sample.index}: {sample.text!r}")
