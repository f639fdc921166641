"""Built-in workload specs for model libraries: ``torchvision:NAME``, ``timm:NAME``, ``hf:NAME``.

Models are built from their constructors or config classes, never by downloading weights.
Each spec trains with AdamW by default; ``NAME@sgd`` / ``@sgdm`` / ``@adam`` / ``@infer``
pick another optimizer or inference, ``NAME/seq=512`` sets a sequence length, and
``NAME/ckpt`` turns on activation checkpointing where the model supports it. ``hf:`` also
takes a Hub id, a folder or a config.json (:mod:`vramscope.hf_models`), ``@generate`` for
``model.generate()`` (``/prompt=N/new=N/cache=static``) and ``/lora=R`` for LoRA
fine-tuning (:mod:`vramscope.lora`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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


# the options torchvision and timm specs take: /size=N (a whole number), /ckpt (hf: HF_OPTIONS)
_OPTIONS = {
    "torchvision": ("size",),
    "timm": ("size", "ckpt"),
}
_WHOLE_NUMBER_OPTIONS = ("size",)


def _parse(name: str, library: str) -> tuple[str, str, dict[str, str]]:
    """``resnet50@sgd/size=160/ckpt`` → ("resnet50", "sgd", {"size": "160", "ckpt": ""}).

    Every option is checked here, before anything is imported or built. The optimizer may
    also come last: ``resnet50/ckpt@sgd``."""
    base, *options = name.split("/")
    late = None
    if options:
        options[-1], late = _late_mode(options[-1], f"{library}:{name}")
    model, _, optim = base.partition("@")
    if late is not None and optim:
        raise WorkloadError(f"{library}:{name}: give the optimizer once, NAME@OPT or NAME/...@OPT")
    optim = optim or late
    opts: dict[str, str] = {}
    allowed = _OPTIONS[library]
    for option in options:
        key, _, value = option.partition("=")
        if key not in allowed:
            known = ", ".join(f"/{k}=N" if k in _WHOLE_NUMBER_OPTIONS else f"/{k}" for k in allowed)
            raise WorkloadError(
                f"unknown option {('/' + option)!r} in {f'{library}:{name}'!r}; "
                f"{library} takes {known}"
            )
        _check_option(option, _WHOLE_NUMBER_OPTIONS)
        opts[key] = value
    optim = optim or "adamw"
    if optim not in OPTIMIZERS:
        raise WorkloadError(f"unknown optimizer {optim!r}; use one of {', '.join(OPTIMIZERS)}")
    return model, optim, opts


def _check_option(option: str, whole_numbers: tuple[str, ...]) -> None:
    """The checks every library's options share: whole numbers, /ckpt without a value,
    /attn with a name."""
    key, eq, value = option.partition("=")
    if key in whole_numbers and not (
        value.isascii() and value.isdigit() and len(value) <= 8 and int(value) > 0
    ):
        raise WorkloadError(
            f"/{key} takes a whole number of 1 or more, like /{key}=512, not {value!r}"
        )
    if key == "ckpt" and eq:
        raise WorkloadError(f"/ckpt takes no value (got {('/' + option)!r})")
    if key == "attn" and not value:
        raise WorkloadError("/attn takes a name, like /attn=eager or /attn=sdpa")


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
        _import("torchvision.models", spec)
        from vramscope import torchvision_models as tv

        if tv.task_of(model_name) == tv.QUANTIZED and optim != "infer" and device.type == "cpu":
            raise WorkloadError(
                f"{spec} is quantized (int8): it has no weights to train; use "
                f"torchvision:{model_name}@infer"
            )
        model, task = tv.build_model(model_name, device)
        size = int(opts["size"]) if "size" in opts else None
        if task == tv.DETECTION:
            tv.fix_detection_size(model, size)
        shape = (size, size) if size is not None else tv.default_size(model_name, task, model)
        training = optim != "infer"
        batch, loss = tv.batch_and_loss(
            model_name, task, model, batch_size, shape, training, device
        )
        workload = _workload(model, optim, batch, loss, spec)
        workload.meta["torchvision"] = {"task": task, "size": list(shape)}
        if task == tv.VIDEO:
            workload.meta["torchvision"]["frames"] = tv.VIDEO_FRAMES
        return workload

    return build


def timm_builder(name: str) -> Builder:
    model_name, optim, opts = _parse(name, "timm")
    spec = f"timm:{name}"

    def build(batch_size: int, device: torch.device) -> Workload:
        timm = _import("timm", spec)
        try:
            model = None
            if "size" in opts:  # a vision transformer made for that size, as timm makes it
                with contextlib.suppress(TypeError):  # (a CNN takes any size, no img_size)
                    model = timm.create_model(
                        model_name, pretrained=False, img_size=int(opts["size"])
                    )
            if model is None:
                model = timm.create_model(model_name, pretrained=False)
        except RuntimeError as exc:
            raise WorkloadError(f"timm cannot build {model_name!r}: {exc}") from None
        if not getattr(model, "num_classes", 1000) and hasattr(model, "reset_classifier"):
            # a backbone without a head (timm's default for some encoders): a classifier of
            # 1,000 classes, as a user fine-tuning it for classification would add
            with contextlib.suppress(Exception):
                model.reset_classifier(1000)
        if "ckpt" in opts and hasattr(model, "set_grad_checkpointing"):
            model.set_grad_checkpointing(True)
        model = model.to(device)
        size = int(opts.get("size", model.default_cfg.get("input_size", (3, 224, 224))[-1]))
        classes = getattr(model, "num_classes", 0)
        if not classes:
            raise WorkloadError(
                f"timm's {model_name} has no classifier to train with labels (num_classes 0)"
            )

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(batch_size, 3, size, size, device=device)
            y = torch.randint(0, classes, (batch_size,), device=device)
            return x, y

        def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
            out = model(x)
            return F.cross_entropy(out, y) if optim != "infer" else out

        return _workload(model, optim, batch, loss, spec)

    return build


# ---- hf: -----------------------------------------------------------------------------------

# the options of hf: specs; /NAME alone for flags, /NAME=VALUE otherwise
HF_OPTIONS = ("seq", "ckpt", "attn", "lora", "targets", "prompt", "new", "cache", "task")
HF_MODES = (*OPTIMIZERS, "generate")
_GENERATE_ONLY = ("prompt", "new", "cache")
DEFAULT_NEW_TOKENS = 256


@dataclass(frozen=True)
class HfSpec:
    """An ``hf:`` spec read: the model, the mode (an optimizer, ``infer`` or ``generate``) and
    the options, every one checked."""

    model: str
    mode: str
    options: dict[str, str]

    @property
    def generate(self) -> bool:
        return self.mode == "generate"

    @property
    def training(self) -> bool:
        return OPTIMIZERS.get(self.mode) is not None

    @property
    def length_option(self) -> str:
        """The option that sets the sequence length: the prompt's for ``@generate``."""
        return "prompt" if self.generate else "seq"

    @property
    def new_tokens(self) -> int:
        return int(self.options.get("new", DEFAULT_NEW_TOKENS)) if self.generate else 0

    def with_length(self, length: int) -> str:
        """The ``hf:`` spec with its sequence length (the prompt's, for ``@generate``) set."""
        options = {**self.options, self.length_option: str(length)}
        mode = "" if self.mode == "adamw" else f"@{self.mode}"
        parts = [k if k == "ckpt" else f"{k}={v}" for k, v in options.items()]
        return "/".join([f"hf:{self.model}{mode}", *parts])

    def config(self) -> tuple[Any, str, str]:
        """The model's transformers config, its task and its auto class."""
        from vramscope import hf_models

        builtin = HF_MODELS.get(self.model)
        if builtin is None:
            config = hf_models.load_config(hf_models.config_source(self.model, HF_MODELS))
            return (config, *hf_models.task_of(config, self.options.get("task")))
        class_name, config_kwargs, task = builtin
        config = getattr(_import("transformers", f"hf:{self.model}"), class_name)(**config_kwargs)
        if self.options.get("task") is not None:  # another head on the built-in shape
            return (config, *hf_models.task_of(config, self.options["task"]))
        auto = "AutoModelForCausalLM" if task == "causal-lm" else "AutoModelForMaskedLM"
        return config, task, auto

    def max_positions(self) -> int | None:
        """The longest sequence the model's positions are made for (None: not said)."""
        from vramscope import hf_models

        return hf_models.max_positions(self.config()[0])


