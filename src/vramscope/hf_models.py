"""Transformers models for ``hf:`` specs: where the config comes from (a built-in shape, a Hub
id, a folder or a ``config.json``), the model its ``architectures`` name, and a batch and a
loss for that model's task.

Models are built from their config, never by downloading weights: for a Hub id only
``config.json`` is downloaded (with ``huggingface_hub``, into its usual cache), and code from
the model's repository runs only when remote code is trusted (``--trust-remote-code``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from vramscope.errors import WorkloadError, first_line

# Hub ids: ``org/name`` or a legacy single ``name`` (``gpt2``, ``bert-base-uncased``)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$")
_TRUST_ENV = "VRAMSCOPE_TRUST_REMOTE_CODE"

# tasks, in the order a config without ``architectures`` is matched against transformers' auto
# mappings: (task, mapping of model type -> class name, auto class)
_TASKS = (
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    (
        "sequence-classification",
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForSequenceClassification",
    ),
    (
        "image-classification",
        "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForImageClassification",
    ),
    (
        "audio-classification",
        "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForAudioClassification",
    ),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "AutoModelForSpeechSeq2Seq"),
    (
        "token-classification",
        "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForTokenClassification",
    ),
    (
        "question-answering",
        "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
        "AutoModelForQuestionAnswering",
    ),
    ("multiple-choice", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "AutoModelForMultipleChoice"),
    (
        "semantic-segmentation",
        "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        "AutoModelForSemanticSegmentation",
    ),
    ("object-detection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "AutoModelForObjectDetection"),
    (
        "image-text-to-text",
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
        "AutoModelForImageTextToText",
    ),
    (
        "contrastive",
        "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
        "AutoModelForZeroShotImageClassification",
    ),
    ("base", "MODEL_MAPPING_NAMES", "AutoModel"),
)
# an architecture transformers does not know (remote code): its task from its name
_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForSequenceClassification", "sequence-classification"),
    ("ForImageClassification", "image-classification"),
    ("ForAudioClassification", "audio-classification"),
    ("ForCTC", "ctc"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMultipleChoice", "multiple-choice"),
    ("ForSemanticSegmentation", "semantic-segmentation"),
    ("ForObjectDetection", "object-detection"),
    ("ForConditionalGeneration", "seq2seq-lm"),
)
# the text tasks whose heads read a label per sequence or per token, two positions, or
# several choices
TEXT_HEAD_TASKS = (
    "sequence-classification",
    "token-classification",
    "question-answering",
    "multiple-choice",
)
CHOICES = 4  # multiple choice: answers a question, as SWAG and RACE have
TEXT_GENERATION_TASKS = ("causal-lm", "seq2seq-lm")
AUDIO_TASKS = ("audio-classification", "ctc", "speech-seq2seq")
TRANSCRIPT_TOKENS = 128  # speech-to-text: the tokens of a clip's transcript (labels)
OBJECTS = 8  # object detection: boxes an image (COCO has about 7)
DETECTION_SIZE = 640  # object detection: the image side when the config names none
SAMPLE_RATE = 16_000  # raw audio: one second by default
FRAMES_PER_SECOND = 100  # log-mel features: 10 ms frames


# ---- remote code -----------------------------------------------------------------------------


def remote_code_trusted() -> bool:
    """Whether code from a model's repository may run: ``--trust-remote-code`` or
    ``trust_remote_code=True`` said so for this command (and its child processes)."""
    return os.environ.get(_TRUST_ENV) == "1"


@contextlib.contextmanager
def trusting_remote_code(trust: bool = True) -> Iterator[None]:
    """Within the block (and the processes it starts), ``hf:`` models may run code from their
    repositories. ``trust=False`` changes nothing: an outer block's trust stays."""
    if not trust:
        yield
        return
    before = os.environ.get(_TRUST_ENV)
    os.environ[_TRUST_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_TRUST_ENV, None)
        else:
            os.environ[_TRUST_ENV] = before


def trust_remote_code_for_process() -> None:
    """``--trust-remote-code`` on the command line: for the rest of this process."""
    os.environ[_TRUST_ENV] = "1"


# ---- where the config comes from ----------------------------------------------------------------


@dataclass(frozen=True)
class ConfigSource:
    """Where an ``hf:`` model's config is: a built-in shape, a folder, a file or a Hub id."""

    kind: str  # "builtin" | "folder" | "file" | "hub"
    where: str  # the built-in name, the path, or the Hub id

    def describe(self) -> str:
        return {
            "builtin": f"the built-in shape {self.where}",
            "folder": f"the folder {self.where}",
            "file": f"the file {self.where}",
            "hub": f"{self.where} on the Hugging Face Hub",
        }[self.kind]


def looks_like_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~"))
        or name.endswith(".json")
        or name.count("/") > 1
        or "\\" in name
    )


