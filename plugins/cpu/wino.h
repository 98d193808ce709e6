/* plugins/cpu/wino.h - f32 3x3 convolutions by Winograd's minimal
 * filtering, F(4x4, 3x3), on AVX-512 (wino.c).
 *
 * oneDNN 2.6's direct kernels run the ResNet example's 3x3 convolutions
 * (16-64 channels, 28x28 to 7x7, NHWC) near the FMA peak, 9 multiplies an
 * output and channel pair; ONNX Runtime's NCHWc kernels do the same, so
 * kiln's evaluation could not pass it by a kernel's speed alone
 * (docs/PERFORMANCE.md, "Session 24: the first layer's convolution").
 * F(4x4, 3x3) computes a 4x4 block of outputs from a 6x6 block of input
 * with 36 multiplies a channel pair instead of 144, the rest being
 * transforms whose cost is linear in the channels (Lavin and Gray, "Fast
 * Algorithms for Convolutional Neural Networks", 2016). */
#ifndef KILN_CPU_WINO_H
#define KILN_CPU_WINO_H

#include "cpu.h"

/* 1 when wino.c runs op on this CPU: AVX-512F, BW and VL, and KILN_CPU_WINO
 * is not "0" (the tests' and benchmarks' A/B hook); f32 NHWC activations
 * and OIHW weights [O, C, 3, 3], C and O multiples of 16 with C O at most
 * 256 x 256, stride 1, dilation 1, one group, padding 0-2; no kept copies
 * (KILN_OPF_KEEP) and no accumulation.  KILN_OP_CONV: bias, fused ReLU and
 * a residual epilogue (KILN_OPF_RESIDUAL) allowed; KILN_OP_CONV_BWD_DATA:
 * dx from dy (dy correlated with the filters turned half a turn, padded by
 * 2 - pad).  A bf16 or f16 convolution that runs as the f32 op on widened
 * copies (lowp.c: f16; bf16 where conv.c refuses it, with a bf16 bias or a
 * residual, or below avx512_core) is such an op too. */
int cpu_wino_ok(const struct kiln_op *op);

/* cpu_wino_ok of op without its kept copies (KILN_OPF_KEEP and its u8
 * tensors): under conv_algo = winograd tune.c refuses the kept op
 * (KILN_ENOTSUP: the layer then prepares its ops without copies) where
 * the bare one runs here. */
int cpu_wino_bare_ok(const struct kiln_op *op);

/* Prepare p (cpu_wino_ok) as wino.c's kernel (cpu_ops_prepare's
 * contract); KILN_ENOTSUP for an op it does not take.  The result differs
 * from the direct sum by rounding, larger than a direct kernel's (the
 * transforms' constants up to 8 and 1/24): up to ~2.5e-5 of the output's
 * rms, against ~5e-6 for oneDNN's direct kernels (tests/check_cpu_wino).
 * Every output is computed by one thread with the same code, so the bytes
 * never depend on the team. */
kiln_status cpu_wino_prepare(struct cpu_ctx *c, struct cpu_plan *p);

#endif