def _model_and_mode(text: str) -> tuple[str, str]:
    head, at, mode = text.rpartition("@")
    if not at or "/" in mode:
        return text, ""
    return head, mode


def _late_mode(last: str, spec: str) -> tuple[str, str | None]:
    """The last segment of a spec and the optimizer or mode written after it (``ckpt@sgd``,
    ``seq=128@infer``), if any; a mode after an option's value must be one."""
    option, at, mode = last.rpartition("@")
    if not at:
        return last, None
    if mode not in HF_MODES:
        raise WorkloadError(
            f"unknown optimizer {mode!r} in {spec!r}; use one of {', '.join(OPTIMIZERS)} "
            "(hf: also generate)"
        )
    return option, mode


def _split_options(segments: list[str]) -> tuple[str, list[str]]:
    """A Hub id or a path, and the options after it: the trailing segments that name an
    option or set a value (``NAME=VALUE``), unless a longer prefix is a path that exists."""
    cut = len(segments)
    while cut > 1 and ("=" in segments[cut - 1] or segments[cut - 1] in HF_OPTIONS):
        cut -= 1
    for longer in range(len(segments), cut, -1):
        candidate = _model_and_mode("/".join(segments[:longer]))[0]
        if Path(candidate).expanduser().exists():
            cut = longer
            break
    return "/".join(segments[:cut]), segments[cut:]