def config_source(name: str, builtins: dict[str, Any]) -> ConfigSource:
    """Which kind of model ``name`` names, from its spelling and the file system alone (no
    network): a built-in name, an existing folder or ``.json`` file, or a Hub id."""
    if name in builtins:
        return ConfigSource("builtin", name)
    path = Path(os.path.expanduser(name))
    if name and path.exists():
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise WorkloadError(f"the folder {name} has no config.json")
            return ConfigSource("folder", str(path))
        return ConfigSource("file", str(path))
    if looks_like_path(name):
        raise WorkloadError(f"no such folder or config file: {name}")
    if _HUB_ID.match(name) and ".." not in name:
        return ConfigSource("hub", name)
    raise WorkloadError(
        f"unknown hf model {name!r}: give a built-in name ({', '.join(builtins)}), a Hub id "
        "(org/name), a folder with a config.json, or a config.json file"
    )


def _hub_reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """A quick look for the Hub before a download, whose own retries take half a minute
    when there is no network. Behind a proxy the download itself decides."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _download_config(repo: str) -> Path:
    """``config.json`` of a Hub repository, from the local cache when it is there."""
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub import errors as hub_errors
    except ImportError:
        raise WorkloadError(
            f"hf:{repo} is read from the Hugging Face Hub, which needs huggingface_hub: "
            "pip install huggingface_hub (it comes with transformers)"
        ) from None
    with contextlib.suppress(Exception):
        return Path(hf_hub_download(repo, "config.json", local_files_only=True))
    offline = (
        f"cannot download the config of {repo}: the Hugging Face Hub cannot be reached "
        "(offline?); pass a folder with its config.json or the config.json file instead"
    )
    if constants.HF_HUB_OFFLINE or not _hub_reachable(constants.ENDPOINT):
        raise WorkloadError(offline)
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # its retry warnings are not for this user
    try:
        return Path(hf_hub_download(repo, "config.json"))
    except hub_errors.GatedRepoError:
        raise WorkloadError(
            f"{repo} is gated on the Hugging Face Hub: accept its terms on its page and log "
            "in (hf auth login), or pass a folder or config.json"
        ) from None
    except hub_errors.RepositoryNotFoundError:
        raise WorkloadError(
            f"no model {repo} on the Hugging Face Hub (or it is private: log in with hf auth login)"
        ) from None
    except hub_errors.EntryNotFoundError:
        raise WorkloadError(f"{repo} on the Hugging Face Hub has no config.json") from None
    except hub_errors.RevisionNotFoundError as exc:
        raise WorkloadError(f"{repo}: {first_line(exc)}") from None
    except (hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled, OSError):
        raise WorkloadError(offline) from None
    except Exception as exc:
        raise WorkloadError(f"cannot download the config of {repo}: {first_line(exc)}") from None
    finally:
        hub_logger.setLevel(level)


def _needs_remote_code(exc: BaseException) -> bool:
    return "trust_remote_code" in str(exc)


@functools.lru_cache(maxsize=32)
def _load_config(source: ConfigSource, trust: bool) -> Any:
    import transformers

    if source.kind == "hub":
        where: str = str(_download_config(source.where).parent)
        raw = _read_json(Path(where) / "config.json", source)
        if trust and raw.get("auto_map"):
            where = source.where  # remote code: transformers fetches its code files
    elif source.kind == "folder":
        where = source.where
        raw = _read_json(Path(where) / "config.json", source)
    else:
        where = source.where
        raw = _read_json(Path(where), source)
        if trust and raw.get("auto_map"):
            raise WorkloadError(
                f"{source.where} names remote code (auto_map), which comes with the model's "
                "folder or Hub repository: pass the folder or the Hub id"
            )
    if not isinstance(raw.get("model_type"), str) and not raw.get("auto_map"):
        raise WorkloadError(f"{source.where} is not a transformers config (it has no model_type)")
    try:
        with _quiet_transformers():
            return transformers.AutoConfig.from_pretrained(where, trust_remote_code=trust)
    except ValueError as exc:
        if _needs_remote_code(exc) or (raw.get("auto_map") and not trust):
            raise WorkloadError(_remote_code_message(source)) from None
        raise WorkloadError(f"transformers cannot read {source.where}: {first_line(exc)}") from None
    except Exception as exc:
        raise WorkloadError(f"transformers cannot read {source.where}: {first_line(exc)}") from None


def _remote_code_message(source: ConfigSource) -> str:
    return (
        f"{source.where} needs code from its repository (its config's auto_map): pass "
        "--trust-remote-code (trust_remote_code=True in Python) if you trust it"
    )


def _read_json(path: Path, source: ConfigSource) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise WorkloadError(f"{source.where} is not valid JSON: {first_line(exc)}") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{source.where} is not a transformers config (not a JSON object)")
    return data


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings about config keys are about the checkpoint, not its memory."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_config(source: ConfigSource) -> Any:
    """The transformers config of a folder, a file or a Hub id (a fresh copy: building may
    change it)."""
    return copy.deepcopy(_load_config(source, remote_code_trusted()))


# ---- the model and its task ---------------------------------------------------------------------


def _class_names(mapping: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for value in mapping.values():
        names.update((value,) if isinstance(value, str) else value)
    return names


def task_of(config: Any, task: str | None = None) -> tuple[str, str]:
    """(task, auto class name) of the model ``config`` describes: ``task`` when given (the
    spec's ``/task=NAME``), else its ``architectures``, else its model type's place in
    transformers' auto mappings (a head of another task, ``Wav2Vec2ForPreTraining`` in a
    checkpoint fine-tuned for CTC, falls back so; the report says so)."""
    from transformers.models.auto import modeling_auto

    if task is not None:
        auto = next((a for t, _, a in _TASKS if t == task), None)
        if auto is None:
            raise WorkloadError(
                f"unknown task {task!r}; hf builds {', '.join(t for t, _, _ in _TASKS)}"
            )
        return task, auto
    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch:
        for task, mapping, auto in _TASKS:
            if arch in _class_names(getattr(modeling_auto, mapping, {})):
                return task, auto
        if _vision_language(arch):
            raise WorkloadError(_uncounted(arch, "not an image-text-to-text model of transformers"))
        if not _is_head(arch):  # a class of the model's own code (remote code): its name
            for suffix, task in _SUFFIXES:
                if arch.endswith(suffix):
                    return task, next(a for t, _, a in _TASKS if t == task)
    model_type = getattr(config, "model_type", None)
    for task, mapping, auto in _TASKS:
        if model_type in getattr(modeling_auto, mapping, {}):
            return task, auto
    if arch:
        raise WorkloadError(_unsupported(arch))
    raise WorkloadError(f"transformers has no model for the config type {model_type!r}")


def _is_head(arch: str) -> bool:
    """Whether ``arch`` names a transformers model with a task head (``...For...``): one
    of no supported task is built as its type's first task, with a note (not by its name's
    suffix, which only a class of a model's own code is read by)."""
    import transformers

    return "For" in arch and hasattr(transformers, arch)


