/* plugins/cpu/fftconv_planes.c - the FFT convolution's planes moved in
 * and out of its per-frequency matrices (fftconv.c explains the method
 * and holds the plan and the run): a block of a side's planes
 * transformed and written as lines of every frequency's matrix
 * (fc_forward_block), a block of output planes read back, inverted and
 * written, shifted, scaled, + bias, ReLU (fc_inverse_block); by FFTW a
 * plane at a time, or by fft16.c 16 planes at once (16 x 16, AVX-512);
 * NHWC planes through a thread's tile (fc_gather, fc_scatter).  Empty
 * without FFTW. */
#include "fftconv_impl.h"

#if HAVE_FFTW

#include "fft16.h" /* cpu_fft16_r2c, cpu_fft16_c2r, FFT16_PLANE_LINES */
#include "v16.h"   /* CPU_V16, cpu_v16_bf16_ld, cpu_v16_bf16_st */

#include <string.h>

/* Does side s (its planes p) go through a tile? */
int fc_tiled(const struct fc_side *s)
{
	return s->pl.s1 == 1 && s->pl.sw != 1 && s->pl.sh == s->pl.w * s->pl.sw;
}

/* Gather sample i's channels j .. (up to FC_T, to the last) into the
 * tile: its pixels are rows of C floats (sh = w sw), a transpose. */
static void fc_gather(struct fc_tile *g, const struct fc_planes *p, const float *src, int64_t i,
		      int64_t j)
{
	const int64_t n = p->n1 - j < FC_T ? p->n1 - j : FC_T;
	cpu_transpose_f32(g->t, p->h * p->w, src + i * p->s0 + j, p->sw, p->h * p->w, n);
	g->i = i, g->j0 = j, g->n = n, g->ni = 1;
}

/* A swapped side's gather: the block of samples (FC_S) and channels (FC_T)
 * plane (i, j) is in (fc_ij's blocks), sample by sample. */
static void fc_gather_block(struct fc_tile *g, const struct fc_planes *p, const float *src,
			    int64_t i, int64_t j)
{
	const int64_t i0 = i / FC_S * FC_S, j0 = j / FC_T * FC_T, hw = p->h * p->w;
	const int64_t n = p->n1 - j0 < FC_T ? p->n1 - j0 : FC_T;
	const int64_t ni = p->n0 - i0 < FC_S ? p->n0 - i0 : FC_S;
	for (int64_t q = 0; q < ni; q++)
		cpu_transpose_f32(g->t + q * FC_T * hw, hw, src + (i0 + q) * p->s0 + j0, p->sw, hw, n);
	g->i = i0, g->j0 = j0, g->n = n, g->ni = ni;
}

/* Write the tile's planes (g->n of them) to their channels of dst. */
void fc_scatter(struct fc_tile *g, const struct fc_planes *p, float *dst)
{
	cpu_transpose_f32(dst + g->i * p->s0 + g->j0, p->sw, g->t, p->h * p->w, g->n, p->h * p->w);
	g->n = 0;
}

/* Transform plane (i, j) of src into the spectrum sp (nf complex).  re:
 * n1 x n2 reals, the calling thread's buffer. */
/* Where plane (i, j) of side s is read: in src, or in the thread's tile
 * g (gathered there first when it is not), with its row and column
 * strides. */
static const float *fc_plane_src(const struct fc_side *s, const float *src, int64_t i, int64_t j,
				 struct fc_tile *g, int64_t *sh, int64_t *sw)
{
	const struct fc_planes *p = &s->pl;
	*sh = p->sh, *sw = p->sw;
	if (!g->t || !fc_tiled(s))
		return src + i * p->s0 + j * p->s1;
	if (!g->n || i < g->i || i >= g->i + g->ni || j < g->j0 || j >= g->j0 + g->n) {
		if (s->swap)
			fc_gather_block(g, p, src, i, j);
		else
			fc_gather(g, p, src, i, j);
	}
	*sh = p->w, *sw = 1;
	return g->t + ((i - g->i) * FC_T + j - g->j0) * p->h * p->w;
}

