"""``hf:`` specs from committed config files: every model type builds for its task and is
estimated; bad input is one line; remote code runs only when trusted; LoRA trains adapters
only; generate() runs to its full length, its skipped decoding steps written exactly as they
would have been traced; ``fit --seq-len`` answers the longest sequence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

pytest.importorskip("transformers", reason="hf: workloads need transformers")

from hf_tiny import CONFIGS, NAMES, tiny_config
from vramscope.errors import VramscopeError, WorkloadError
from vramscope.estimate.estimator import estimate
from vramscope.workload import resolve
from vramscope.zoo import parse_hf

ROOT = Path(__file__).resolve().parents[1]
TASKS = {
    "bert-base-uncased": "masked-lm",
    "clip-vit-base-patch32": "contrastive",
    "gemma-2-2b": "causal-lm",
    "llama-3-8b": "causal-lm",
    "mistral-7b": "causal-lm",
    "mixtral-8x7b": "causal-lm",
    "phi-3-mini": "causal-lm",
    "qwen2.5-7b": "causal-lm",
    "t5-base": "seq2seq-lm",
    "vit-base-patch16-224": "image-classification",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """name -> a folder with a small copy of that committed config."""
    root = tmp_path_factory.mktemp("hf")
    return {name: tiny_config(name, root / name) for name in NAMES}


def vramscope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vramscope", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("vramscope: error:") and needle in lines[0], lines[0]


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """The command line in this process (what ``main`` prints and its exit code)."""
    from vramscope.cli.main import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, int(exit_info.value.code or 0), out, err)


# ---- the committed configs ------------------------------------------------------------------


def test_the_fixtures_are_the_ten_models_of_the_issue():
    assert set(NAMES) == set(TASKS)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_config_is_read_for_its_task_at_full_size(name):
    from vramscope.hf_models import config_source, load_config, task_of

    source = config_source(str(CONFIGS / name), {})
    assert source.kind == "folder"
    config = load_config(source)
    assert task_of(config)[0] == TASKS[name]
    # and as the config.json file itself
    file_source = config_source(str(CONFIGS / name / "config.json"), {})
    assert file_source.kind == "file"
    assert type(load_config(file_source)) is type(config)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_model_type_is_estimated_for_a_training_step(tiny, name):
    # Mixtral's experts run torch's grouped matmul, which takes bfloat16 on a GPU
    precision = "bf16-true" if name == "mixtral-8x7b" else None
    report = estimate(f"hf:{tiny[name]}/seq=32", 2, precision=precision)
    assert report.workload["training"]
    # the estimate's parameters are the model the config describes
    import transformers

    from vramscope.hf_models import config_source, load_config, task_of

    config = load_config(config_source(str(tiny[name]), {}))
    auto = getattr(transformers, task_of(config)[1])
    model = auto.from_config(config)
    assert report.workload["parameters"] == sum(p.numel() for p in model.parameters())
    root = report.modules[0]
    assert root["optimizer_state_bytes"] >= 2 * root["parameters_bytes"] * 0.99


def test_a_true_precision_builds_the_model_in_its_dtype(tiny):
    spec = resolve(f"hf:{tiny['qwen2.5-7b']}/seq=16")
    from vramscope.workload import build_workload

    workload = build_workload(spec.builder, 2, torch.device("cpu"), spec.spec, "bf16-true")
    assert {p.dtype for p in workload.model.parameters()} == {torch.bfloat16}
    assert workload.precision == "bf16-true"
    assert workload.meta["hf"]["task"] == "causal-lm"
    assert workload.meta["hf"]["seq"] == 16


def _saved(config: Any, arch: str, folder: Path) -> Path:
    """``config`` naming the class ``arch``, saved as ``folder/config.json``."""
    config.architectures = [arch]
    config.save_pretrained(folder)
    return folder


def _built(spec: str, batch_size: int, task: str) -> tuple[Any, dict[str, Any]]:
    """The workload of an hf: spec built on the CPU (checked to be for ``task``) and one
    of its batches."""
    from vramscope.workload import build_workload

    resolved = resolve(spec)
    workload = build_workload(resolved.builder, batch_size, torch.device("cpu"), resolved.spec)
    assert workload.meta["hf"]["task"] == task
    return workload, workload.batch()


def _stepped_and_estimated(
    workload: Any, batch: dict[str, Any], spec: str, batch_size: int, real: Any = None
) -> Any:
    """A real step on the batch, then the estimate of the same spec (of the real model
    ``real``'s parameters, when given); the report."""
    workload.loss(workload.model, **batch).backward()  # the real step runs
    report = estimate(spec, batch_size)
    assert report.workload["training"]
    if real is not None:
        assert report.workload["parameters"] == sum(p.numel() for p in real.parameters())
    return report


def test_a_decoder_classifier_without_a_pad_token_pads_with_its_end_token(tmp_path):
    """Llama for sequence classification finds each sequence's last token by its pad token
    and refuses a batch of 2 without one (a real CPU run of the same model raises too):
    the end-of-sequence token pads, as fine-tuning scripts set it, and the report says so."""
    folder = tiny_config(
        "llama-3-8b", tmp_path / "llama-cls", architectures=["LlamaForSequenceClassification"]
    )
    workload, batch = _built(f"hf:{folder}/seq=16", 2, "sequence-classification")
    assert workload.meta["hf"]["pad_token_id"] == workload.model.config.eos_token_id == 1
    report = _stepped_and_estimated(workload, batch, f"hf:{folder}/seq=16", 2)
    notes = report.extra["estimate"]["notes"]
    assert any("has no pad_token_id: token 1 (its end-of-sequence token) pads" in n for n in notes)


def test_an_encoder_decoder_classifier_gets_one_end_token_a_sequence(tmp_path):
    """BART for sequence classification reads the decoder's state at each sequence's end
    token and refuses sequences without one: the batch ends each sequence with it, as a
    tokenizer does, and has it nowhere else."""
    folder = tmp_path / "bart-cls"
    folder.mkdir()
    config = {
        "model_type": "bart", "architectures": ["BartForSequenceClassification"],
        "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "vocab_size": 64, "max_position_embeddings": 64, "eos_token_id": 2, "pad_token_id": 1,
        "bos_token_id": 0, "decoder_start_token_id": 2,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    workload, batch = _built(f"hf:{folder}/seq=16", 4, "sequence-classification")
    ids = batch["input_ids"]
    assert (ids[:, -1] == 2).all() and int((ids == 2).sum()) == 4
    _stepped_and_estimated(workload, batch, f"hf:{folder}/seq=16", 4)


@pytest.mark.parametrize(
    "arch, task, head, shapes",
    [
        ("BertForTokenClassification", "token-classification", "classifier",
         {"input_ids": (4, 16), "labels": (4, 16)}),
        ("BertForQuestionAnswering", "question-answering", "qa_outputs",
         {"input_ids": (4, 16), "start_positions": (4,), "end_positions": (4,)}),
        ("BertForMultipleChoice", "multiple-choice", "classifier",
         {"input_ids": (4, 4, 16), "labels": (4,)}),
    ],
)  # fmt: skip
def test_text_heads_are_built_as_their_architecture_names(tmp_path, arch, task, head, shapes):
    """A config naming a token classifier, a question-answering or a multiple-choice head
    is that model (not its type's masked LM): its head, its parameters, a batch of its
    shape (four choices a question), a real step, and an estimate of the same model."""
    import transformers

    folder = tiny_config("bert-base-uncased", tmp_path / task, architectures=[arch])
    workload, batch = _built(f"hf:{folder}/seq=16", 4, task)
    assert type(workload.model).__name__ == arch and hasattr(workload.model, head)
    assert {k: tuple(v.shape) for k, v in batch.items()} == shapes
    cls = getattr(transformers, arch)
    real = cls(cls.config_class.from_pretrained(folder))
    _stepped_and_estimated(workload, batch, f"hf:{folder}/seq=16", 4, real)


def test_a_head_of_another_task_is_estimated_as_its_type_and_says_so(tmp_path):
    """A config naming a head hf: does not build (a pretraining checkpoint, BERT's next
    sentence prediction) is estimated as its type's first task, and the report names both and
    how to choose: ``/task=NAME`` builds the head asked for; an unknown task is one line."""
    folder = tiny_config(
        "bert-base-uncased", tmp_path / "nsp", architectures=["BertForNextSentencePrediction"]
    )
    report = estimate(f"hf:{folder}/seq=16", 2)
    notes = report.extra["estimate"]["notes"]
    assert any(
        "names BertForNextSentencePrediction" in n and "estimated as BertForMaskedLM" in n
        for n in notes
    )
    workload, _ = _built(f"hf:{folder}/seq=16/task=token-classification", 2, "token-classification")
    assert type(workload.model).__name__ == "BertForTokenClassification"
    assert not workload.meta.get("notes")  # the head asked for: nothing to say
    with pytest.raises(WorkloadError, match="unknown task 'tagging'"):
        resolve(f"hf:{folder}/seq=16/task=tagging").builder(2, torch.device("cpu"))


def test_adapters_on_the_head_the_config_names_are_no_other_head(tiny):
    """A LoRA fine-tune wraps the causal LM the config names in peft's model: that is the
    config's head all the same, and no note says otherwise."""
    workload, _ = _built(f"hf:{tiny['llama-3-8b']}/seq=16/lora=4", 2, "causal-lm")
    assert type(workload.model).__name__.startswith("PeftModel")
    assert not any("a head hf: does not build" in n for n in workload.meta.get("notes", []))


def test_whisper_is_trained_on_log_mel_frames_and_a_transcript(tmp_path):
    """Whisper (speech-to-text) gets its fixed 3,000 log-mel frames and a transcript of 128
    tokens as labels; its real step runs, and the estimate is of the same model."""
    import transformers

    config = transformers.WhisperConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=64, max_target_positions=96,
    )  # fmt: skip
    spec = f"hf:{_saved(config, 'WhisperForConditionalGeneration', tmp_path / 'whisper')}"
    workload, batch = _built(spec, 2, "speech-seq2seq")
    # 2 frames an encoder position; the transcript at most the decoder's positions
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_features": (2, 16, 128),
        "labels": (2, 96),
    }
    real = transformers.WhisperForConditionalGeneration(config)
    _stepped_and_estimated(workload, batch, spec, 2, real)