def _vision_language(arch: str) -> bool:
    from transformers.models.auto import modeling_auto

    return any(
        arch in _class_names(getattr(modeling_auto, name, {}))
        for name in (
            "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
            "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
        )
    )


def other_head_note(config: Any, built: str | None) -> str | None:
    """A note when the class built (``built``, before any adapters; None when ``/task=``
    chose it) is not the head the config names, a head of a task hf: does not build."""
    arch = (getattr(config, "architectures", None) or [None])[0]
    if built is None or not arch or arch == built or not _is_head(arch):
        return None
    return (
        f"the config names {arch}, a head hf: does not build for it; estimated as {built}; "
        f"choose the head with /task=NAME ({', '.join(t for t, _, _ in _TASKS)})"
    )


def _uncounted(arch: str, why: str) -> str:
    """The refusal of a vision-language model whose image tokens a config cannot count."""
    return (
        f"{arch}: a vision-language model takes as many image tokens in its text as its "
        "processor makes; hf: counts them from the model's image features for one image "
        f"(LLaVA, PaliGemma, Gemma 3, InternVL), and this one's cannot be counted so ({why}); "
        "write a build function that makes its batch with its processor (docs/workloads.md), "
        "or measure a run"
    )


def _unsupported(arch: str) -> str:
    return (
        "hf: builds causal and sequence-to-sequence LMs, masked LMs, text (sequence, token), "
        "image and audio classifiers, semantic segmentation, object detection, question "
        "answering, multiple choice, CTC and speech-to-text models, vision-language models, "
        f"CLIP-style and base models; {arch} is none of these"
    )