def parse_hf(name: str) -> HfSpec:
    """``llama-1b@generate/prompt=2048/new=512`` → its model, mode and options. The model may
    itself contain slashes (a Hub id ``org/name``, a path): options are the trailing
    segments whose name is an option, and a path that exists is never split."""
    segments = name.split("/")
    late = None
    if len(segments) > 1:  # the mode written last (``gpt2/seq=128@infer``)
        segments[-1], late = _late_mode(segments[-1], f"hf:{name}")
    if _model_and_mode(segments[0])[0] in HF_MODELS:
        model_part, options = segments[0], segments[1:]
    else:
        model_part, options = _split_options(segments)
    model, mode = _model_and_mode(model_part)
    if late is not None and mode:
        raise WorkloadError(f"hf:{name}: give the mode once, NAME@MODE or NAME/...@MODE")
    mode = mode or late or "adamw"
    if mode not in HF_MODES:
        raise WorkloadError(
            f"unknown optimizer {mode!r}; use one of {', '.join(OPTIMIZERS)} (or generate)"
        )
    opts: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key not in HF_OPTIONS:
            raise WorkloadError(
                f"unknown option {('/' + option)!r} in {f'hf:{name}'!r}; hf takes /seq=N, "
                "/ckpt, /attn=NAME, /lora[=R], /targets=NAMES, /task=NAME and, with "
                "@generate, /prompt=N, /new=N, /cache=dynamic|static"
            )
        _check_option(option, ("seq", "prompt", "new"))
        if key == "lora":
            from vramscope.lora import parse_rank

            value = str(parse_rank(value))
        if key == "targets":
            from vramscope.lora import parse_targets

            parse_targets(value)
        if key == "cache" and value not in ("dynamic", "static"):
            raise WorkloadError(f"/cache takes dynamic or static, not {value!r}")
        opts[key] = value
    if mode == "generate" and "seq" in opts:
        raise WorkloadError("@generate takes /prompt=N (the prompt's length) and /new=N, not /seq")
    if mode != "generate" and any(k in opts for k in _GENERATE_ONLY):
        extra = next(k for k in _GENERATE_ONLY if k in opts)
        raise WorkloadError(f"/{extra} is for generation: write NAME@generate/{extra}=...")
    if "targets" in opts and "lora" not in opts:
        raise WorkloadError("/targets names the layers LoRA adapts: add /lora (or /lora=R)")
    if "ckpt" in opts and mode in ("infer", "generate"):
        raise WorkloadError(f"/ckpt recomputes activations in backward; @{mode} has none")
    if not model:
        raise WorkloadError(f"hf:{name} names no model")
    return HfSpec(model, mode, opts)


