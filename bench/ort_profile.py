"""bench/ort_profile.py - ONNX Runtime's own per-node profile of an exported model,
beside kiln's per-primitive one (ONEDNN_VERBOSE=1 tests/onnx_tool logits ... --time R).

  python bench/ort_profile.py MODEL.onnx PREFIX [--threads N] [--runs R]

MODEL.onnx: `kiln export --onnx`; PREFIX.shape and PREFIX.x.f32: the input
`tests/onnx_tool logits CONFIG ROWS PREFIX` wrote (bench/onnx.sh's batch).
The session is bench/onnx.sh's (ORT_ENABLE_ALL, sequential, inter-op 1, CPU
provider) with SessionOptions.enable_profiling; after 2 warm-up runs it
prints each node's median kernel time over R runs (default 10), in
execution order, with its op and output shape, then their sum and the
median model_run time (ms).
"""
import argparse
import collections
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prefix")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    with open(a.prefix + ".shape") as f:
        dims = [line.split(":")[1].split() for line in f if line.startswith("x:")][0]
    x = np.fromfile(a.prefix + ".x." + dims[0], dtype=np.float32).reshape([int(d) for d in dims[1:]])
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    tmp = tempfile.mkdtemp(prefix="ort_profile")
    so.profile_file_prefix = os.path.join(tmp, "ort")
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    for _ in range(2 + a.runs):
        sess.run(None, {name: x})
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    os.rmdir(tmp)
    runs = [e["dur"] / 1e3 for e in events if e.get("name") == "model_run"][2:]
    nodes = collections.OrderedDict()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            args = e.get("args", {})
            key = (e["name"][: -len("_kernel_time")], args.get("op_name", "?"),
                   str(args.get("output_type_shape", "")))
            nodes.setdefault(key, []).append(e["dur"] / 1e3)
    total = 0.0
    for (node, op, shape), ms in nodes.items():
        m = float(np.median(ms[2:] if len(ms) > 2 else ms))
        total += m
        print("%9.3f ms  %-24s %-20s %s" % (m, node, op, shape))
    print("nodes %.2f ms; model_run median %.2f ms (%d threads, %d runs)"
          % (total, float(np.median(runs)) if runs else 0.0, a.threads, a.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