def test_semantic_segmentation_gets_a_class_per_pixel(tmp_path):
    """Segformer for semantic segmentation (not its type's image classifier): a label per
    pixel, a real step, the same model estimated."""
    import transformers

    config = transformers.SegformerConfig(
        hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2],
        decoder_hidden_size=32, image_size=64, num_labels=5,
    )  # fmt: skip
    spec = f"hf:{_saved(config, 'SegformerForSemanticSegmentation', tmp_path / 'segformer')}"
    workload, batch = _built(spec, 2, "semantic-segmentation")
    assert tuple(batch["labels"].shape) == (2, 64, 64) and int(batch["labels"].max()) < 5
    real = transformers.SegformerForSemanticSegmentation(config)
    _stepped_and_estimated(workload, batch, spec, 2, real)


def test_object_detection_matches_queries_to_boxes_with_assumed_costs(tmp_path):
    """DETR for object detection: eight boxes an image as labels; its loss matches queries
    to boxes with scipy on the costs' numpy array, which the trace gives as zeros of their
    shape (the assignment's size does not depend on them) and names in a finding."""
    import transformers

    config = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
            out_features=["stage4"],
        ),
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=12,
        num_labels=5, image_size=64,
    )  # fmt: skip
    spec = f"hf:{_saved(config, 'DetrForObjectDetection', tmp_path / 'detr')}"
    workload, batch = _built(spec, 2, "object-detection")
    assert tuple(batch["pixel_values"].shape) == (2, 3, 64, 64)
    assert [tuple(t["boxes"].shape) for t in batch["labels"]] == [(8, 4), (8, 4)]
    real = transformers.DetrForObjectDetection(config)
    report = _stepped_and_estimated(workload, batch, spec, 2, real)
    assert any("Tensor.numpy()" in f.message for f in report.findings)


