#!/usr/bin/python3
"""Generate tests/data/layer_refs.safetensors: PyTorch references for kiln's
convolutional-network layers (read by tests/check_layers.c).

Each single-pass case is a small model, written as kiln INI text:

    [optional conv "c0" (1 -> C), or other layers feeding the layer "t"]
    -> t (the layer under test) -> flatten "flat" -> softmax_xent "loss"

run once in training mode (forward + backward) on a batch x [N, 1, H, W]
(the graph input always has one channel, so its bytes are the same in NCHW
and NHWC).  Stored per case: the INI text, x, the labels, every parameter
and buffer under its kiln name, the loss, the output y of "t" (NCHW logical
order), the input gradient dx, every parameter gradient, the batchnorm
running stats after the training pass and, for batchnorm cases, the
eval-mode output and loss computed with those updated running stats.

The "cnn5" case is a small residual CNN trained 5 SGD steps (lr 0.1,
momentum 0.9, weight_decay 1e-4) on 5 fixed batches; stored: the initial
weights, each step's batch, loss, gradients and running stats, and the
final weights and running stats.

Every case is also run in float64 from the same float32 start; the script
fails if float32 PyTorch differs from float64 by more than a quarter of the
tolerance tests/check_layers.c allows (so an implementation with another
accumulation order can meet it).

The safetensors file is written by hand (no safetensors package needed).
Deterministic: each case seeds torch with crc32(case name), one thread.

Usage: /usr/bin/python3 tests/data/gen_layer_refs.py tests/data/layer_refs.safetensors
"""
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from safetensors_io import read_safetensors, write_safetensors

# Tolerance used by tests/check_layers.c: max |got - ref| <= REL * max(FLOOR, max |ref|).
REL = 1e-4
FLOOR = 0.1

# ---- cases -----------------------------------------------------------------
#
# A layer is (name, type, opts); opts are kiln keys, written to the INI in
# the given order ("inputs" as "a, b"; "input" names one layer).  Keys not
# given take kiln's defaults, which the PyTorch side mirrors below.


def conv(name, out, kernel, **kw):
    o = {"out": out, "kernel": kernel}
    o.update(kw)
    o.setdefault("bias", 1)  # always explicit: kiln drops it before batchnorm
    return (name, "conv", o)


def c0(out):
    """The 1 -> out channel conv that makes a multi-channel input for "t"."""
    return conv("c0", out, 3, padding=1, bias=1)


