"""The stages around every local backend's token loop: the prompt stage (prompt.py: render, tokenize, check,
clamp) and the output stage (output.py: detokenize, stops, the reasoning split, logprobs, usage, timings)."""
