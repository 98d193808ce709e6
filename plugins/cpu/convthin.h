/* plugins/cpu/convthin.h - kiln's own direct convolution for layers with
 * few input channels (a network's first layer), on AVX-512 (convthin.c).
 *
 * oneDNN's kernels vectorise over channels; with one input channel they
 * ran the Fashion-MNIST CNN's conv1 (128 x 1 x 28 x 28 -> 32, 5x5, pad 2)
 * at about half the f32 peak, forward and weight gradient 2.9 ms of a
 * ~25 ms bf16 step on the 2-core Zen 4 (docs/PERFORMANCE.md, "Session 24:
 * the first layer's convolution").  convthin.c vectorises over 16 output
 * columns instead: every tap is one load of a padded input row and 16
 * FMAs (the forward: 16 output channels at once) or one FMA into a tap's
 * accumulator (the weight gradient).  The data gradient stays oneDNN's (a
 * first layer has none). */
#ifndef KILN_CPU_CONVTHIN_H
#define KILN_CPU_CONVTHIN_H

#include "cpu.h"

/* 1 when convthin.c runs op on this CPU: AVX-512F, BW and VL, and
 * KILN_CPU_CONVTHIN is not "0" (the tests' and benchmarks' A/B hook);
 * KILN_OP_CONV (bias, fused ReLU) or KILN_OP_CONV_BWD_WEIGHTS (bias
 * gradient, accumulation), NCHW, 1 to 4 input channels, one group, stride
 * 1, dilation 1, padding >= 0, a kernel of at most 7 x 7 (the weight
 * gradient: at most 25 taps a channel); every tensor f32, or bf16
 * activations (x, y, dy, w bf16; the bias f32 or bf16; dw and db f32);
 * no kept copies (KILN_OPF_KEEP) and no residual. */
int cpu_convthin_ok(const struct kiln_op *op);

/* cpu_convthin_ok of op without its kept copies (KILN_OPF_KEEP and its
 * u8 tensors): tune.c refuses the kept op (KILN_ENOTSUP, the layer then
 * prepares its ops without copies) where the bare one runs here. */
int cpu_convthin_bare_ok(const struct kiln_op *op);

/* Prepare p (cpu_convthin_ok) as convthin.c's kernel (cpu_ops_prepare's
 * contract); KILN_ENOTSUP for an op it does not take.  A bf16 op runs by
 * AVX512_BF16's dot products where the CPU has them (products exact, f32
 * sums, denormal inputs and results flushed to zero, outputs rounded to
 * nearest even: not the f32 op's bytes), else in f32 arithmetic on the
 * widened values (the f32 op's bytes, rounded once).  The bytes never
 * depend on the team (the weight gradient's sums run in one order per
 * output channel). */
kiln_status cpu_convthin_prepare(struct cpu_ctx *c, struct cpu_plan *p);

#endif