def test_a_vision_language_model_gets_as_many_image_tokens_as_its_features(tmp_path):
    """LLaVA: one image a sequence, as many image tokens as its vision tower gives features
    (a 32-pixel image in 16-pixel patches: 4, the class token dropped), counted on the meta
    device; the loss on the text alone; a real step; the same model estimated."""
    import transformers

    from vramscope.hf_models import image_tokens

    text = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=128,
    )  # fmt: skip
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=16,
    )  # fmt: skip
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_id=127)
    folder = _saved(config, "LlavaForConditionalGeneration", tmp_path / "llava")
    assert image_tokens(config, 32, 3) == 4
    workload, batch = _built(f"hf:{folder}/seq=16", 2, "image-text-to-text")
    assert (batch["input_ids"] == 127).sum(dim=1).tolist() == [4, 4]
    assert (batch["labels"] != -100).sum(dim=1).tolist() == [11, 11]
    assert tuple(batch["pixel_values"].shape) == (2, 3, 32, 32)
    real = transformers.LlavaForConditionalGeneration(config)
    _stepped_and_estimated(workload, batch, f"hf:{folder}/seq=16", 2, real)
    with pytest.raises(WorkloadError, match="cannot hold one image's 4 tokens"):
        resolve(f"hf:{folder}/seq=4").builder(2, torch.device("cpu"))


