"""A multimodal release's layout (Qwen3.5 and Gemma 4 ship so): config.json nests the language model's config under
text_config, and the weights sit under model.language_model. beside a vision tower (and Qwen3.5's multi-token
prediction layers). The text model loads from it and runs as the text-only checkpoint does."""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import load_file, save_file

from inferplug.models.loader import read_config
from tests.conftest import _save_tiny
from tests.models.test_families import LONG, VOCAB, engine_logprobs
from tests.engine.engine_helpers import prompts_of


def test_a_multimodal_qwen35_checkpoint_runs_its_language_model(tmp_path):
    text = _save_tiny("qwen35", tmp_path / "text")
    release = tmp_path / "release"
    shutil.copytree(text, release)
    config = json.loads((text / "config.json").read_text())
    (release / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
        "tie_word_embeddings": config["tie_word_embeddings"], "text_config": config,
        "vision_config": {"model_type": "qwen3_5", "depth": 1}}))
    weights = load_file(text / "model.safetensors")
    nested = {(k if k.startswith("lm_head.") else k.replace("model.", "model.language_model.", 1)): v
              for k, v in weights.items()}
    nested["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    nested["mtp.fc.weight"] = torch.zeros(4, 4)
    (release / "model.safetensors").unlink()
    save_file(nested, release / "model.safetensors")

    assert read_config(release) == read_config(text)
    prompt = prompts_of([LONG], vocab=VOCAB, seed=5)[0]
    assert torch.equal(engine_logprobs(release, prompt), engine_logprobs(text, prompt))
