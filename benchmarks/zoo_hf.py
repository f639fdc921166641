"""The transformers part of the zoo sweep: every model type whose config builds offline, shrunk.

Usage: python benchmarks/zoo_hf.py [--only TYPE ...] [--jobs 2] [--timeout 300]

For every model type of transformers' ``CONFIG_MAPPING`` whose config builds offline
(``AutoConfig.for_model(type)``), and every auto class the sweep trains with that has the
type (causal LM, masked LM, seq2seq LM, image classification, audio classification, CTC),
the config is shrunk to a few small layers (:func:`shrink`) and checked: the model builds
and one real CPU training step runs. When a shrink breaks the model, the next level is
tried: widths kept and only layers cut, then the default config when it has under
``DEFAULT_LIMIT`` parameters. The configs that work, with ``architectures`` set to the
class, are written to ``benchmarks/results/zoo_hf_configs.json`` (committed, so that the
GPU machine builds exactly the same models; :func:`write_config_files` writes them out as
``config.json`` files that ``hf:`` specs name).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS_JSON = HERE / "results" / "zoo_hf_configs.json"
# where the configs are written as files for hf: specs (ignored by git; relative to ROOT)
CONFIG_DIR = Path("benchmarks") / "zoo_configs"

# task -> (transformers' auto mapping, auto class)
SWEEP_TASKS: dict[str, tuple[str, str]] = {
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "seq2seq-lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "image-classification": (
        "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForImageClassification",
    ),
    "audio-classification": (
        "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForAudioClassification",
    ),
    "ctc": ("MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC"),
}
DEFAULT_LIMIT = 300_000_000  # the default config is used unshrunk only below this size
LEVELS = ("small", "layers", "default")

# ---- the shrink -------------------------------------------------------------------------------

LAYERS = 2
HIDDEN = 128
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 256
EXPERTS = 4
TOP_K = 2
LORA_RANK = 32

_LAYER_KEYS = {
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "depth",
    "encoder_depth",
    "decoder_depth",
    "speech_encoder_layers",
    "t2u_encoder_layers",
    "t2u_decoder_layers",
    "num_hidden_groups",
}
# keys that count some of the layers: at most this many
_AT_MOST = {
    "max_window_layers": LAYERS,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "num_nextn_predict_layers": 1,
    "num_kv_shared_layers": 0,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "moe_num_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
    "num_codevectors_per_group": 32,
    "codevector_dim": 64,
    "proj_codevector_dim": 64,
    "classifier_proj_size": 64,
    "xvector_output_dim": 64,
    "subsampling_conv_channels": 64,
    "index_topk": 64,
}
_SHARED_EXPERT_KEYS = {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts"}
_HIDDEN_KEYS = {
    "hidden_size",
    "d_model",
    "n_embd",
    "embed_dim",
    "model_dim",
    "emb_dim",
    "d_embed",
    "word_embed_proj_dim",
    "embedding_size",
    "output_hidden_size",
    "pooler_hidden_size",
    "out_hidden_size",
    "attention_hidden_size",
}
_HEAD_KEYS = {
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "attention_heads",
    "speech_encoder_attention_heads",
    "t2u_encoder_attention_heads",
    "t2u_decoder_attention_heads",
    "index_n_heads",
    "linear_num_value_heads",
}
_KV_HEAD_KEYS = {
    "num_key_value_heads",
    "n_head_kv",
    "num_kv_heads",
    "multi_query_group_num",
    "linear_num_key_heads",
}
_HEAD_DIM_KEYS = {
    "head_dim",
    "attention_head_dim",
    "attention_head_size",
    "d_kv",
    "dim_head",
    "d_head",
    "kv_channels",
    "v_head_dim",
    "qk_head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "index_head_dim",
}
_HALF_HEAD_DIM_KEYS = {"qk_nope_head_dim", "qk_rope_head_dim"}  # DeepSeek: they add up
_LORA_KEYS = {"kv_lora_rank", "q_lora_rank"}
_INTERMEDIATE_KEYS = {
    "intermediate_size",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "n_inner",
    "d_ff",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "shared_intermediate_size",
    "expert_intermediate_size",
    "ffn_hidden_size",
    "intermediate_size_mlp",
    "speech_encoder_intermediate_size",
    "t2u_encoder_ffn_dim",
    "t2u_decoder_ffn_dim",
}
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
_TOP_K_KEYS = {"num_experts_per_tok", "moe_topk", "num_experts_per_token", "moe_k"}
_CHANNEL_LIST_KEYS = {"conv_dim", "tdnn_dim"}  # wav2vec2's feature encoder, x-vector head


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _layer_keyed(key: str, value: Any) -> bool:
    """A dict keyed by layer index (Gemma 4's ``per_layer_config``)."""
    return (
        "layer" in str(key)
        and isinstance(value, dict)
        and bool(value)
        and all(str(k).isdigit() for k in value)
    )


def _kinds(values: list[Any]) -> list[int]:
    """The index of the first layer of each kind in a per-layer list."""
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        seen.setdefault(json.dumps(value, sort_keys=True), i)
    return sorted(seen.values())


def _cover(values: list[Any], n: int) -> list[Any]:
    """``n`` entries of a per-layer list, in order, keeping one layer of each kind (hybrid
    models keep an attention layer beside their linear or state-space ones)."""
    chosen = set(_kinds(values)[:n])
    for i in range(len(values)):
        if len(chosen) >= n:
            break
        chosen.add(i)
    return [values[i] for i in sorted(chosen)]


def _per_layer(key: str, value: Any, count: int) -> bool:
    """Whether a list has one entry per layer (layer types, flags) of ``count`` layers."""
    if not isinstance(value, list) or len(value) != count:
        return False
    return "layer" in str(key) or all(isinstance(v, (str, bool)) for v in value)


def _shrink_dict(d: dict[str, Any], level: str) -> dict[str, Any]:
    """One level of a config's dict, and the sub-configs inside it, shrunk in place."""
    for key, value in list(d.items()):
        if isinstance(value, dict) and not _layer_keyed(key, value):
            _shrink_dict(value, level)
    layer_counts = {k: d[k] for k in _LAYER_KEYS if _is_int(d.get(k)) and d[k] > LAYERS}
    if isinstance(d.get("depths"), list):  # hierarchical (Swin): num_layers counts stages
        layer_counts.pop("num_layers", None)
    # as many layers as the kinds of layer a per-layer list has (2 to 4)
    kinds = [
        len(_kinds(value))
        for count in set(layer_counts.values())
        for key, value in d.items()
        if _per_layer(key, value, count)
    ]
    # a repeating pattern of layer kinds (Recurrent Gemma's recurrent, recurrent, attention):
    # enough layers that every kind comes up
    kinds += [
        _kinds(value)[-1] + 1
        for key, value in d.items()
        if isinstance(value, list)
        and value
        and all(isinstance(v, str) for v in value)
        and 0 < len(value) < min(layer_counts.values(), default=0)
    ]
    n = max(LAYERS, min(4, max(kinds, default=0)))
    for key, value in list(d.items()):
        if key in layer_counts:
            d[key] = min(value, n)
        elif key == "depths" and isinstance(value, list) and all(_is_int(v) for v in value):
            d[key] = [1] * len(value)
        elif key in _AT_MOST and _is_int(value):
            d[key] = min(value, _AT_MOST[key])
        elif key in _EXPERT_KEYS and _is_int(value):
            d[key] = min(value, EXPERTS)
        elif key in _TOP_K_KEYS and _is_int(value):
            d[key] = min(value, TOP_K)
    for count in set(layer_counts.values()):
        for key, value in list(d.items()):
            if _per_layer(key, value, count):
                d[key] = _cover(value, min(count, n))
            elif (
                "layer" in str(key)
                and isinstance(value, list)
                and value
                and all(_is_int(v) and 0 <= v < count for v in value)
            ):  # indices of some layers (attention, MoE): those that remain, or the last
                d[key] = [v for v in value if v < n] or [n - 1]
            elif _layer_keyed(key, value):
                kept = {k: v for k, v in value.items() if int(k) < n}
                d[key] = kept or {str(n - 1): next(iter(value.values()))}
    if "num_layers_per_stack" in d:  # HRM: the layer count is made from it after the build
        d["num_layers_per_stack"] = None
    # a layer kind every k layers from an offset (Jamba's attention and experts)
    for key, value in list(d.items()):
        if not isinstance(key, str):
            continue
        if key.endswith("_period") and "layer" in key and _is_int(value) and value > n:
            d[key] = n
            offset = key.replace("_period", "_offset")
            if _is_int(d.get(offset)):
                d[offset] = d[offset] % n
    if level != "small":
        return d
    heads = None
    for key in _HEAD_KEYS:
        if _is_int(d.get(key)) and d[key] > 0:
            heads = min(d[key], HEADS)
            kv_before = {k: d[k] for k in _KV_HEAD_KEYS if _is_int(d.get(k))}
            original = d[key]
            d[key] = heads
            for kv_key, kv in kv_before.items():
                # multi-head attention stays so; grouped or multi-query keeps a divisor
                d[kv_key] = heads if kv >= original else min(kv, KV_HEADS)
    for key, value in list(d.items()):
        if not _is_int(value) or value <= 0:
            continue
        if key in _HIDDEN_KEYS:
            d[key] = min(value, HIDDEN)
        elif key in _HEAD_DIM_KEYS:
            d[key] = min(value, HEAD_DIM)
        elif key in _HALF_HEAD_DIM_KEYS:
            d[key] = min(value, HEAD_DIM // 2)
        elif key in _LORA_KEYS:
            d[key] = min(value, LORA_RANK)
        elif key in _INTERMEDIATE_KEYS:
            d[key] = min(value, INTERMEDIATE)
    for key in _CHANNEL_LIST_KEYS:
        value = d.get(key)
        if isinstance(value, list) and all(_is_int(v) for v in value):
            d[key] = [min(v, 64) for v in value]
    if _is_int(d.get("qk_rope_head_dim")):  # DeepSeek: rotary dims are the rope part
        if "head_dim" in d:
            d["head_dim"] = d["qk_rope_head_dim"]
        if "qk_head_dim" in d and _is_int(d.get("qk_nope_head_dim")):
            d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    # Mamba-2 heads: heads × head dim = expand × hidden size, and groups divide the heads
    for heads_key, dim_key, expand_key in (
        ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
        ("num_heads", "head_dim", "expand"),
    ):
        hidden = next((d[k] for k in _HIDDEN_KEYS if _is_int(d.get(k))), None)
        if all(_is_int(d.get(k)) for k in (heads_key, dim_key, expand_key)) and hidden:
            inner = int(d[expand_key]) * hidden
            d[heads_key] = min(d[heads_key], 8)
            d[dim_key] = inner // d[heads_key]
            for groups in ("mamba_n_groups", "n_groups"):
                if _is_int(d.get(groups)) and d[heads_key] % d[groups]:
                    d[groups] = 1
    if isinstance(d.get("intermediate_size"), list):
        d["intermediate_size"] = [min(v, INTERMEDIATE) for v in d["intermediate_size"]]
    return d


def shrink(config: Any, level: str = "small") -> Any:
    """A copy of a transformers config with a few small layers.

    ``small``: layers → 2 (depth lists → 1 per stage, per-layer lists cut to match), hidden
    size / d_model → 128, 4 heads with key-value heads kept consistent (multi-head stays
    multi-head, grouped keeps 2), explicit head dims of 32, intermediate sizes → 256, at most
    4 experts with top-2 routing; in every nested sub-config (text, vision, audio, encoder,
    decoder). ``layers``: only the layer counts and experts. ``default``: the config as it is.
    Vocabularies and special token ids are kept, so they stay valid."""
    if level == "default":
        return copy.deepcopy(config)
    d = _shrink_dict(config.to_dict(), level)
    d.pop("transformers_version", None)
    return type(config).from_dict(_plain(d))


# ---- which models ----------------------------------------------------------------------------


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' warnings about configs and initialisation are not the sweep's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def candidates(only: list[str] | None = None) -> list[dict[str, str]]:
    """(model type, task, class) for every type whose config builds offline, for every
    sweep task whose auto mapping has it; types that do not build are listed with their
    error."""
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    rows: list[dict[str, str]] = []
    for model_type in CONFIG_MAPPING_NAMES:
        if only and model_type not in only:
            continue
        tasks = {
            task: getattr(modeling_auto, mapping).get(model_type)
            for task, (mapping, _) in SWEEP_TASKS.items()
        }
        tasks = {t: c for t, c in tasks.items() if c}
        if not tasks:
            continue
        try:
            with quiet():
                AutoConfig.for_model(model_type)
        except Exception as exc:
            rows.append({"type": model_type, "config_error": _first(exc)})
            continue
        for task, cls in tasks.items():
            if isinstance(cls, (list, tuple)):
                cls = cls[0]
            rows.append({"type": model_type, "task": task, "class": cls})
    return rows


def _first(exc: BaseException) -> str:
    """``Type: first line (at file.py:N)``, the innermost frame named."""
    import traceback

    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {line[:240]}{where}"


def parameters_on_meta(config: Any, task: str, cls: str | None = None) -> int:
    """The model's parameter count, built on the meta device (no memory, no init), or on
    the CPU where a constructor cannot build on the meta device (LeViT)."""
    import torch
    import transformers

    auto = getattr(transformers, SWEEP_TASKS[task][1])
    if cls is not None:
        config = copy.deepcopy(config)
        config.architectures = [cls]
    try:
        with quiet(), torch.device("meta"):
            model = auto.from_config(config)
    except Exception:
        with quiet():
            model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


CTC_VOCABULARY = 32  # wav2vec2's character vocabulary, for CTC configs that name none
TEXT_VOCABULARY = 1024  # for a text model whose default config names no vocabulary


DEFAULT_ROPE_THETA = 10_000.0


def _fill_dict(d: dict[str, Any], task: str) -> bool:
    """Fill what a default config leaves as None and its model needs (experts, top-k, a
    vocabulary, key-value heads, head dims, a rotary base, attention layers of a hybrid),
    in place; whether anything was filled."""
    filled = False
    heads = next((d[k] for k in _HEAD_KEYS if _is_int(d.get(k))), None)
    hidden = next((d[k] for k in _HIDDEN_KEYS if _is_int(d.get(k))), None)
    layers = next((d[k] for k in _LAYER_KEYS if _is_int(d.get(k))), LAYERS)
    for key, value in list(d.items()):
        if isinstance(value, dict):
            filled |= _fill_dict(value, task)
            continue
        if value is not None:
            continue
        fill: Any = None
        if key in _EXPERT_KEYS:
            fill = EXPERTS
        elif key in _TOP_K_KEYS:
            fill = TOP_K
        elif key in _SHARED_EXPERT_KEYS:
            fill = 1
        elif key == "vocab_size":
            fill = CTC_VOCABULARY if task == "ctc" else TEXT_VOCABULARY
            # a config without a vocabulary has no special tokens either (ESM)
            for special, value in (("pad_token_id", 1), ("mask_token_id", 2)):
                if special in d and d[special] is None:
                    d[special] = value
        elif key in _KV_HEAD_KEYS and heads:
            fill = heads
        elif key == "head_dim" and heads and hidden:
            fill = hidden // heads
        elif key == "rope_theta":
            fill = DEFAULT_ROPE_THETA
        elif str(key).endswith("layer_indices"):  # a hybrid with no attention layer named
            fill = [layers - 1]
        if fill is not None:
            d[key], filled = fill, True
    return filled


# what every transformers config has; a nested part that is no model's config of its own
# (model_type "") takes none of them back (DBRX's attention and FFN parts)
_GENERIC_KEYS = {
    "_name_or_path",
    "architectures",
    "chunk_size_feed_forward",
    "dtype",
    "id2label",
    "is_encoder_decoder",
    "label2id",
    "model_type",
    "output_attentions",
    "output_hidden_states",
    "problem_type",
    "return_dict",
    "torch_dtype",
    "transformers_version",
}


def _plain(d: dict[str, Any], nested: bool = False) -> dict[str, Any]:
    """The dict without the generic keys of nested parts whose model type is empty."""
    out = {}
    for key, value in d.items():
        if nested and d.get("model_type") == "" and key in _GENERIC_KEYS:
            continue
        out[key] = _plain(value, True) if isinstance(value, dict) else value
    return out


def complete(config: Any, task: str) -> Any:
    """What a checkpoint's config has and a default config may lack: experts, top-k and a
    vocabulary where the default leaves them None, a decoder start token for a
    sequence-to-sequence model (the pad token, as T5's)."""
    d = config.to_dict()
    if _fill_dict(d, task):
        d.pop("transformers_version", None)
        config = type(config).from_dict(_plain(d))
    if task == "seq2seq-lm" and getattr(config, "decoder_start_token_id", None) is None:
        pad = getattr(config, "pad_token_id", None)
        config.decoder_start_token_id = pad if pad is not None else 0
    return config


def config_dict(config: Any, cls: str) -> dict[str, Any]:
    """The config as a ``config.json`` holds it, naming ``cls`` as its architecture."""
    config = copy.deepcopy(config)
    config.architectures = [cls]
    d = config.to_dict()
    d.pop("transformers_version", None)
    return _plain(d)


def check(d: dict[str, Any], key: str, task: str) -> None:
    """Build the model of a config dict and run one real CPU training step (batch 2, as the
    sweep's real step; text of 32 tokens, audio of its default length)."""
    import torch

    from vramscope.workload import StepRunner, resolve

    # a file per attempt: configs read from a path are cached by it
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"vramscope-zoo-check-{os.getpid()}"
    path = write_config(d, f"{key}-{time.monotonic_ns()}", folder)
    cpu = torch.device("cpu")
    text = task in ("causal-lm", "masked-lm", "seq2seq-lm")
    try:
        with quiet():
            workload = resolve(f"hf:{path}" + ("/seq=32" if text else "")).build(2, cpu)
            StepRunner(workload, cpu)()
    finally:
        path.unlink(missing_ok=True)


def choose(row: dict[str, str]) -> dict[str, Any]:
    """The smallest level of the shrink that builds and trains for one (type, task)."""
    from transformers import AutoConfig

    with quiet():
        base = AutoConfig.for_model(row["type"])
    key = entry_key(row["type"], row["task"])
    out: dict[str, Any] = {**row, "tried": {}}
    for level in LEVELS:
        start = time.perf_counter()
        try:
            with quiet():
                config = complete(shrink(base, level), row["task"])
            params = parameters_on_meta(config, row["task"], row["class"])
            if level == "default" and params > DEFAULT_LIMIT:
                out["tried"][level] = f"too large: {params / 1e6:.0f}M parameters"
                continue
            d = config_dict(config, row["class"])
            check(d, key, row["task"])
        except Exception as exc:
            out["tried"][level] = _first(exc)
            continue
        out.update(
            level=level,
            parameters=params,
            seconds=round(time.perf_counter() - start, 1),
            config=d,
        )
        return out
    return out


def entry_key(model_type: str, task: str) -> str:
    return f"{model_type}--{task}"


def write_config(d: dict[str, Any], key: str, folder: Path) -> Path:
    """``folder/KEY.json`` holding one config; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    text = json.dumps(d, indent=1, sort_keys=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def write_config_files(
    entries: dict[str, Any] | None = None, folder: Path = CONFIG_DIR
) -> dict[str, str]:
    """Every committed config as a ``config.json``-style file under ``folder`` (relative
    to the repository's root, where the sweep runs); key -> path as an ``hf:`` spec takes
    it."""
    if entries is None:
        entries = load_entries()
    target = folder if folder.is_absolute() else ROOT / folder
    paths = {}
    for key, entry in entries.items():
        if "config" in entry:
            write_config(entry["config"], key, target)
            paths[key] = str(folder / f"{key}.json")
    return paths


def load_entries(path: Path = CONFIGS_JSON) -> dict[str, Any]:
    return json.loads(path.read_text())["entries"]


# ---- the command ------------------------------------------------------------------------------


def _run_one(row: dict[str, str], timeout: float) -> dict[str, Any]:
    """``choose(row)`` in a forked child (a hang or a crash stays there)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def target() -> None:
        try:
            child.send(choose(row))
        except BaseException as exc:
            child.send({**row, "error": _first(exc)})

    proc = ctx.Process(target=target)
    proc.start()
    child.close()
    result = None
    if parent.poll(timeout):
        with contextlib.suppress(EOFError):
            result = parent.recv()
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result is None:
        why = "timeout" if proc.exitcode is None or proc.exitcode < 0 else "crashed"
        result = {**row, "error": f"{why} after {timeout:.0f} s (exit {proc.exitcode})"}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model types")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default=str(CONFIGS_JSON))
    args = parser.parse_args()
    import concurrent.futures

    import torch  # noqa: F401  (imported once, before the children fork)
    import transformers

    rows = candidates(args.only)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {"entries": {}, "types": {}}
    entries: dict[str, Any] = previous.get("entries", {}) if args.only else {}
    types: dict[str, Any] = previous.get("types", {}) if args.only else {}
    todo = []
    for row in rows:
        if "config_error" in row:
            types[row["type"]] = {"config_error": row["config_error"]}
        else:
            types.setdefault(row["type"], {})
            todo.append(row)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(_run_one, row, args.timeout): row for row in todo}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            key = entry_key(result["type"], result["task"])
            entries[key] = result
            state = result.get("level") or f"FAILED {result.get('error') or result['tried']}"
            print(f"{key:50s} {state}", flush=True)
    document = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "transformers": transformers.__version__,
            "levels": list(LEVELS),
            "default_limit_parameters": DEFAULT_LIMIT,
        },
        "types": dict(sorted(types.items())),
        "entries": dict(sorted(entries.items())),
    }
    out.write_text(json.dumps(document, indent=1) + "\n")
    built = sum(1 for e in entries.values() if "config" in e)
    print(f"{built} of {len(entries)} (type, task) pairs build and train; wrote {out.name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
