"""torchvision models for ``torchvision:NAME`` specs: each builder's task, and a batch and a loss fit for it.

Tasks follow torchvision's model modules: classification (``torchvision.models``),
semantic segmentation, detection (with instance segmentation and keypoints), video
classification, optical flow, and quantized models (which run on the CPU only). Models are
built with ``weights=None`` and ``weights_backbone=None``: nothing is downloaded. Every
random value of a step is made by the batch function, on the workload's device.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from vramscope.errors import WorkloadError

CLASSIFICATION = "classification"
SEGMENTATION = "segmentation"
DETECTION = "detection"
VIDEO = "video"
OPTICAL_FLOW = "optical-flow"
QUANTIZED = "quantized"
TASKS = (CLASSIFICATION, SEGMENTATION, DETECTION, VIDEO, OPTICAL_FLOW, QUANTIZED)

# default input sizes (pixels, square) where the task's own default is not enough
_CLASSIFICATION_SIZES = {"inception_v3": 299}
SEGMENTATION_SIZE = 480  # torchvision's segmentation references train on 480-pixel crops
VIDEO_FRAMES = 16  # the references' clip length
_VIDEO_SIZES = {"r3d_18": 112, "mc3_18": 112, "r2plus1d_18": 112}  # ResNet-3D: 112-pixel clips
VIDEO_SIZE = 224
FLOW_SIZE = (368, 496)  # the references' FlyingChairs crop (height, width)
BOXES_PER_IMAGE = 4
# auxiliary-classifier weights: Inception v3 as torchvision's fine-tuning tutorial, GoogLeNet
# as its paper
_AUX_WEIGHTS = {"inception_v3": 0.4, "googlenet": 0.3}
SEGMENTATION_AUX_WEIGHT = 0.5  # torchvision's segmentation references


def task_of(name: str) -> str:
    """The task of torchvision's builder ``name``, from the module it lives in."""
    import torchvision.models as models

    for module, task in (
        (models.detection, DETECTION),
        (models.segmentation, SEGMENTATION),
        (models.video, VIDEO),
        (models.optical_flow, OPTICAL_FLOW),
        (models.quantization, QUANTIZED),
    ):
        if name in models.list_models(module=module):
            return task
    return CLASSIFICATION


