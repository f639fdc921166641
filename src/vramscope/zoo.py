"""Built-in workload specs for model libraries: ``torchvision:NAME``, ``timm:NAME``, ``hf:NAME``.

Models are built from their constructors or config classes, never by downloading weights.
Each spec trains with AdamW by default; ``NAME@sgd`` / ``@sgdm`` / ``@adam`` / ``@infer``
pick another optimizer or inference, ``NAME/seq=512`` sets a sequence length, and
``NAME/ckpt`` turns on activation checkpointing where the model supports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from vramscope.contract import Builder, Workload
from vramscope.errors import WorkloadError

# Transformer shapes for hf:NAME, as config keyword arguments of a transformers config class.
HF_MODELS: dict[str, tuple[str, dict[str, Any], str]] = {
    # name: (config class, config kwargs, task)
    "gpt2": ("GPT2Config", {}, "causal-lm"),
    "gpt2-medium": ("GPT2Config", {"n_embd": 1024, "n_layer": 24, "n_head": 16}, "causal-lm"),
    "opt-125m": (
        "OPTConfig",
        {"hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072, "num_attention_heads": 12},
        "causal-lm",
    ),
    "opt-350m": (
        "OPTConfig",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "ffn_dim": 4096,
            "num_attention_heads": 16,
            "word_embed_proj_dim": 512,
        },
        "causal-lm",
    ),
    "bert-base": ("BertConfig", {}, "masked-lm"),
    "bert-large": (
        "BertConfig",
        {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
        },
        "masked-lm",
    ),
    "llama-1b": (
        "LlamaConfig",
        {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "max_position_embeddings": 2048,
        },
        "causal-lm",
    ),
    "llama-7b": (
        "LlamaConfig",
        {
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
        },
        "causal-lm",
    ),
}
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer] | None] = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-4),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-4),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01),
    "sgdm": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "infer": None,
}


def _import(module: str, spec: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise WorkloadError(
            f"{spec} needs the {module.split('.')[0]} package: pip install {module.split('.')[0]}"
        ) from None


# the options each library's specs take: /seq=N, /size=N (a whole number), /ckpt, /attn=NAME
_OPTIONS = {
    "torchvision": ("size",),
    "timm": ("size", "ckpt"),
    "hf": ("seq", "ckpt", "attn"),
}
_WHOLE_NUMBER_OPTIONS = ("seq", "size")


def _parse(name: str, library: str) -> tuple[str, str, dict[str, str]]:
    """``resnet50@sgd/seq=512/ckpt`` → ("resnet50", "sgd", {"seq": "512", "ckpt": ""}).

    Every option is checked here, before anything is imported or built."""
    base, *options = name.split("/")
    model, _, optim = base.partition("@")
    opts: dict[str, str] = {}
    allowed = _OPTIONS[library]
    for option in options:
        key, eq, value = option.partition("=")
        if key not in allowed:
            known = ", ".join(f"/{k}=N" if k in _WHOLE_NUMBER_OPTIONS else f"/{k}" for k in allowed)
            raise WorkloadError(
                f"unknown option {('/' + option)!r} in {f'{library}:{name}'!r}; "
                f"{library} takes {known}"
            )
        if key in _WHOLE_NUMBER_OPTIONS and not (
            value.isascii() and value.isdigit() and len(value) <= 8 and int(value) > 0
        ):
            raise WorkloadError(
                f"/{key} takes a whole number of 1 or more, like /{key}=512, not {value!r}"
            )
        if key == "ckpt" and eq:
            raise WorkloadError(f"/ckpt takes no value (got {('/' + option)!r})")
        if key == "attn" and not value:
            raise WorkloadError("/attn takes a name, like /attn=eager or /attn=sdpa")
        opts[key] = value
    optim = optim or "adamw"
    if optim not in OPTIMIZERS:
        raise WorkloadError(f"unknown optimizer {optim!r}; use one of {', '.join(OPTIMIZERS)}")
    return model, optim, opts


def _workload(
    model: torch.nn.Module,
    optim: str,
    batch: Callable[[], Any],
    loss: Callable[..., Any],
    name: str,
) -> Workload:
    make = OPTIMIZERS[optim]
    optimizer = make(model.parameters()) if make is not None else None
    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss, name=name)


def torchvision_builder(name: str) -> Builder:
    model_name, optim, opts = _parse(name, "torchvision")
    spec = f"torchvision:{name}"

    def build(batch_size: int, device: torch.device) -> Workload:
        models = _import("torchvision.models", spec)
        try:
            factory = models.get_model_builder(model_name)
        except ValueError:
            raise WorkloadError(f"torchvision has no model {model_name!r}") from None
        size = int(opts.get("size", 224))
        model = factory(weights=None).to(device)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch_size, 3, size, size, device=device)
            y = torch.randint(0, 1000, (batch_size,), device=device)
            return x, y

        def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
            out = model(x)
            if isinstance(out, dict):  # segmentation / detection style outputs
                out = out["out"]
            return F.cross_entropy(out, y) if optim != "infer" else out

        return _workload(model, optim, batch, loss, spec)

    return build


def timm_builder(name: str) -> Builder:
    model_name, optim, opts = _parse(name, "timm")
    spec = f"timm:{name}"

    def build(batch_size: int, device: torch.device) -> Workload:
        timm = _import("timm", spec)
        try:
            model = timm.create_model(model_name, pretrained=False)
        except RuntimeError as exc:
            raise WorkloadError(f"timm cannot build {model_name!r}: {exc}") from None
        if "ckpt" in opts and hasattr(model, "set_grad_checkpointing"):
            model.set_grad_checkpointing(True)
        model = model.to(device)
        size = int(opts.get("size", model.default_cfg.get("input_size", (3, 224, 224))[-1]))
        classes = getattr(model, "num_classes", 1000) or 1000

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch_size, 3, size, size, device=device)
            y = torch.randint(0, classes, (batch_size,), device=device)
            return x, y

        def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
            out = model(x)
            return F.cross_entropy(out, y) if optim != "infer" else out

        return _workload(model, optim, batch, loss, spec)

    return build


def hf_builder(name: str) -> Builder:
    model_name, optim, opts = _parse(name, "hf")
    spec = f"hf:{name}"
    if model_name not in HF_MODELS:
        raise WorkloadError(f"unknown hf model {model_name!r}; known: {', '.join(HF_MODELS)}")
    config_class, config_kwargs, task = HF_MODELS[model_name]

    def build(batch_size: int, device: torch.device) -> Workload:
        transformers = _import("transformers", spec)
        config = getattr(transformers, config_class)(**config_kwargs)
        seq = int(opts.get("seq", min(1024, getattr(config, "max_position_embeddings", 512))))
        attn = opts.get("attn", "sdpa")
        if task == "causal-lm":
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
        else:
            model = transformers.AutoModelForMaskedLM.from_config(config, attn_implementation=attn)
        if "ckpt" in opts:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model = model.to(device)
        vocab = config.vocab_size

        def batch() -> dict[str, torch.Tensor]:
            ids = torch.randint(0, vocab, (batch_size, seq), device=device)
            return {"input_ids": ids, "labels": ids}

        def loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
            if optim == "infer":
                return model(input_ids=input_ids).logits
            return model(input_ids=input_ids, labels=labels).loss

        return _workload(model, optim, batch, loss, spec)

    return build
