"""Fake exllamav2 0.3.2 (see tests/fakes/README.md): model, config, caches, tokenizer.

ExLlamaV2Config reads config.json the way the real one does, including its quirk of reading
only a top-level `rope_theta` (default 10000 for Llama); the model then runs with the
config's `rotary_embedding_base`, so a wrong theta shows up as wrong output.
"""

from __future__ import annotations

import json
import os

import torch

__version__ = "0.3.2"


class ExLlamaV2Config:
    def __init__(self, model_dir: str | None = None):
        self.max_batch_size = 1
        self.max_input_len = 2048
        self.max_attention_size = 2048**2
        self.max_output_len = None
        self.scale_pos_emb = 1.0
        self.scale_alpha_value = 1.0
        self.no_flash_attn = False
        if model_dir is not None:
            self.model_dir = model_dir
            self.prepare()
        else:
            self.model_dir = None

    def prepare(self, no_tensors: bool = False):
        assert self.model_dir is not None, "No model_dir specified in ExLlamaV2Config"
        assert os.path.exists(self.model_dir), "Can't find " + self.model_dir
        self.model_config = os.path.join(self.model_dir, "config.json")
        with open(self.model_config, encoding="utf8") as f:
            read_config = json.load(f)
        self.bos_token_id = read_config.get("bos_token_id")
        self.eos_token_id = read_config.get("eos_token_id")
        if isinstance(self.eos_token_id, list):
            self.eos_token_id = self.eos_token_id[0]
        self.rotary_embedding_base = float(read_config.get("rope_theta", 10000.0))  # top level only, as the real one
        self.max_seq_len = read_config.get("max_position_embeddings", 2048)
        self.original_max_seq_len = self.max_seq_len
        self.vocab_size = read_config["vocab_size"]

    def arch_compat_overrides(self, quiet: bool = False, warn_only=False):
        pass


class ExLlamaV2:
    def __init__(self, config: ExLlamaV2Config, lazy_load=False, archparams=None):
        self.config = config
        self.hf_model = None
        self.loaded = False

    def _load_hf(self):
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.from_pretrained(self.config.model_dir)
        hf_config.rope_parameters = {**(hf_config.rope_parameters or {}),
                                     "rope_theta": self.config.rotary_embedding_base}
        self.hf_model = AutoModelForCausalLM.from_pretrained(self.config.model_dir, config=hf_config,
                                                             dtype=torch.float32)
        self.hf_model.eval()
        self.loaded = True

    def load(self, gpu_split: list[float] | None = None, lazy: bool = False, stats: bool = False,
             callback=None, callback_gen=None, progress: bool = False):
        self._load_hf()

    def load_autosplit(self, cache, reserve_vram=None, last_id_only: bool = False, callback=None,
                       callback_gen=None, progress: bool = False):
        assert cache.lazy, "load_autosplit needs a cache constructed with lazy = True"
        self._load_hf()

    def unload(self):
        self.hf_model = None
        self.loaded = False


class ExLlamaV2CacheBase:
    def __init__(self, model: ExLlamaV2, batch_size: int, max_seq_len: int, dtype, weights_per_element_k: int,
                 weights_per_element_v: int, has_scales: bool, num_key_value_heads: int | None = None,
                 fixed_device: int | None = None):
        self.model = model
        self.max_seq_len = max_seq_len if max_seq_len != -1 else self.model.config.max_seq_len
        self.batch_size = batch_size
        self.dtype = dtype


class ExLlamaV2Cache(ExLlamaV2CacheBase):
    def __init__(self, model: ExLlamaV2, batch_size: int = 1, max_seq_len: int = -1, copy_from=None,
                 lazy: bool = False, num_key_value_heads: int | None = None, fixed_device: int | None = None):
        super().__init__(model, batch_size, max_seq_len, torch.half, 1, 1, False, num_key_value_heads, fixed_device)
        self.lazy = lazy


class ExLlamaV2Cache_Q4(ExLlamaV2Cache):
    pass


class ExLlamaV2Cache_Q6(ExLlamaV2Cache):
    pass


class ExLlamaV2Cache_Q8(ExLlamaV2Cache):
    pass


class ExLlamaV2Tokenizer:
    def __init__(self, config, lazy_init=True, force_json=False, force_spm=False):
        from transformers import AutoTokenizer

        self.config = config
        self.hf = AutoTokenizer.from_pretrained(config.model_dir)
        self.eos_token_id = config.eos_token_id if config.eos_token_id is not None else self.hf.eos_token_id
        self.bos_token_id = config.bos_token_id

    def encode(self, text, add_bos: bool = False, add_eos: bool = False, encode_special_tokens: bool = False,
               return_offsets: bool = False, embeddings=None):
        ids = self.hf.encode(text, add_special_tokens=False)
        ids = ([self.bos_token_id] if add_bos else []) + ids + ([self.eos_token_id] if add_eos else [])
        return torch.tensor([ids], dtype=torch.long)

    def decode(self, ids, decode_special_tokens: bool = False):
        return [self.hf.decode(row.tolist(), skip_special_tokens=not decode_special_tokens) for row in ids]

    def get_id_to_piece_list(self, include_special_tokens=False):
        known = len(self.hf)  # the model's vocab may be padded past the tokenizer's
        return [self.hf.decode([i]) if i < known else "" for i in range(max(known, self.config.vocab_size))]
