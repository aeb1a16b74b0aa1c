"""What a model family is: how its decoder differs from Llama's, and where its config and tensors live.

The decoder (models/decoder.py) is Llama's, with every difference below a switch; a family module
(models/families/<name>.py) sets the switches that apply to it and reads its own config fields. Adding a family is
that module, its entry in models/registry.py and its test fixtures: the engine, the scheduler, the server and the
integrations never see which family runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from inferplug.models.gguf import GGUFFile

ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")  # the gated MLP's: SwiGLU, GeGLU (tanh gelu), gpt-oss's clamped SwiGLU
# the texts of the tokens llama.cpp takes as a reply's end in any GGUF whose vocabulary has them (its EOG set): a
# GGUF names one EOS id, often the base model's (<eos>, <|endoftext|>), while a chat model ends its turns with another
# (Gemma 3's <end_of_turn>, Qwen's <|im_end|>, Llama 3's <|eot_id|>); and fill-in-the-middle's pad, repository and
# file-separator tokens, where a code model's completion leaves its file
END_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
              "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
              "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
              "<reponame>", "<|file_sep|>")


@dataclass(frozen=True)
class Family:
    name: str
    hf_model_types: tuple[str, ...]  # config.json's model_type values
    gguf_architectures: tuple[str, ...]  # GGUF general.architecture values
    qk_norm: bool = False  # a per-head RMSNorm on q and k, before RoPE (Qwen3, Gemma 3)
    v_norm: bool = False  # an RMSNorm without a scale on each v head (Gemma 4)
    norms_plus_one: bool = False  # a norm scales by 1 + w: HF stores w, llama.cpp's GGUF w + 1 (Gemma, Qwen3.5)
    plain_norms: tuple[str, ...] = ()  # norms (HF module names) that scale by w even so (Qwen3.5's DeltaNet output's)
    sandwich_norms: bool = False  # norms on the attention and MLP outputs too, before the residual add (Gemma 3)
    scaled_embedding: bool = False  # the embedding times sqrt(hidden) (Gemma)
    activation: str = "silu"
    attention_sinks: bool = False  # one learned logit per head joins each query's softmax, then is dropped (gpt-oss)
    all_biases: bool = False  # biases on q/k/v/o, the router and every expert (gpt-oss)
    gguf_interleaved_rope: bool = False  # llama.cpp's converter interleaves Q/K rows (NORM RoPE): undone at load
    # tokens that end a reply besides the GGUF's EOS / EOT ids, found by their text as llama.cpp finds its EOG tokens;
    # a family whose turns end otherwise names its own (gpt-oss: <|return|> and <|call|>, where <|end|> ends a
    # message, not the reply). An HF dir lists them in generation_config.json.
    end_tokens: tuple[str, ...] = END_TOKENS
    # GGUF layer tensor part -> HF module, where the family's differ from Llama's (models/gguf_convert._LAYER_NAMES)
    gguf_layer_names: dict[str, str] = field(default_factory=dict)
    # the family's own config fields (ModelConfig keyword arguments) from config.json, and from a GGUF's metadata
    hf_fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    gguf_fields: Callable[["GGUFFile"], dict[str, Any]] | None = None
    # an HF checkpoint's tensors (name -> tensor) renamed and cut as the decoder takes them, given the expert count
    hf_weights: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    # which decoder paths cover it (the rest run the layer-by-layer ops): the CPU whole-stack decode kernel, and
    # what keeps it out (resolve says so)
    fused_decode: bool = False
    unfused_why: str = ""
    tensor_parallel_why: str = ""  # why tensor parallel does not split it ("": it does)
    document_cache_why: str = ""  # why the RAG document cache (engine/doc_cache.py) does not take it ("": it does)
    # a recurrent state per sequence (Qwen3.5's DeltaNet layers): why speculative decoding and beam search do not
    # run on it ("": none, they run); its prefix cache runs from snapshots of the state (engine/state_snapshots.py)
    recurrent_why: str = ""
