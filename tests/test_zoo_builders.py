"""The built-in specs build every task of the zoo: torchvision's tasks and transformers' speech
models, each with a real CPU step on a tiny input; the zoo sweep's config shrink builds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from vramscope.errors import WorkloadError
from vramscope.workload import StepRunner, resolve

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]


def step(spec: str, batch_size: int = 2) -> tuple[object, object]:
    workload = resolve(spec).build(batch_size, CPU)
    return workload, StepRunner(workload, CPU)()


# ---- torchvision ---------------------------------------------------------------------------------


@pytest.fixture
def torchvision():
    return pytest.importorskip("torchvision", reason="the torchvision: specs need torchvision")


def test_tasks_follow_torchvision_modules(torchvision):
    from vramscope import torchvision_models as tv

    assert tv.task_of("resnet18") == "classification"
    assert tv.task_of("fcn_resnet50") == "segmentation"
    assert tv.task_of("maskrcnn_resnet50_fpn") == "detection"
    assert tv.task_of("r3d_18") == "video"
    assert tv.task_of("raft_small") == "optical-flow"
    assert tv.task_of("quantized_resnet18") == "quantized"


def test_googlenet_trains_with_its_auxiliary_classifiers(torchvision):
    workload, loss = step("torchvision:googlenet/size=96")
    assert workload.meta["torchvision"]["task"] == "classification"
    assert loss > 0


def test_segmentation_targets_are_class_maps(torchvision):
    workload = resolve("torchvision:lraspp_mobilenet_v3_large/size=64").build(2, CPU)
    _, y = workload.batch()
    assert y.shape == (2, 64, 64) and y.dtype == torch.long
    assert StepRunner(workload, CPU)() > 0


def test_detection_trains_on_boxes_and_infers_on_images(torchvision):
    workload, loss = step("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn/size=64")
    assert loss > 0
    images, targets = workload.batch()
    assert len(images) == 2 and images[0].shape == (3, 64, 64)
    boxes = targets[0]["boxes"]
    assert (boxes[:, 2:] > boxes[:, :2]).all() and boxes.max() <= 64
    workload, out = step("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn@infer/size=64")
    assert out is None and not workload.training


def test_mask_and_keypoint_targets(torchvision):
    masks = resolve("torchvision:maskrcnn_resnet50_fpn/size=64").build(1, CPU)
    _, targets = masks.batch()
    assert targets[0]["masks"].shape == (4, 64, 64)
    points = resolve("torchvision:keypointrcnn_resnet50_fpn/size=64").build(1, CPU)
    _, targets = points.batch()
    assert targets[0]["keypoints"].shape == (4, 17, 3)
    assert points.model.transform.min_size == (64,)  # no random pick of a size per step


def test_video_clips_have_frames(torchvision):
    workload, loss = step("torchvision:r3d_18/size=32")
    x, _ = workload.batch()
    assert x.shape == (2, 3, 16, 32, 32) and loss > 0


def test_raft_sums_the_l1_loss_of_every_prediction(torchvision):
    _, loss = step("torchvision:raft_small/size=128", batch_size=1)
    assert loss > 0
    with pytest.raises(WorkloadError, match="divisible by 8"):
        resolve("torchvision:raft_small/size=100").build(1, CPU)


def test_quantized_models_run_on_the_cpu_only(torchvision):
    with pytest.raises(WorkloadError, match="CPU only"):
        resolve("torchvision:quantized_resnet18@infer").build(1, torch.device("cuda"))
    with pytest.raises(WorkloadError, match="@infer"):
        resolve("torchvision:quantized_resnet18").build(1, CPU)


def test_default_sizes_per_task(torchvision):
    from vramscope import torchvision_models as tv

    model, task = tv.build_model("ssdlite320_mobilenet_v3_large", CPU)
    assert tv.default_size("ssdlite320_mobilenet_v3_large", task, model) == (320, 320)
    assert tv.default_size("inception_v3", "classification", model) == (299, 299)
    assert tv.default_size("r3d_18", "video", model) == (112, 112)
    assert tv.default_size("mvit_v2_s", "video", model) == (224, 224)


# ---- transformers: speech and the shrink ---------------------------------------------------------


@pytest.fixture
def zoo_hf():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import zoo_hf
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return zoo_hf


def _write(tmp_path: Path, zoo_hf, model_type: str, task: str, cls: str) -> Path:
    from transformers import AutoConfig

    config = zoo_hf.complete(zoo_hf.shrink(AutoConfig.for_model(model_type)), task)
    path = tmp_path / f"{model_type}-{task}.json"
    path.write_text(json.dumps(zoo_hf.config_dict(config, cls)))
    return path


@pytest.mark.parametrize(
    ("model_type", "task", "cls"),
    [
        ("llama", "causal-lm", "LlamaForCausalLM"),
        ("mixtral", "causal-lm", "MixtralForCausalLM"),
        ("bert", "masked-lm", "BertForMaskedLM"),
        ("t5", "seq2seq-lm", "T5ForConditionalGeneration"),
        ("vit", "image-classification", "ViTForImageClassification"),
    ],
)
def test_shrunk_configs_build_small_models(tmp_path, zoo_hf, model_type, task, cls):
    from transformers import AutoConfig

    config = zoo_hf.shrink(AutoConfig.for_model(model_type))
    assert zoo_hf.parameters_on_meta(config, task) < 20_000_000
    path = _write(tmp_path, zoo_hf, model_type, task, cls)
    workload, loss = step(f"hf:{path}" + ("/seq=16" if "lm" in task else ""), batch_size=1)
    assert workload.meta["hf"]["task"] == task
    assert loss > 0


def test_ctc_labels_are_shorter_than_the_frames_and_padded(tmp_path, zoo_hf):
    path = _write(tmp_path, zoo_hf, "wav2vec2", "ctc", "Wav2Vec2ForCTC")
    workload = resolve(f"hf:{path}").build(2, CPU)
    assert workload.meta["hf"]["task"] == "ctc"
    batch = workload.batch()
    assert batch["input_values"].shape == (2, 16_000)
    labels = batch["labels"]
    assert labels.shape[1] < 49  # wav2vec2's encoder makes 49 frames of a second
    assert (labels[-1] == -100).any() and (labels[0] >= 1).all()
    assert StepRunner(workload, CPU)() is not None


def test_whisper_classifies_log_mel_frames(tmp_path, zoo_hf):
    path = _write(
        tmp_path, zoo_hf, "whisper", "audio-classification", "WhisperForAudioClassification"
    )
    workload = resolve(f"hf:{path}@infer").build(1, CPU)
    features = workload.batch()["input_features"]
    config = json.loads(path.read_text())
    assert features.shape == (1, config["num_mel_bins"], 2 * config["max_source_positions"])


def test_architectures_select_the_speech_auto_classes():
    pytest.importorskip("transformers")
    from transformers import Wav2Vec2Config

    from vramscope.hf_models import task_of

    config = Wav2Vec2Config(architectures=["Wav2Vec2ForCTC"])
    assert task_of(config) == ("ctc", "AutoModelForCTC")
    config = Wav2Vec2Config(architectures=["Wav2Vec2ForSequenceClassification"])
    assert task_of(config) == ("audio-classification", "AutoModelForAudioClassification")


@pytest.mark.parametrize(
    ("spec", "model", "mode", "options"),
    [
        ("gpt2@infer/seq=128", "gpt2", "infer", {"seq": "128"}),
        ("gpt2/seq=128@infer", "gpt2", "infer", {"seq": "128"}),
        ("gpt2/seq=64/ckpt@sgd", "gpt2", "sgd", {"seq": "64", "ckpt": ""}),
    ],
)
def test_an_hf_spec_takes_its_mode_first_or_last(spec, model, mode, options):
    from vramscope.zoo import parse_hf

    parsed = parse_hf(spec)
    assert (parsed.model, parsed.mode, parsed.options) == (model, mode, options)


@pytest.mark.parametrize("spec", ["resnet50@sgd/size=160/ckpt", "resnet50/size=160/ckpt@sgd"])
def test_a_vision_spec_takes_its_optimizer_first_or_last(spec):
    from vramscope.zoo import _parse

    assert _parse(spec, "timm") == ("resnet50", "sgd", {"size": "160", "ckpt": ""})


@pytest.mark.parametrize(
    ("parse", "spec", "message"),
    [
        ("hf", "gpt2@sgd/seq=128@infer", "give the mode once"),
        ("timm", "resnet50@sgd/size=160@adamw", "give the optimizer once"),
        ("timm", "resnet50/size=160@lion", "unknown optimizer 'lion'"),
    ],
)
def test_a_mode_given_twice_or_unknown_is_one_line(parse, spec, message):
    """Never one of two modes dropped without a word."""
    from vramscope.errors import WorkloadError
    from vramscope.zoo import _parse, parse_hf

    with pytest.raises(WorkloadError, match=message):
        parse_hf(spec) if parse == "hf" else _parse(spec, "timm")
