#!/usr/bin/python3
"""The inputs bench/gpt.sh feeds kiln and llm.c: nothing is downloaded.

Usage: python3 bench/gpt_inputs.py DIR LAYERS DIM HEADS VOCAB CONTEXT TOKENS
Writes into DIR:
  train.bin   TOKENS random token ids < VOCAB in llm.c's token shard format
              (256 int32 header: magic 20240520, version 1, count; uint16
              tokens), read by kiln's tokens source and llm.c's DataLoader
  model.bin   a randomly initialised GPT-2 of that shape in llm.c's model
              file format (magic 20240326, version 3: f32, the vocabulary
              padded; GPT-2's N(0, 0.02) weights, unit layer norms, zero
              biases), for llm.c's train_gpt2.c (kiln loads it too, as
              [model] init_from)
"""
import os
import sys

import numpy as np


def main():
    out = sys.argv[1]
    L, C, H, V, T, n = (int(a) for a in sys.argv[2:8])
    rng = np.random.default_rng(0)
    os.makedirs(out, exist_ok=True)
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, n)
    with open(os.path.join(out, "train.bin"), "wb") as f:
        f.write(header.tobytes() + rng.integers(0, V, n).astype("<u2").tobytes())
    header = np.zeros(256, dtype="<i4")
    header[:8] = (20240326, 3, T, V, L, H, C, V)

    def normal(*shape):
        return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype("<f4")

    with open(os.path.join(out, "model.bin"), "wb") as f:
        f.write(header.tobytes())
        f.write(normal(V, C).tobytes())
        f.write(normal(T, C).tobytes())
        for shape, init in (((C,), 1), ((C,), 0), ((3 * C, C), None), ((3 * C,), 0),
                            ((C, C), None), ((C,), 0), ((C,), 1), ((C,), 0),
                            ((4 * C, C), None), ((4 * C,), 0), ((C, 4 * C), None), ((C,), 0)):
            for _ in range(L):
                a = normal(*shape) if init is None else np.full(shape, init, dtype="<f4")
                f.write(a.tobytes())
        f.write(np.ones(C, dtype="<f4").tobytes())
        f.write(np.zeros(C, dtype="<f4").tobytes())


if __name__ == "__main__":
    main()
