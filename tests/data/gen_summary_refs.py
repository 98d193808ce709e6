#!/usr/bin/python3
"""Generate tests/data/summary_refs.txt: what torchinfo reports for the
PyTorch twins of kiln's examples (fashion_mnist_resnet.ini, _cnn.ini,
_mlp.ini), for tests/summary.sh to compare with `kiln summary`.

Every kiln layer is a module of the same name here (ReLUs and residual adds
included), so a forward hook on each gives its output shape for a 1x1x28x28
input, as torchinfo's "Output Shape" column does; a layer's parameters are
the numel of its own parameters and the total is sum(p.numel() for p in
model.parameters()), torchinfo's "Total params".  Batchnorm running stats
are buffers, not parameters (in both).  Convolutions followed by a
batchnorm have no bias, as kiln gives them none.

When the torchinfo package is importable (pip install torchinfo) the script
also runs torchinfo.summary on each model and checks that its total and its
output shapes are the ones written.  Deterministic; no data, no network.

Output lines: MODEL LAYER SHAPE PARAMS (SHAPE comma-separated), and
MODEL total - PARAMS.

Usage: /usr/bin/python3 tests/data/gen_summary_refs.py tests/data/summary_refs.txt
"""
import sys

import torch
import torch.nn as nn


class Add(nn.Module):
    def forward(self, a, b):
        return a + b


def conv_bn(m, name, cin, cout, k, stride=1, padding=0):
    setattr(m, name, nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=False))


class ResNet(nn.Module):
    """examples/fashion_mnist_resnet.ini"""

    def __init__(self):
        super().__init__()
        conv_bn(self, "stem", 1, 16, 3, padding=1)
        self.stem_bn = nn.BatchNorm2d(16)
        self.stem_relu = nn.ReLU()
        cin = 16
        for s, c in ((1, 16), (2, 32), (3, 64)):
            stride = 1 if s == 1 else 2
            conv_bn(self, f"s{s}_conv1", cin, c, 3, stride, 1)
            setattr(self, f"s{s}_bn1", nn.BatchNorm2d(c))
            setattr(self, f"s{s}_relu1", nn.ReLU())
            conv_bn(self, f"s{s}_conv2", c, c, 3, 1, 1)
            setattr(self, f"s{s}_bn2", nn.BatchNorm2d(c))
            if s > 1:
                conv_bn(self, f"s{s}_down", cin, c, 1, 2)
                setattr(self, f"s{s}_down_bn", nn.BatchNorm2d(c))
            setattr(self, f"s{s}_add", Add())
            setattr(self, f"s{s}_out", nn.ReLU())
            cin = c
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.stem_relu(self.stem_bn(self.stem(x)))
        for s in (1, 2, 3):
            g = lambda n: getattr(self, f"s{s}_{n}")
            y = g("bn2")(g("conv2")(g("relu1")(g("bn1")(g("conv1")(x)))))
            skip = g("down_bn")(g("down")(x)) if s > 1 else x
            x = g("out")(g("add")(y, skip))
        return self.fc(self.flat(self.pool(x)))


class CNN(nn.Sequential):
    """examples/fashion_mnist_cnn.ini"""

    def __init__(self):
        super().__init__()
        for name, mod in (("conv1", nn.Conv2d(1, 32, 5, padding=2)), ("relu1", nn.ReLU()),
                          ("pool1", nn.MaxPool2d(2)), ("conv2", nn.Conv2d(32, 64, 5, padding=2)),
                          ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)), ("flat", nn.Flatten()),
                          ("fc1", nn.Linear(64 * 7 * 7, 1024)), ("relu3", nn.ReLU()),
                          ("drop", nn.Dropout(0.4)), ("fc2", nn.Linear(1024, 10))):
            self.add_module(name, mod)


class MLP(nn.Sequential):
    """examples/fashion_mnist_mlp.ini"""

    def __init__(self):
        super().__init__()
        for name, mod in (("flat", nn.Flatten()), ("fc1", nn.Linear(784, 512)), ("relu1", nn.ReLU()),
                          ("fc2", nn.Linear(512, 256)), ("relu2", nn.ReLU()),
                          ("fc3", nn.Linear(256, 10))):
            self.add_module(name, mod)


def layers_of(model):
    """[(name, shape, params)] in call order, from forward hooks."""
    seen = []
    hooks = []
    for name, mod in model.named_children():
        own = sum(p.numel() for p in mod.parameters(recurse=False))
        hooks.append(mod.register_forward_hook(
            lambda m, i, o, name=name, own=own: seen.append((name, tuple(o.shape), own))))
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 1, 28, 28))
    for h in hooks:
        h.remove()
    return seen


def check_torchinfo(name, model, rows, total):
    try:
        import torchinfo
    except ImportError:
        return
    s = torchinfo.summary(model, input_size=(1, 1, 28, 28), verbose=0, depth=1)
    if s.total_params != total:
        sys.exit(f"{name}: torchinfo total_params {s.total_params} != {total}")
    shapes = [tuple(x.output_size) for x in s.summary_list if x.depth == 1]
    if shapes != [r[1] for r in rows]:
        sys.exit(f"{name}: torchinfo output shapes {shapes} differ from the hooks'")
    print(f"{name}: torchinfo {torchinfo.__version__} agrees: total_params {s.total_params}",
          file=sys.stderr)


def main(path):
    out = []
    for name, model in (("resnet", ResNet()), ("cnn", CNN()), ("mlp", MLP())):
        rows = layers_of(model)
        total = sum(p.numel() for p in model.parameters())
        check_torchinfo(name, model, rows, total)
        for layer, shape, own in rows:
            out.append(f"{name} {layer} {','.join(map(str, shape))} {own}")
        out.append(f"{name} total - {total}")
    with open(path, "w") as f:
        f.write("# MODEL LAYER SHAPE PARAMS: tests/data/gen_summary_refs.py (PyTorch "
                f"{torch.__version__.split('+')[0]}), read by tests/summary.sh\n")
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
