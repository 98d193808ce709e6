#!/usr/bin/python3
"""Generate tests/data/optim_refs.safetensors: PyTorch references for kiln's
fused optimizers (KILN_OP_SGD, KILN_OP_ADAMW, KILN_OP_LAMB; kiln's adam is
KILN_OP_ADAMW with its L2 weight decay f[4]; SGD's dampening is f[3] and
amsgrad ADAMW's i[1], ABI 2.29).

Three parameter tensors, named as kiln names the model of metadata
`model.ini` (fc1.weight [4,6], fc1.bias [4], fc2.weight [3,4]), start from the
same values in every case and take 5 steps (metadata `steps`; a case's own
count is `<case>.steps`: 20 for the session-43 cases) with the same
gradients (`grad<k>/<name>`, 20 of them: the 15 after the first 5 shrink,
x0.85 a step, so that a second moment falls below its running maximum).
Each case stores the parameters after every step.  The learning rate changes
from step to step (the base lr times LR_FACTORS), so a kernel that read the
lr once, at prepare, would fail.

Cases (metadata `cases`; `<case>.ini` is the kiln [train] section):
  sgd           torch.optim.SGD(momentum=0.9, weight_decay=0.01)
  sgd_nesterov  the same with nesterov=True
  sgdw          SGD with decoupled weight decay (SGDW): p *= 1 - lr*wd, then
                torch.optim.SGD(momentum=0.9, weight_decay=0) steps
  adamw         torch.optim.AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
  adamw_nodecay the same with fc1.bias in a group of weight_decay=0
  lamb          LAMB, the reference below, weight_decay=0.01
  lamb_nodecay  the same with no weight decay on fc1.bias
  adam          torch.optim.Adam(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
                coupled (L2) weight decay, g + wd*p before the moments
  adam_nodecay  the same with fc1.bias in a group of weight_decay=0
(adam and adam_nodecay came in session 42, appended: the draws and every
earlier case's tensors are the same bytes as before.)
Session 43, 20 steps each (appended the same way: the 15 later gradients
are drawn after the first 5, and every earlier tensor is the same bytes):
  sgd_dampening torch.optim.SGD(momentum=0.9, dampening=0.5, weight_decay=0.01):
                the first step's buffer is the gradient, undamped
  sgd_dampening_nodecay  the same with fc1.bias in a group of weight_decay=0
                (kiln's op reads the step count as in2, the multiplier as in3)
  adam_amsgrad  torch.optim.Adam(betas=(0.9, 0.9), eps=1e-8, weight_decay=0.01,
                amsgrad=True), fc1.bias in a group of weight_decay=0
  adamw_amsgrad torch.optim.AdamW(betas=(0.9, 0.9), eps=1e-8, weight_decay=0.01,
                amsgrad=True)
beta2 = 0.9 so that the second moment falls below its maximum within the 20
steps; the script fails unless each of these cases ends at least 1e-3
(relative, a hundred times check_optim's tolerance) away from the same run
with dampening 0 / amsgrad off, so a kiln that ignored the option fails
check_optim.

LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning",
Algorithm 2, phi = identity; the trust ratio is applied to every tensor, as
NVIDIA apex FusedLAMB with use_nvlamb=True, and there is no gradient-norm
clipping), per parameter tensor p with gradient g at step t (1-based):
  m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
  m_hat = m / (1 - beta1^t);  v_hat = v / (1 - beta2^t)
  u = m_hat / (sqrt(v_hat) + eps) + wd*p
  r = ||p|| / ||u||, or 1 when either norm is 0
  p = p - lr * r * u

Every case also runs in float64 from the same float32 start; the script
fails if float32 PyTorch is off from it by more than 1e-6 relative (a tenth
of check_optim's tolerance) and prints the ratio.

The safetensors file is written by hand (no safetensors package needed).
Deterministic: seed 0, one thread, no network, no dataset.

Usage: /usr/bin/python3 tests/data/gen_optim_refs.py tests/data/optim_refs.safetensors
"""
import sys

import numpy as np
import torch

from safetensors_io import read_safetensors, write_safetensors

STEPS = 5
LONG_STEPS = 20  # the session-43 cases, and the gradients drawn
LR_FACTORS = (1.0, 0.5, 0.25, 0.75, 0.1, 0.5, 0.9, 0.3, 1.0, 0.6, 0.2, 0.8, 0.4, 0.7, 0.15,
              0.95, 0.35, 0.55, 0.25, 0.65)
