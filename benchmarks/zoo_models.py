"""The zoo sweep's workload list: every torchvision builder, a timm model per family, the shrunk transformers models, and the hand-written layers.

A workload row is a dict: ``id`` (unique), ``spec``, ``library``, ``family`` (timm's module,
transformers' model type, torchvision's task, the layer's name), ``task``, ``batch``,
``precision``, and ``cpu_only`` for models that cannot run on a GPU (torchvision's quantized
ones: they are run, but count for no coverage). Batch sizes are small, so that each one measures in seconds on a GPU: vision
8–16 images (4 at detection's 800 pixels and for 224-pixel video clips), transformers batch
4 at 128 tokens, a third of the rows in ``bf16-mixed`` (picked by a hash of the spec, so
the choice does not move when models are added) so that autocast paths are covered.

timm's smallest variant per family is counted on the meta device and cached in
``benchmarks/results/zoo_timm_models.json`` (``python benchmarks/zoo_models.py --timm`` makes
it again), so that the list is the same on every machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import warnings
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TIMM_JSON = HERE / "results" / "zoo_timm_models.json"
TIMM_VARIANTS_JSON = HERE / "results" / "zoo_timm_variants.json"
LIBRARIES = ("torchvision", "timm", "hf", "layers")

HF_BATCH = 4
HF_SEQ = 128
HF_PROMPT, HF_NEW = 64, 32
VISION_BATCH = 16


def mixed(spec: str) -> bool:
    """Whether a row runs in bf16-mixed: a third of them, by a stable hash of the spec."""
    return zlib.crc32(spec.encode()) % 3 == 0


def _row(
    spec: str, library: str, family: str, task: str, batch: int, precision: str | None = None
) -> dict[str, Any]:
    if precision is None:
        precision = "bf16-mixed" if mixed(spec) else "32-true"
    return {
        "id": f"{spec} b{batch} {precision}",
        "spec": spec,
        "library": library,
        "family": family,
        "task": task,
        "batch": batch,
        "precision": precision,
    }


# ---- torchvision -------------------------------------------------------------------------------

# batch per task: small enough that each step is quick on a GPU
_TORCHVISION_BATCH = {
    "classification": VISION_BATCH,
    "segmentation": 8,
    "detection": 4,
    "optical-flow": 4,
    "quantized": VISION_BATCH,
}
# the largest classification models, at a smaller batch
_TORCHVISION_LARGE = {"vit_h_14": 4, "regnet_y_128gf": 4, "vit_l_16": 8, "regnet_y_32gf": 8}
# one inference row per task, so that @infer is covered for each
_TORCHVISION_INFER = (
    "resnet50",
    "fcn_resnet50",
    "maskrcnn_resnet50_fpn",
    "r3d_18",
    "raft_small",
    "quantized_resnet18",
)


def torchvision_rows() -> list[dict[str, Any]]:
    import torchvision.models as models

    from vramscope import torchvision_models as tv

    rows = []
    for name in models.list_models():
        task = tv.task_of(name)
        if task == tv.VIDEO:
            batch = 8 if name in ("r3d_18", "mc3_18", "r2plus1d_18") else 4
        else:
            batch = _TORCHVISION_LARGE.get(name, _TORCHVISION_BATCH[task])
        spec = f"torchvision:{name}" + ("@infer" if task == tv.QUANTIZED else "")
        rows.append(_row(spec, "torchvision", task, task, batch))
        if task == tv.QUANTIZED:
            rows[-1]["cpu_only"] = True  # int8 kernels: no GPU to estimate for
    for name in _TORCHVISION_INFER:
        if name.startswith("quantized_"):
            continue  # already an inference row
        task = tv.task_of(name)
        batch = _TORCHVISION_BATCH.get(task, 8)
        rows.append(_row(f"torchvision:{name}@infer", "torchvision", task, task, batch))
    return rows


# ---- timm ----------------------------------------------------------------------------------------


def _grad_checkpointing(model: Any) -> bool:
    """Whether ``set_grad_checkpointing(True)`` turns checkpointing on somewhere."""
    try:
        model.set_grad_checkpointing(True)
    except Exception:
        return False
    return any(getattr(m, "grad_checkpointing", False) is True for m in model.modules())


def choose_timm_models() -> dict[str, Any]:
    """Per family (the module a model is registered from), its smallest variant by
    parameter count (built on the meta device), and whether it checkpoints."""
    import timm
    import torch
    from timm.models._registry import _model_to_module

    families: dict[str, list[str]] = {}
    for name in timm.list_models():
        families.setdefault(_model_to_module[name], []).append(name)
    chosen: dict[str, Any] = {}
    for family, names in sorted(families.items()):
        sizes: dict[str, int] = {}
        errors: dict[str, str] = {}
        for name in names:
            try:
                with warnings.catch_warnings(), torch.device("meta"):
                    warnings.simplefilter("ignore")
                    model = timm.create_model(name, pretrained=False)
                sizes[name] = sum(p.numel() for p in model.parameters())
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if not sizes:
            chosen[family] = {"variants": len(names), "errors": errors}
            continue
        smallest = min(sizes, key=lambda n: (sizes[n], n))
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = timm.create_model(smallest, pretrained=False)
        chosen[family] = {
            "model": smallest,
            "parameters": sizes[smallest],
            "input_size": list(model.default_cfg.get("input_size", (3, 224, 224))),
            "ckpt": _grad_checkpointing(model),
            "variants": len(names),
        }
        if errors:
            chosen[family]["errors"] = errors
        print(f"{family:28s} {smallest:50s} {sizes[smallest] / 1e6:8.2f}M", flush=True)
    return chosen


def write_timm_models(path: Path = TIMM_JSON) -> None:
    import timm

    families = choose_timm_models()
    document = {
        "meta": {"date": datetime.date.today().isoformat(), "timm": timm.__version__},
        "families": families,
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def timm_rows(path: Path = TIMM_JSON) -> list[dict[str, Any]]:
    families = json.loads(path.read_text())["families"]
    rows = []
    for family, entry in families.items():
        if "model" not in entry:
            continue
        name = entry["model"]
        side = entry["input_size"][-1]
        batch = VISION_BATCH if side <= 256 else 8
        rows.append(_row(f"timm:{name}", "timm", family, "image-classification", batch))
        if entry.get("ckpt"):
            spec = f"timm:{name}/ckpt"
            rows.append(_row(spec, "timm", family, "image-classification", batch))
    return rows


# ---- timm's other variants (models the accuracy sweep never saw) ------------------------------

VARIANTS_PER_FAMILY = 2
VARIANT_MAX_PARAMETERS = 200_000_000


def choose_timm_variants(per_family: int = VARIANTS_PER_FAMILY) -> dict[str, Any]:
    """Per family, up to ``per_family`` variants other than the sweep's smallest, picked by a
    stable hash of their names (not by size, not by hand) among those of at most 200M
    parameters (counted on the meta device): models nobody tuned the estimator on."""
    import timm
    import torch
    from timm.models._registry import _model_to_module

    smallest = {e.get("model") for e in json.loads(TIMM_JSON.read_text())["families"].values()}
    families: dict[str, list[str]] = {}
    for name in timm.list_models():
        if name not in smallest:
            families.setdefault(_model_to_module[name], []).append(name)
    chosen: dict[str, Any] = {}
    for family, names in sorted(families.items()):
        for name in sorted(names, key=lambda n: zlib.crc32(n.encode())):
            if len(chosen.get(family, [])) >= per_family:
                break
            try:
                with warnings.catch_warnings(), torch.device("meta"):
                    warnings.simplefilter("ignore")
                    model = timm.create_model(name, pretrained=False)
            except Exception:
                continue  # counted by the sweep's family rows; a variant must build
            parameters = sum(p.numel() for p in model.parameters())
            if parameters > VARIANT_MAX_PARAMETERS:
                continue
            side = list(model.default_cfg.get("input_size", (3, 224, 224)))[-1]
            chosen.setdefault(family, []).append(
                {"model": name, "parameters": parameters, "side": side}
            )
            print(f"{family:28s} {name:50s} {parameters / 1e6:8.2f}M", flush=True)
    return chosen


def write_timm_variants(path: Path = TIMM_VARIANTS_JSON) -> None:
    import timm

    document = {
        "meta": {"date": datetime.date.today().isoformat(), "timm": timm.__version__},
        "families": choose_timm_variants(),
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def timm_variant_rows(path: Path = TIMM_VARIANTS_JSON) -> list[dict[str, Any]]:
    rows = []
    for family, entries in json.loads(path.read_text())["families"].items():
        for entry in entries:
            batch = VISION_BATCH if entry["side"] <= 256 else 8
            spec = f"timm:{entry['model']}"
            rows.append(_row(spec, "timm-variants", family, "image-classification", batch))
    return rows


# ---- transformers ------------------------------------------------------------------------------


def hf_rows() -> list[dict[str, Any]]:
    import zoo_hf

    entries = zoo_hf.load_entries()
    paths = zoo_hf.write_config_files(entries)
    rows = []
    for key, entry in entries.items():
        if key not in paths:
            continue
        path, task, family = paths[key], entry["task"], entry["type"]
        options = f"/seq={HF_SEQ}" if task in ("causal-lm", "masked-lm", "seq2seq-lm") else ""
        row = _row(f"hf:{path}{options}", "hf", family, task, HF_BATCH)
        row["level"] = entry["level"]
        rows.append(row)
        if task == "causal-lm":
            spec = f"hf:{path}@generate/prompt={HF_PROMPT}/new={HF_NEW}"
            row = _row(spec, "hf", family, "generate", HF_BATCH)
            row["level"] = entry["level"]
            rows.append(row)
    return rows


def hf_head_rows(tasks: tuple[str, ...], library: str) -> list[dict[str, Any]]:
    """Text heads fine-tuned on a pretrained LM, for every model type of the sweep whose
    shrunk causal or masked LM config has a class for the task: the same config with that
    class as its architecture. Not part of the sweep: a check on heads it never traced."""
    from transformers.models.auto import modeling_auto

    import zoo_hf

    mappings = {
        "sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
        "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
        "question-answering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
        "multiple-choice": "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
        "speech-seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
        "semantic-segmentation": "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        "image-text-to-text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    }
    task_sources = {
        "speech-seq2seq": ("audio-classification", "ctc", "seq2seq-lm"),
        "semantic-segmentation": ("image-classification",),
        "image-text-to-text": ("causal-lm", "seq2seq-lm"),
    }
    rows = []
    for task in tasks:
        heads = getattr(modeling_auto, mappings[task])
        sources = task_sources.get(task, ("causal-lm", "masked-lm"))
        seen = set()
        for entry in zoo_hf.load_entries().values():
            cls = heads.get(entry["type"])
            if "config" not in entry or entry["task"] not in sources:
                continue
            if not cls or entry["type"] in seen:
                continue
            seen.add(entry["type"])
            key = zoo_hf.entry_key(entry["type"], task)
            config = {**entry["config"], "architectures": [cls]}
            zoo_hf.write_config(config, key, ROOT / zoo_hf.CONFIG_DIR)
            options = (
                "" if task in ("speech-seq2seq", "semantic-segmentation") else f"/seq={HF_SEQ}"
            )
            spec = f"hf:{zoo_hf.CONFIG_DIR / key}.json{options}"
            row = _row(spec, library, entry["type"], task, HF_BATCH)
            row["level"] = entry["level"]
            rows.append(row)
    return rows


def hf_sequence_classification_rows() -> list[dict[str, Any]]:
    """Sequence classification (the most common fine-tune): the last non-padding token found
    from the ids, pooled outputs, an encoder-decoder's end token."""
    return hf_head_rows(("sequence-classification",), "hf-seqcls")


