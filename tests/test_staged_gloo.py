"""benchmarks/staged_gloo.py: two gloo ranks run the staged ops on CPU tensors (staging
forced, each tensor through a clone, as device tensors go through CPU copies), and the
values are those the ops give."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, results: dict) -> None:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    sys.path.insert(0, str(BENCHMARKS))
    import staged_gloo

    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    staged_gloo.install(cpu=True)
    got: dict[str, list] = {}
    group = dist.group.WORLD
    other = 1 - rank

    # point to point, as a pipeline's stages call them (P2POp, batch_isend_irecv)
    send = torch.full((3,), float(rank + 1))
    # a pipeline stage's receive buffer is a leaf that requires grad: the transport writes
    # into it as NCCL would, outside autograd
    received = torch.zeros(3, requires_grad=True)
    ops = [dist.P2POp(dist.isend, send, other), dist.P2POp(dist.irecv, received, other)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    got["p2p"] = received.detach().tolist()
    work = dist.isend(send * 10, other) if rank == 0 else dist.irecv(received, other)
    work.wait()
    got["isend"] = received.detach().tolist()

    # functional collectives (the _c10d_functional kernels)
    shard = torch.arange(2.0) + 10 * rank
    got["all_gather"] = funcol.all_gather_tensor(shard, 0, group).wait().tolist()
    whole = torch.arange(4.0) * (rank + 1)
    got["reduce_scatter"] = funcol.reduce_scatter_tensor(whole, "sum", 0, group).wait().tolist()
    got["all_reduce"] = funcol.all_reduce(shard, "avg", group).wait().tolist()
    rows = torch.arange(3.0).unsqueeze(1) + 100 * rank  # 3 rows: 1 sent to rank 0, 2 to 1
    out_splits = [1, 1] if rank == 0 else [2, 2]
    exchanged = funcol.all_to_all_single(rows, out_splits, [1, 2], group).wait()
    got["all_to_all"] = exchanged.flatten().tolist()
    x = torch.full((2, 2), float(rank + 1), requires_grad=True)
    y = funcol.all_to_all_single_autograd(x, [1, 1], [1, 1], group)
    (y * (rank + 1)).sum().backward()
    got["all_to_all_grad"] = x.grad.flatten().tolist()

    # the tensor collectives FSDP2 calls, asynchronous
    out = torch.empty(4)
    dist.all_gather_into_tensor(out, shard, async_op=True).wait()
    got["c10d_all_gather"] = out.tolist()
    half = torch.empty(2)
    dist.reduce_scatter_tensor(half, whole)
    got["c10d_reduce_scatter"] = half.tolist()
    got["staged"] = dict(staged_gloo.COUNTS)
    results[rank] = got
    dist.barrier()
    dist.destroy_process_group()


def test_staged_ops_give_the_values_of_the_ops():
    pytest.importorskip("torch.distributed")
    import torch.multiprocessing as mp

    port = _free_port()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank, args=(2, port, results), nprocs=2, join=True)
    zero, one = results[0], results[1]
    assert zero["p2p"] == [2.0] * 3 and one["p2p"] == [1.0] * 3
    assert one["isend"] == [10.0] * 3
    assert zero["all_gather"] == one["all_gather"] == [0.0, 1.0, 10.0, 11.0]
    # [0,1,2,3] + [0,2,4,6] = [0,3,6,9], rank 0 the first half
    assert zero["reduce_scatter"] == [0.0, 3.0] and one["reduce_scatter"] == [6.0, 9.0]
    assert zero["all_reduce"] == one["all_reduce"] == [5.0, 6.0]
    assert zero["all_to_all"] == [0.0, 100.0] and one["all_to_all"] == [1.0, 2.0, 101.0, 102.0]
    # y's rows come back to the rank that sent them, the gradient of each scaled by the
    # receiving rank: rank 0's row 0 stays (×1), its row 1 goes to rank 1 (×2)
    assert zero["all_to_all_grad"] == [1.0, 1.0, 2.0, 2.0]
    assert one["all_to_all_grad"] == [1.0, 1.0, 2.0, 2.0]
    assert zero["c10d_all_gather"] == [0.0, 1.0, 10.0, 11.0]
    assert zero["c10d_reduce_scatter"] == [0.0, 3.0] and one["c10d_reduce_scatter"] == [6.0, 9.0]
    # each through the staging, not gloo's own path for CPU tensors
    staged = zero["staged"]
    for name in ("isend", "irecv", "all_gather_into_tensor", "reduce_scatter_tensor"):
        assert staged.get(name), (name, staged)
    # all-to-all: the plain one, the autograd one and its backward
    assert staged.get("all_reduce") and staged.get("all_to_all_single") == 3