def build_model(name: str, device: torch.device) -> tuple[torch.nn.Module, str]:
    """torchvision's model ``name`` with random weights, and its task."""
    import torchvision.models as models

    try:
        factory = models.get_model_builder(name)
    except ValueError:
        raise WorkloadError(f"torchvision has no model {name!r}") from None
    task = task_of(name)
    kwargs: dict[str, Any] = {"weights": None}
    parameters = inspect.signature(factory).parameters
    if "weights_backbone" in parameters:
        kwargs["weights_backbone"] = None  # its default downloads ImageNet weights
    if name in _AUX_WEIGHTS:
        kwargs["init_weights"] = True  # the initialisation weights=None uses, without its warning
    if task == QUANTIZED:
        if device.type != "cpu":
            float_name = name.removeprefix("quantized_")
            raise WorkloadError(
                f"torchvision:{name} is quantized (int8): its kernels run on the CPU only, not "
                f"on {device.type}; estimate its float model torchvision:{float_name} instead"
            )
        kwargs["quantize"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = factory(**kwargs)
    return model.to(device), task


def default_size(name: str, task: str, model: torch.nn.Module) -> tuple[int, int]:
    """The input size a task trains at: 224 for classification (Inception v3: 299), 480 for
    segmentation, the model's own resize for detection, 112 for ResNet-3D clips and 224 for
    other video models, 368 x 496 for optical flow."""
    if task in (CLASSIFICATION, QUANTIZED):
        side = _CLASSIFICATION_SIZES.get(name.removeprefix("quantized_"), 224)
    elif task == SEGMENTATION:
        side = SEGMENTATION_SIZE
    elif task == DETECTION:
        transform = model.transform
        side = int(transform.fixed_size[0]) if transform.fixed_size else max(transform.min_size)
    elif task == VIDEO:
        side = _VIDEO_SIZES.get(name, VIDEO_SIZE)
    else:
        return FLOW_SIZE
    return side, side


def batch_and_loss(
    name: str,
    task: str,
    model: torch.nn.Module,
    batch_size: int,
    size: tuple[int, int],
    training: bool,
    device: torch.device,
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """``batch()`` and ``loss(model, *batch)`` for ``task``; in inference the loss is the
    model's output."""
    if task == DETECTION:
        return _detection(model, batch_size, size, training, device)
    if task == OPTICAL_FLOW:
        return _optical_flow(batch_size, size, training, device)
    height, width = size
    if task == SEGMENTATION:
        return _segmentation(model, batch_size, size, training, device)
    if task == VIDEO:
        shape: tuple[int, ...] = (batch_size, 3, VIDEO_FRAMES, height, width)
        classes = 400  # Kinetics-400, the video builders' default
    else:
        shape = (batch_size, 3, height, width)
        classes = 1000
    aux_weight = _AUX_WEIGHTS.get(name.removeprefix("quantized_"), 0.0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(*shape, device=device)
        y = torch.randint(0, classes, (batch_size,), device=device)
        return x, y

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
        out = model(x)
        if not training:
            return out
        if isinstance(out, tuple):  # Inception v3, GoogLeNet: auxiliary classifiers in training
            main, *aux = (o for o in out if o is not None)
            total = F.cross_entropy(main, y)
            for logits in aux:
                total = total + aux_weight * F.cross_entropy(logits, y)
            return total
        return F.cross_entropy(out, y)

    return batch, loss


def _segmentation(
    model: torch.nn.Module,
    batch_size: int,
    size: tuple[int, int],
    training: bool,
    device: torch.device,
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """Pixel-wise cross entropy on (B, H, W) class maps; the ``aux`` head's loss too (half
    weight, as torchvision's references) when the model has one."""
    classes = _segmentation_classes(model)
    height, width = size

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, 3, height, width, device=device)
        y = torch.randint(0, classes, (batch_size, height, width), device=device)
        return x, y

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
        out = model(x)
        if not training:
            return out["out"]
        total = F.cross_entropy(out["out"], y, ignore_index=255)
        if out.get("aux") is not None:
            total = total + SEGMENTATION_AUX_WEIGHT * F.cross_entropy(
                out["aux"], y, ignore_index=255
            )
        return total

    return batch, loss


def _segmentation_classes(model: torch.nn.Module) -> int:
    head = getattr(model, "classifier", None)
    last = None
    for module in head.modules() if head is not None else ():
        if isinstance(module, torch.nn.Conv2d):
            last = module
    return int(last.out_channels) if last is not None else 21


def _detection_classes(model: torch.nn.Module) -> int:
    """The number of classes a detector predicts (background included)."""
    roi_heads = getattr(model, "roi_heads", None)
    if roi_heads is not None:
        return int(roi_heads.box_predictor.cls_score.out_features)
    head = getattr(getattr(model, "head", None), "classification_head", None)
    return int(getattr(head, "num_classes", 91))


def _detection(
    model: torch.nn.Module,
    batch_size: int,
    size: tuple[int, int],
    training: bool,
    device: torch.device,
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """A list of images and, in training, a list of targets: valid random boxes and labels,
    masks for Mask R-CNN, keypoints for Keypoint R-CNN. The loss is the sum of the model's
    loss dict; inference returns the detections."""
    classes = _detection_classes(model)
    roi_heads = getattr(model, "roi_heads", None)
    masks = roi_heads is not None and getattr(roi_heads, "mask_predictor", None) is not None
    keypoint_predictor = getattr(roi_heads, "keypoint_predictor", None)
    keypoints = 0
    if keypoint_predictor is not None:
        keypoints = int(keypoint_predictor.kps_score_lowres.out_channels)
    height, width = size
    n = BOXES_PER_IMAGE

    def target() -> dict[str, torch.Tensor]:
        scale = torch.tensor([width, height, width, height], device=device)
        corner = torch.rand(n, 2, device=device) * 0.5
        extent = torch.rand(n, 2, device=device) * 0.45 + 0.05
        boxes = torch.cat([corner, corner + extent], dim=1) * scale
        out = {"boxes": boxes, "labels": torch.randint(1, classes, (n,), device=device)}
        if masks:
            out["masks"] = (torch.rand(n, height, width, device=device) > 0.5).to(torch.uint8)
        if keypoints:
            xy = boxes[:, None, :2] + torch.rand(n, keypoints, 2, device=device) * (
                boxes[:, None, 2:] - boxes[:, None, :2]
            )
            visible = torch.full((n, keypoints, 1), 2.0, device=device)
            out["keypoints"] = torch.cat([xy, visible], dim=2)
        return out

    if not training:

        def images() -> tuple[list[torch.Tensor]]:
            return ([torch.rand(3, height, width, device=device) for _ in range(batch_size)],)

        def detect(model: torch.nn.Module, images: list[torch.Tensor]) -> Any:
            return model(images)

        return images, detect

    def batch() -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        images = [torch.rand(3, height, width, device=device) for _ in range(batch_size)]
        return images, [target() for _ in range(batch_size)]

    def loss(
        model: torch.nn.Module, images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]
    ) -> Any:
        losses = model(images, targets)
        return sum(losses.values())

    return batch, loss


def _optical_flow(
    batch_size: int, size: tuple[int, int], training: bool, device: torch.device
) -> tuple[Callable[[], Any], Callable[..., Any]]:
    """RAFT: two images and a ground-truth flow; the loss is the L1 error of every flow
    prediction the model makes (one per refinement iteration)."""
    height, width = size
    if height % 8 or width % 8:
        raise WorkloadError(f"RAFT needs a size divisible by 8, not {height}x{width}")

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        first = torch.randn(batch_size, 3, height, width, device=device)
        second = torch.randn(batch_size, 3, height, width, device=device)
        flow = torch.randn(batch_size, 2, height, width, device=device)
        return first, second, flow

    def loss(
        model: torch.nn.Module, first: torch.Tensor, second: torch.Tensor, flow: torch.Tensor
    ) -> Any:
        predictions = model(first, second)
        if not training:
            return predictions
        return sum((p - flow).abs().mean() for p in predictions)

    return batch, loss


def fix_detection_size(model: torch.nn.Module, size: int | None) -> None:
    """Detectors resize their images: to one size (the largest of their choices, so that a
    step does not depend on a random pick), or to ``size`` when one is asked for."""
    transform = model.transform
    if transform.fixed_size:
        return
    side = size if size is not None else max(transform.min_size)
    transform.min_size = (side,)
    transform.max_size = max(int(transform.max_size), side)