def test_a_vision_language_model_whose_tokens_cannot_be_counted_is_one_line(tmp_path):
    """Qwen2-VL's image features need the image's patch grid besides its pixels: the
    estimate stops with one line that says so and what to do."""
    import transformers

    config = transformers.Qwen2VLConfig()
    folder = _saved(config, "Qwen2VLForConditionalGeneration", tmp_path / "qwen2-vl")
    with pytest.raises(WorkloadError, match="write a build function that makes its batch"):
        resolve(f"hf:{folder}/seq=64").builder(2, torch.device("cpu"))


# ---- reading the spec -------------------------------------------------------------------------


def test_spec_options_and_modes_are_read_around_slashes_in_the_model(tmp_path):
    parsed = parse_hf("llama-1b@generate/prompt=2048/new=512/cache=static")
    assert (parsed.model, parsed.mode) == ("llama-1b", "generate")
    assert parsed.options == {"prompt": "2048", "new": "512", "cache": "static"}
    hub = parse_hf("meta-llama/Meta-Llama-3-8B@infer/seq=4096")
    assert (hub.model, hub.mode, hub.options) == (
        "meta-llama/Meta-Llama-3-8B",
        "infer",
        {"seq": "4096"},
    )
    lora = parse_hf("Qwen/Qwen2.5-7B/lora=r64/targets=q_proj,v_proj/ckpt")
    assert lora.model == "Qwen/Qwen2.5-7B" and lora.options["lora"] == "64"
    assert lora.training and "ckpt" in lora.options
    # a folder on disk is never split, even where its name looks like an option
    folder = tmp_path / "seq=8"
    folder.mkdir()
    assert parse_hf(f"{folder}/seq=32").model == str(folder)
    # the length option is rewritten for fit --seq-len
    assert parsed.with_length(96) == "hf:llama-1b@generate/prompt=96/new=512/cache=static"
    assert lora.with_length(64).endswith("/lora=64/targets=q_proj,v_proj/ckpt/seq=64")


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("hf:llama-1b/prompt=5", "/prompt is for generation"),
        ("hf:llama-1b@generate/seq=5", "not /seq"),
        ("hf:llama-1b@generate/cache=paged", "/cache takes dynamic or static"),
        ("hf:llama-1b@infer/ckpt", "@infer has none"),
        ("hf:llama-1b/lora=abc", "/lora takes a rank"),
        ("hf:llama-1b/targets=q_proj", "add /lora"),
        ("hf:llama-1b/new=0", "/new takes a whole number"),
        ("hf:llama-1b@lion", "unknown optimizer 'lion'"),
        ("hf:./no/such/config.json", "no such folder or config file"),
        ("hf:bad name!", "unknown hf model"),
    ],
)
def test_bad_specs_are_refused_before_anything_is_built(spec, needle):
    with pytest.raises(WorkloadError, match=needle.replace("(", r"\(")):
        resolve(spec)


