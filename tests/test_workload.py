from pathlib import Path

import pytest
import torch

from vramscope.errors import VramscopeError, WorkloadError
from vramscope.workload import StepRunner, normalize_precision, resolve

CPU = torch.device("cpu")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wl.py"
    path.write_text(text)
    return path


def test_example_specs_build_real_workloads():
    w = resolve("example:cnn").build(2, CPU)
    assert w.training and w.name == "example:cnn"
    loss = StepRunner(w, CPU)()
    assert loss > 0


def test_unknown_example_lists_the_known_ones():
    with pytest.raises(WorkloadError, match="cnn, gpt"):
        resolve("example:nope")


def test_missing_file_and_missing_function(tmp_path):
    with pytest.raises(WorkloadError, match="no such file"):
        resolve(str(tmp_path / "absent.py") + ":build")
    path = write(tmp_path, "def other(b, d):\n    pass\n")
    with pytest.raises(WorkloadError, match=r"has no function .build..*other"):
        resolve(f"{path}:build")


def test_build_that_raises_shows_the_users_error_and_line(tmp_path):
    path = write(tmp_path, "def build(batch_size, device):\n    raise ValueError('bad shape')\n")
    spec = resolve(f"{path}:build")
    with pytest.raises(WorkloadError) as info:
        spec.build(2, CPU)
    assert "ValueError: bad shape" in str(info.value)
    assert "wl.py:2" in str(info.value)


def test_build_must_return_a_workload(tmp_path):
    path = write(tmp_path, "def build(batch_size, device):\n    return 42\n")
    with pytest.raises(WorkloadError, match=r"returned int, not vramscope\.Workload"):
        resolve(f"{path}:build").build(1, CPU)


def test_spec_syntax_errors_are_one_line():
    with pytest.raises(WorkloadError, match=r"file\.py:function"):
        resolve("not-a-spec")


@pytest.mark.parametrize(
    ("alias", "name"), [("bf16", "bf16-mixed"), ("fp32", "32-true"), ("16-true", "16-true")]
)
def test_precision_aliases(alias, name):
    assert normalize_precision(alias) == name


def test_unknown_precision():
    with pytest.raises(VramscopeError, match="unknown precision"):
        normalize_precision("fp8")


def test_accumulation_divides_the_loss_and_steps_once():
    w = resolve("example:gpt").build(2, CPU).with_overrides(accumulate=2)
    steps = []
    w.optimizer.register_step_post_hook(lambda *a: steps.append(1))
    StepRunner(w, CPU)()
    assert steps == [1]


def test_inference_runs_without_grad():
    import torch.nn.functional as F

    from vramscope.workload import Workload

    model = torch.nn.Linear(4, 2)
    w = Workload(model=model, batch=lambda: torch.randn(3, 4), loss=lambda m, x: F.relu(m(x)))
    out = StepRunner(w, CPU).micro_batch()
    assert not out.requires_grad and not model.training