def task_of_model(model: torch.nn.Module) -> str | None:
    """The task of an already built transformers model (None for other models)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        return None
    from transformers.models.auto import modeling_auto

    name = type(model).__name__
    for task, mapping, _ in _TASKS:
        if name in _class_names(getattr(modeling_auto, mapping, {})):
            return task
    return None


def build_model(
    config: Any,
    task: str,
    auto: str,
    dtype: torch.dtype,
    attn: str | None,
    device: torch.device | None = None,
) -> torch.nn.Module:
    """The model of ``config`` for ``task``, with ``dtype`` parameters (never weights from a
    checkpoint: they start as the model initialises them)."""
    import transformers

    kwargs: dict[str, Any] = {"trust_remote_code": remote_code_trusted()}
    kwargs[_dtype_keyword(transformers.__version__)] = dtype
    if attn:
        kwargs["attn_implementation"] = attn
    factory: Callable[..., torch.nn.Module] = getattr(transformers, auto).from_config
    if getattr(config, "architectures", ()) is None:
        config.architectures = []  # the auto classes iterate it to pick among several classes
    try:
        with _quiet_transformers(), device or contextlib.nullcontext():
            return factory(config, **kwargs)
    except ValueError as exc:
        if _needs_remote_code(exc):
            raise WorkloadError(
                "the model needs code from its repository (its config's auto_map): pass "
                "--trust-remote-code (trust_remote_code=True in Python) if you trust it"
            ) from None
        raise WorkloadError(f"transformers cannot build {task} model: {first_line(exc)}") from None


def _dtype_keyword(version: str) -> str:
    """transformers 4.56 renamed ``torch_dtype`` to ``dtype``."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return "dtype"
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def text_config(config: Any) -> Any:
    """The config of the text part (CLIP's ``text_config``; the config itself for LMs)."""
    inner = getattr(config, "text_config", None)
    return inner if inner is not None and hasattr(inner, "vocab_size") else config


def vision_config(config: Any) -> Any:
    inner = getattr(config, "vision_config", None)
    return inner if inner is not None else config


def quantized_note(config: Any) -> str | None:
    """A config that names a quantization (``quantization_config``: bitsandbytes, AWQ, GPTQ,
    FP8; a quantized checkpoint's): the model is built and estimated without it, and the
    report says so (its weights on a GPU take a fraction of these; the quantized kernels'
    own buffers are not modelled)."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    fields = quant if isinstance(quant, dict) else getattr(quant, "__dict__", {})
    method = str(fields.get("quant_method") or "a quantization")[:40]
    bits = fields.get("bits") or (
        4 if fields.get("load_in_4bit") else 8 if fields.get("load_in_8bit") else None
    )
    what = f"{method}, {bits}-bit" if isinstance(bits, int) else method
    return (
        f"the config names a quantization ({what}): estimated as the model unquantized, in "
        "the precision asked for; its quantized weights take a fraction of these bytes on a "
        "GPU (4-bit: about a quarter of bfloat16's), and the quantized kernels are not modelled"
    )


def max_positions(config: Any) -> int | None:
    """The longest sequence the model's positions are made for (None: not said)."""
    text = text_config(config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def default_sequence(config: Any, task: str) -> int:
    """The default sequence length: for audio, one second (samples of raw audio, or feature
    frames); for text, the model's positions, at most 1,024."""
    if task in AUDIO_TASKS:
        return SAMPLE_RATE if audio_layout(config, task).kind == "raw" else FRAMES_PER_SECOND
    longest = max_positions(config)
    if task == "contrastive":
        return longest or 77
    return min(1024, longest) if longest else 1024


# ---- a batch and a loss for each task -----------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """What one micro-batch is: the batch size, the sequence length (text), the prompt and
    the new tokens (generation)."""

    batch_size: int
    seq: int
    new_tokens: int = 0
    cache: str | None = None  # generation: "dynamic" | "static"


def batch_and_loss(
    config: Any, task: str, mode: str, shapes: Shapes, device: torch.device
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """``batch()`` and ``loss(model, **batch)`` for ``task``; ``mode`` is ``train``, ``infer``
    or ``generate``."""
    b, seq = shapes.batch_size, shapes.seq
    text = text_config(config)
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    per_layer = int(getattr(text, "vocab_size_per_layer_input", 0) or 0)
    if 0 < per_layer < vocab:
        # Gemma 3n: the ids past the per-layer embeddings' vocabulary are other modalities'
        # tokens, which a text batch does not hold
        vocab = per_layer
    if mode == "generate":
        if task not in TEXT_GENERATION_TASKS:
            raise WorkloadError(
                "@generate needs a model that generates text (a causal or "
                f"sequence-to-sequence LM); this one's task is {task}"
            )
        return _generation(vocab, shapes, device)
    if task in ("causal-lm", "masked-lm", "seq2seq-lm"):

        def batch() -> dict[str, torch.Tensor]:
            ids = torch.randint(0, vocab, (b, seq), device=device)
            return {"input_ids": ids, "labels": ids}

        def loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
            if mode == "infer":
                if task == "seq2seq-lm":
                    return model(input_ids=input_ids, decoder_input_ids=labels).logits
                return model(input_ids=input_ids).logits
            return model(input_ids=input_ids, labels=labels).loss

        return batch, loss
    if task in TEXT_HEAD_TASKS:
        return _text_heads(config, task, mode, shapes, vocab, device)
    if task in AUDIO_TASKS:
        return _audio(config, task, mode, shapes, device)
    vision = vision_config(config)
    size = _image_size(vision)
    channels = int(getattr(vision, "num_channels", 3) or 3)
    if task == "image-classification" and _main_input(config, task) == "input_ids":
        # ImageGPT: an image as a sequence of colour-cluster ids, a label per image
        return _text_heads(config, "sequence-classification", mode, shapes, vocab, device)
    if task == "object-detection":
        return _detection(config, mode, b, channels, device)
    if task == "image-text-to-text":
        return _image_and_text(config, mode, shapes, vocab, (size, channels), device)
    if task in ("image-classification", "semantic-segmentation"):
        labels_count = int(getattr(config, "num_labels", 2) or 2)
        # semantic segmentation: a class per pixel (Segformer, UperNet, DPT)
        label_shape = (b,) if task == "image-classification" else (b, size, size)

        def batch_img() -> dict[str, torch.Tensor]:
            pixels = torch.randn(b, channels, size, size, device=device)
            return {
                "pixel_values": pixels,
                "labels": torch.randint(0, labels_count, label_shape, device=device),
            }

        def loss_img(
            model: torch.nn.Module, pixel_values: torch.Tensor, labels: torch.Tensor
        ) -> Any:
            if mode == "infer":
                return model(pixel_values=pixel_values).logits
            return model(pixel_values=pixel_values, labels=labels).loss

        return batch_img, loss_img
    if task == "contrastive":

        def batch_pair() -> dict[str, torch.Tensor]:
            return {
                "input_ids": torch.randint(0, vocab, (b, seq), device=device),
                "pixel_values": torch.randn(b, channels, size, size, device=device),
            }

        def loss_pair(
            model: torch.nn.Module, input_ids: torch.Tensor, pixel_values: torch.Tensor
        ) -> Any:
            out = model(input_ids=input_ids, pixel_values=pixel_values, return_loss=mode != "infer")
            return out.logits_per_image if mode == "infer" else out.loss

        return batch_pair, loss_pair
    # a base model: its hidden states, and their mean as the loss of a training step
    main_input = "pixel_values" if hasattr(vision, "image_size") and not vocab else "input_ids"

    def batch_base() -> dict[str, torch.Tensor]:
        if main_input == "pixel_values":
            return {"pixel_values": torch.randn(b, channels, size, size, device=device)}
        return {"input_ids": torch.randint(0, vocab, (b, seq), device=device)}

    def loss_base(model: torch.nn.Module, **inputs: torch.Tensor) -> Any:
        hidden = model(**inputs)[0]
        return hidden if mode == "infer" else hidden.float().mean()

    return batch_base, loss_base


def _main_input(config: Any, task: str) -> str | None:
    return getattr(model_class(config, task), "main_input_name", None)


def pad_with_end_token(config: Any) -> int | None:
    """A config without ``pad_token_id`` gets its end-of-sequence token as padding, as
    fine-tuning scripts set it (``model.config.pad_token_id = tokenizer.eos_token_id``): a
    decoder's classification head finds each sequence's last token by it and refuses a batch
    of more than one sequence without it. Set on the config and its text part (composite
    models' heads read that). Returns the id set (0 when the config names no end token in its
    vocabulary), None when the config had one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "pad_token_id", None) is not None:
        return None
    pad = next((t for t in (_end_token(text), _end_token(config)) if t is not None), 0)
    for part in {id(config): config, id(text): text}.values():
        if getattr(part, "pad_token_id", None) is None:
            part.pad_token_id = pad
    return pad