def test_a_folder_without_a_config_is_refused(tmp_path):
    with pytest.raises(WorkloadError, match=r"has no config\.json"):
        resolve(f"hf:{tmp_path}")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "hf:some-org/some-model"], "cannot be reached (offline?)"),
        (["estimate", "hf:./missing/config.json"], "no such folder or config file"),
        (["measure", "hf:./missing"], "no such folder or config file"),
        (["estimate", f"hf:{CONFIGS / 'bert-base-uncased'}@generate"], "needs a model that"),
        (["fit", "example:gpt", "--gpu", "h100", "--seq-len"], "--seq-len searches"),
        (["fit", "hf:gpt2", "--gpu", "h100", "--seq-len", "--verify"], "drop --verify"),
        (["fit", "hf:gpt2", "--gpu", "h100", "--max-seq-len", "64"], "goes with --seq-len"),
    ],
)
def test_bad_input_on_the_command_line_is_one_line_and_exit_2(args, needle, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert_one_line_error(cli(args, capsys), needle)


def test_an_unknown_hub_id_without_a_network_is_one_line_in_a_fresh_process():
    proc = vramscope("estimate", "hf:some-org/some-model", env={"HF_HUB_OFFLINE": "1"})
    assert_one_line_error(proc, "cannot download the config of some-org/some-model")


def test_config_files_that_are_not_transformers_configs_are_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert_one_line_error(cli(["estimate", f"hf:{broken}"], capsys), "is not valid JSON")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hidden_size": 8}))
    assert_one_line_error(cli(["estimate", f"hf:{other}"], capsys), "not a transformers config")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"model_type": "no-such-type"}))
    assert_one_line_error(cli(["estimate", f"hf:{unknown}"], capsys), "transformers cannot read")


# ---- remote code -------------------------------------------------------------------------------

REMOTE_CONFIG = """
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny-remote"

    def __init__(self, width=32, vocab_size=64, **kwargs):
        self.width = width
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
"""
REMOTE_MODEL = """
import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_tiny import TinyConfig


class TinyForCausalLM(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.width)
        self.head = torch.nn.Linear(config.width, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, labels=None, **kwargs):
        logits = self.head(self.embed(input_ids))
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return CausalLMOutput(loss=loss, logits=logits)
"""