# (case name, N, H, W, layers before flatten/loss; the layer under test is "t")
CASES = [
    # convolution
    ("conv_k3_n1", 1, 7, 7, [conv("t", 3, 3)]),
    ("conv_k3_p1_nobias", 3, 7, 7, [conv("t", 4, 3, padding=1, bias=0)]),
    ("conv_k5_s2_p2", 3, 13, 13, [conv("t", 2, 5, stride=2, padding=2)]),
    ("conv_k1_multi", 2, 7, 7, [c0(3), conv("t", 4, 1)]),
    ("conv_k3_s2_p1_multi", 1, 13, 13, [c0(2), conv("t", 3, 3, stride=2, padding=1)]),
    ("conv_k3_s2_p0_13", 3, 13, 13, [c0(2), conv("t", 3, 3, stride=2, bias=0)]),
    ("conv_groups2", 2, 7, 7, [c0(4), conv("t", 4, 3, padding=1, groups=2)]),
    ("conv_depthwise", 2, 7, 7, [c0(4), conv("t", 8, 3, padding=1, groups=4, bias=0)]),
    ("conv_dil2", 2, 13, 13, [c0(2), conv("t", 3, 3, padding=2, dilation=2)]),
    ("conv_dil2_s2", 1, 13, 13, [conv("t", 2, 3, stride=2, dilation=2)]),
    ("conv_k5_p2_multi", 3, 7, 7, [c0(2), conv("t", 3, 5, padding=2)]),
    ("conv_k3x5", 2, 7, 7, [c0(2), conv("t", 3, "3,5", padding=1)]),
    ("conv_pairs", 2, 9, 11, [c0(2), conv("t", 3, "3,5", stride="2,1", padding="1,2",
                                         dilation="1,2")]),
    # a 1x1 strided conv of one input channel after a trainable layer (NCHW:
    # its weight gradient reads x and dy as NHWC, the data gradient reads dy
    # blocked, so the weight gradient's kept dy is not the data gradient's)
    ("conv_k1_s2_c1_o1", 4, 12, 12, [c0(1), conv("t", 1, 1, stride=2)]),
    ("conv_k1_s2_c1_o2", 4, 12, 12, [c0(1), conv("t", 2, 1, stride=2)]),
    ("conv_k1_s2_c1_o6", 4, 12, 12, [c0(1), conv("t", 6, 1, stride=2)]),
    ("conv_k1_s2_c1_o16", 4, 12, 12, [c0(1), conv("t", 16, 1, stride=2)]),
    ("conv_k1_s2_c1_o32", 4, 12, 12, [c0(1), conv("t", 32, 1, stride=2)]),
    ("conv_k1_s2_c1_o48", 4, 12, 12, [c0(1), conv("t", 48, 1, stride=2)]),
    # a first layer whose dy is already the weight gradient's layout (1x1
    # output): it keeps no dy copy
    ("conv_k1_d2_1x1", 4, 1, 1, [conv("t", 6, 1, dilation=2, bias=0)]),
    # batch normalisation (2-d: after a linear; 4-d: after a conv)
    ("bn4d", 3, 7, 7, [c0(3), ("t", "batchnorm", {})]),
    ("bn4d_eps_mom", 2, 5, 5, [c0(4), ("t", "batchnorm", {"eps": 0.001, "momentum": 0.3})]),
    ("bn2d", 6, 3, 3, [("f", "flatten", {}), ("fc", "linear", {"out": 5}),
                       ("t", "batchnorm", {})]),
    # pooling
    ("maxpool_k2", 2, 7, 7, [("t", "maxpool", {"kernel": 2})]),
    ("maxpool_k2_s1_multi", 2, 7, 7, [c0(2), ("t", "maxpool", {"kernel": 2, "stride": 1})]),
    ("maxpool_k3_s1_p1", 2, 7, 7, [c0(2), ("t", "maxpool", {"kernel": 3, "stride": 1,
                                                            "padding": 1})]),
    ("maxpool_k3_s2_p1", 1, 13, 13, [c0(3), ("t", "maxpool", {"kernel": 3, "stride": 2,
                                                              "padding": 1})]),
    ("maxpool_k2_p1", 2, 7, 7, [("t", "maxpool", {"kernel": 2, "padding": 1})]),
    ("maxpool_pairs", 2, 7, 9, [c0(2), ("t", "maxpool", {"kernel": "3,2", "stride": "2,1",
                                                          "padding": "1,0"})]),
    ("avgpool_k2", 2, 7, 7, [c0(2), ("t", "avgpool", {"kernel": 2})]),
    ("avgpool_k3_s1", 2, 7, 7, [("t", "avgpool", {"kernel": 3, "stride": 1})]),
    ("avgpool_k3_s2_p1_incl", 2, 13, 13, [c0(2), ("t", "avgpool", {
        "kernel": 3, "stride": 2, "padding": 1, "count_include_pad": 1})]),
    ("avgpool_k3_s2_p1_excl", 2, 13, 13, [c0(2), ("t", "avgpool", {
        "kernel": 3, "stride": 2, "padding": 1, "count_include_pad": 0})]),
    ("avgpool_k2_s1_p1_excl", 2, 7, 7, [("t", "avgpool", {
        "kernel": 2, "stride": 1, "padding": 1, "count_include_pad": 0})]),
    ("avgpool_pairs_excl", 2, 7, 9, [c0(2), ("t", "avgpool", {
        "kernel": "3,2", "stride": "2,1", "padding": "1,0", "count_include_pad": 0})]),
    ("global_avgpool", 3, 7, 7, [c0(4), ("t", "global_avgpool", {})]),
    # activations (elementwise, on the input directly and after a conv)
    ("relu", 2, 5, 5, [("t", "relu", {})]),
    ("relu_multi", 2, 5, 5, [c0(3), ("t", "relu", {})]),
    ("leaky_relu", 2, 5, 5, [("t", "leaky_relu", {})]),
    ("leaky_relu_02", 2, 5, 5, [c0(2), ("t", "leaky_relu", {"negative_slope": 0.2})]),
    ("gelu", 2, 5, 5, [("t", "gelu", {})]),
    ("sigmoid", 2, 5, 5, [("t", "sigmoid", {})]),
    ("tanh", 2, 5, 5, [c0(2), ("t", "tanh", {})]),
    # joins: two branches from a common conv
    ("add", 2, 7, 7, [c0(3), conv("a", 2, 3, padding=1, input="c0"),
                      conv("b", 2, 1, input="c0"), ("t", "add", {"inputs": "a, b"})]),
    ("add_residual", 2, 7, 7, [c0(3), conv("a", 3, 3, padding=1),
                               ("t", "add", {"inputs": "a, c0"})]),
    ("concat", 2, 7, 7, [c0(3), conv("a", 2, 3, padding=1, input="c0"),
                         conv("b", 3, 1, input="c0"), ("t", "concat", {"inputs": "a, b"})]),
    # linear and flatten on 4-d inputs (flattened in C, H, W order)
    ("linear4d", 3, 5, 5, [("t", "linear", {"out": 6})]),
    ("linear4d_multi", 3, 5, 5, [c0(3), ("t", "linear", {"out": 6})]),
    ("flatten_multi", 2, 5, 5, [c0(3), ("t", "flatten", {}), ("fc", "linear", {"out": 7})]),
]