def hf_text_head_rows() -> list[dict[str, Any]]:
    """Token classification, extractive question answering, multiple choice; speech-to-text
    for the types whose shrunk audio or sequence-to-sequence config has a class for it
    (Whisper); semantic segmentation for the image classifiers' types (Segformer); image and
    text for the vision-language types whose shrunk LM config the sweep has (Gemma 3)."""
    tasks = (
        "token-classification",
        "question-answering",
        "multiple-choice",
        "speech-seq2seq",
        "semantic-segmentation",
        "image-text-to-text",
    )
    return hf_head_rows(tasks, "hf-heads")


def hf_detection_rows() -> list[dict[str, Any]]:
    """Object detection for every detector type transformers has, each with its default
    config (no pretrained backbone): the sweep has no detector configs to shrink. Not part of
    the sweep: a check on heads it never traced."""
    from transformers.models.auto import configuration_auto, modeling_auto

    import zoo_hf

    rows = []
    for model_type, cls in sorted(modeling_auto.MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES.items()):
        try:
            config = configuration_auto.CONFIG_MAPPING[model_type]()
        except Exception:
            continue  # a config that does not build with its defaults
        if hasattr(config, "use_pretrained_backbone"):
            config.use_pretrained_backbone = False
        config.architectures = [cls if isinstance(cls, str) else cls[0]]
        key = zoo_hf.entry_key(model_type, "object-detection")
        zoo_hf.write_config(config.to_dict(), key, ROOT / zoo_hf.CONFIG_DIR)
        spec = f"hf:{zoo_hf.CONFIG_DIR / key}.json"
        rows.append(_row(spec, "hf-detection", model_type, "object-detection", 2))
    return rows