def test_remote_code_runs_only_with_trust_remote_code(tmp_path, capsys):
    folder = tmp_path / "tiny-remote"
    folder.mkdir()
    (folder / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny.py").write_text(REMOTE_MODEL)
    config = {
        "model_type": "tiny-remote",
        "architectures": ["TinyForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_tiny.TinyConfig",
            "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
        },
        "width": 32,
        "vocab_size": 64,
        "max_position_embeddings": 128,
    }
    (folder / "config.json").write_text(json.dumps(config))
    spec = f"hf:{folder}/seq=16"
    assert_one_line_error(cli(["estimate", spec, "-b", "2"], capsys), "--trust-remote-code")
    # in a process of its own: --trust-remote-code trusts for the rest of the process
    proc = vramscope("estimate", spec, "-b", "2", "--trust-remote-code", "--json", "-", "-q")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["workload"]["parameters"] == 64 * 32 + 32 * 64 + 64
    # in Python, for one call
    with pytest.raises(VramscopeError, match="--trust-remote-code"):
        estimate(spec, 2)
    assert estimate(spec, 2, trust_remote_code=True).workload["parameters"] == 4160
    with pytest.raises(VramscopeError, match="--trust-remote-code"):
        estimate(spec, 2)


# ---- LoRA -----------------------------------------------------------------------------------------


def test_lora_freezes_the_model_and_trains_the_adapters_alone(tiny):
    pytest.importorskip("peft", reason="LoRA needs peft")
    spec = resolve(f"hf:{tiny['llama-3-8b']}/lora=8/seq=16")
    workload = spec.build(2, torch.device("cpu"))
    trainable = {n: p for n, p in workload.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # PEFT's default layers for Llama: q_proj and v_proj, A (r x in) and B (out x r) each
    config = workload.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    q = 8 * config.hidden_size + config.num_attention_heads * head_dim * 8
    v = 8 * config.hidden_size + config.num_key_value_heads * head_dim * 8
    assert sum(p.numel() for p in trainable.values()) == config.num_hidden_layers * (q + v)
    optimized = {id(p) for g in workload.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for p in trainable.values()}

    report = estimate(f"hf:{tiny['llama-3-8b']}/lora=8/seq=16", 2)
    root = report.modules[0]
    adapter_bytes = sum(p.numel() for p in trainable.values()) * 4
    assert root["gradients_bytes"] < 2 * adapter_bytes
    assert root["optimizer_state_bytes"] < 4 * adapter_bytes
    assert root["parameters_bytes"] > 10 * root["gradients_bytes"]
    trained = sum(p.numel() for p in trainable.values())
    assert f"{trained:,} of {report.workload['parameters']:,} parameters train" in " ".join(
        report.extra["estimate"]["notes"]
    )


def test_compare_runs_full_fine_tuning_against_lora_and_lora_with_checkpointing(tiny):
    pytest.importorskip("peft", reason="LoRA needs peft")
    from vramscope.fit.compare import compare
    from vramscope.fit.strategies import default_strategies

    spec = f"hf:{tiny['mistral-7b']}/seq=64"
    names = default_strategies(spec)
    assert {"lora-r8", "lora-r64", "lora-r8+checkpointing"} <= set(names)
    assert "lora-r8" not in default_strategies(f"hf:{tiny['mistral-7b']}@infer")
    assert "lora-r8" not in default_strategies("example:gpt")
    report = compare(
        [spec],
        4,
        strategies=["lora-r8", "lora-r64", "lora-r8+checkpointing", "checkpointing"],
        measured=False,
    )
    rows = {r["name"]: r for r in report.extra["fit"]["strategies"]}
    assert set(rows) == {
        "baseline",
        "lora-r8",
        "lora-r64",
        "lora-r8+checkpointing",
        "checkpointing",
    }
    allocated = {name: row["peak"]["allocated_bytes"] for name, row in rows.items()}
    assert allocated["lora-r8"] < allocated["baseline"]
    assert allocated["lora-r8"] < allocated["lora-r64"]
    assert allocated["lora-r8+checkpointing"] < allocated["lora-r8"]
    # LoRA needs a transformers model that trains
    other = compare(["example:gpt"], 2, strategies=["lora-r8"], measured=False)
    skipped = {r["name"]: r.get("skipped") for r in other.extra["fit"]["strategies"]}
    assert "transformers" in skipped["lora-r8"]


# ---- generation -----------------------------------------------------------------------------


def _events(trace):
    """A trace's allocations and frees, blocks numbered by first use, with size, kind and
    stream."""
    ids: dict[int, int] = {}
    rows = []
    for event in trace.events:
        block = trace.blocks[event[1]]
        number = ids.setdefault(event[1], len(ids))
        rows.append((event[0], number, block.size, block.kind, *event[3:]))
    return rows


@pytest.mark.parametrize(
    ("name", "options", "precision"),
    [
        ("llama-3-8b", "prompt=100/new=80", "bf16-true"),
        ("t5-base", "prompt=40/new=60/cache=static", None),
    ],
)
def test_skipped_decoding_steps_are_written_exactly_as_traced(tiny, name, options, precision):
    from vramscope.estimate import generation
    from vramscope.estimate.profiles import get_profile
    from vramscope.estimate.trace import trace_workload

    spec = resolve(f"hf:{tiny[name]}@generate/{options}")
    cut = trace_workload(spec, 3, get_profile("h200"), precision=precision)
    assert any("decoding steps traced" in note for note in cut.notes)
    with mock.patch.object(generation, "_time_to_cut", lambda call: False):
        full = trace_workload(spec, 3, get_profile("h200"), precision=precision)
    assert not any("decoding steps traced" in note for note in full.notes)
    assert _events(cut) == _events(full)
    assert cut.marks == full.marks and cut.step_starts == full.step_starts


def test_generation_labels_its_kv_cache_and_runs_every_new_token(tiny):
    from vramscope.estimate.profiles import get_profile
    from vramscope.estimate.trace import trace_workload

    batch, prompt, new = 3, 50, 40
    trace = trace_workload(
        resolve(f"hf:{tiny['qwen2.5-7b']}@generate/prompt={prompt}/new={new}/cache=static"),
        batch,
        get_profile("h200"),
        precision="bf16-true",
    )
    cache = [b.size for b in trace.blocks.values() if b.kind == "kv_cache"]
    # a static cache: keys and values of every layer for every token but the last one
    # generated (it is never fed back), made once a step
    config = json.loads((tiny["qwen2.5-7b"] / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    one = batch * config["num_key_value_heads"] * (prompt + new - 1) * head_dim * 2
    layers = [size for size in cache if size > 64]
    assert set(layers) == {one}
    assert len(layers) == 2 * config["num_hidden_layers"] * 2  # two steps traced


def test_generation_is_measured_for_real_on_the_cpu(tiny):
    from vramscope.tracking.runner import measure

    report = measure(f"hf:{tiny['phi-3-mini']}@generate/prompt=12/new=5", 2, steps=1, device="cpu")
    assert report.exit.status == "ok"
    assert report.workload["training"] is False


# ---- fit --seq-len --------------------------------------------------------------------------------


def test_fit_seq_len_answers_the_longest_sequence_that_fits(tiny):
    from vramscope.fit.search import fit_sequence

    spec = f"hf:{tiny['llama-3-8b']}@infer"
    report = fit_sequence(spec, budget="100MiB", batch_size=4, max_seq_len=4096)
    section = report.extra["fit"]
    best = section["max_seq_len"]
    assert section["axis"] == "seq_len" and section["batch_size"] == 4
    assert 16 <= best < 4096 and best % 16 == 0
    points = {p["seq_len"]: p for p in section["curve"]}
    assert points[best]["fits"]
    assert all(
        not p["fits"] for n, p in points.items() if n > section["max_seq_len_without_margin"]
    )
    assert report.findings[0].message.startswith(f"Longest sequence: {best:,} tokens at batch 4; ")
    assert section["answer"] == {
        "max_seq_len": best,
        "source": "estimate",
        "real_trials": 0,
        "margin_applied": True,
    }

    capped = fit_sequence(spec, gpu="h100", batch_size=1, max_seq_len=64)
    assert capped.extra["fit"]["max_seq_len"] == 64 and capped.extra["fit"]["capped"]


def test_fit_seq_len_of_generation_searches_the_prompt_on_the_command_line(tiny, capsys):
    spec = f"hf:{tiny['llama-3-8b']}@generate/new=24"
    args = ["fit", spec, "--seq-len", "--gpu", "h100", "-b", "2", "--max-seq-len", "40"]
    proc = cli(args, capsys)
    assert proc.returncode == 0, proc.stderr
    assert (
        "Longest prompt: at least 32 + 24 new = 56 tokens at batch 2 (the search's cap, "
        "--max-seq-len)" in " ".join(proc.stdout.split())
    )
    with pytest.raises(VramscopeError, match="reads text"):
        from vramscope.fit.search import fit_sequence

        fit_sequence(f"hf:{tiny['vit-base-patch16-224']}", gpu="h100")


@pytest.mark.parametrize(
    ("spec", "task", "auto"),
    [
        ("bert-base/seq=64", "masked-lm", "AutoModelForMaskedLM"),
        (
            "bert-base/seq=64/task=sequence-classification",
            "sequence-classification",
            "AutoModelForSequenceClassification",
        ),
        (
            "gpt2/task=token-classification",
            "token-classification",
            "AutoModelForTokenClassification",
        ),
    ],
)
def test_a_built_in_name_takes_the_head_its_task_option_names(spec, task, auto):
    from vramscope.zoo import parse_hf

    _, got_task, got_auto = parse_hf(spec).config()
    assert (got_task, got_auto) == (task, auto)


def test_a_built_in_name_refuses_an_unknown_task_in_one_line():
    from vramscope.errors import WorkloadError
    from vramscope.zoo import parse_hf

    with pytest.raises(WorkloadError, match="unknown task 'nonsense'"):
        parse_hf("gpt2/task=nonsense").config()


def test_a_config_that_names_a_quantization_is_estimated_unquantized_and_says_so(tmp_path):
    """A quantized checkpoint's config.json (bitsandbytes 4-bit here): built without its
    quantization; the report says the weights would take a fraction of these bytes."""
    import json

    from transformers import LlamaConfig

    from vramscope.estimate.estimator import estimate

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256,
    ).to_dict()  # fmt: skip
    config["architectures"] = ["LlamaForCausalLM"]
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    report = estimate(f"hf:{tmp_path}/config.json/seq=32", 1)
    notes = report.extra["estimate"]["notes"]
    assert any(n.startswith("the config names a quantization (bitsandbytes, 4-bit)") for n in notes)
