"""Record, on a real GPU, four families of workspaces the estimator got short in the zoo
(issue 35), over shapes drawn from a seeded generator (the same list every run):

* ``rnn``: recurrent layers over packed sequences (``pack_padded_sequence``): LSTM, GRU and
  tanh RNN of hidden 128 to 1024, 1 to 3 layers, one or two directions, input width 64 to
  512, batch 4 to 64, random lengths, float32 and float16, training. Every allocation and
  free of the second step's forward and backward (sizes, in order) is kept, with the
  lengths, so that the reserve and the three workspaces can be read off on the CPU.
* ``pw``: 1x1 stride-1 forward convolutions of 64 to 2048 channels over 14x14 to 64x64
  positions (a ResNet's bottleneck and downsampling layers; a dilated ResNet keeps 60x60 in
  its last stages), float32 and bfloat16.
* ``mid``: the backward of inner convolutions (1x1 and 3x3, stride 1 and 2, 32 to 1280
  channels, 7x7 to 56x56, channels-first and channels-last), the data gradient and the
  weight gradient each alone, so that each pass's workspace is seen by itself.
* ``clfwd``: forwards over an image's 1 to 4 channels in channels-last.

Usage (on a machine with a CUDA GPU):

    python tests/gpu/record_workspace_sweep_2.py OUT.json.gz [SECONDS]

``extra`` (``pw``, ``mid``): the peak of allocated memory during the op, less what was
allocated before it and the op's outputs (``cudnn.benchmark`` off, as ``vramscope measure``
runs). ``SECONDS`` (default 170) bounds the run.
"""

import gzip
import json
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

torch.backends.cudnn.benchmark = False
dev = torch.device("cuda")
out_path = sys.argv[1]
budget = float(sys.argv[2]) if len(sys.argv) > 2 else 170.0
rng = random.Random(35)
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
rows = []
start = time.time()


def nbytes(t):
    return t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) else 0


# ---- recurrent layers over packed sequences -------------------------------------------------

MARK = 4096 * 512  # marker allocations (unique sizes) around the recorded calls


def history(on):
    if on:
        try:
            torch.cuda.memory._record_memory_history(
                "all", context=None, stacks="python", max_entries=400_000, clear_history=True
            )
        except TypeError:
            torch.cuda.memory._record_memory_history(
                "all", context=None, stacks="python", max_entries=400_000
            )
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def events_between(trace, first, last):
    """(action, size) of every alloc and free between the two marker allocations."""
    out, inside = [], False
    for e in trace:
        if e["action"] == "alloc" and e["size"] == first:
            inside, out = True, []
            continue
        if e["action"] == "alloc" and e["size"] == last and inside:
            return out
        if inside and e["action"] in ("alloc", "free_requested"):
            out.append([e["action"][0], e["size"], e["addr"] % (1 << 40)])
    return None