CNN5 = [
    conv("c1", 4, 3, padding=1, bias=0),
    ("bn1", "batchnorm", {}),
    ("r1", "relu", {}),
    conv("c2", 4, 3, padding=1, bias=1),
    ("bn2", "batchnorm", {}),
    ("add", "add", {"inputs": "bn2, r1"}),
    ("r2", "relu", {}),
    ("pool", "maxpool", {"kernel": 2}),
    ("flat", "flatten", {}),
    ("fc", "linear", {"out": 10}),
    ("loss", "softmax_xent", {}),
]
CNN5_N, CNN5_H, CNN5_W, CNN5_STEPS = 4, 8, 8, 5
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4

# ---- INI text --------------------------------------------------------------


def ini_text(layers, extra=""):
    out = []
    for name, typ, opts in layers:
        out.append("[layer.%s]\ntype = %s\n" % (name, typ))
        for k, v in opts.items():
            out.append("%s = %s\n" % (k, v))
    return "".join(out) + extra


def full_layers(layers):
    return layers + [("flat", "flatten", {}), ("loss", "softmax_xent", {})]


# ---- a tiny interpreter of the layer list in PyTorch ------------------------


def pair(v):
    if isinstance(v, str):
        a = [int(s) for s in v.split(",")]
        return (a[0], a[1]) if len(a) == 2 else (a[0], a[0])
    return (int(v), int(v))


def uniform(shape, bound):
    return (torch.rand(shape, dtype=torch.float32) * 2 - 1) * bound