SHRINK = 0.85  # gradient k >= STEPS is drawn, then scaled by SHRINK^(k - STEPS + 1)
SHAPES = (("fc1.weight", (4, 6)), ("fc1.bias", (4,)), ("fc2.weight", (3, 4)))
MODEL_INI = ("[layer.fc1]\ntype = linear\nout = 4\n[layer.r]\ntype = relu\n"
             "[layer.fc2]\ntype = linear\nout = 3\nbias = 0\n"
             "[layer.loss]\ntype = softmax_xent\n")
SAMPLE = 6  # fc1's input features
WD = 0.01

# name: (optimizer, base lr, extra kiln keys, no_decay)
CASES = {
    "sgd": ("sgd", 0.1, "momentum = 0.9\nnesterov = 0\n", False),
    "sgd_nesterov": ("sgd", 0.1, "momentum = 0.9\nnesterov = 1\n", False),
    "sgdw": ("sgdw", 0.1, "momentum = 0.9\nweight_decay_mode = decoupled\n", False),
    "adamw": ("adamw", 0.01, "beta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n", False),
    "adamw_nodecay": ("adamw", 0.01, "beta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n", True),
    "lamb": ("lamb", 0.01, "beta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n", False),
    "lamb_nodecay": ("lamb", 0.01, "beta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n", True),
    "adam": ("adam", 0.01, "beta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n", False),
    "adam_nodecay": ("adam", 0.01, "beta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n", True),
    "sgd_dampening": ("sgd", 0.1, "momentum = 0.9\ndampening = 0.5\nnesterov = 0\n", False),
    "sgd_dampening_nodecay": ("sgd", 0.1, "momentum = 0.9\ndampening = 0.5\nnesterov = 0\n",
                              True),
    "adam_amsgrad": ("adam", 0.01, "beta1 = 0.9\nbeta2 = 0.9\neps = 1e-8\namsgrad = 1\n", True),
    "adamw_amsgrad": ("adamw", 0.01, "beta1 = 0.9\nbeta2 = 0.9\neps = 1e-8\namsgrad = 1\n",
                      False),
}
# the session-43 cases: LONG_STEPS steps each
LONG = ("sgd_dampening", "sgd_dampening_nodecay", "adam_amsgrad", "adamw_amsgrad")


def case_steps(name):
    return LONG_STEPS if name in LONG else STEPS


def key_value(keys, key, default):
    """The value of `key = v` in a case's kiln keys, as a float."""
    for line in keys.splitlines():
        k, _, v = line.partition("=")
        if k.strip() == key:
            return float(v)
    return default


class Lamb(torch.optim.Optimizer):
    """The reference LAMB of the module docstring, one tensor at a time."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v, g = state["m"], state["v"], p.grad
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = m / (1 - beta1 ** t)
                v_hat = v / (1 - beta2 ** t)
                u = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                w_norm, u_norm = p.norm(), u.norm()
                ratio = (w_norm / u_norm).item() if w_norm > 0 and u_norm > 0 else 1.0
                p.add_(u, alpha=-group["lr"] * ratio)


def make_optimizer(name, params, plain=False):
    """params: dict name -> tensor.  Returns (optimizer, pre-step hook).
    plain: without the case's dampening and amsgrad (the run the case must
    differ from)."""
    kind, lr, keys, nodecay = CASES[name]
    damp = 0.0 if plain else key_value(keys, "dampening", 0.0)
    amsgrad = not plain and key_value(keys, "amsgrad", 0) == 1
    betas = (key_value(keys, "beta1", 0.9), key_value(keys, "beta2", 0.999))
    if nodecay:
        groups = [{"params": [t for n, t in params.items() if not n.endswith(".bias")]},
                  {"params": [t for n, t in params.items() if n.endswith(".bias")],
                   "weight_decay": 0.0}]
    else:
        groups = [{"params": list(params.values())}]
    pre = None
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, dampening=damp, weight_decay=WD,
                               nesterov="nesterov = 1" in keys), pre
    if kind == "sgdw":
        opt = torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=0.0)

        def pre(o):  # decoupled decay of the weights before the step
            with torch.no_grad():
                for group in o.param_groups:
                    for p in group["params"]:
                        p.mul_(1 - group["lr"] * WD)
        return opt, pre
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8,
                                 weight_decay=WD, amsgrad=amsgrad), pre
    if kind == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=1e-8,
                                weight_decay=WD, amsgrad=amsgrad), pre
    if kind == "lamb":
        return Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD), pre
    raise ValueError(kind)


def step_lr(name, k):
    """The lr of step k, rounded to float32 as kiln's device lr is."""
    return float(np.float32(CASES[name][1] * LR_FACTORS[k]))


