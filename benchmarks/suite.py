"""The accuracy suite: workloads measured on a GPU and estimated on a CPU, side by side.

Each entry names a workload spec (contract 1) with its batch size, precision,
accumulation and allocator options. ``measure_suite.py`` measures them on a GPU, each in
a fresh process; ``accuracy.py`` estimates them and compares. Both run the cases from the
repository's root (:data:`ROOT`), where the specs' relative paths point.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    name: str
    spec: str
    batch_size: int
    precision: str = "32-true"
    accumulate: int = 1
    allocator_config: str | None = None

    def cli_args(self) -> list[str]:
        args = [self.spec, "--batch-size", str(self.batch_size), "--precision", self.precision]
        args += ["--accumulate", str(self.accumulate)]
        if self.allocator_config:
            args += ["--allocator-config", self.allocator_config]
        return args


EXPANDABLE = "expandable_segments:True"
# the committed transformers configs; specs name them relative to the repository's root,
# where measure_suite.py and accuracy.py run their cases
CONFIGS = "tests/data/hf_configs"

SUITE: list[Case] = [
    # torchvision CNNs
    Case("resnet50-sgdm-fp32", "torchvision:resnet50@sgdm", 64),
    Case("resnet50-sgdm-bf16", "torchvision:resnet50@sgdm", 128, "bf16-mixed"),
    Case(
        "resnet50-adam-fp32-expandable",
        "torchvision:resnet50@adam",
        64,
        allocator_config=EXPANDABLE,
    ),
    Case("resnet50-infer-fp32", "torchvision:resnet50@infer", 128),
    Case("resnet18-sgd-fp32", "torchvision:resnet18@sgd", 128),
    Case("mobilenetv3-adamw-fp16", "torchvision:mobilenet_v3_large", 128, "16-mixed"),
    Case("efficientnet_b0-adam-fp32", "torchvision:efficientnet_b0@adam", 64),
    Case("vgg16-sgdm-fp32", "torchvision:vgg16@sgdm", 32),
    # timm ViT / Swin / ConvNeXt
    Case("vit_b16-adamw-bf16", "timm:vit_base_patch16_224", 64, "bf16-mixed"),
    Case("vit_b16-ckpt-bf16", "timm:vit_base_patch16_224/ckpt", 64, "bf16-mixed"),
    Case("swin_t-adamw-fp32", "timm:swin_tiny_patch4_window7_224", 32),
    Case("convnext_t-adamw-bf16", "timm:convnext_tiny", 64, "bf16-mixed"),
    # transformers from configs
    Case("gpt2-adamw-fp32", "hf:gpt2/seq=1024", 8),
    Case("gpt2-adamw-bf16", "hf:gpt2/seq=1024", 16, "bf16-mixed"),
    Case("gpt2-adamw-fp16", "hf:gpt2/seq=1024", 8, "16-mixed"),
    Case("gpt2-ckpt-bf16", "hf:gpt2/seq=1024/ckpt", 16, "bf16-mixed"),
    Case("gpt2-accum4-bf16", "hf:gpt2/seq=1024", 8, "bf16-mixed", accumulate=4),
    Case("gpt2-bf16-expandable", "hf:gpt2/seq=1024", 16, "bf16-mixed", allocator_config=EXPANDABLE),
    Case("gpt2-sgdm-fp32", "hf:gpt2@sgdm/seq=1024", 8),
    Case("opt125m-adamw-bf16", "hf:opt-125m/seq=1024", 8, "bf16-mixed"),
    Case("bert-base-adamw-fp32", "hf:bert-base/seq=512", 16),
    Case("bert-base-infer-fp32", "hf:bert-base@infer/seq=512", 64),
    Case("llama1b-adamw-bf16true", "hf:llama-1b/seq=1024", 4, "bf16-true"),
    Case("llama1b-ckpt-bf16", "hf:llama-1b/seq=1024/ckpt", 4, "bf16-mixed"),
    # the shipped examples
    Case("example-gpt-fp32", "example:gpt", 32),
    Case("example-cnn-fp32", "example:cnn", 256),
]
# added with LLM support
LLM: list[Case] = [
    # a recurrent network: cuDNN's LSTM (flat weights, reserve, workspace)
    Case("lstm-2x512-adam-fp32", "tests/layer_workloads.py:lstm", 1024),
    # LoRA fine-tuning (PEFT) of a 1B Llama-shaped model: frozen weights, adapters trained
    Case("llama1b-lora8-bf16true", "hf:llama-1b/lora=8/seq=1024", 8, "bf16-true"),
    Case("llama1b-lora64-bf16true", "hf:llama-1b/lora=64/seq=1024", 8, "bf16-true"),
    Case("llama1b-lora8-ckpt-bf16true", "hf:llama-1b/lora=8/ckpt/seq=1024", 8, "bf16-true"),
    Case("llama1b-lora8-bf16mixed", "hf:llama-1b/lora=8/seq=1024", 4, "bf16-mixed"),
    # model.generate(): a 2,048-token prompt and 512 new tokens, dynamic and static KV cache
    Case(
        "llama1b-generate-2048+512-bf16true",
        "hf:llama-1b@generate/prompt=2048/new=512",
        8,
        "bf16-true",
    ),
    Case(
        "llama1b-generate-static-2048+512-bf16true",
        "hf:llama-1b@generate/prompt=2048/new=512/cache=static",
        8,
        "bf16-true",
    ),
    # models from the committed configs (tests/data/hf_configs), at their full size
    Case("mistral7b-infer-bf16true", f"hf:{CONFIGS}/mistral-7b@infer/seq=2048", 2, "bf16-true"),
    Case(
        "qwen2.5-7b-generate-bf16true",
        f"hf:{CONFIGS}/qwen2.5-7b@generate/prompt=512/new=128",
        4,
        "bf16-true",
    ),
    Case("phi3-mini-infer-bf16true", f"hf:{CONFIGS}/phi-3-mini@infer/seq=4096", 2, "bf16-true"),
    Case("gemma2-2b-lora8-bf16true", f"hf:{CONFIGS}/gemma-2-2b/lora=8/seq=1024", 4, "bf16-true"),
    Case("t5-base-adamw-fp32", f"hf:{CONFIGS}/t5-base/seq=512", 16),
    Case("bert-uncased-lora8-fp32", f"hf:{CONFIGS}/bert-base-uncased/lora=8/seq=512", 32),
    Case("vit-b16-hf-adamw-bf16", f"hf:{CONFIGS}/vit-base-patch16-224", 64, "bf16-mixed"),
    Case("clip-b32-adamw-fp32", f"hf:{CONFIGS}/clip-vit-base-patch32", 128),
]
SUITE += LLM
# what to measure again for them: the new cases, and llama1b-adamw-bf16true (a -true
# precision now builds the model in its dtype, as from_pretrained(dtype=...) loads it,
# instead of casting it after the build)
LLM_CASES = ["llama1b-adamw-bf16true", *(c.name for c in LLM)]
