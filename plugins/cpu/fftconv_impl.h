/* plugins/cpu/fftconv_impl.h - what fftconv.c (the FFT convolution's
 * plan and run) and fftconv_planes.c (its planes moved in and out of the
 * per-frequency matrices) share: the plan, its operands' planes and
 * sides, the NHWC tile, and the movers fc_run calls.  Private to those
 * two files (the op's interface is fftconv.h); the top of fftconv.c
 * explains the method. */
#ifndef KILN_CPU_FFTCONV_IMPL_H
#define KILN_CPU_FFTCONV_IMPL_H

#include "fftconv.h"

#if HAVE_FFTW
#include <fftw3.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FC_V16 1 /* fft16.c's 16 x 16 transforms (when cpu_fft16_ok) */
#else
#define FC_V16 0
#endif

#define FC_ALIGN 64 /* bytes */
#define FC_MAX 128  /* largest transform side */
#define FC_L 16     /* floats a line: FC_ALIGN / sizeof(float) */

#if HAVE_FFTW

/* One operand's planes: plane (i, j) of n0 x n1 planes, h x w elements
 * at element strides s0, s1 (between planes), sh, sw (rows, columns). */
struct fc_planes {
	int64_t n0, n1, h, w, s0, s1, sh, sw;
};

/* Where plane (i, j)'s frequencies go in a per-frequency matrix: row i,
 * column j (swap: row j, column i), of a plain [Re Im] matrix (block = 0,
 * rows x 2 cols; block = 2: [Re -Im], the conjugate) or of the block form
 * [[Re, s Im], [-s Im, Re]] (block = s = 1 or -1, 2 rows x 2 cols).
 * ld = 2 cols. */
struct fc_side {
	struct fc_planes pl;
	int swap, block;
	int64_t rows, cols;
	int bf16; /* its planes are bf16 (fft16.c's blocks only: fc_bf16_tensors) */
};

struct cpu_fftconv {
	int type, bias, relu, acc;
	int bias_bf16;            /* the forward's bias is bf16 (fc_inverse_block16) */
	int n1, n2, nh, nf;       /* transform n1 x n2; nh = n2/2 + 1 columns; nf = n1 nh */
	int64_t sh1, sh2;         /* output shift: z index = (out index + sh) mod n */
	struct fc_side a, b, o;   /* GEMM operands A, B; o: the output's planes */
	int64_t M, N, K;          /* o = a b per frequency: [M, K] [K, N] */
	int a_in, b_in;           /* the inputs a and b are transforms of */
	int keep;                 /* KILN_OPF_KEEP: spectra kept between the passes */
	size_t fx, fw;            /* floats per frequency of the kept x and w (the
				   * forward's operands, read by the weight gradient) */
	int64_t O;                /* output channels (the bias's length) */
	size_t fa, fb, fo;        /* floats per frequency of each matrix (padded) */
	size_t off_b, off_o, off_t, per_thread; /* workspace byte offsets */
	size_t sps;               /* complex between a thread's FC_L spectra */
	size_t off_tile;          /* a thread's channel tile (NHWC), in its buffers */
	size_t off_blk;           /* the kept weight gradient's B at one frequency
				   * (fb floats), in its buffers; 0: none */
	int threads;              /* per-thread buffers */
	int v16;                  /* 16 x 16 transforms by fft16.c, 16 planes
				   * at once (fc_forward_block16) */
	size_t off_sp;            /* a thread's spectra, in its buffers */
	int openblas;             /* GEMMs by cblas_sgemm, else dnnl_sgemm */
	fftwf_plan r2c, c2r;
};

/* NHWC planes are strided (element stride C): a plane read or written
 * one element at a time touches a cache line per element.  An NHWC
 * activation's side moves FC_T channels of a sample at once through a
 * thread's tile instead, FC_T planes of h x w contiguous floats, by 8 x 8
 * transposes (cpu_transpose_f32): a gather reads FC_T neighbouring floats
 * a pixel (a whole line at FC_T = 16), a scatter writes them; its planes
 * are taken channels inner (fc_ij).  The transforms see the same values
 * and each plane's frequencies go where they did, so the bytes are those
 * without it (docs/PERFORMANCE.md, "Session 17: the FFT convolution's
 * NHWC planes": the weight gradient 5-10% faster, the others the same).
 * With fft16.c's blocks (f->v16) a swapped side's tile is instead each
 * channel's h x 16 lines of FC_S samples' lanes, read by the transform
 * where they lie (fftconv_planes.c fc_gather_lanes; session 48). */
#define FC_T 16

/* A swapped side's tile holds FC_S samples' FC_T channels (fc_ij). */
#define FC_S 16

struct fc_tile {
	float *t;       /* FC_T planes of h w floats (a swapped side: FC_S x FC_T,
			 * sample-major; with f->v16, fc_gather_lanes': each
			 * of FC_T channels' h x 16 lines of FC_S samples'
			 * lanes); NULL: no tile */
	int64_t i, j0;  /* sample i's channels j0 .. j0 + n - 1 */
	int64_t n;      /* 0: empty */
	int64_t ni;     /* samples i .. i + ni - 1 (1 but on a swapped side) */
};

/* Frequencies a block's transpose moves at once (fc_forward_block,
 * fc_inverse_block): 2 FC_K rows of FC_L floats, 1 KiB on the stack. */
#define FC_K 8 /* (fc_lines_put16 and fc_lines_get16 move 8) */

/* fftconv_planes.c's, for fc_run and the plan (each explained there) */
int fc_tiled(const struct fc_side *s);
void fc_scatter(struct fc_tile *g, const struct fc_planes *p, float *dst);
void fc_forward_block(const struct cpu_fftconv *f, const struct fc_side *s, const float *src,
		      int64_t row, int64_t c0, int64_t n, float *m, size_t fs, float *re,
		      fftwf_complex *sp, struct fc_tile *g, float *pf);
void fc_inverse_block(const struct cpu_fftconv *f, const float *m, int64_t row, int64_t c0,
		      int64_t n, float *dst, const float *bias, float *re, fftwf_complex *sp,
		      struct fc_tile *g, const float *pf);

#endif /* HAVE_FFTW */

#endif
