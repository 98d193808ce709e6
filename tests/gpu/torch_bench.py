#!/usr/bin/env python3
"""The PyTorch side of tests/gpu/run.sh's benchmarks, timed as kiln is (a
fixed batch resident on the GPU, CUDA events around the timed steps after a
warm-up).  Prints one JSON line.

  resnet50  torchvision-equivalent ResNet-50 (v1.5; defined here, so no
            torchvision is needed), batch 256, 224x224, eager, AMP bf16
            (torch.autocast), channels_last, cudnn.benchmark, SGD momentum:
            images/s.  The model of examples/resnet50_synthetic.ini.
  matmul    torch.matmul bf16 8192^3: TFLOP/s, the rate the GEMM-heavy MLP
            step (tests/gpu/gemm_mlp.ini) is compared with.
  gpt2      GPT-2 124M as examples/gpt2_small.ini builds it (12 x 768, 12
            heads, context 1024, vocabulary 50304 with the loss over the first
            50257, lm_head tied to wte, tanh GELU), batch 8 x 1024 random
            tokens, AMP bf16, F.scaled_dot_product_attention (causal), fused
            AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1), clip 1.0;
            eager, or --compile default / max-autotune-no-cudagraphs (the
            compile's time reported apart, outside the rate): ms per step and
            the first step's loss."""
import argparse
import json
import sys

import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        s = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + s)


def resnet50(classes=1000):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def gpt2_model():
    """GPT-2 124M: bench/pytorch_gpt.py's GPT (the char GPT benchmark's model,
    kiln's layer names) in examples/gpt2_small.ini's shape."""
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    from pytorch_gpt import GPT
    return GPT(vocab=50304, ctx=1024, c=768, layers=12, heads=12)


def gpt2_step(a, dev):
    import time
    torch.backends.cuda.matmul.allow_tf32 = True
    model = gpt2_model().to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wpe" not in n and "wte" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wpe" not in n and "wte" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    fwd = model if a.compile == "none" else torch.compile(
        model, mode=None if a.compile == "default" else a.compile)
    g = torch.Generator(device="cpu").manual_seed(1)
    tok = torch.randint(0, 50257, (a.batch, 1025), generator=g).to(dev)
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(x)
        loss = nn.functional.cross_entropy(logits[..., :50257].float().reshape(-1, 50257),
                                           y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss)

    t0 = time.time()
    step()  # the first step: compiles (when asked) and warms the allocator
    torch.cuda.synchronize()
    first = time.time() - t0
    ms = timed(step, a.warmup, a.steps)
    return {"what": "gpt2 124M amp bf16 sdpa fused adamw", "compile": a.compile,
            "batch": a.batch, "first_step_s": round(first, 2), "ms_per_step": round(ms, 3),
            "tokens_per_s": round(a.batch * 1024 / ms * 1000.0, 1),
            "loss_step1": round(float(losses[0]), 5)}


def timed(step, warmup, steps):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(steps):
        step()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / steps  # ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["resnet50", "matmul", "gpt2"])
    ap.add_argument("--compile", default="none",
                    choices=["none", "default", "max-autotune-no-cudagraphs"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False"}))
        return 77
    dev = torch.device("cuda")
    torch.manual_seed(1)
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    if a.what == "gpt2":
        info.update(gpt2_step(a, dev))
    elif a.what == "matmul":
        n = 8192
        x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        ms = timed(lambda: torch.matmul(x, y), 10, a.steps)
        info.update({"what": "matmul bf16 8192^3", "ms": round(ms, 4),
                     "tflops": round(2 * n ** 3 / ms / 1e9, 2)})
    else:
        torch.backends.cudnn.benchmark = True
        model = resnet50().to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        x = torch.randn(a.batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (a.batch,), device=dev)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()

        ms = timed(step, a.warmup, a.steps)
        info.update({"what": "resnet50 eager amp bf16 channels_last cudnn.benchmark",
                     "batch": a.batch, "ms_per_step": round(ms, 3),
                     "images_per_s": round(a.batch / ms * 1000.0, 1)})
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
