/* plugins/cpu/fftconv.h - f32 convolutions by FFT (fftconv.c): CONV,
 * CONV_BWD_DATA and CONV_BWD_WEIGHTS of stride 1, dilation 1 and one group,
 * as per-frequency complex products run as real GEMMs ([plugin.cpu]
 * conv_algo; docs/PERFORMANCE.md, "Session 17: FFT convolution").
 * Without FFTW (configure --with-fftw, HAVE_FFTW) every function here says
 * no: cpu_fftconv_ok returns 0 and cpu_fftconv_prepare KILN_ENOTSUP. */
#ifndef KILN_CPU_FFTCONV_H
#define KILN_CPU_FFTCONV_H

#include "cpu.h"

#ifndef HAVE_FFTW
#define HAVE_FFTW 0
#endif

/* [plugin.cpu] conv_algo (cpu_ctx.conv_algo): direct (oneDNN), fft, the
 * shape rule, or the faster of the two timed (tune.c) */
enum { CPU_CONV_DIRECT = 0, CPU_CONV_FFT = 1, CPU_CONV_WINO = 2 /* wino.c wherever it applies */ };

struct cpu_fftconv;

/* 1 when fftconv.c can run op (with KILN_OPF_KEEP: spectra kept, x's
 * from the forward for the weight gradient, dy's from that for the data
 * gradient; prepare refuses a kept input of another size):
 * an f32 CONV (bias, fused ReLU), CONV_BWD_DATA (no accumulation) or
 * CONV_BWD_WEIGHTS (bias gradient, accumulation) of stride 1, dilation 1,
 * groups 1, no residual, a transform of at most 128 x 128; the build has
 * FFTW. */
int cpu_fftconv_ok(const struct kiln_op *op);
/* 1 for the convolutions conv_algo = rule gives the FFT (cpu_fftconv_ok,
 * kernel 5x5 or larger, the padded input at most 32 x 32, 16 or more
 * input and output channels; on every ISA since session 21). */
int cpu_fftconv_rule(const struct kiln_op *op);
/* 1 when the bf16 convolution op, widened to f32, would run by FFT on
 * fft16.c's transforms (16 x 16 planes, AVX-512F, no KILN_CPU_FFT_FFTW)
 * under conv_algo (CPU_GEMM_RULE: cpu_fftconv_rule; CPU_CONV_FFT: any
 * op cpu_fftconv_ok takes).  tune.c then runs it as lowp.c's f32 op on
 * widened copies instead of oneDNN's bf16 kernels (docs/PERFORMANCE.md,
 * "Session 23": conv2's kept FFT passes took ~16-19 CPU-ms a step
 * against the bf16 kernels' 34). */
int cpu_fftconv_bf16_fast(const struct kiln_op *op, int conv_algo);
/* 0 when fftconv.c's plan of op never reads input i (its pointer is
 * then only passed through): with KILN_OPF_KEEP the weight gradient reads
 * x's spectrum from the forward's kept copy, not x (input 0), and the data
 * gradient dy's and w's from the weight gradient's, not dy or w (inputs 0
 * and 1); 1 otherwise.  lowp.c (lp_unread) neither widens nor passes an
 * input read by no one (NULL), and the FFT kernel refuses a NULL input it
 * reads (KILN_EINVAL), so the two cannot drift apart into a fault. */
int cpu_fftconv_reads(const struct kiln_op *op, int i);
/* The transform size fftconv.c uses along a dimension of n inputs padded
 * by pad on each side, k taps and out outputs (stride 1): the smallest
 * size of its fast set that is at least max(n + pad, out, k); 0 when
 * larger than 128.  (The wrap-around of the circular correlation then
 * touches only zeros: the input needs no explicit padding.) */
int cpu_fftconv_size(int64_t n, int64_t pad, int64_t k, int64_t out);
/* Prepare p (cpu_fftconv_ok) as an FFT convolution (same contract as
 * cpu_ops_prepare); KILN_ENOTSUP for what it cannot run. */
kiln_status cpu_fftconv_prepare(struct cpu_ctx *c, struct cpu_plan *p);
void cpu_fftconv_free(struct cpu_fftconv *f);

#endif
