"""The accuracy suite: workloads measured on a GPU and estimated on a CPU, side by side.

Each entry names a workload spec (contract 1) with its batch size, precision,
accumulation and allocator options. ``measure_suite.py`` measures them on a GPU, each in
a fresh process; ``accuracy.py`` estimates them and compares.
"""

from __future__ import annotations

from dataclasses import dataclass


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
