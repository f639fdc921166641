"""A small GPT trained with DDP or FSDP2 (fully_shard) over gloo, as a user writes it; on
a GPU every rank shares cuda:0. Each rank can write its own allocator peaks at the end,
for comparison with what vramscope measured."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from vramscope.examples import ExampleGPT

parser = argparse.ArgumentParser()
parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--heavy-rank", type=int, default=-1, help="this rank keeps --heavy-mib more")
parser.add_argument("--heavy-mib", type=int, default=256)
parser.add_argument("--own-peaks", help="a folder for each rank's own peaks (rank-N.json)")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
device = torch.device("cuda", 0) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)  # two ranks, one GPU
torch.manual_seed(0)
model = ExampleGPT(vocab=8192, dim=256, layers=4, heads=4, seq=128).to(device)
if args.strategy == "ddp":
    model = DistributedDataParallel(model, device_ids=[0] if cuda else None)
else:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
kept = None
if rank == args.heavy_rank:
    kept = torch.ones(args.heavy_mib * 2**20 // 4, device=device)
generator = torch.Generator().manual_seed(rank)
for _ in range(args.steps):
    tokens = torch.randint(0, 8192, (args.batch, 129), generator=generator).to(device)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if args.own_peaks:
    own = {"rank": rank, "parameter_bytes": 0, "parameter_block_bytes": 0}
    storages = set()
    for p in model.parameters():
        local = getattr(p, "_local_tensor", p)  # FSDP2: this rank's shard
        own["parameter_bytes"] += local.numel() * local.element_size()
        storage = local.untyped_storage()
        if storage.data_ptr() not in storages:  # each storage once, as the allocator holds it
            storages.add(storage.data_ptr())
            own["parameter_block_bytes"] += -(-storage.nbytes() // 512) * 512 if cuda else 0
    if cuda:
        own["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        own["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    with open(os.path.join(args.own_peaks, f"rank-{rank}.json"), "w") as out:
        json.dump(own, out)
dist.barrier()
dist.destroy_process_group()