def hf_builder(name: str) -> Builder:
    from vramscope import hf_models

    parsed = parse_hf(name)
    spec = f"hf:{name}"
    source = hf_models.config_source(parsed.model, HF_MODELS)
    builtin = HF_MODELS.get(parsed.model)
    opts = parsed.options

    def build(batch_size: int, device: torch.device, precision: str | None = None) -> Workload:
        _import("transformers", spec)
        config, task, auto = parsed.config()
        # the built-in shapes keep the attention they were measured with
        attn = opts.get("attn", "sdpa" if builtin is not None else None)
        if parsed.generate:
            new = parsed.new_tokens
            longest = hf_models.max_positions(config)
            default = min(1024, longest - new) if longest and longest > new else 1024
            shapes = hf_models.Shapes(
                batch_size, int(opts.get("prompt", default)), new, opts.get("cache")
            )
        else:
            seq = int(opts.get("seq", hf_models.default_sequence(config, task)))
            shapes = hf_models.Shapes(batch_size, seq)
        mode = "generate" if parsed.generate else "train" if parsed.training else "infer"
        padded = hf_models.pad_with_end_token(config) if task == "sequence-classification" else None
        batch, loss = hf_models.batch_and_loss(config, task, mode, shapes, device)
        model = hf_models.build_model(config, task, auto, _true_dtype(precision), attn)
        if "ckpt" in opts:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if parsed.generate:
            hf_models.without_end_of_sequence(model)
        head = None if "task" in opts else type(model).__name__  # (a head asked for: no note)
        if "lora" in opts:
            from vramscope import lora

            targets = lora.parse_targets(opts["targets"]) if "targets" in opts else None
            settings = lora.LoraSettings(int(opts["lora"]), targets)
            model = lora.with_adapters(model, settings, task)
        model = model.to(device)
        optimizer = None
        make = OPTIMIZERS.get(parsed.mode)
        if make is not None:
            optimizer = make([p for p in model.parameters() if p.requires_grad])
        workload = Workload(model=model, optimizer=optimizer, batch=batch, loss=loss, name=spec)
        if precision in ("bf16-true", "16-true"):
            workload.precision = precision
        workload.meta["hf"] = {
            "task": task,
            "config": source.describe(),
            **_shape_meta(shapes, parsed),
        }
        for note in (hf_models.other_head_note(config, head), hf_models.quantized_note(config)):
            if note is not None:
                workload.meta.setdefault("notes", []).append(note)
        if padded is not None:
            workload.meta["hf"]["pad_token_id"] = padded
            workload.meta.setdefault("notes", []).append(
                f"the config has no pad_token_id: token {padded} (its end-of-sequence token) "
                "pads, as fine-tuning scripts set it, so that the classifier finds each "
                "sequence's last token"
            )
        return workload

    return build


def _true_dtype(precision: str | None) -> torch.dtype:
    """A ``-true`` precision builds the model in that dtype, as ``from_pretrained(dtype=...)``
    loads it, rather than in float32 first and cast afterwards."""
    return {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(
        precision or "", torch.float32
    )


def _shape_meta(shapes: Any, parsed: HfSpec) -> dict[str, Any]:
    if parsed.generate:
        return {
            "prompt": shapes.seq,
            "new_tokens": shapes.new_tokens,
            "cache": shapes.cache or "dynamic",
        }
    return {"seq": shapes.seq}


def call_builder(
    builder: Callable[..., Any], batch_size: int, device: torch.device, precision: str | None
) -> Any:
    """``builder(batch_size, device)``, told the precision asked for when it takes
    ``precision=``."""
    if precision is not None and accepts_precision(builder):
        return builder(batch_size, device, precision=precision)
    return builder(batch_size, device)


def accepts_precision(builder: Callable[..., Any]) -> bool:
    """Whether a build function takes ``precision=`` (then it builds the model in a ``-true``
    precision's dtype directly)."""
    try:
        parameters = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        return False
    return "precision" in parameters