# ---- layers ------------------------------------------------------------------------------------


def layer_rows() -> list[dict[str, Any]]:
    import zoo_layers

    return [
        _row(f"benchmarks/zoo_layers.py:{name}", "layers", name, "layer", batch, precision)
        for name, (batch, precision) in zoo_layers.LAYERS.items()
    ]


def workloads(only: str | None = None) -> list[dict[str, Any]]:
    """Every row of the sweep (of one library with ``only``), libraries interleaved so that a
    run cut short has some of each."""
    makers = {
        "torchvision": torchvision_rows,
        "timm": timm_rows,
        "hf": hf_rows,
        "layers": layer_rows,
    }
    checks = {
        "timm-variants": timm_variant_rows,
        "hf-seqcls": hf_sequence_classification_rows,
        "hf-heads": hf_text_head_rows,
        "hf-detection": hf_detection_rows,
    }
    if only in checks:  # not part of the sweep: checks on models it never saw
        return checks[only]()
    lists = [makers[lib]() for lib in LIBRARIES if only in (None, lib)]
    rows: list[dict[str, Any]] = []
    for i in range(max((len(x) for x in lists), default=0)):
        rows.extend(x[i] for x in lists if i < len(x))
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "workload ids are unique"
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timm", action="store_true", help="choose timm's models again")
    parser.add_argument(
        "--timm-variants", action="store_true", help="choose timm's other variants again"
    )
    parser.add_argument(
        "--only", choices=(*LIBRARIES, "timm-variants", "hf-seqcls", "hf-heads", "hf-detection")
    )
    args = parser.parse_args()
    if args.timm:
        write_timm_models()
        return 0
    if args.timm_variants:
        write_timm_variants()
        return 0
    for row in workloads(args.only):
        print(f"{row['library']:12s} {row['batch']:3d} {row['precision']:10s} {row['spec']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