static void fc_forward_plane(const struct cpu_fftconv *f, const struct fc_side *s, const float *src,
			     int64_t i, int64_t j, float *re, fftwf_complex *sp, struct fc_tile *g)
{
	const struct fc_planes *p = &s->pl;
	int64_t sh, sw;
	const float *x = fc_plane_src(s, src, i, j, g, &sh, &sw);
	memset(re, 0, (size_t)f->n1 * (size_t)f->n2 * sizeof *re);
	for (int64_t r = 0; r < p->h; r++) {
		float *row = re + r * f->n2;
		const float *xr = x + r * sh;
		if (sw == 1)
			memcpy(row, xr, (size_t)p->w * sizeof *row);
		else
			for (int64_t q = 0; q < p->w; q++)
				row[q] = xr[q * sw];
	}
	fftwf_execute_dft_r2c(f->r2c, re, sp);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define FC_T16 1
#define FC_AVX512 __attribute__((target("avx512f")))

/* r[i] = column i of the 16 x 16 floats r[0..15] (rows), in registers (the
 * loops unrolled: arrays of vectors in loops stay in memory at -O2) */
FC_AVX512 static inline __attribute__((always_inline)) void fc_t16(__m512 r[16])
{
	__m512 t[16];
#pragma GCC unroll 16
	for (int i = 0; i < 16; i += 2) {
		t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
		t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
	}
#pragma GCC unroll 16
	for (int i = 0; i < 16; i += 4) {
		r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
		r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
		r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
		r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
	}
#pragma GCC unroll 16
	for (int i = 0; i < 16; i += 8)
#pragma GCC unroll 16
		for (int q = 0; q < 4; q++) {
			t[i + q] = _mm512_shuffle_f32x4(r[i + q], r[i + 4 + q], 0x88);
			t[i + 4 + q] = _mm512_shuffle_f32x4(r[i + q], r[i + 4 + q], 0xDD);
		}
#pragma GCC unroll 16
	for (int q = 0; q < 8; q++) {
		r[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
		r[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xDD);
	}
}

/* fc_forward_block's lines for a full block (FC_L planes) and FC_K = 8
 * frequencies from k0: each plane's 8 complex (16 floats) a row,
 * transposed, row 2k the real parts of frequency k0 + k, 2k + 1 the
 * imaginary; d, e at k0's matrix. */
FC_AVX512 static void fc_lines_put16(const fftwf_complex *sp, size_t sps, int k0, float *d, float *e,
				     size_t fs, int64_t Q, float si, int plain)
{
	__m512 r[16];
#pragma GCC unroll 16
	for (int c = 0; c < 16; c++)
		r[c] = _mm512_loadu_ps((const float *)(sp + (size_t)c * sps + (size_t)k0));
	fc_t16(r);
	const __m512 vs = _mm512_set1_ps(si), ve = _mm512_set1_ps(-si);
#pragma GCC unroll 16
	for (int k = 0; k < 8; k++, d += fs, e += fs) {
		_mm512_storeu_ps(d, r[2 * k]);
		_mm512_storeu_ps(d + Q, _mm512_mul_ps(vs, r[2 * k + 1]));
		if (!plain) {
			_mm512_storeu_ps(e, _mm512_mul_ps(ve, r[2 * k + 1]));
			_mm512_storeu_ps(e + Q, r[2 * k]);
		}
	}
}

/* The mirror, fc_inverse_block's: 8 frequencies' lines from d into the
 * FC_L spectra's complex k0 .. k0 + 7. */
FC_AVX512 static void fc_lines_get16(fftwf_complex *sp, size_t sps, int k0, const float *d,
				     size_t fs, int64_t Q)
{
	__m512 r[16];
#pragma GCC unroll 16
	for (int k = 0; k < 8; k++, d += fs) {
		r[2 * k] = _mm512_loadu_ps(d);
		r[2 * k + 1] = _mm512_loadu_ps(d + Q);
	}
	fc_t16(r);
#pragma GCC unroll 16
	for (int c = 0; c < 16; c++)
		_mm512_storeu_ps((float *)(sp + (size_t)c * sps + (size_t)k0), r[c]);
}

/* 16 x 16 transforms by fft16.c (f->v16): a block's n <= FC_L planes are
 * the lanes of the transforms' lines, lane c plane c0 + c of the matrix
 * row (lanes n.. zero, never stored).  A side whose planes are a
 * sample's channels (NHWC, unswapped) loads a pixel's n channels as one
 * line; a swapped NHWC side's (dy of the gradients) are read where they
 * lie, in fc_gather_lanes' tile (session 48); other planes (rows
 * contiguous: NCHW, the weights) are read a row of each plane at a time
 * and transposed (fc_t16).  A frequency's n real and n imaginary parts
 * then come out as lines, stored as they are: the per-plane transforms
 * and the transposes of fc_lines_put16 and fc_lines_get16 are gone
 * (docs/PERFORMANCE.md, "Session 23: the FFT's transforms 16 planes at
 * once"). */
static int fc_direct(const struct fc_side *s)
{
	return !s->swap && s->pl.s1 == 1 && s->pl.sw != 1;
}

/* fft16.c's blocks also load and store bf16 (AVX-512BW and VL's 16-bit
 * masked moves; fc_v16_cpu): v16.h's loads and stores */
#define FC_AVX512BW CPU_V16

/* Row r's elements 0 .. w - 1 (w <= 16; the rest 0) of plane x (bf16:
 * widened): */
FC_AVX512BW static inline __m512 fc_row16(const void *xv, int bf16, int64_t sw, int64_t w, __mmask16 wm)
{
	if (bf16) /* (sw 1: fc_bf16_tensors' NCHW planes) */
		return cpu_v16_bf16_ld(xv, wm);
	const float *x = xv;
	if (sw == 1)
		return _mm512_maskz_loadu_ps(wm, x);
	float t[16] = { 0 };
	for (int64_t q = 0; q < w; q++)
		t[q] = x[q * sw];
	return _mm512_loadu_ps(t);
}

/* A swapped tiled side's tile for fft16.c's blocks (NHWC dy of the weight
 * and data gradients): the block of FC_S samples and FC_T channels that
 * plane (i, j) is in, as each channel's h x 16 lines of FC_S lanes (lane
 * q sample i0 + q; columns w.. and absent samples 0): the lines
 * cpu_fft16_r2c reads, so the tile's channels are transformed where they
 * lie.  Each pixel's channels of a sample are one line, and the 16 lines
 * of its samples are transposed once (fc_t16) for the FC_T blocks that
 * read them.  The transforms see the values in the lanes
 * fc_forward_block16's transposed rows put them: the same bytes.  Before
 * session 48 the tile held planes (fc_gather_block's transposes) that each
 * block transposed again, a row of 16 planes at a time: the NHWC kept weight
 * gradient took ~1.2 CPU-ms more than the NCHW one (docs/PERFORMANCE.md,
 * "Session 48: the NHWC CNN against the NCHW one on the Zen 4").  Not
 * inlined: inlined into fc_forward_block16, the NCHW forward's blocks
 * measured ~1.5% slower (3 of 12 interleaved rounds faster). */
FC_AVX512BW __attribute__((noinline)) static void
fc_gather_lanes(struct fc_tile *g, const struct fc_planes *p, const float *src, int64_t i, int64_t j)
{
	const int64_t i0 = i / FC_S * FC_S, j0 = j / FC_T * FC_T, lines = p->h * 16 * 16;
	const int64_t n = p->n1 - j0 < FC_T ? p->n1 - j0 : FC_T;
	const int64_t ni = p->n0 - i0 < FC_S ? p->n0 - i0 : FC_S;
	const __mmask16 cm = (__mmask16)((1u << n) - 1);
	const __m512 zero = _mm512_setzero_ps();
	for (int64_t r = 0; r < p->h; r++)
		for (int64_t q = 0; q < 16; q++) {
			float *t = g->t + (r * 16 + q) * 16;
			__m512 v[16];
#pragma GCC unroll 16
			for (int s = 0; s < 16; s++)
				v[s] = s < ni && q < p->w
					       ? _mm512_maskz_loadu_ps(cm, src + (i0 + s) * p->s0 + j0 +
									   r * p->sh + q * p->sw)
					       : zero;
			fc_t16(v);
#pragma GCC unroll 16
			for (int c = 0; c < 16; c++)
				if (c < n)
					_mm512_store_ps(t + c * lines, v[c]);
		}
	g->i = i0, g->j0 = j0, g->n = n, g->ni = ni;
}

/* Whether side s's blocks read fc_gather_lanes' tile (f->v16) */
static int fc_lanes(const struct fc_side *s, const struct fc_tile *g)
{
	return s->swap && !s->bf16 && g->t && fc_tiled(s);
}

/* fc_forward_block of a full or partial block by fft16.c: xl the thread's
 * FFT16_PLANE_LINES lines, sl its FFT16_SPEC_LINES. */
FC_AVX512BW static void fc_forward_block16(const struct cpu_fftconv *f, const struct fc_side *s,
					 const float *src, int64_t row, int64_t c0, int64_t n,
					 float *m, size_t fs, float *xl, float *sl, struct fc_tile *g,
					 float *pf)
{
	const struct fc_planes *p = &s->pl;
	const __mmask16 lanes = (__mmask16)((1u << n) - 1), wm = (__mmask16)((1u << p->w) - 1);
	const __m512 zero = _mm512_setzero_ps();
	if (fc_lanes(s, g)) { /* lane c: sample c0 + c of channel row, in the tile */
		if (!g->n || c0 != g->i || row < g->j0 || row >= g->j0 + g->n)
			fc_gather_lanes(g, p, src, c0, row);
		xl = g->t + (row - g->j0) * p->h * 16 * 16;
	} else if (fc_direct(s)) { /* lane c: channel c0 + c of sample row */
		const float *x = src + row * p->s0 + c0;
		for (int64_t r = 0; r < p->h; r++)
			for (int64_t q = 0; q < 16; q++)
				_mm512_store_ps(xl + (r * 16 + q) * 16,
						q < p->w ? _mm512_maskz_loadu_ps(lanes, x + r * p->sh + q * p->sw)
							 : zero);
	} else {
		const char *x[FC_L];
		int64_t sh = p->sh, sw = 1;
		const int64_t es = s->bf16 ? 2 : 4;
		for (int64_t c = 0; c < n; c++) {
			const int64_t i = s->swap ? c0 + c : row, j = s->swap ? row : c0 + c;
			x[c] = s->bf16 ? (const char *)src + (i * p->s0 + j * p->s1) * 2
				       : (const char *)fc_plane_src(s, src, i, j, g, &sh, &sw);
		}
		for (int64_t r = 0; r < p->h; r++) {
			__m512 v[16];
#pragma GCC unroll 16
			for (int c = 0; c < 16; c++)
				v[c] = c < n ? fc_row16(x[c] + r * sh * es, s->bf16, sw, p->w, wm) : zero;
			fc_t16(v);
#pragma GCC unroll 16
			for (int q = 0; q < 16; q++)
				_mm512_store_ps(xl + (r * 16 + q) * 16, v[q]);
		}
	}
	cpu_fft16_r2c(xl, (int)p->h, sl);
	/* the lines as fc_lines_put16 stores them: [Re, si Im] (plain) or the
	 * block form's [Re, si Im] and [-si Im, Re] */
	const int64_t Q = s->cols, ld = 2 * Q;
	const int plain = s->block == 0 || s->block == 2;
	const float si = plain ? (s->block ? -1.0f : 1.0f) : (float)s->block;
	const __m512 vs = _mm512_set1_ps(si), ve = _mm512_set1_ps(-si);
	float *d = m + row * ld + c0, *e = d + s->rows * ld;
	for (int k = 0; k < f->nf; k++, d += fs, e += fs) {
		if (pf) { /* the next block's lines, written while this one's are */
			__builtin_prefetch(pf + (size_t)k * fs, 1, 3);
			__builtin_prefetch(pf + (size_t)k * fs + Q, 1, 3);
			if (!plain) {
				__builtin_prefetch(pf + (size_t)k * fs + s->rows * ld, 1, 3);
				__builtin_prefetch(pf + (size_t)k * fs + s->rows * ld + Q, 1, 3);
			}
		}
		const __m512 re = _mm512_load_ps(sl + 32 * k), im = _mm512_load_ps(sl + 32 * k + 16);
		_mm512_mask_storeu_ps(d, lanes, re);
		_mm512_mask_storeu_ps(d + Q, lanes, _mm512_mul_ps(vs, im));
		if (!plain) {
			_mm512_mask_storeu_ps(e, lanes, _mm512_mul_ps(ve, im));
			_mm512_mask_storeu_ps(e + Q, lanes, re);
		}
	}
}

/* y (=|+=) v in lanes wm */
FC_AVX512BW static inline void fc_put16(float *y, __mmask16 wm, __m512 v, int acc)
{
	if (acc)
		v = _mm512_add_ps(_mm512_maskz_loadu_ps(wm, y), v);
	_mm512_mask_storeu_ps(y, wm, v);
}

/* fc_inverse_block of a full or partial block by fft16.c: the n planes'
 * spectra read as lines into sl, inverted into zl (FFT16_PLANE_LINES),
 * each element shifted, scaled, + bias, ReLU, and written (or added) as
 * fc_put does; NHWC outputs a pixel's n channels as one line, the others
 * a row of each plane at a time, transposed back. */
FC_AVX512BW static void fc_inverse_block16(const struct cpu_fftconv *f, const float *m, int64_t row,
					 int64_t c0, int64_t n, float *dst, const float *bias,
					 float *zl, float *sl, const float *pf)
{
	const struct fc_side *s = &f->o;
	const struct fc_planes *p = &s->pl;
	const int64_t Q = s->cols, ld = 2 * Q;
	const __mmask16 lanes = (__mmask16)((1u << n) - 1), wm = (__mmask16)((1u << p->w) - 1);
	const float *d = m + row * ld + c0;
	for (int k = 0; k < f->nf; k++, d += f->fo) {
		if (pf) { /* the next block's lines, while this one computes */
			__builtin_prefetch(pf + (size_t)k * f->fo, 0, 3);
			__builtin_prefetch(pf + (size_t)k * f->fo + Q, 0, 3);
		}
		_mm512_store_ps(sl + 32 * k, _mm512_maskz_loadu_ps(lanes, d));
		_mm512_store_ps(sl + 32 * k + 16, _mm512_maskz_loadu_ps(lanes, d + Q));
	}
	cpu_fft16_c2r(sl, zl);
	const __m512 scale = _mm512_set1_ps(1.0f / (float)(f->n1 * f->n2)), zero = _mm512_setzero_ps();
	/* the output channel of plane (row, c0 + c): o of (b, o) or of (o, c) */
	__m512 b0 = zero;
	if (bias && f->type == KILN_OP_CONV)
		b0 = f->bias_bf16 ? cpu_v16_bf16_ld((const uint16_t *)bias + c0, lanes)
				  : _mm512_maskz_loadu_ps(lanes, bias + c0);
	else if (bias) /* (never bf16: fc_bf16_tensors) */
		b0 = _mm512_set1_ps(bias[row]);
	const int64_t q0 = (f->sh2 + f->n2) % f->n2;
	for (int64_t r = 0, zi = (f->sh1 + f->n1) % f->n1; r < p->h;
	     r++, zi = zi + 1 == f->n1 ? 0 : zi + 1) {
		__m512 v[16];
#pragma GCC unroll 16
		for (int q = 0; q < 16; q++) {
			const int64_t zq = (q0 + q) & 15;
			v[q] = _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(zl + (zi * 16 + zq) * 16), scale), b0);
			if (f->relu) /* a NaN kept (max returns its second operand) */
				v[q] = _mm512_max_ps(zero, v[q]);
		}
		if (fc_direct(s)) {
			float *y = dst + row * p->s0 + c0 + r * p->sh;
			for (int64_t q = 0; q < p->w; q++)
				fc_put16(y + q * p->sw, lanes, v[q], f->acc);
			continue;
		}
		fc_t16(v);
		for (int64_t c = 0; c < n; c++) {
			const int64_t o = row * p->s0 + (c0 + c) * p->s1 + r * p->sh;
			if (s->bf16) { /* NCHW (fc_bf16_tensors), never accumulated */
				cpu_v16_bf16_st((uint16_t *)dst + o, wm, v[c]);
				continue;
			}
			float *y = dst + o;
			if (p->sw == 1) {
				fc_put16(y, wm, v[c], f->acc);
				continue;
			}
			float t[16];
			_mm512_storeu_ps(t, v[c]);
			for (int64_t q = 0; q < p->w; q++)
				y[q * p->sw] = f->acc ? y[q * p->sw] + t[q] : t[q];
		}
	}
}
#endif

