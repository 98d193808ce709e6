"""How the PyTorch halves of kiln's benchmarks run a model, besides plain
eager: torch.compile (PyTorch 2.x) and a Lightning Trainer.fit.

  --mode eager         the model as it is (PyTorch 1.13 and 2.x)
  --mode compile       torch.compile(model), mode "default"
  --mode compile-max   torch.compile(model, mode="max-autotune-no-cudagraphs")
  --mode lightning     the same nn.Module inside a LightningModule, fed by a
                       DataLoader over the in-memory tensors, Trainer.fit; the
                       rate is over the whole fit (every step, set-up and
                       tear-down included), as a user runs it

A compiled model compiles on its first steps; those are among the untimed
warm-up steps, and compile_s (the warm-up's time beyond that many steady
steps) says what compiling cost.
"""
import os
import time

MODES = ("eager", "compile", "compile-max", "lightning")
COMPILE_MODE = {"compile": "default", "compile-max": "max-autotune-no-cudagraphs"}


def add_mode_arg(ap):
    ap.add_argument("--mode", choices=MODES, default="eager",
                    help="eager (default); compile, compile-max: torch.compile with "
                         "mode default / max-autotune-no-cudagraphs; lightning: "
                         "Trainer.fit of the same module (PyTorch 2.x)")


def compiled(model, mode):
    """model, or torch.compile(model) for the compile modes."""
    import torch
    if mode not in COMPILE_MODE:
        return model
    if not hasattr(torch, "compile"):
        raise SystemExit("--mode %s needs PyTorch 2.x (this is %s)" % (mode, torch.__version__))
    return torch.compile(model, mode=COMPILE_MODE[mode])


def compile_seconds(warmup_s, warmup_steps, timed_s, timed_steps):
    """The warm-up's seconds beyond warmup_steps steady steps: what the
    compiler (and first-touch allocation) cost."""
    return max(0.0, warmup_s - warmup_steps * timed_s / max(1, timed_steps))


def lightning_fit(model, make_opt, loss_fn, x, y, batch, steps, precision, fmt=None,
                  clip_norm=0.0, seed=1, devices=1, strategy="auto"):
    """Trainer.fit of `model` for `steps` steps of `batch` samples drawn by a
    shuffling DataLoader over (x, y), the last partial batch dropped.  Trainer
    defaults except: CPU, one device, no progress bar (stdout carries the JSON
    result), no sanity validation (there is no validation loop), its files in
    a scratch directory, removed after the fit.  It writes one checkpoint
    (ModelCheckpoint's default, at the epoch's end) and TensorBoard events;
    it does not validate.  precision "bf16" is Lightning's "bf16-mixed" (CPU
    autocast).  devices > 1 with strategy "ddp": that many processes (Lightning
    starts the others by running the script again), each `batch` samples a
    step from its DistributedSampler shard.  Returns (samples trained by all
    the processes, seconds of the whole fit, last loss, the Lightning
    version)."""
    import shutil
    import tempfile

    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model
            self.last_loss = float("nan")

        def training_step(self, b, i):
            xb, yb = b
            if fmt is not None:
                xb = xb.contiguous(memory_format=fmt)
            loss = loss_fn(self.model(xb), yb)
            self.last_loss = loss.detach()
            return loss

        def configure_optimizers(self):
            return make_opt(self.model)

    L.seed_everything(seed, verbose=False)
    dl = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True,
                    num_workers=0)
    root = tempfile.mkdtemp(prefix="kiln-lightning-")
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps, max_epochs=-1,
                        precision="bf16-mixed" if precision == "bf16" else "32-true",
                        enable_progress_bar=False, num_sanity_val_steps=0,
                        gradient_clip_val=clip_norm or None, default_root_dir=root)
    module = Module()
    t0 = time.perf_counter()
    trainer.fit(module, dl)
    fit_s = time.perf_counter() - t0
    done = trainer.global_step
    shutil.rmtree(root, ignore_errors=True)  # its checkpoint and logs (4 MB for the MLP)
    return done * batch * devices, fit_s, float(module.last_loss), L.__version__


def mode_fields(mode, compile_s=None, extra=None):
    """The JSON fields every script adds for its mode."""
    import torch
    out = {"mode": mode, "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(),
           "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}
    if compile_s is not None:
        out["compile_s"] = compile_s
    out.update(extra or {})
    return out
