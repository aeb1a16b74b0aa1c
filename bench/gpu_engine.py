"""The native engine on a CUDA GPU against HF transformers' generate, on the same random weights.

7B geometry (hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 14336, vocab 32000; --layers sets the depth, 32
by default), bf16, greedy with ignore_eos so every request makes exactly --output tokens. Both run the same
token-id prompts: the engine (Triton attention, CUDA graphs for decode) as a continuously batched server would,
HF as one padded-free static batch (all prompts one length). Prints a table and writes JSON.

    python3 bench/gpu_engine.py --out gpu_engine.json                 # on a CUDA machine
    python3 bench/gpu_engine.py --device cpu --dry-run                # the script's logic on a tiny model, here
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from inferplug.engine.config import EngineConfig  # noqa: E402
from inferplug.engine.llm_engine import LLMEngine  # noqa: E402
from inferplug.models.loader import read_config  # noqa: E402
from inferplug.types import Request, SamplingParams  # noqa: E402

GEOMETRY_7B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                   vocab_size=32000, max_position_embeddings=4096)
GEOMETRY_TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                     vocab_size=512, max_position_embeddings=512)  # --dry-run: the same code paths, small


def build_hf_model(geometry: dict, layers: int, device: str, dtype: torch.dtype):
    """A random LlamaForCausalLM made directly on the device in the dtype (no fp32 copy on the host)."""
    import transformers

    config = transformers.LlamaConfig(**geometry, num_hidden_layers=layers, rms_norm_eps=1e-5, rope_theta=500000.0,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper logits: fewer greedy near-ties between the two implementations
    return model.eval(), config


def word_tokenizer(vocab_size: int):
    """A real (word-level) tokenizer over the whole vocabulary: the engine detokenizes what it generates."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0")


def engine_run(engine: LLMEngine, prompts: list[list[int]], output: int) -> tuple[float, dict[str, list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    sync()
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(prompt=prompt, params=params, request_id=str(i)))
    while engine.has_unfinished():
        for event in engine.step():
            tokens.setdefault(event.request_id, []).extend(event.token_ids)
    sync()
    return time.perf_counter() - start, tokens


def hf_run(model, prompts: list[list[int]], output: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=model.device)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output, min_new_tokens=output,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    sync()
    return time.perf_counter() - start, out[:, ids.shape[1]:].tolist()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_engine.json"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batches", default="1,16,64", help="concurrent requests per run, comma-separated")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens per request")
    parser.add_argument("--output", type=int, default=256, help="generated tokens per request (ignore_eos)")
    parser.add_argument("--attention", default=None, help="the engine's attention (default: triton on CUDA, else auto)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny model and short runs: checks the script")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench/gpu_engine.py needs a CUDA GPU (or --device cpu --dry-run)")
    cuda = args.device.startswith("cuda")
    geometry = GEOMETRY_TINY if args.dry_run else GEOMETRY_7B
    layers, prompt_len, output = (2, 24, 8) if args.dry_run else (args.layers, args.prompt, args.output)
    dtype = torch.bfloat16 if cuda else torch.float32
    batches = [int(b) for b in args.batches.split(",")]

    t0 = time.perf_counter()
    hf, hf_config = build_hf_model(geometry, layers, args.device, dtype)
    attention = args.attention or ("triton" if cuda else "auto")
    config = EngineConfig(dtype=str(dtype).removeprefix("torch."), device=args.device, attention=attention,
                          max_num_seqs=max(batches), max_num_batched_tokens=max(2048, prompt_len),
                          num_kv_blocks=max(batches) * -(-(prompt_len + output) // 16) + 16,
                          max_model_len=prompt_len + output)
    with tempfile.TemporaryDirectory() as tmp:  # the engine reads the config.json HF writes
        hf_config.save_pretrained(tmp)
        model_config = read_config(Path(tmp))
    engine = LLMEngine(model_config, dict(hf.state_dict()), word_tokenizer(geometry["vocab_size"]), config)
    setup_s = time.perf_counter() - t0
    generator = torch.Generator().manual_seed(1)
    warm = torch.randint(0, geometry["vocab_size"], (2, prompt_len), generator=generator).tolist()
    engine_run(engine, warm, 4)  # Triton compiles and the CUDA graphs are captured here, not in the timings
    hf_run(hf, warm, 4)

    rows = []
    for batch in batches:
        prompts = torch.randint(0, geometry["vocab_size"], (batch, prompt_len), generator=generator).tolist()
        engine_s, engine_tokens = engine_run(engine, prompts, output)
        hf_s, hf_tokens = hf_run(hf, prompts, output)
        same = sum(engine_tokens[str(i)][:16] == hf_tokens[i][:16] for i in range(batch))
        rows.append({"batch": batch, "prompt": prompt_len, "output": output,
                     "engine_s": round(engine_s, 3), "hf_s": round(hf_s, 3),
                     "engine_tok_s": round(batch * output / engine_s, 1), "hf_tok_s": round(batch * output / hf_s, 1),
                     "speedup": round(hf_s / engine_s, 2), "first16_agree": f"{same}/{batch}"})
        assert engine.blocks.num_free == engine.blocks.num_blocks, "the engine leaked KV blocks"
    graphs = engine.runner.graphs
    attention = engine.runner.model.ops.name  # the kernel set that ran (ops.kernel_set's answer)
    print(f"{torch.cuda.get_device_name() if cuda else 'cpu'}: {layers} layers of 7B geometry, attention {attention}"
          f"{' (dry run: tiny)' if args.dry_run else ''}, {dtype}, setup {setup_s:.0f} s, "
          f"decode graph replays {graphs.replays if graphs else 0}")
    print("| batch | prompt | output | engine s | HF s | engine tok/s | HF tok/s | engine / HF | first 16 tokens agree |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['prompt']} | {r['output']} | {r['engine_s']} | {r['hf_s']} | {r['engine_tok_s']} | "
              f"{r['hf_tok_s']} | {r['speedup']}x | {r['first16_agree']} |")
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if cuda else "cpu",
                                    "torch": torch.__version__, "layers": layers, "dtype": str(dtype),
                                    "attention": attention, "dry_run": args.dry_run,
                                    "graph_replays": graphs.replays if graphs else 0, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