def _end_token(config: Any) -> int | None:
    """The config's end-of-sequence token id, when it is one of its vocabulary's."""
    return _token(config, "eos_token_id")


def _token(config: Any, name: str) -> int | None:
    """The special token id ``name`` of the config, when it is one of its vocabulary's."""
    token = getattr(config, name, None)
    if isinstance(token, (list, tuple)):
        token = token[0] if token else None
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(token, int) or (isinstance(vocab, int) and not 0 <= token < vocab):
        return None
    return token


def _text_ids(
    config: Any, vocab: int, device: torch.device, pair: bool = False
) -> Callable[..., torch.Tensor]:
    """Random token ids of a shape, each sequence ending with the end token and having none
    before, as a tokenizer makes them: an encoder-decoder's classifier (BART's) reads the
    decoder's state there and refuses sequences without one (or with different counts); a
    decoder padded with it ignores it. ``pair``: a question and its context (or a question
    and an answer), ``q </s></s> context </s>`` as RoBERTa's tokenizer joins them, with the
    separator token where the config names one: Longformer finds the question by its three
    separators and refuses a sample without them; other models read none of it."""
    end = _end_token(config)
    separator = _token(config, "sep_token_id") if pair else None
    mark = separator if separator is not None else end
    avoid = {t for t in (end, mark) if t is not None}
    filler = next((t for t in range(vocab) if t not in avoid), None)

    def ids(*shape: int) -> torch.Tensor:
        drawn = torch.randint(0, vocab, shape, device=device)
        if not avoid or filler is None:
            return drawn
        for token in avoid:
            drawn = torch.where(drawn == token, filler, drawn)
        if pair and mark is not None and shape[-1] >= 4:
            question = max(1, shape[-1] // 8)
            drawn[..., question] = mark
            drawn[..., question + 1] = mark
        last = mark if pair else end
        if last is not None:
            drawn[..., -1] = last
        return drawn

    return ids


def _text_heads(
    config: Any, task: str, mode: str, shapes: Shapes, vocab: int, device: torch.device
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """Sequence classification (a label per sequence), token classification (a label per
    token: named entities), extractive question answering (a start and an end position per
    sequence) and multiple choice (``CHOICES`` sequences of ``seq`` tokens per question, one
    label)."""
    b, seq = shapes.batch_size, shapes.seq
    labels_count = int(getattr(config, "num_labels", 2) or 2)
    pair = task in ("question-answering", "multiple-choice")
    ids = _text_ids(config, vocab, device, pair=pair)

    def positions() -> torch.Tensor:
        return torch.randint(0, seq, (b,), device=device)

    def batch() -> dict[str, torch.Tensor]:
        if task == "sequence-classification":
            labels = torch.randint(0, labels_count, (b,), device=device)
            return {"input_ids": ids(b, seq), "labels": labels}
        if task == "token-classification":
            labels = torch.randint(0, labels_count, (b, seq), device=device)
            return {"input_ids": ids(b, seq), "labels": labels}
        if task == "question-answering":
            return {
                "input_ids": ids(b, seq),
                "start_positions": positions(),
                "end_positions": positions(),
            }
        labels = torch.randint(0, CHOICES, (b,), device=device)
        return {"input_ids": ids(b, CHOICES, seq), "labels": labels}

    def loss(model: torch.nn.Module, input_ids: torch.Tensor, **targets: torch.Tensor) -> Any:
        if mode == "infer":
            out = model(input_ids=input_ids)
            return out.start_logits if task == "question-answering" else out.logits
        return model(input_ids=input_ids, **targets).loss

    return batch, loss


def model_class(config: Any, task: str) -> type | None:
    """The transformers class a config builds for ``task``: its ``architectures``, else its
    model type's entry in the task's auto mapping (None when transformers has none)."""
    import transformers
    from transformers.models.auto import modeling_auto

    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch is None:
        mapping = next((m for t, m, _ in _TASKS if t == task), None)
        names = getattr(modeling_auto, mapping, {}) if mapping else {}
        arch = names.get(getattr(config, "model_type", None))
        if isinstance(arch, (list, tuple)):
            arch = arch[0]
    found = getattr(transformers, arch, None) if isinstance(arch, str) else None
    return found if isinstance(found, type) else None


@dataclass(frozen=True)
class AudioLayout:
    """How a speech model takes its audio: the keyword, and the shape of one example.

    ``kind``: ``raw`` (samples, ``(B, T)``), ``frames`` (feature frames, ``(B, T, dim)``),
    ``mel-first`` (Whisper's log-mel spectrogram, ``(B, dim, T)``, of a fixed length) or
    ``spectrogram`` (AST's ``(B, T, dim)`` of a fixed length)."""

    keyword: str
    kind: str
    dim: int = 0
    fixed_length: int | None = None


def audio_layout(config: Any, task: str) -> AudioLayout:
    """The main input of a speech model: its class's ``main_input_name``, shaped from the
    config (raw audio for ``input_values``; log-mel frames for ``input_features``)."""
    cls = model_class(config, task)
    keyword = getattr(cls, "main_input_name", None) or "input_values"
    encoder = getattr(config, "encoder_config", None) or config
    mel = getattr(config, "num_mel_bins", None) or getattr(encoder, "num_mel_bins", None)
    if keyword == "input_values":
        if mel and getattr(config, "max_length", None):  # AST: a spectrogram, fixed length
            return AudioLayout(keyword, "spectrogram", int(mel), int(config.max_length))
        return AudioLayout(keyword, "raw")
    sources = getattr(config, "max_source_positions", None)
    if mel and sources:  # Whisper: mel bins first, two frames per encoder position
        return AudioLayout(keyword, "mel-first", int(mel), 2 * int(sources))
    dim = getattr(config, "feature_projection_input_dim", None)
    if dim is None and mel:
        # stacked frames: a model that projects num_mel_bins * k features at its input
        dim = int(mel) * int(getattr(config, "stacked_frames", 0) or _stacking(cls, config))
    if not dim:
        raise WorkloadError(
            f"cannot tell the shape of {keyword} for {getattr(config, 'model_type', '?')}: "
            "its config names no feature size"
        )
    return AudioLayout(keyword, "frames", int(dim))


def _stacking(cls: type | None, config: Any) -> int:
    """How many frames a features model stacks at its input (``num_mel_bins * k`` in its
    source: Granite Speech stacks 4), else 1."""
    import inspect
    import sys

    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        source = ""
    found = re.search(r"num_mel_bins\s*\*\s*(\d+)", source)
    return int(found.group(1)) if found else 1


def _ctc_padding(cls: type | None, config: Any) -> int:
    """The value that pads CTC labels: -100, or the pad token where the model masks labels
    by ``labels != pad_token_id``."""
    import inspect

    try:
        source = inspect.getsource(cls.forward) if cls is not None else ""
    except (OSError, TypeError):
        source = ""
    if "!= self.config.pad_token_id" in source and config.pad_token_id is not None:
        return int(config.pad_token_id)
    return -100


def _conv_frames(samples: int, config: Any) -> int:
    """Frames out of a wav2vec2-style convolutional feature encoder for ``samples``."""
    length = samples
    for kernel, stride in zip(
        getattr(config, "conv_kernel", ()) or (),
        getattr(config, "conv_stride", ()) or (),
        strict=False,
    ):
        length = (length - int(kernel)) // int(stride) + 1
    return max(length, 1)


def _audio(
    config: Any, task: str, mode: str, shapes: Shapes, device: torch.device
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """Audio classification (a label per clip), CTC (label sequences shorter than the
    model's output frames, the last one padded) and speech-to-text (Whisper: a transcript
    of ``TRANSCRIPT_TOKENS`` tokens, at most the decoder's positions, as labels)."""
    layout = audio_layout(config, task)
    b = shapes.batch_size
    length = layout.fixed_length or shapes.seq
    if layout.kind == "raw":
        shape: tuple[int, ...] = (b, length)
        frames_out = _conv_frames(length, config)
    elif layout.kind == "mel-first":
        shape = (b, layout.dim, length)
        frames_out = length // 2
    else:
        shape = (b, length, layout.dim)
        frames_out = length // 8  # the most subsampling of these encoders
    keyword = layout.keyword
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if task == "speech-seq2seq":
        longest = getattr(config, "max_target_positions", None)
        tokens = min(TRANSCRIPT_TOKENS, int(longest)) if longest else TRANSCRIPT_TOKENS
    if task == "ctc":
        if vocab < 2:
            raise WorkloadError("a CTC model needs a vocabulary of 2 or more tokens")
        padding = _ctc_padding(model_class(config, task), config)
        label_length = max(1, frames_out // 2)
        blank = getattr(config, "pad_token_id", 0)
        low = 1 if blank in (0, None) else 0
    else:
        classes = int(getattr(config, "num_labels", 2) or 2)

    # feature frames come with the mask their feature extractor makes (some encoders
    # compute their output lengths from it)
    masked = layout.kind == "frames"

    def batch() -> dict[str, torch.Tensor]:
        inputs = {keyword: torch.randn(*shape, device=device)}
        if masked:
            inputs["attention_mask"] = torch.ones(b, length, dtype=torch.long, device=device)
        if task == "speech-seq2seq":  # a transcript of TRANSCRIPT_TOKENS a clip
            return {**inputs, "labels": torch.randint(0, vocab, (b, tokens), device=device)}
        if task != "ctc":
            return {**inputs, "labels": torch.randint(0, classes, (b,), device=device)}
        labels = torch.randint(low, vocab, (b, label_length), device=device)
        if label_length > 1:
            labels[-1, label_length // 2 :] = padding
        return {**inputs, "labels": labels}

    def loss(model: torch.nn.Module, labels: torch.Tensor, **inputs: torch.Tensor) -> Any:
        if mode == "infer":
            if task == "speech-seq2seq":  # one forward over the transcript (teacher forcing)
                return model(**inputs, decoder_input_ids=labels).logits
            return model(**inputs).logits
        return model(**inputs, labels=labels).loss

    return batch, loss


def _detection(
    config: Any, mode: str, b: int, channels: int, device: torch.device
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """Object detection (DETR, RT-DETR, YOLOS...): images of the config's size (else its
    backbone's, else ``DETECTION_SIZE``) and ``OBJECTS`` boxes an image, each a class and a
    box (centre, width, height, in [0, 1]), as transformers' image processors make the
    labels. The loss matches queries to boxes (scipy's assignment: sizes whatever the
    values)."""
    sized = next(
        (
            part
            for part in (config, getattr(config, "backbone_config", None))
            if getattr(part, "image_size", None)
        ),
        None,
    )  # the backbone's size where the config names none (LW-DETR's windows need it)
    size = _image_size(sized) if sized is not None else DETECTION_SIZE
    classes = int(getattr(config, "num_labels", 2) or 2)

    def batch() -> dict[str, Any]:
        labels = [
            {
                "class_labels": torch.randint(0, classes, (OBJECTS,), device=device),
                "boxes": torch.rand(OBJECTS, 4, device=device) * 0.5 + 0.25,
            }
            for _ in range(b)
        ]
        pixels = torch.randn(b, channels, size, size, device=device)
        return {"pixel_values": pixels, "labels": labels}

    def loss(model: torch.nn.Module, pixel_values: torch.Tensor, labels: Any) -> Any:
        if mode == "infer":
            return model(pixel_values=pixel_values).logits
        return model(pixel_values=pixel_values, labels=labels).loss

    return batch, loss


def image_tokens(config: Any, size: int, channels: int) -> int:
    """How many tokens one image takes in a vision-language model's text: its image
    features for one ``size`` image counted on the meta device (no memory), the model's own
    code deciding (LLaVA's patches without the class token, PaliGemma's, InternVL's pixel
    shuffle). A model whose features need more than the pixels (its patch grid, its image
    sizes) is refused in one line."""
    cls = model_class(config, "image-text-to-text")
    arch = getattr(cls, "__name__", "?")
    try:
        with _quiet_transformers(), torch.device("meta"):
            model = cls(config)
            out = model.get_image_features(pixel_values=torch.zeros(1, channels, size, size))
    except Exception as exc:  # a missing argument, no such method, a shape it cannot take
        raise WorkloadError(_uncounted(arch, first_line(exc))) from None
    if not isinstance(out, (torch.Tensor, list, tuple)):
        out = getattr(out, "pooler_output", None)  # a ModelOutput
    parts = out if isinstance(out, (list, tuple)) else [out]
    if not parts or not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in parts):
        raise WorkloadError(_uncounted(arch, "its image features have no token axis"))
    return sum(int(t.shape[-2]) * (int(t.shape[0]) if t.dim() == 3 else 1) for t in parts)


def _image_and_text(
    config: Any,
    mode: str,
    shapes: Shapes,
    vocab: int,
    image: tuple[int, int],
    device: torch.device,
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """A vision-language model fine-tuned on image and text (LLaVA, PaliGemma, InternVL):
    one image a sequence, its ``image_tokens`` image tokens at the start of the
    ``seq``-token sequence as the processor places them, the text after, and the loss on
    the text alone."""
    token = getattr(config, "image_token_id", None)
    if token is None:
        token = getattr(config, "image_token_index", None)
    size, channels = image
    count = image_tokens(config, size, channels)
    if token is None:
        arch = str((getattr(config, "architectures", None) or ["?"])[0])
        raise WorkloadError(_uncounted(arch, "its config names no image token"))
    b, seq = shapes.batch_size, shapes.seq
    if seq <= count + 1:
        raise WorkloadError(
            f"a sequence of {seq} tokens cannot hold one image's {count} tokens and text; "
            f"pass /seq=N with N above {count + 1}"
        )
    filler = next(t for t in range(vocab) if t != token)

    def batch() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (b, seq), device=device)
        ids = torch.where(ids == token, filler, ids)
        ids[:, 1 : 1 + count] = token
        labels = ids.clone()
        labels[:, : 1 + count] = -100  # the image and the first token are not predicted
        pixels = torch.randn(b, channels, size, size, device=device)
        return {"input_ids": ids, "pixel_values": pixels, "labels": labels}

    def loss(
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor,
        labels: torch.Tensor,
    ) -> Any:
        if mode == "infer":
            return model(input_ids=input_ids, pixel_values=pixel_values).logits
        return model(input_ids=input_ids, pixel_values=pixel_values, labels=labels).loss

    return batch, loss


def _image_size(vision: Any) -> int:
    size = getattr(vision, "image_size", 224)
    if isinstance(size, (list, tuple)):
        size = size[-1]
    if isinstance(size, dict):
        size = size.get("height", 224)
    return int(size or 224)


def _generation(
    vocab: int, shapes: Shapes, device: torch.device
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """``model.generate()`` of exactly ``new_tokens`` tokens after a ``seq``-token prompt,
    greedy, with the dynamic or the static KV cache and no ``torch.compile``: the same on a
    GPU as in an estimate (the model's end-of-sequence token is switched off in build)."""
    b, prompt, new = shapes.batch_size, shapes.seq, shapes.new_tokens
    options: dict[str, Any] = {
        "max_new_tokens": new,
        "min_new_tokens": new,
        "do_sample": False,
        "disable_compile": True,
    }
    if shapes.cache == "static":
        options["cache_implementation"] = "static"

    def batch() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (b, prompt), device=device)
        # the mask a tokenizer gives: without it generate() looks for padding in the prompt
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def loss(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)

    return batch, loss


def without_end_of_sequence(model: torch.nn.Module) -> None:
    """Generation runs every new token: no end-of-sequence token (a model with random
    weights would stop wherever it happens to emit one)."""
    config = getattr(model, "generation_config", None)
    if config is not None:
        config.eos_token_id = None