def measure_rnn(case, idx):
    cell, hidden, layers, bi, inputs, batch, steps, dt = case
    lengths = [rng.randint(max(1, steps // 4), steps) for _ in range(batch)]
    lengths[0] = steps
    module = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN}[cell]
    model = module(inputs, hidden, num_layers=layers, bidirectional=bi, batch_first=True)
    model = model.to(dev, DT[dt])
    lens = torch.tensor(lengths)

    def step():
        x = torch.randn(batch, steps, inputs, device=dev, dtype=DT[dt], requires_grad=True)
        packed = nn.utils.rnn.pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
        return x, packed

    x, packed = step()
    _, h = model(packed)
    h = h[0] if isinstance(h, tuple) else h
    h.float().sum().backward()
    del x, packed, h
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    x, packed = step()
    torch.cuda.synchronize()
    m = [MARK + (4 * idx + i) * 512 for i in range(4)]
    history(True)
    a = torch.empty(m[0], dtype=torch.uint8, device=dev)
    _, h = model(packed)
    h = h[0] if isinstance(h, tuple) else h
    loss = h.float().sum()
    b = torch.empty(m[1], dtype=torch.uint8, device=dev)
    c = torch.empty(m[2], dtype=torch.uint8, device=dev)
    loss.backward()
    d = torch.empty(m[3], dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    history(False)
    rows.append(
        {
            "kind": "rnn",
            "cell": cell,
            "hidden": hidden,
            "layers": layers,
            "bidirectional": bi,
            "inputs": inputs,
            "batch": batch,
            "steps": steps,
            "dtype": dt,
            "lengths": lengths,
            "batch_sizes": packed.batch_sizes.tolist(),
            "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "forward": events_between(trace, m[0], m[1]),
            "backward": events_between(trace, m[2], m[3]),
        }
    )
    del a, b, c, d, x, packed, h, loss, model


rnn_cases = [
    # the zoo's layer (benchmarks/zoo_layers.py:lstm_packed) first
    ("LSTM", 256, 2, True, 128, 32, 160, "fp32"),
    ("LSTM", 512, 1, False, 256, 32, 64, "fp32"),
]
for _ in range(400):
    cell = rng.choice(["LSTM", "LSTM", "GRU", "RNN"])
    hidden = rng.choice([128, 256, 256, 512, 512, 1024])
    layers = rng.choice([1, 1, 2, 2, 3])
    bi = rng.random() < 0.5
    inputs = rng.choice([64, 128, 256, 512])
    batch = rng.choice([4, 8, 16, 32, 64])
    steps = rng.choice([16, 50, 100, 160, 256])
    dt = rng.choice(["fp32", "fp32", "fp32", "fp16"])
    rnn_cases.append((cell, hidden, layers, bi, inputs, batch, steps, dt))

# ---- convolutions ---------------------------------------------------------------------------


def measure_conv(kind, xs, ws, stride, padding, groups, dt, mask, channels_last):
    x = torch.randn(xs, device=dev, dtype=DT[dt])
    w = torch.randn(ws, device=dev, dtype=DT[dt])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        y = F.conv2d(x, w, None, stride, padding, 1, groups)
    torch.cuda.synchronize()
    rec = {
        "kind": kind,
        "x": list(xs),
        "w": list(ws),
        "stride": list(stride),
        "padding": list(padding),
        "groups": groups,
        "dtype": dt,
        "cl": channels_last,
        "x_bytes": nbytes(x),
        "y_bytes": nbytes(y),
        "w_bytes": nbytes(w),
    }
    if kind in ("pw", "clfwd"):
        del y
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            y = F.conv2d(x, w, None, stride, padding, 1, groups)
        torch.cuda.synchronize()
        rec["extra"] = torch.cuda.max_memory_allocated() - base - nbytes(y)
        del y
    else:
        go = torch.randn_like(y)
        del y
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        res = torch.ops.aten.convolution_backward(
            go, x, w, None, list(stride), list(padding), [1, 1], False, [0, 0], groups, mask
        )
        torch.cuda.synchronize()
        rec["outs"] = sum(nbytes(t) for t in res)
        rec["extra"] = torch.cuda.max_memory_allocated() - base - rec["outs"]
        rec["mask"] = mask
        del res, go
    del x, w
    rows.append(rec)


conv_cases = []
# pw: 1x1 stride-1 forwards
for _ in range(500):
    ci = rng.choice([64, 128, 256, 512, 1024, 2048])
    co = rng.choice([64, 128, 256, 512, 1024, 2048])
    h = rng.choice([14, 28, 30, 56, 60, 64])
    b = rng.choice([1, 2, 4, 8, 16, 32])
    dt = rng.choice(["fp32", "fp32", "bf16"])
    if b * max(ci, co) * h * h * 4 > 1.2e9:
        continue
    conv_cases.append(("pw", (b, ci, h, h), (co, ci, 1, 1), (1, 1), (0, 0), 1, dt, None, False))
# FCN-ResNet50's four stride-1 pointwise layers of its last stage (60x60, batch 8) first
fcn = [(1024, 512), (512, 2048), (1024, 2048), (2048, 512), (512, 1024)]
head = [
    ("pw", (8, ci, 60, 60), (co, ci, 1, 1), (1, 1), (0, 0), 1, "fp32", None, False)
    for ci, co in fcn
]
# mid: backward passes of inner convolutions, each alone
for _ in range(1100):
    ci = rng.choice([32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1280])
    co = rng.choice([32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1280])
    k = rng.choice([1, 1, 3])
    s = rng.choice([1, 1, 1, 2])
    h = rng.choice([7, 8, 14, 16, 28, 56])
    b = rng.choice([1, 2, 4, 8, 16, 32, 64, 128])
    dt = rng.choice(["fp32", "fp32", "bf16"])
    cl = rng.random() < 0.25
    mask = rng.choice([[False, True, False], [True, False, False]])
    if b * max(ci, co) * h * h * 4 > 8e8:
        continue
    conv_cases.append(
        ("mid", (b, ci, h, h), (co, ci, k, k), (s, s), (k // 2, k // 2), 1, dt, mask, cl)
    )
# clfwd: forwards over an image's 1 to 4 channels in channels-last (a VAE's first layer; a
# transposed convolution's data gradient back to the image is such a forward)
for _ in range(200):
    c = rng.choice([1, 3, 3, 4])
    co = rng.choice([16, 32, 64, 96, 128, 256])
    k, s = rng.choice([(3, 1), (3, 2), (4, 2), (4, 4), (7, 2), (16, 16)])
    h = rng.choice([64, 128, 224, 256, 512])
    b = rng.choice([1, 2, 4, 8, 16, 32, 64])
    dt = rng.choice(["fp32", "fp32", "bf16"])
    if b * co * (h // s) ** 2 * 4 > 1.2e9:
        continue
    p = (k - s + 1) // 2
    conv_cases.append(("clfwd", (b, c, h, h), (co, c, k, k), (s, s), (p, p), 1, dt, None, True))
rng.shuffle(conv_cases)
conv_cases = head + conv_cases


def safe(fn, *a):
    try:
        fn(*a)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
    except Exception as e:
        rows.append({"error": repr(e)[:300], "args": repr(a)[:300]})


done = {"rnn": 0, "conv": 0}
try:
    for i, case in enumerate(rnn_cases):
        if time.time() - start > 0.45 * budget:
            break
        safe(measure_rnn, case, i)
        done["rnn"] += 1
    history(False)
    torch.cuda.empty_cache()
    for case in conv_cases:
        if time.time() - start > budget:
            break
        safe(measure_conv, *case)
        done["conv"] += 1
finally:
    with gzip.open(out_path, "wt") as f:
        json.dump(
            {
                "torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version(),
                "gpu": torch.cuda.get_device_name(),
                "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count,
                "rows": rows,
                "planned": {"rnn": len(rnn_cases), "conv": len(conv_cases)},
                "done": done,
            },
            f,
        )
print(
    len(rows),
    "rows",
    done,
    "in",
    round(time.time() - start),
    "s; errors",
    sum("error" in r for r in rows),
)