/* Side s's planes of matrix row `row`, columns c0 .. c0 + n - 1 (n <=
 * FC_L): each transformed into the thread's spectra sp (FC_L of them,
 * f->sps complex apart), then, FC_K frequencies at a time, transposed
 * (n spectra's 2 FC_K floats into 2 FC_K rows of n: in AVX-512 registers
 * for a full block, fc_lines_put16, else by cpu_transpose_f32 through a
 * buffer) and each frequency's n real and n imaginary parts written as
 * one line each (fs floats between the frequencies' matrices at m).  Written a
 * plane at a time, every plane's transform stored one float into each
 * half of each of the nf matrices: 3.4% of the CNN's CPU samples
 * (docs/PERFORMANCE.md, "Session 22: the FFT's transform stores").  The
 * same values and the same products by +-1: the same bytes. */
void fc_forward_block(const struct cpu_fftconv *f, const struct fc_side *s, const float *src,
		      int64_t row, int64_t c0, int64_t n, float *m, size_t fs, float *re,
		      fftwf_complex *sp, struct fc_tile *g, float *pf)
{
#ifdef FC_T16
	if (f->v16) {
		fc_forward_block16(f, s, src, row, c0, n, m, fs, re, (float *)sp, g, pf);
		return;
	}
#endif
	for (int64_t c = 0; c < n; c++)
		fc_forward_plane(f, s, src, s->swap ? c0 + c : row, s->swap ? row : c0 + c, re,
				 sp + (size_t)c * f->sps, g);
	const int64_t Q = s->cols, ld = 2 * Q;
	const int plain = s->block == 0 || s->block == 2;
	/* plain: [Re, si Im]; the block form (rows r and R + r): [Re, sg Im]
	 * and [-sg Im, Re] (-sg Im a product, as before: a NaN's sign) */
	const float si = plain ? (s->block ? -1.0f : 1.0f) : (float)s->block, ne = -si;
	float *d = m + row * ld + c0, *e = d + s->rows * ld;
	float t[2 * FC_K][FC_L] __attribute__((aligned(FC_ALIGN)));
	int k0 = 0;
#ifdef FC_T16
	if (n == FC_L && __builtin_cpu_supports("avx512f"))
		for (; k0 + FC_K <= f->nf; k0 += FC_K, d += FC_K * fs, e += FC_K * fs)
			fc_lines_put16(sp, f->sps, k0, d, e, fs, Q, si, plain);
#endif
	for (; k0 < f->nf; k0 += FC_K) {
		const int kn = f->nf - k0 < FC_K ? f->nf - k0 : FC_K;
		cpu_transpose_f32(&t[0][0], FC_L, (const float *)(sp + k0), 2 * (int64_t)f->sps, n,
				  2 * kn);
		for (int k = 0; k < kn; k++, d += fs, e += fs) {
			const float *tr = t[2 * k], *ti = t[2 * k + 1];
			if (n == FC_L) { /* constant sizes: whole vectors */
#pragma omp simd
				for (int c = 0; c < FC_L; c++)
					d[c] = tr[c], d[Q + c] = si * ti[c];
				if (!plain) {
#pragma omp simd
					for (int c = 0; c < FC_L; c++)
						e[c] = ne * ti[c], e[Q + c] = tr[c];
				}
				continue;
			}
			for (int64_t c = 0; c < n; c++)
				d[c] = tr[c], d[Q + c] = si * ti[c];
			if (!plain)
				for (int64_t c = 0; c < n; c++)
					e[c] = ne * ti[c], e[Q + c] = tr[c];
		}
	}
}

