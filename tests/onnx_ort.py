"""tests/onnx_ort.py - run an exported ONNX model in ONNX Runtime on the
input tests/onnx_tool logits wrote, and compare with kiln's logits.

  python onnx_ort.py MODEL.onnx PREFIX [--threads N] [--time R] [--tol T]
                     [--opt all|none]

PREFIX.shape, PREFIX.x.f32 (or .x.i32) and PREFIX.logits.f32 come from
`onnx_tool logits`.  Checks the model with onnx.checker first, then prints
"max_abs_diff D max_abs_logit M rel R" and exits 1 when R = D / M (the
largest difference over the largest logit, so logits near zero do not
divide by ~0) exceeds T (default 1e-4).  --time R: then R timed runs of the
same batch, "ort_ms <median>" and "ort_cpu_ms <median>" (the process's CPU
time per run, every thread's; two warm-up runs first).  --opt none: no
graph optimisations (ONNX Runtime then evaluates the nodes as written: a QDQ
model's QuantizeLinear/DequantizeLinear as the operators define them,
rather than fused into its own int8 kernels); default all.
"""
import argparse
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort


def read_shapes(prefix):
    shapes = {}
    with open(prefix + ".shape") as f:
        for line in f:
            key, dims = line.split(":")
            parts = dims.split()
            if key == "x":
                shapes["x_dtype"] = parts[0]
                parts = parts[1:]
            shapes[key] = [int(d) for d in parts]
    return shapes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prefix")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--time", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--opt", choices=("all", "none"), default="all")
    a = ap.parse_args()
    onnx.checker.check_model(onnx.load(a.model), full_check=True)
    s = read_shapes(a.prefix)
    dtype = np.int32 if s["x_dtype"] == "i32" else np.float32
    x = np.fromfile(a.prefix + ".x." + s["x_dtype"], dtype=dtype).reshape(s["x"])
    want = np.fromfile(a.prefix + ".logits.f32", dtype=np.float32).reshape(s["logits"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if a.opt == "all"
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input": x})[0]
    if got.shape != want.shape:
        print("shape %s, kiln's %s" % (got.shape, want.shape))
        return 1
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    top = float(np.max(np.abs(want)))
    rel = diff / top if top > 0 else diff
    agree = float(np.mean(np.argmax(got, -1) == np.argmax(want, -1)))
    print("max_abs_diff %.3g max_abs_logit %.3g rel %.3g argmax_agree %.4f"
          % (diff, top, rel, agree))
    if a.time:
        for _ in range(2):
            sess.run(["logits"], {"input": x})
        ms, cpu = [], []
        for _ in range(a.time):
            t0, c0 = time.perf_counter(), time.process_time()
            sess.run(["logits"], {"input": x})
            ms.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        print("ort_ms %.3f" % float(np.median(ms)))
        print("ort_cpu_ms %.3f" % float(np.median(cpu)))
    return 0 if rel <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