def run_case(name, init, grads, dtype, plain=False):
    """Params after each step: list (steps) of dict name -> tensor."""
    params = {n: init[n].to(dtype).clone().requires_grad_(True) for n, _ in SHAPES}
    opt, pre = make_optimizer(name, params, plain)
    out = []
    for k in range(case_steps(name)):
        for group in opt.param_groups:
            group["lr"] = step_lr(name, k)
        for n, _ in SHAPES:
            params[n].grad = grads[k][n].to(dtype).clone()
        if pre:
            pre(opt)
        opt.step()
        out.append({n: params[n].detach().clone() for n, _ in SHAPES})
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    init = {n: torch.randn(s) * 0.5 for n, s in SHAPES}
    grads = [{n: torch.randn(s) * 0.3 for n, s in SHAPES} for _ in range(STEPS)]
    # (drawn after the first STEPS: those and every earlier tensor unchanged)
    grads += [{n: torch.randn(s) * (0.3 * SHRINK ** (k - STEPS + 1)) for n, s in SHAPES}
              for k in range(STEPS, LONG_STEPS)]
    tensors = [("init/" + n, init[n].numpy()) for n, _ in SHAPES]
    for k in range(LONG_STEPS):
        tensors += [("grad%d/%s" % (k, n), grads[k][n].numpy()) for n, _ in SHAPES]
    meta = {"generator": "tests/data/gen_optim_refs.py", "torch": torch.__version__,
            "model.ini": MODEL_INI, "sample": str(SAMPLE), "steps": str(STEPS),
            "params": ",".join(n for n, _ in SHAPES), "cases": ",".join(CASES)}
    worst = 0.0
    for name, (kind, lr, keys, nodecay) in CASES.items():
        f32 = run_case(name, init, grads, torch.float32)
        f64 = run_case(name, init, grads, torch.float64)
        ini = "[train]\noptimizer = %s\nweight_decay = %g\n%s" % (
            "sgd" if kind == "sgdw" else kind, WD, keys)
        if nodecay:
            ini += "no_decay = *.bias\n"
        meta[name + ".ini"] = ini
        steps = case_steps(name)
        meta[name + ".steps"] = str(steps)
        meta[name + ".lr"] = " ".join(repr(step_lr(name, k)) for k in range(steps))
        if name in LONG:
            # the option must matter: the plain run ends elsewhere
            plain = run_case(name, init, grads, torch.float32, plain=True)[-1]
            apart = max(((plain[n] - f32[-1][n]).abs().max() / f32[-1][n].abs().max()).item()
                        for n, _ in SHAPES)
            print("%-14s vs dampening 0 / amsgrad off: max relative %.2e" % (name, apart))
            if apart < 1e-3:
                sys.exit("%s: only %.2e away from the run without its option" % (name, apart))
        case_worst = 0.0
        for k in range(steps):
            for n, _ in SHAPES:
                a, b = f32[k][n].double(), f64[k][n]
                rel = ((a - b).abs().max() / b.abs().max()).item()
                case_worst = max(case_worst, rel)
                tensors.append(("%s/step%d/%s" % (name, k, n), f32[k][n].numpy()))
        print("%-14s float32 vs float64: max relative %.2e" % (name, case_worst))
        worst = max(worst, case_worst)
    if worst > 1e-6:
        sys.exit("float32 PyTorch is off from float64 by %.2e (> 1e-6)" % worst)
    write_safetensors(sys.argv[1], tensors, meta)
    back, meta_back = read_safetensors(sys.argv[1])
    assert meta_back == meta
    for name, arr in tensors:
        assert np.array_equal(back[name], arr), name
    print("wrote %s: %d tensors" % (sys.argv[1], len(tensors)))

if __name__ == "__main__":
    main()