/* y[q * sw] (=|+=) act(z[q] scale + b0), q < n <= FC_MAX: ReLU keeps a
 * NaN (as oneDNN's), so a step's non-finite check still sees it.  The
 * row is computed contiguously (vectorised, no branch), then stored. */
CPU_CLONES static void fc_put(float *restrict y, int64_t sw, const float *restrict z, int64_t n,
			      float scale, float b0, int relu, int acc)
{
	float v[FC_MAX];
#pragma omp simd
	for (int64_t q = 0; q < n; q++)
		v[q] = z[q] * scale + b0;
	if (relu) {
#pragma omp simd
		for (int64_t q = 0; q < n; q++)
			v[q] = v[q] < 0.0f ? 0.0f : v[q];
	}
	if (acc) {
		for (int64_t q = 0; q < n; q++)
			y[q * sw] += v[q];
	} else if (sw == 1) {
		memcpy(y, v, (size_t)n * sizeof *y);
	} else {
		for (int64_t q = 0; q < n; q++)
			y[q * sw] = v[q];
	}
}

/* The inverse transform of output plane (i, j) from its spectrum sp
 * (overwritten), written (shifted, cropped, scaled; + bias, ReLU, or
 * added) into dst. */
static void fc_inverse_plane(const struct cpu_fftconv *f, int64_t i, int64_t j, float *dst,
			     const float *bias, float *re, fftwf_complex *sp, struct fc_tile *g)
{
	const struct fc_side *s = &f->o;
	const struct fc_planes *p = &s->pl;
	fftwf_execute_dft_c2r(f->c2r, sp, re);
	const float scale = 1.0f / (float)(f->n1 * f->n2);
	/* the output channel of plane (i, j): o of (b, o) or of (o, c) */
	const float b0 = bias ? bias[f->type == KILN_OP_CONV ? j : i] : 0.0f;
	float *y = dst + i * p->s0 + j * p->s1;
	int64_t sh = p->sh, sw = p->sw;
	if (g->t && fc_tiled(s) && !f->acc) { /* written to the tile, scattered by FC_T */
		if (g->n && (g->i != i || j != g->j0 + g->n || g->n == FC_T))
			fc_scatter(g, p, dst);
		if (!g->n)
			g->i = i, g->j0 = j, g->ni = 1;
		g->n++;
		y = g->t + (j - g->j0) * p->h * p->w, sh = p->w, sw = 1;
	}
	/* output column q reads z column (q + sh2) mod n2: two runs */
	const int64_t q0 = (f->sh2 + f->n2) % f->n2, w1 = f->n2 - q0 < p->w ? f->n2 - q0 : p->w;
	for (int64_t r = 0, zi = (f->sh1 + f->n1) % f->n1; r < p->h;
	     r++, zi = zi + 1 == f->n1 ? 0 : zi + 1) {
		const float *zr = re + zi * f->n2;
		float *yr = y + r * sh;
		fc_put(yr, sw, zr + q0, w1, scale, b0, f->relu, f->acc);
		if (w1 < p->w)
			fc_put(yr + w1 * sw, sw, zr, p->w - w1, scale, b0, f->relu, f->acc);
	}
}

