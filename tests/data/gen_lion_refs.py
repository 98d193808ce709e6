#!/usr/bin/python3
"""Generate tests/data/lion_refs.safetensors: the PyTorch reference for the
example optimizer plugin examples/plugins/lion.c, in the layout of
optim_refs.safetensors (gen_optim_refs.py, whose model, start values,
gradients, learning rates and writer it reuses): the same three parameter
tensors take 5 steps; each case stores the parameters after every step.

Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
Program 1), exactly as lucidrains/lion-pytorch steps it, per tensor p with
gradient g and momentum m (zero at first):
  p = p * (1 - lr*wd)
  p = p - lr * sign(beta1*m + (1-beta1)*g)
  m = beta2*m + (1-beta2)*g

Cases (metadata `cases`; `<case>.ini` is the kiln [train] section):
  lion          beta1 0.9, beta2 0.99 (lion-pytorch's defaults), wd 0.01
  lion_nodecay  the same with no weight decay on fc1.bias (no_decay)

Usage: /usr/bin/python3 tests/data/gen_lion_refs.py tests/data/lion_refs.safetensors
"""
import sys

import torch

import gen_optim_refs as ref

LR = 0.01
CASES = {"lion": False, "lion_nodecay": True}


class Lion(torch.optim.Optimizer):
    """lion-pytorch's update (the module docstring), one tensor at a time."""

    def __init__(self, params, lr, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - lr * wd)
                update = m.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def run_case(nodecay, init, grads, dtype):
    params = {n: init[n].to(dtype).clone() for n, _ in ref.SHAPES}
    decay = [t for n, t in params.items() if not (nodecay and n.endswith(".bias"))]
    keep = [t for n, t in params.items() if nodecay and n.endswith(".bias")]
    groups = [{"params": decay}] + ([{"params": keep, "weight_decay": 0.0}] if keep else [])
    opt = Lion(groups, lr=LR, weight_decay=ref.WD)
    out = []
    for k in range(ref.STEPS):
        for group in opt.param_groups:
            group["lr"] = float(ref.np.float32(LR * ref.LR_FACTORS[k]))
        for n, _ in ref.SHAPES:
            params[n].grad = grads[k][n].to(dtype).clone()
        opt.step()
        out.append({n: params[n].clone() for n, _ in ref.SHAPES})
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    init = {n: torch.randn(s) * 0.5 for n, s in ref.SHAPES}
    grads = [{n: torch.randn(s) * 0.3 for n, s in ref.SHAPES} for _ in range(ref.STEPS)]
    tensors = [("init/" + n, init[n].numpy()) for n, _ in ref.SHAPES]
    for k in range(ref.STEPS):
        tensors += [("grad%d/%s" % (k, n), grads[k][n].numpy()) for n, _ in ref.SHAPES]
    meta = {"generator": "tests/data/gen_lion_refs.py", "torch": torch.__version__,
            "model.ini": ref.MODEL_INI, "sample": str(ref.SAMPLE), "steps": str(ref.STEPS),
            "params": ",".join(n for n, _ in ref.SHAPES), "cases": ",".join(CASES)}
    for name, nodecay in CASES.items():
        f32 = run_case(nodecay, init, grads, torch.float32)
        f64 = run_case(nodecay, init, grads, torch.float64)
        meta[name + ".ini"] = ("[train]\noptimizer = lion\nweight_decay = %g\n"
                               "beta1 = 0.9\nbeta2 = 0.99\n%s" %
                               (ref.WD, "no_decay = *.bias\n" if nodecay else ""))
        meta[name + ".lr"] = " ".join(repr(float(ref.np.float32(LR * f)))
                                      for f in ref.LR_FACTORS)
        worst = 0.0
        for k in range(ref.STEPS):
            for n, _ in ref.SHAPES:
                a, b = f32[k][n].double(), f64[k][n]
                worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
                tensors.append(("%s/step%d/%s" % (name, k, n), f32[k][n].numpy()))
        print("%-13s float32 vs float64: max relative %.2e" % (name, worst))
        if worst > 1e-6:
            sys.exit("float32 PyTorch is off from float64 by %.2e (> 1e-6)" % worst)
    ref.write_safetensors(sys.argv[1], tensors, meta)
    print("wrote %s: %d tensors" % (sys.argv[1], len(tensors)))


if __name__ == "__main__":
    main()
