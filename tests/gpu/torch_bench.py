#!/usr/bin/env python3
"""The PyTorch side of tests/gpu/run.sh's benchmarks, timed as kiln is (a
fixed batch resident on the GPU, CUDA events around the timed steps after a
warm-up).  Prints one JSON line.

  resnet50  torchvision-equivalent ResNet-50 (v1.5; defined here, so no
            torchvision is needed), batch 256, 224x224, eager, AMP bf16
            (torch.autocast), channels_last, cudnn.benchmark, SGD momentum:
            images/s.  The model of examples/resnet50_synthetic.ini.
  matmul    torch.matmul bf16 8192^3: TFLOP/s, the rate the GEMM-heavy MLP
            step (tests/gpu/gemm_mlp.ini) is compared with."""
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
    ap.add_argument("what", choices=["resnet50", "matmul"])
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
    if a.what == "matmul":
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