class Net:
    """params: name -> tensor (trainable); buffers: name -> tensor."""

    def __init__(self, layers):
        self.layers = layers
        self.params = {}
        self.buffers = {}
        self.order = []   # parameter and buffer names, in creation order

    def _param(self, create, name, make, buffer=False):
        store = self.buffers if buffer else self.params
        if create and name not in store:
            store[name] = make()
            self.order.append(name)
        return store[name]

    def forward(self, x, P, B, training, create=False, dtype=torch.float32):
        """Run the layers; P, B: parameter and buffer dicts used (already in
        dtype).  Returns (outputs by layer name, last output)."""
        outs = {}
        prev = x
        n = x.shape[0]
        for name, typ, o in self.layers:
            if "inputs" in o:
                ins = [outs[s.strip()] for s in o["inputs"].split(",")]
            elif "input" in o:
                ins = [outs[o["input"]]]
            else:
                ins = [prev]
            h = ins[0]
            if typ == "conv":
                kh, kw = pair(o["kernel"])
                g = int(o.get("groups", 1))
                cin = h.shape[1]
                bound = 1.0 / np.sqrt(cin // g * kh * kw)
                if create:
                    self._param(True, name + ".weight",
                                lambda: uniform((o["out"], cin // g, kh, kw), bound))
                    if o["bias"]:
                        self._param(True, name + ".bias", lambda: uniform((o["out"],), bound))
                    P = self.params if P is None else P
                w = P[name + ".weight"]
                b = P[name + ".bias"] if o["bias"] else None
                y = F.conv2d(h, w, b, stride=pair(o.get("stride", 1)),
                             padding=pair(o.get("padding", 0)),
                             dilation=pair(o.get("dilation", 1)), groups=g)
            elif typ == "batchnorm":
                c = h.shape[1]
                if create:
                    self._param(True, name + ".weight", lambda: torch.rand(c) + 0.5)
                    self._param(True, name + ".bias", lambda: torch.rand(c) - 0.5)
                    self._param(True, name + ".running_mean",
                                lambda: torch.randn(c) * 0.2, buffer=True)
                    self._param(True, name + ".running_var",
                                lambda: torch.rand(c) + 0.5, buffer=True)
                    P = self.params if P is None else P
                    B = self.buffers if B is None else B
                y = F.batch_norm(h, B[name + ".running_mean"], B[name + ".running_var"],
                                 P[name + ".weight"], P[name + ".bias"], training,
                                 float(o.get("momentum", 0.1)), float(o.get("eps", 1e-5)))
            elif typ in ("maxpool", "avgpool"):
                k = pair(o["kernel"])
                s = pair(o.get("stride", o["kernel"]))
                p = pair(o.get("padding", 0))
                if typ == "maxpool":
                    y = F.max_pool2d(h, k, s, p)
                else:
                    y = F.avg_pool2d(h, k, s, p,
                                     count_include_pad=bool(o.get("count_include_pad", 1)))
            elif typ == "global_avgpool":
                y = h.mean(dim=(2, 3), keepdim=True)
            elif typ == "relu":
                y = F.relu(h)
            elif typ == "leaky_relu":
                y = F.leaky_relu(h, float(o.get("negative_slope", 0.01)))
            elif typ == "gelu":
                y = F.gelu(h)  # exact (erf)
            elif typ == "sigmoid":
                y = torch.sigmoid(h)
            elif typ == "tanh":
                y = torch.tanh(h)
            elif typ == "add":
                y = ins[0] + ins[1]
            elif typ == "concat":
                y = torch.cat(ins, dim=1)
            elif typ == "flatten":
                y = h.reshape(n, -1)
            elif typ == "linear":
                h = h.reshape(n, -1)
                bound = 1.0 / np.sqrt(h.shape[1])
                if create:
                    self._param(True, name + ".weight",
                                lambda: uniform((o["out"], h.shape[1]), bound))
                    self._param(True, name + ".bias", lambda: uniform((o["out"],), bound))
                    P = self.params if P is None else P
                y = F.linear(h, P[name + ".weight"], P[name + ".bias"])
            elif typ == "softmax_xent":
                y = h  # the logits; the loss is taken by the caller
            else:
                raise ValueError(typ)
            outs[name] = y
            prev = y
        return outs, prev

    def init(self, x):
        """Create the parameters by running once (float32, no grad)."""
        with torch.no_grad():
            self.forward(x, None, None, False, create=True)

    def names(self, buffers):
        return [k for k in self.order if (k in self.buffers) == buffers]


def leaves(d, dtype, grad):
    return {k: v.detach().clone().to(dtype).requires_grad_(grad) for k, v in d.items()}


def arr(t, dtype=np.float32):
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(dtype))


def tol_ok(got, ref):
    """got float32 tensor vs ref float64 tensor: error / allowed."""
    got = got.detach().double()
    ref = ref.detach().double()
    if got.numel() == 0:
        return 0.0
    allowed = REL * max(FLOOR, ref.abs().max().item())
    return (got - ref).abs().max().item() / allowed


# ---- single-pass cases ------------------------------------------------------


def run_case(net, x, labels, dtype, training=True):
    P = leaves(net.params, dtype, training)
    B = leaves(net.buffers, dtype, False)
    xx = x.detach().clone().to(dtype).requires_grad_(training)
    outs, logits = net.forward(xx, P, B, training)
    loss = F.cross_entropy(logits, labels)
    res = {"loss": loss, "y": outs["t"], "B": B}
    if training:
        loss.backward()
        res["dx"] = xx.grad
        res["grads"] = {k: v.grad for k, v in P.items()}
    return res


def gen_case(name, n, h, w, layers, tensors, meta):
    torch.manual_seed(zlib.crc32(name.encode()))
    x = torch.randn(n, 1, h, w, dtype=torch.float32)
    net = Net(full_layers(layers))
    net.init(x)
    with torch.no_grad():
        _, logits = net.forward(x, net.params, {k: v.clone() for k, v in net.buffers.items()},
                                False)
    k = logits.shape[1]
    labels = torch.randint(0, k, (n,))

    r32 = run_case(net, x, labels, torch.float32)
    r64 = run_case(net, x, labels, torch.float64)
    worst = [("loss", tol_ok(r32["loss"], r64["loss"])), ("y", tol_ok(r32["y"], r64["y"])),
             ("dx", tol_ok(r32["dx"], r64["dx"]))]
    worst += [("grad " + p, tol_ok(r32["grads"][p], r64["grads"][p])) for p in net.params]
    worst += [("stat " + b, tol_ok(r32["B"][b], r64["B"][b])) for b in net.buffers]

    meta[name + ".ini"] = ini_text(full_layers(layers))
    pre = name + "/"
    tensors.append((pre + "x", arr(x)))
    tensors.append((pre + "labels", arr(labels, np.int32)))
    for p in net.order:
        src = net.params.get(p, net.buffers.get(p))
        tensors.append((pre + "param/" + p, arr(src)))
    lm = r32["loss"].item()
    tensors.append((pre + "loss", np.array([lm * n, lm], dtype=np.float32)))
    tensors.append((pre + "y", arr(r32["y"])))
    tensors.append((pre + "dx", arr(r32["dx"])))
    for p in net.names(False):
        tensors.append((pre + "grad/" + p, arr(r32["grads"][p])))
    for b in net.names(True):
        tensors.append((pre + "after/" + b, arr(r32["B"][b])))

    if net.buffers:
        # evaluation with the running stats the training pass left
        def eval_with(dtype, r):
            saved = net.buffers
            net.buffers = r["B"]
            with torch.no_grad():
                e = run_case(net, x, labels, dtype, training=False)
            net.buffers = saved
            return e
        e32 = eval_with(torch.float32, r32)
        e64 = eval_with(torch.float64, r64)
        worst += [("eval loss", tol_ok(e32["loss"], e64["loss"])),
                  ("eval y", tol_ok(e32["y"], e64["y"]))]
        le = e32["loss"].item()
        tensors.append((pre + "eval_loss", np.array([le * n, le], dtype=np.float32)))
        tensors.append((pre + "eval_y", arr(e32["y"])))

    what, ratio = max(worst, key=lambda t: t[1])
    sys.stderr.write("%-24s f32 vs f64: worst %.3f of the tolerance (%s)\n" % (name, ratio, what))
    assert ratio < 0.25, (name, what, ratio)


# ---- cnn5: five SGD steps ----------------------------------------------------


def train_cnn5(net, xs, ys, dtype):
    P = leaves(net.params, dtype, True)
    B = leaves(net.buffers, dtype, False)
    order = net.names(False)
    opt = torch.optim.SGD([P[p] for p in order], lr=LR, momentum=MOMENTUM,
                          weight_decay=WEIGHT_DECAY, nesterov=False)
    steps = []
    for k in range(CNN5_STEPS):
        opt.zero_grad()
        _, logits = net.forward(xs[k].to(dtype), P, B, True)
        loss = F.cross_entropy(logits, ys[k])
        loss.backward()
        steps.append({"loss": loss.detach().clone(),
                      "grads": {p: P[p].grad.detach().clone() for p in order},
                      "stats": {b: B[b].detach().clone() for b in B}})
        opt.step()
    return steps, P, B


def gen_cnn5(tensors, meta):
    name = "cnn5"
    torch.manual_seed(zlib.crc32(name.encode()))
    xs = [torch.randn(CNN5_N, 1, CNN5_H, CNN5_W) for _ in range(CNN5_STEPS)]
    ys = [torch.randint(0, 10, (CNN5_N,)) for _ in range(CNN5_STEPS)]
    net = Net(CNN5)
    net.init(xs[0])
    # PyTorch's defaults for the batchnorm affine parameters and buffers
    for p in net.order:
        if p.startswith("bn"):
            store = net.buffers if p in net.buffers else net.params
            fill = 1.0 if p.endswith((".weight", ".running_var")) else 0.0
            store[p] = torch.full_like(store[p], fill)

    s32, p32, b32 = train_cnn5(net, xs, ys, torch.float32)
    s64, p64, b64 = train_cnn5(net, xs, ys, torch.float64)
    worst = []
    for k in range(CNN5_STEPS):
        worst.append(("loss%d" % k, tol_ok(s32[k]["loss"], s64[k]["loss"])))
        for p in s32[k]["grads"]:
            worst.append(("grad%d %s" % (k, p), tol_ok(s32[k]["grads"][p], s64[k]["grads"][p])))
        for b in s32[k]["stats"]:
            worst.append(("stats%d %s" % (k, b), tol_ok(s32[k]["stats"][b], s64[k]["stats"][b])))
    for p in p32:
        worst.append(("final " + p, tol_ok(p32[p], p64[p])))
    what, ratio = max(worst, key=lambda t: t[1])
    sys.stderr.write("%-24s f32 vs f64: worst %.3f of the tolerance (%s)\n" % (name, ratio, what))
    assert ratio < 0.25, (name, what, ratio)

    meta[name + ".ini"] = ini_text(CNN5, "[train]\nlr = %g\nmomentum = %g\nweight_decay = %g\n"
                                   % (LR, MOMENTUM, WEIGHT_DECAY))
    meta[name + ".steps"] = str(CNN5_STEPS)
    meta[name + ".lr"] = "%g" % LR
    pre = name + "/"
    for p in net.order:
        src = net.params.get(p, net.buffers.get(p))
        tensors.append((pre + "param/" + p, arr(src)))
    for k in range(CNN5_STEPS):
        tensors.append((pre + "x%d" % k, arr(xs[k])))
        tensors.append((pre + "labels%d" % k, arr(ys[k], np.int32)))
        lm = s32[k]["loss"].item()
        tensors.append((pre + "loss%d" % k, np.array([lm * CNN5_N, lm], dtype=np.float32)))
        for p in net.names(False):
            tensors.append((pre + "grad%d/%s" % (k, p), arr(s32[k]["grads"][p])))
        for b in net.names(True):
            tensors.append((pre + "stats%d/%s" % (k, b), arr(s32[k]["stats"][b])))
    for p in net.names(False):
        tensors.append((pre + "final/" + p, arr(p32[p])))
    for b in net.names(True):
        tensors.append((pre + "final/" + b, arr(b32[b])))


# ---- safetensors -------------------------------------------------------------


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: %s OUT.safetensors\n" % sys.argv[0])
        return 2
    out_path = sys.argv[1]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    tensors = []
    metadata = {"generator": "tests/data/gen_layer_refs.py", "torch": torch.__version__,
                "tolerance": "max|got-ref| <= %g * max(%g, max|ref|)" % (REL, FLOOR),
                "cases": ",".join(c[0] for c in CASES)}
    for name, n, h, w, layers in CASES:
        gen_case(name, n, h, w, layers, tensors, metadata)
    gen_cnn5(tensors, metadata)
    write_safetensors(out_path, tensors, metadata)

    back, meta = read_safetensors(out_path)
    assert meta == metadata
    assert set(back) == {n for n, _ in tensors}
    for name, a in tensors:
        got = back[name]
        assert got.shape == a.shape and got.dtype.kind == a.dtype.kind, name
        assert np.array_equal(got, a), name
    return 0


if __name__ == "__main__":
    sys.exit(main())
