"""Ways of writing a training loop, tracked on a real GPU: parameters updated by hand, a
second model of a class the first holds, models named as the script calls them, and short
steps that wait for the journal's next write."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import vramscope
from vramscope.journal.reader import read_journal
from vramscope.journal.rebuild import report_from_journal

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_attribution import assert_named_as_the_script_calls_them, two_models_rows  # noqa: E402
from test_step_bounds import sgd_by_hand  # noqa: E402

BLOCK = 512  # the caching allocator's smallest block


def _blocks(module: nn.Module) -> int:
    return sum(-(-p.numel() * p.element_size() // BLOCK) * BLOCK for p in module.parameters())


@pytest.mark.parametrize("clear", ["none", "zero_grad"])
def test_parameters_updated_by_hand_end_a_step_at_each_update(clear: str) -> None:
    """``p -= lr * p.grad`` with no optimizer: five steps of one micro-batch each, and the
    run's peak ``max_memory_allocated``'s."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    report = sgd_by_hand(clear, "cuda").report()
    assert [(s.index, s.micro_batches) for s in report.steps] == [(i, 1) for i in range(5)]
    assert report.peak.allocated_bytes == torch.cuda.max_memory_allocated()


def test_a_second_model_of_a_class_the_first_holds_is_found_with_its_weights() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    enc = nn.Sequential(nn.Linear(512, 256), nn.ReLU()).to(device)
    dec = nn.Linear(256, 512).to(device)
    opt = torch.optim.SGD([*enc.parameters(), *dec.parameters()], lr=1e-3)
    with vramscope.track(detail="modules") as session:
        for _ in range(4):
            x = torch.randn(64, 512, device=device)
            loss = nn.functional.mse_loss(dec(enc(x)), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    rows = session.report().modules
    roots = {m["class"]: m for m in rows if m["depth"] == 0 and m["class"]}
    assert sorted(roots) == ["Linear", "Sequential"]
    assert roots["Linear"]["parameters_bytes"] == _blocks(dec)
    assert roots["Sequential"]["parameters_bytes"] == _blocks(enc)


def test_each_model_is_named_as_the_script_calls_it(tmp_path: Path) -> None:
    """The CPU test's script, its tensors made on the GPU (torch's default device)."""
    prelude = "import torch\ntorch.set_default_device('cuda')\n"
    rows = two_models_rows(tmp_path, prelude)
    assert_named_as_the_script_calls_them(rows)
    assert all(m["parameters_bytes"] % BLOCK == 0 for m in rows if m["depth"] == 0)


def test_short_cuda_steps_all_reach_the_journal(tmp_path: Path) -> None:
    """Steps well under the journal's write gap: written a few at a time, every one of them
    in the journal when the session stops, and the report rebuilt from it the session's."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Linear(64, 64).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tmp_path / "short.journal"
    with vramscope.track(journal=path) as session:
        for _ in range(300):
            opt.zero_grad()
            model(torch.randn(16, 64, device=device)).sum().backward()
            opt.step()
    journal = read_journal(path)
    assert journal.intact
    rebuilt = report_from_journal(journal)
    own = session.report()
    assert sum(s.count for s in rebuilt.steps) == sum(s.count for s in own.steps) == 300
    assert rebuilt.steps == own.steps
    assert rebuilt.peak.allocated_bytes == own.peak.allocated_bytes
