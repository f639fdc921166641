"""Small copies of the committed transformers configs (``tests/data/hf_configs``): the same
model types and options, a few layers of a few dozen features, so that tests build and
trace them in seconds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
NAMES = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())

# key -> small value, wherever the key appears (the config and its text/vision parts)
_SMALL: dict[str, int] = {
    "num_hidden_layers": 2,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "hidden_size": 64,
    "d_model": 64,
    "intermediate_size": 128,
    "d_ff": 128,
    "num_attention_heads": 4,
    "num_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "d_kv": 16,
    "vocab_size": 512,
    "projection_dim": 32,
    "num_local_experts": 4,
    "image_size": 32,
    "patch_size": 8,
    "max_window_layers": 2,
}


def _shrink(config: dict[str, Any]) -> dict[str, Any]:
    small = {}
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config"):
            small[key] = _shrink(value)
        elif key in _SMALL and isinstance(value, int) and not isinstance(value, bool):
            small[key] = min(value, _SMALL[key])
        else:
            small[key] = value
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if isinstance(small.get(key), int) and small[key] >= _SMALL["vocab_size"]:
            small[key] = 1
    if "vision_config" in small and "text_config" in small:
        small["projection_dim"] = _SMALL["projection_dim"]
    return small


def tiny_config(name: str, folder: Path, **changes: Any) -> Path:
    """A folder holding a small ``config.json`` of the committed config ``name``."""
    config = json.loads((CONFIGS / name / "config.json").read_text())
    config = _shrink(config) | changes
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