/* The output planes of matrix row `row`, columns c0 .. c0 + n - 1 (n <=
 * FC_L): FC_K frequencies at a time, each frequency's n real and n
 * imaginary parts read as one line each, transposed into the thread's
 * spectra sp (f->sps complex apart; fc_lines_get16 for a full block on
 * AVX-512, else a buffer and cpu_transpose_f32), then each plane inverted
 * (fc_inverse_plane).  Read a plane at a time, each plane read one float
 * of each half of each of the nf product matrices: 3.7% of the CNN's
 * CPU samples. */
void fc_inverse_block(const struct cpu_fftconv *f, const float *m, int64_t row, int64_t c0,
		      int64_t n, float *dst, const float *bias, float *re, fftwf_complex *sp,
		      struct fc_tile *g, const float *pf)
{
#ifdef FC_T16
	if (f->v16) {
		fc_inverse_block16(f, m, row, c0, n, dst, bias, re, (float *)sp, pf);
		return;
	}
#endif
	const struct fc_side *s = &f->o;
	const int64_t Q = s->cols, ld = 2 * Q;
	const float *d = m + row * ld + c0;
	float t[2 * FC_K][FC_L] __attribute__((aligned(FC_ALIGN)));
	int k0 = 0;
#ifdef FC_T16
	if (n == FC_L && __builtin_cpu_supports("avx512f"))
		for (; k0 + FC_K <= f->nf; k0 += FC_K, d += FC_K * f->fo)
			fc_lines_get16(sp, f->sps, k0, d, f->fo, Q);
#endif
	for (; k0 < f->nf; k0 += FC_K) {
		const int kn = f->nf - k0 < FC_K ? f->nf - k0 : FC_K;
		for (int k = 0; k < kn; k++, d += f->fo) {
			if (n == FC_L) { /* constant sizes: whole vectors */
				memcpy(t[2 * k], d, sizeof t[0]);
				memcpy(t[2 * k + 1], d + Q, sizeof t[0]);
				continue;
			}
			memcpy(t[2 * k], d, (size_t)n * sizeof *d);
			memcpy(t[2 * k + 1], d + Q, (size_t)n * sizeof *d);
		}
		cpu_transpose_f32((float *)(sp + k0), 2 * (int64_t)f->sps, &t[0][0], FC_L, 2 * kn, n);
	}
	for (int64_t c = 0; c < n; c++)
		fc_inverse_plane(f, s->swap ? c0 + c : row, s->swap ? row : c0 + c, dst, bias, re,
				 sp + (size_t)c * f->sps, g);
}

#endif /* HAVE_FFTW */
