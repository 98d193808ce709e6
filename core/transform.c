/* core/transform.c - the [data] image transforms of the loader workers
 * (see transform.h): torchvision's Resize, CenterCrop, RandomCrop,
 * RandomResizedCrop, Grayscale, RandomHorizontalFlip, ToTensor and
 * Normalize on PIL images, with PIL's pixels.
 *
 * Resizing is Pillow's ImagingResample (src/libImaging/Resample.c, the
 * version torchvision 0.14 runs on) re-derived: per output pixel a
 * triangle filter centred at (xx + 0.5) * scale, widened by the scale when
 * shrinking, normalised to sum 1 in double, then rounded to 22-bit fixed
 * point; a horizontal pass over only the rows the vertical pass reads,
 * rounded and clipped to 8 bits, then the vertical pass.  Same arithmetic
 * in the same order, so the bytes equal PIL's.
 *
 * Random draws (counter b = epoch * 16 + k of stream KILN_RNG_AUGMENT,
 * coordinate a = the sample index; kiln_rng_uniform4 gives a counter's
 * four words):
 *   k = 0..9   RandomResizedCrop try k: scale, log-ratio, top, left;
 *   k = 10     RandomCrop: top, left;
 *   k = 11     the flip (word 0 < 0.5: flip).
 */
#include "transform.h"
#include "../plugins/common/norm_lut.h" /* common_norm_lut: the devices' table */

#include <math.h>   /* log, exp, sqrt, nearbyint: per sample, never per pixel */
#include <stdint.h>
#include <stdio.h>

/* The coefficients must round as PIL's do: no fused multiply-adds. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define PRECISION_BITS 22 /* Pillow's 32 - 8 - 2 */
#define MAX_SIDE 65536

enum { DRAW_RRC = 0, DRAW_CROP = 10, DRAW_FLIP = 11 };

/* ---- scratch ------------------------------------------------------------- */

void kiln_xform_scratch_free(struct kiln_xform_scratch *s)
{
	if (!s)
		return;
	free(s->a);
	free(s->b);
	free(s->w);
	free(s->wi);
	memset(s, 0, sizeof *s);
}

/* Make *p hold at least `bytes` (contents not kept). */
static kiln_status grow(void **p, size_t *cap, size_t bytes)
{
	if (*p && *cap >= bytes)
		return KILN_OK;
	size_t n = bytes + bytes / 4 + 64;
	void *q = malloc(n);
	if (!q)
		return kiln_error(KILN_ENOMEM, "transform: out of memory for %zu bytes of scratch",
				  bytes);
	free(*p);
	*p = q;
	*cap = n;
	return KILN_OK;
}

size_t kiln_xform_out_bytes(const struct kiln_xform *x)
{
	return (size_t)x->out_h * (size_t)x->out_w * (size_t)x->out_c *
	       (x->out_dtype == KILN_U8 ? 1 : 4);
}

/* ---- PIL's antialiased bilinear resize ----------------------------------- */

/* Taps per output pixel along an axis of `in` -> `out` pixels
 * (Pillow: ceil(support) * 2 + 1, support = max(in/out, 1)). */
static int axis_taps(int in, int out)
{
	double scale = (double)in / out, support = scale < 1.0 ? 1.0 : scale;
	int c = (int)support;
	if (c < support)
		c++;
	return 2 * c + 1;
}

static inline double triangle(double x)
{
	if (x < 0.0)
		x = -x;
	return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for box [0, in) of an
 * axis resampled to `out` pixels: output pixel xx reads input pixels
 * bounds[2xx] .. bounds[2xx] + bounds[2xx+1] - 1 with 22-bit weights
 * kk[xx * taps ..]. */
static void axis_coeffs(int in, int out, int taps, int32_t *bounds, int32_t *kk)
{
	double scale = (double)in / out;
	double filterscale = scale < 1.0 ? 1.0 : scale;
	double support = filterscale; /* bilinear support 1.0 * filterscale */
	double ss = 1.0 / filterscale;
	for (int xx = 0; xx < out; xx++) {
		double center = (xx + 0.5) * scale;
		int xmin = (int)(center - support + 0.5);
		if (xmin < 0)
			xmin = 0;
		int xmax = (int)(center + support + 0.5);
		if (xmax > in)
			xmax = in;
		xmax -= xmin;
		double ww = 0.0;
		for (int x = 0; x < xmax; x++)
			ww += triangle((x + xmin - center + 0.5) * ss);
		int32_t *k = kk + (size_t)xx * taps;
		for (int x = 0; x < xmax; x++) {
			double w = triangle((x + xmin - center + 0.5) * ss);
			if (ww != 0.0)
				w /= ww;
			k[x] = (int32_t)(w < 0 ? -0.5 + w * (1 << PRECISION_BITS)
					       : 0.5 + w * (1 << PRECISION_BITS));
		}
		for (int x = xmax; x < taps; x++)
			k[x] = 0;
		bounds[2 * xx] = xmin;
		bounds[2 * xx + 1] = xmax;
	}
}

static inline uint8_t clip8(int32_t s)
{
	s >>= PRECISION_BITS;
	return (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
}

/* Horizontal pass, portable: rows x (bounds/kk) -> dst [rows, ow, c]. */
static void hpass_c(const uint8_t *src, size_t stride, int c, int rows, int ow,
		    const int32_t *bounds, const int32_t *kk, int taps, uint8_t *restrict dst)
{
	for (int r = 0; r < rows; r++) {
		const uint8_t *in = src + (size_t)r * stride;
		uint8_t *o = dst + (size_t)r * ow * c;
		for (int xx = 0; xx < ow; xx++) {
			const int32_t *k = kk + (size_t)xx * taps;
			int n = bounds[2 * xx + 1];
			if (c == 1) {
				const uint8_t *p = in + bounds[2 * xx];
				int32_t s0 = 1 << (PRECISION_BITS - 1);
				for (int x = 0; x < n; x++)
					s0 += p[x] * k[x];
				o[xx] = clip8(s0);
				continue;
			}
			const uint8_t *p = in + (size_t)bounds[2 * xx] * 3;
			int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
			for (int x = 0; x < n; x++, p += 3) {
				s0 += p[0] * k[x];
				s1 += p[1] * k[x];
				s2 += p[2] * k[x];
			}
			o[3 * xx] = clip8(s0);
			o[3 * xx + 1] = clip8(s1);
			o[3 * xx + 2] = clip8(s2);
		}
	}
}

/* Vertical pass, portable, output row yy: taps rows from ymin, n values.
 * Integer sums are exact, so summing row by row (the order that
 * vectorises) equals Pillow's column by column. */
static void vrow_c(const uint8_t *src, size_t stride, int n, int ymin, int taps_used,
		   const int32_t *k, int32_t *restrict acc, uint8_t *restrict dst)
{
	for (int i = 0; i < n; i++)
		acc[i] = 1 << (PRECISION_BITS - 1);
	for (int y = 0; y < taps_used; y++) {
		const uint8_t *restrict row = src + (size_t)(ymin + y) * stride;
		int32_t w = k[y];
		for (int i = 0; i < n; i++)
			acc[i] += row[i] * w;
	}
	for (int i = 0; i < n; i++)
		dst[i] = clip8(acc[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* AVX2 (chosen at run time): the same integer sums, 8 or 4 lanes at once. */
#include <immintrin.h>
#define XF_AVX2 __attribute__((target("avx2")))

/* RGB: one pixel's three channels per 4-lane sum (the 4th lane reads the
 * next byte and is dropped), except where that byte may lie past the end
 * of src (the last row's last pixel): there the portable code. */
XF_AVX2 static void hpass_avx2(const uint8_t *src, size_t stride, int rows, int w, int ow,
			       const int32_t *bounds, const int32_t *kk, int taps,
			       uint8_t *restrict dst)
{
	for (int r = 0; r < rows; r++) {
		const uint8_t *in = src + (size_t)r * stride;
		uint8_t *o = dst + (size_t)r * ow * 3;
		int last = r == rows - 1;
		for (int xx = 0; xx < ow; xx++) {
			const int32_t *k = kk + (size_t)xx * taps;
			int x0 = bounds[2 * xx], n = bounds[2 * xx + 1];
			const uint8_t *p = in + (size_t)x0 * 3;
			if (last && x0 + n >= w) {
				hpass_c(in, stride, 3, 1, 1, bounds + 2 * xx, k, taps, o + 3 * xx);
				continue;
			}
			__m128i s = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
			for (int x = 0; x < n; x++, p += 3) {
				int32_t px;
				memcpy(&px, p, 4);
				__m128i v = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(px));
				s = _mm_add_epi32(s, _mm_mullo_epi32(v, _mm_set1_epi32(k[x])));
			}
			s = _mm_srai_epi32(s, PRECISION_BITS);
			s = _mm_packs_epi32(s, s);
			s = _mm_packus_epi16(s, s);
			int32_t q = _mm_cvtsi128_si32(s);
			memcpy(o + 3 * xx, &q, 3);
		}
	}
}

XF_AVX2 static void vrow_avx2(const uint8_t *src, size_t stride, int n, int ymin,
			      int taps_used, const int32_t *k, int32_t *restrict acc,
			      uint8_t *restrict dst)
{
	int i0 = 0;
	for (; i0 + 16 <= n; i0 += 16) {
		__m256i s0 = _mm256_set1_epi32(1 << (PRECISION_BITS - 1)), s1 = s0;
		for (int y = 0; y < taps_used; y++) {
			const uint8_t *row = src + (size_t)(ymin + y) * stride + i0;
			__m256i w = _mm256_set1_epi32(k[y]);
			__m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)row));
			__m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8)));
			s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(a, w));
			s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(b, w));
		}
		s0 = _mm256_srai_epi32(s0, PRECISION_BITS);
		s1 = _mm256_srai_epi32(s1, PRECISION_BITS);
		/* saturating packs clip to [0, 255] as clip8 does */
		__m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xd8);
		__m128i q = _mm_packus_epi16(_mm256_castsi256_si128(p),
					     _mm256_extracti128_si256(p, 1));
		_mm_storeu_si128((__m128i *)(dst + i0), q);
	}
	for (; i0 + 8 <= n; i0 += 8) {
		__m256i s0 = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
		for (int y = 0; y < taps_used; y++) {
			const uint8_t *row = src + (size_t)(ymin + y) * stride + i0;
			__m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)row));
			s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(a, _mm256_set1_epi32(k[y])));
		}
		s0 = _mm256_srai_epi32(s0, PRECISION_BITS);
		__m128i q = _mm_packs_epi32(_mm256_castsi256_si128(s0), _mm256_extracti128_si256(s0, 1));
		q = _mm_packus_epi16(q, q);
		_mm_storel_epi64((__m128i *)(dst + i0), q);
	}
	if (i0 < n)
		vrow_c(src + i0, stride, n - i0, ymin, taps_used, k, acc, dst + i0);
}

/* Whether to take the AVX2 loops: the CPU has AVX2 and the environment
 * does not say KILN_XFORM_SIMD=0 (for tests of the portable loops). */
static int have_avx2(void)
{
	static int cached = -1;
	int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
	if (v < 0) {
		const char *e = getenv("KILN_XFORM_SIMD");
		__builtin_cpu_init();
		v = __builtin_cpu_supports("avx2") && !(e && !strcmp(e, "0"));
		__atomic_store_n(&cached, v, __ATOMIC_RELAXED);
	}
	return v;
}
#endif

static void hpass(const uint8_t *src, size_t stride, int c, int rows, int w, int ow,
		  const int32_t *bounds, const int32_t *kk, int taps, uint8_t *restrict dst)
{
#if defined(__x86_64__) && defined(__GNUC__)
	if (c == 3 && have_avx2()) {
		hpass_avx2(src, stride, rows, w, ow, bounds, kk, taps, dst);
		return;
	}
#endif
	(void)w;
	hpass_c(src, stride, c, rows, ow, bounds, kk, taps, dst);
}

static void vrow(const uint8_t *src, size_t stride, int n, int ymin, int taps_used,
		 const int32_t *k, int32_t *restrict acc, uint8_t *restrict dst)
{
#if defined(__x86_64__) && defined(__GNUC__)
	if (have_avx2()) {
		vrow_avx2(src, stride, n, ymin, taps_used, k, acc, dst);
		return;
	}
#endif
	vrow_c(src, stride, n, ymin, taps_used, k, acc, dst);
}

/* Scratch a resize of a bh x bw box to oh x ow x c needs: *ints int32s
 * (bounds, weights, one row of accumulators), *tmp bytes (the rows of the
 * horizontal pass). */
static void resize_needs(int bh, int bw, int oh, int ow, int c, size_t *ints, size_t *tmp)
{
	*ints = 2 * (size_t)ow + (size_t)ow * axis_taps(bw, ow) + 2 * (size_t)oh +
		(size_t)oh * axis_taps(bh, oh) + (size_t)ow * c;
	*tmp = (size_t)bh * ow * c;
}

/* Resize the bh x bw box at src (row stride `stride`, c channels) to
 * out [oh, ow, c] packed.  wi and tmp hold resize_needs() of scratch. */
static void resize_core(const uint8_t *src, size_t stride, int c, int bh, int bw, int oh,
			int ow, uint8_t *out, uint8_t *tmp, int32_t *wi)
{
	int need_h = ow != bw, need_v = oh != bh;
	if (!need_h && !need_v) {
		for (int y = 0; y < oh; y++)
			memcpy(out + (size_t)y * ow * c, src + (size_t)y * stride, (size_t)ow * c);
		return;
	}
	int th = axis_taps(bw, ow), tv = axis_taps(bh, oh);
	int32_t *bh_ = wi, *kh = bh_ + 2 * (size_t)ow, *bv = kh + (size_t)ow * th,
		*kv = bv + 2 * (size_t)oh, *acc = kv + (size_t)oh * tv;
	if (need_v)
		axis_coeffs(bh, oh, tv, bv, kv);
	if (need_h) {
		axis_coeffs(bw, ow, th, bh_, kh);
		/* only the rows the vertical pass reads (Pillow's ybox) */
		int y0 = 0, y1 = bh;
		if (need_v) {
			y0 = bv[0];
			y1 = bv[2 * oh - 2] + bv[2 * oh - 1];
		}
		uint8_t *dst = need_v ? tmp : out;
		hpass(src + (size_t)y0 * stride, stride, c, y1 - y0, bw, ow, bh_, kh, th, dst);
		if (!need_v)
			return;
		for (int yy = 0; yy < oh; yy++)
			vrow(tmp, (size_t)ow * c, ow * c, bv[2 * yy] - y0, bv[2 * yy + 1],
			     kv + (size_t)yy * tv, acc, out + (size_t)yy * ow * c);
	} else {
		for (int yy = 0; yy < oh; yy++)
			vrow(src, stride, ow * c, bv[2 * yy], bv[2 * yy + 1], kv + (size_t)yy * tv,
			     acc, out + (size_t)yy * ow * c);
	}
}

kiln_status kiln_xform_resize_box(const struct kiln_image *in, const int box[4], int oh,
				  int ow, uint8_t *out, struct kiln_xform_scratch *s)
{
	if (!in->data || (in->c != 1 && in->c != 3) || box[0] < 0 || box[1] < 0 ||
	    box[2] < 1 || box[3] < 1 || box[0] + box[2] > in->w || box[1] + box[3] > in->h ||
	    oh < 1 || ow < 1 || oh > MAX_SIDE || ow > MAX_SIDE)
		return kiln_error(KILN_EINVAL, "transform: cannot resize box {%d,%d,%d,%d} of a %dx%dx%d image to %dx%d",
				  box[0], box[1], box[2], box[3], in->h, in->w, in->c, oh, ow);
	size_t ints, tmp;
	kiln_status st;
	resize_needs(box[3], box[2], oh, ow, in->c, &ints, &tmp);
	if ((st = grow((void **)&s->wi, &s->wi_cap, ints * sizeof(int32_t))) ||
	    (st = grow((void **)&s->a, &s->a_cap, tmp)))
		return st;
	size_t stride = (size_t)in->w * in->c;
	resize_core(in->data + (size_t)box[1] * stride + (size_t)box[0] * in->c, stride, in->c,
		    box[3], box[2], oh, ow, out, s->a, s->wi);
	return KILN_OK;
}

/* ---- geometry ------------------------------------------------------------ */

/* A window on 8-bit HWC pixels. */
struct view {
	const uint8_t *p;
	size_t stride;
	int h, w, c;
};

/* Resize box {x0, y0, bw, bh} of v to oh x ow into the scratch buffer
 * *buf (output first, the horizontal pass's rows after it); v becomes
 * the result. */
static kiln_status resize_view(struct view *v, const int box[4], int oh, int ow,
			       uint8_t **buf, size_t *cap, struct kiln_xform_scratch *s)
{
	size_t ints, tmp, outb = (size_t)oh * ow * v->c;
	kiln_status st;
	resize_needs(box[3], box[2], oh, ow, v->c, &ints, &tmp);
	if ((st = grow((void **)&s->wi, &s->wi_cap, ints * sizeof(int32_t))) ||
	    (st = grow((void **)buf, cap, outb + tmp)))
		return st;
	resize_core(v->p + (size_t)box[1] * v->stride + (size_t)box[0] * v->c, v->stride, v->c,
		    box[3], box[2], oh, ow, *buf, *buf + outb, s->wi);
	v->p = *buf;
	v->stride = (size_t)ow * v->c;
	v->h = oh;
	v->w = ow;
	return KILN_OK;
}

kiln_status kiln_xform_resize_shorter(int h, int w, int n, int *nh, int *nw)
{
	*nh = *nw = 0;
	if (h < 1 || w < 1 || n < 1)
		return kiln_error(KILN_EINVAL, "transform: cannot resize the shorter side of a %dx%d image (width x height) to %d",
				  w, h, n);
	int shorter = w <= h ? w : h, longer = w <= h ? h : w;
	/* In int64: the longer side of a long thin image passes INT_MAX, and
	 * a double past it converted to int is undefined (it gave
	 * -2147483648 and a negative batch size).  n * longer < 2^47, exact. */
	int64_t nl = (int64_t)((double)n * longer / shorter);
	int64_t rw = w <= h ? n : nl, rh = w <= h ? nl : n;
	/* width x height, as kiln predict's other size messages */
	if (n > MAX_SIDE || nl > MAX_SIDE)
		return kiln_error(KILN_EDATA, "a %dx%d image (width x height) with its shorter side resized to %d would be %lldx%lld, outside the transforms' 1 to %d pixels a side (MAX_SIDE, core/transform.c): too long and thin for `resize = %d`",
				  w, h, n, (long long)rw, (long long)rh, MAX_SIDE, n);
	*nw = (int)rw;
	*nh = (int)rh;
	return KILN_OK;
}

/* Python's round() of d / 2 for d >= 0: halves go to the even integer. */
static int half_round_even(int d)
{
	int k = d / 2;
	return (d & 1) && (k & 1) ? k + 1 : k;
}

/* CenterCrop((oh, ow)) of an h x w image as a window offset (negative:
 * zero padding), as torchvision pads and then crops. */
static void center_offsets(int h, int w, int oh, int ow, int *top, int *left)
{
	int pt = 0, pl = 0, ph = h, pw = w;
	if (ow > w || oh > h) {
		pl = ow > w ? (ow - w) / 2 : 0;
		pt = oh > h ? (oh - h) / 2 : 0;
		pw = w + pl + (ow > w ? (ow - w + 1) / 2 : 0);
		ph = h + pt + (oh > h ? (oh - h + 1) / 2 : 0);
	}
	*top = half_round_even(ph - oh) - pt;
	*left = half_round_even(pw - ow) - pl;
}

/* Uniform integer in [0, n] from u in [0, 1) (torch.randint(0, n + 1)). */
static int draw_upto(float u, int n)
{
	int v = (int)((double)u * ((double)n + 1.0));
	return v > n ? n : v;
}

static uint32_t counter(int64_t epoch, int k)
{
	return (uint32_t)((uint64_t)epoch * 16u + (uint32_t)k);
}

void kiln_xform_rrc_box(const struct kiln_xform *x, int h, int w, uint64_t seed,
			int64_t epoch, int64_t index, int box[4])
{
	if (h < 1 || w < 1) {
		box[0] = box[1] = box[2] = box[3] = 0;
		return;
	}
	double area = (double)h * w;
	double s0 = x->scale[0], s1 = x->scale[1];
	double lr0 = log(x->ratio[0]), lr1 = log(x->ratio[1]);
	for (int t = 0; t < 10; t++) {
		float u[4];
		kiln_rng_uniform4(seed, KILN_RNG_AUGMENT, (uint64_t)index, counter(epoch, DRAW_RRC + t), u);
		double target = area * (s0 + (s1 - s0) * u[0]);
		double aspect = exp(lr0 + (lr1 - lr0) * u[1]);
		/* Python's round(): ties to even, as nearbyint in the default mode */
		double cw = nearbyint(sqrt(target * aspect)), ch = nearbyint(sqrt(target / aspect));
		if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
			box[2] = (int)cw;
			box[3] = (int)ch;
			box[1] = draw_upto(u[2], h - box[3]);
			box[0] = draw_upto(u[3], w - box[2]);
			return;
		}
	}
	/* torchvision's fallback: the whole image, clamped to the ratio range */
	double in_ratio = (double)w / h, rmin = x->ratio[0], rmax = x->ratio[1];
	int cw = w, ch = h;
	if (in_ratio < rmin)
		ch = (int)nearbyint(cw / rmin);
	else if (in_ratio > rmax)
		cw = (int)nearbyint(ch * rmax);
	if (ch < 1)
		ch = 1;
	if (cw < 1)
		cw = 1;
	if (ch > h)
		ch = h;
	if (cw > w)
		cw = w;
	box[0] = (w - cw) / 2;
	box[1] = (h - ch) / 2;
	box[2] = cw;
	box[3] = ch;
}

/* ---- output -------------------------------------------------------------- */

/* PIL's convert("L"): ITU-R 601-2 luma in 16-bit fixed point. */
static inline uint8_t luma(const uint8_t *p)
{
	return (uint8_t)((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
}

/* Output row y of window (top, left) of v, flipped or not, in oc
 * channels: *p is its first pixel and *step the distance between pixels,
 * pointing into v when only the order changes, else into `row`,
 * assembled there (zero fill, channel conversion). */
static void out_row(const struct view *v, int top, int left, int ow, int oc, int flip, int y,
		    uint8_t *row, const uint8_t **p, ptrdiff_t *step)
{
	int sy = top + y, ic = v->c;
	*p = row;
	*step = oc;
	if (sy < 0 || sy >= v->h) {
		memset(row, 0, (size_t)ow * oc);
		return;
	}
	const uint8_t *src = v->p + (size_t)sy * v->stride;
	if (ic == oc && left >= 0 && left + ow <= v->w) {
		*p = src + (size_t)(left + (flip ? ow - 1 : 0)) * ic;
		*step = flip ? -ic : ic;
		return;
	}
	for (int x = 0; x < ow; x++) {
		int sx = left + (flip ? ow - 1 - x : x);
		uint8_t *o = row + (size_t)x * oc;
		if (sx < 0 || sx >= v->w) {
			memset(o, 0, (size_t)oc);
			continue;
		}
		const uint8_t *q = src + (size_t)sx * ic;
		if (ic == oc) {
			o[0] = q[0];
			if (oc == 3) {
				o[1] = q[1];
				o[2] = q[2];
			}
		} else if (oc == 1)
			o[0] = luma(q);
		else
			o[0] = o[1] = o[2] = q[0];
	}
}

/* One output row of 3-channel pixels p[0], p[st], p[2 st], ... into three
 * planes (CHW), as u8 or through the f32 lut.  The pixel step is almost
 * always +3 or -3 (a row read in place, flipped or not): those get loops
 * with a constant stride, which the compiler turns into shuffles. */
#define DEINT3(T, CONV)                                                         \
	do {                                                                    \
		if (st == 3)                                                    \
			for (int i = 0; i < ow; i++) {                          \
				d0[i] = CONV(0, p[3 * i]);                      \
				d1[i] = CONV(1, p[3 * i + 1]);                  \
				d2[i] = CONV(2, p[3 * i + 2]);                  \
			}                                                       \
		else if (st == -3)                                              \
			for (int i = 0; i < ow; i++) {                          \
				d0[i] = CONV(0, p[-3 * i]);                     \
				d1[i] = CONV(1, p[-3 * i + 1]);                 \
				d2[i] = CONV(2, p[-3 * i + 2]);                 \
			}                                                       \
		else                                                            \
			for (int i = 0; i < ow; i++, p += st) {                 \
				d0[i] = CONV(0, p[0]);                          \
				d1[i] = CONV(1, p[1]);                          \
				d2[i] = CONV(2, p[2]);                          \
			}                                                       \
	} while (0)
#define CONV_LUT(c, u) (lut[(c) * 256 + (u)])

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* 16 RGB pixels (48 bytes at s) into 16 bytes of each plane, with SSSE3
 * byte shuffles; rev reverses the 16 lanes (a flipped row). */
__attribute__((target("ssse3"))) static inline void deint16(const uint8_t *s, __m128i *r,
							     __m128i *g, __m128i *b)
{
	const __m128i a = _mm_loadu_si128((const __m128i *)s),
		      m = _mm_loadu_si128((const __m128i *)(s + 16)),
		      c = _mm_loadu_si128((const __m128i *)(s + 32));
#define Z -1
	*r = _mm_or_si128(_mm_or_si128(
		_mm_shuffle_epi8(a, _mm_setr_epi8(0, 3, 6, 9, 12, 15, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z)),
		_mm_shuffle_epi8(m, _mm_setr_epi8(Z, Z, Z, Z, Z, Z, 2, 5, 8, 11, 14, Z, Z, Z, Z, Z))),
		_mm_shuffle_epi8(c, _mm_setr_epi8(Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, 1, 4, 7, 10, 13)));
	*g = _mm_or_si128(_mm_or_si128(
		_mm_shuffle_epi8(a, _mm_setr_epi8(1, 4, 7, 10, 13, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z)),
		_mm_shuffle_epi8(m, _mm_setr_epi8(Z, Z, Z, Z, Z, 0, 3, 6, 9, 12, 15, Z, Z, Z, Z, Z))),
		_mm_shuffle_epi8(c, _mm_setr_epi8(Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, 2, 5, 8, 11, 14)));
	*b = _mm_or_si128(_mm_or_si128(
		_mm_shuffle_epi8(a, _mm_setr_epi8(2, 5, 8, 11, 14, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z)),
		_mm_shuffle_epi8(m, _mm_setr_epi8(Z, Z, Z, Z, Z, 1, 4, 7, 10, 13, Z, Z, Z, Z, Z, Z))),
		_mm_shuffle_epi8(c, _mm_setr_epi8(Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, 0, 3, 6, 9, 12, 15)));
#undef Z
}

/* st = +3 or -3: returns how many pixels it wrote (a multiple of 16). */
__attribute__((target("ssse3"))) static int deint3_u8_ssse3(uint8_t *d0, uint8_t *d1,
							     uint8_t *d2, const uint8_t *p,
							     ptrdiff_t st, int ow)
{
	const __m128i rev = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	int i = 0;
	if (st == 3) {
		for (; i + 16 <= ow; i += 16) {
			__m128i r, g, b;
			deint16(p + 3 * i, &r, &g, &b);
			_mm_storeu_si128((__m128i *)(d0 + i), r);
			_mm_storeu_si128((__m128i *)(d1 + i), g);
			_mm_storeu_si128((__m128i *)(d2 + i), b);
		}
	} else {
		/* output pixel i is p[-3 i]: read 16 pixels forward from the
		 * 16th-from-here and store them reversed */
		for (; i + 16 <= ow; i += 16) {
			__m128i r, g, b;
			deint16(p - 3 * (i + 15), &r, &g, &b);
			_mm_storeu_si128((__m128i *)(d0 + i), _mm_shuffle_epi8(r, rev));
			_mm_storeu_si128((__m128i *)(d1 + i), _mm_shuffle_epi8(g, rev));
			_mm_storeu_si128((__m128i *)(d2 + i), _mm_shuffle_epi8(b, rev));
		}
	}
	return i;
}
#endif

static void deint3_u8(uint8_t *d0, size_t plane, const uint8_t *p, ptrdiff_t st, int ow)
{
	uint8_t *d1 = d0 + plane, *d2 = d1 + plane;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if ((st == 3 || st == -3) && __builtin_cpu_supports("ssse3")) {
		int done = deint3_u8_ssse3(d0, d1, d2, p, st, ow);
		d0 += done, d1 += done, d2 += done;
		p += st * done;
		ow -= done;
	}
#endif
	for (int i = 0; i < ow; i++, p += st) {
		d0[i] = p[0];
		d1[i] = p[1];
		d2[i] = p[2];
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/* A gray row read forward (st = 1) into f32 8 pixels a step, as
 * common_norm_avx512 (norm_lut.h) does 16 where the CPU has AVX-512
 * (session 20: AVX2 machines took the table walk, one scalar store a
 * pixel: the loader thread's stores into the staging slot, lines the
 * compute cores hold, stalled ~56% of its normalize there); the n % 8
 * last through the table, the same bits. */
__attribute__((target("avx2"))) static void gray_row_avx2(float *d, const uint8_t *p, ptrdiff_t n,
							   const float *lut, float mean, float sd)
{
	const __m256 k = _mm256_set1_ps(255.0f), m = _mm256_set1_ps(mean), s = _mm256_set1_ps(sd);
	ptrdiff_t i = 0;
	for (; i + 8 <= n; i += 8) {
		long long q;
		memcpy(&q, p + i, 8);
		__m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(q)));
		v = _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(v, k), m), s);
		_mm256_storeu_ps(d + i, v);
	}
	for (; i < n; i++)
		d[i] = lut[p[i]];
}

/* have_avx2's rule for the AVX-512 row: the CPU has it and
 * KILN_XFORM_SIMD is not 0. */
static int have_avx512bw(void)
{
	static int cached = -1;
	int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
	if (v < 0) {
		v = have_avx2() && __builtin_cpu_supports("avx512f") &&
		    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
		__atomic_store_n(&cached, v, __ATOMIC_RELAXED);
	}
	return v;
}
#endif

/* d[i] = lut[p[i * st]] for i < ow: one gray row (or a whole gray image
 * read forward, emit's one pass).  mean and std are the ones lut was
 * built from. */
static void gray_row(float *restrict d, const uint8_t *restrict p, ptrdiff_t st, ptrdiff_t ow,
		     const float *restrict lut, float mean, float sd)
{
#if defined(__x86_64__) && defined(__GNUC__)
	if (st == 1 && have_avx512bw()) {
		common_norm_avx512(d, p, ow, mean, sd);
		return;
	}
	if (st == 1 && ow >= 8 && have_avx2()) {
		gray_row_avx2(d, p, ow, lut, mean, sd);
		return;
	}
#else
	(void)mean, (void)sd;
#endif
	for (ptrdiff_t i = 0; i < ow; i++, p += st)
		d[i] = lut[p[0]];
}

static void deint3_f32(float *restrict d0, size_t plane, const uint8_t *restrict p,
		       ptrdiff_t st, int ow, const float *restrict lut)
{
	float *restrict d1 = d0 + plane, *restrict d2 = d1 + plane;
	DEINT3(float, CONV_LUT);
}

/* Write window (top, left) of v as x's output: channels, flip, layout,
 * dtype.  lut[c * 256 + u] = (u/255 - mean[c]) / std[c] in f32, as
 * ToTensor + Normalize compute it; row: ow * out_c bytes. */
static void emit(const struct kiln_xform *x, const struct view *v, int top, int left,
		 int flip, const float *lut, uint8_t *row, void *out)
{
	int oh = x->out_h, ow = x->out_w, oc = x->out_c;
	size_t plane = (size_t)oh * ow;
	if (oc == 1 && v->c == 1 && !flip && !top && !left && v->h == oh && v->w == ow &&
	    v->stride == (size_t)ow) {
		/* the gray image itself, unchanged in shape (MNIST's): one pass
		 * over its pixels, as the rows would have been, without the
		 * per-row calls and a masked tail a row (session 49) */
		if (x->out_dtype == KILN_U8)
			memcpy(out, v->p, plane);
		else
			gray_row(out, v->p, 1, (ptrdiff_t)plane, lut, x->mean[0], x->std[0]);
		return;
	}
	for (int y = 0; y < oh; y++) {
		const uint8_t *p;
		ptrdiff_t st;
		out_row(v, top, left, ow, oc, flip, y, row, &p, &st);
		if (x->out_dtype == KILN_U8) {
			uint8_t *o = (uint8_t *)out + (size_t)y * ow * (x->nhwc ? oc : 1);
			if (st == oc && (x->nhwc || oc == 1))
				memcpy(o, p, (size_t)ow * oc);
			else if (oc == 1)
				for (int i = 0; i < ow; i++, p += st)
					o[i] = p[0];
			else if (x->nhwc)
				for (int i = 0; i < ow; i++, p += st) {
					o[3 * i] = p[0];
					o[3 * i + 1] = p[1];
					o[3 * i + 2] = p[2];
				}
			else
				deint3_u8(o, plane, p, st, ow);
			continue;
		}
		const float *l0 = lut, *l1 = lut + 256, *l2 = lut + 512;
		if (oc == 1) {
			gray_row((float *)out + (size_t)y * ow, p, st, ow, l0, x->mean[0], x->std[0]);
		} else if (x->nhwc) {
			float *d = (float *)out + (size_t)y * ow * 3;
			for (int i = 0; i < ow; i++, p += st) {
				d[3 * i] = l0[p[0]];
				d[3 * i + 1] = l1[p[1]];
				d[3 * i + 2] = l2[p[2]];
			}
		} else {
			deint3_f32((float *)out + (size_t)y * ow, plane, p, st, ow, lut);
		}
	}
}

kiln_status kiln_xform_apply(const struct kiln_xform *x, const struct kiln_image *in,
			     uint64_t seed, int64_t epoch, int64_t index, void *out,
			     struct kiln_xform_scratch *s)
{
	kiln_status st;
	if (!in->data || in->h < 1 || in->w < 1 || (in->c != 1 && in->c != 3))
		return kiln_error(KILN_EDATA, "an image of %dx%dx%d (expected 1 or 3 channels)",
				  in->h, in->w, in->c);
	if ((x->out_c != 1 && x->out_c != 3) || x->out_h < 1 || x->out_w < 1 ||
	    x->out_h > MAX_SIDE || x->out_w > MAX_SIDE || x->resize < 0 || x->pad < 0)
		return kiln_error(KILN_EINVAL, "transform: output %dx%dx%d, resize %d, pad %d",
				  x->out_h, x->out_w, x->out_c, x->resize, x->pad);
	struct view v = { in->data, (size_t)in->w * in->c, in->h, in->w, in->c };
	int oh = x->out_h, ow = x->out_w;

	/* 1. Resize(int) */
	if (x->resize > 0) {
		int nh, nw;
		if ((st = kiln_xform_resize_shorter(v.h, v.w, x->resize, &nh, &nw)))
			return st;
		int box[4] = { 0, 0, v.w, v.h };
		if ((nh != v.h || nw != v.w) &&
		    (st = resize_view(&v, box, nh, nw, &s->a, &s->a_cap, s)))
			return st;
	}

	/* 2. crop: a window (top, left) on v, or a resize of a box of it */
	int top = 0, left = 0;
	switch (x->crop) {
	case KILN_CROP_NONE:
		if (v.h != oh || v.w != ow) {
			int box[4] = { 0, 0, v.w, v.h };
			if ((st = resize_view(&v, box, oh, ow, &s->b, &s->b_cap, s)))
				return st;
		}
		break;
	case KILN_CROP_CENTER:
		center_offsets(v.h, v.w, oh, ow, &top, &left);
		break;
	case KILN_CROP_RANDOM: {
		int ph = v.h + 2 * x->pad, pw = v.w + 2 * x->pad;
		if (ph < oh || pw < ow)
			return kiln_error(KILN_EDATA, "a %dx%d image (padded by %d) is smaller than the random crop %dx%d",
					  v.h, v.w, x->pad, oh, ow);
		float u[4];
		kiln_rng_uniform4(seed, KILN_RNG_AUGMENT, (uint64_t)index, counter(epoch, DRAW_CROP), u);
		top = draw_upto(u[0], ph - oh) - x->pad;
		left = draw_upto(u[1], pw - ow) - x->pad;
		break;
	}
	case KILN_CROP_RESIZED: {
		int box[4];
		kiln_xform_rrc_box(x, v.h, v.w, seed, epoch, index, box);
		if (box[2] == ow && box[3] == oh) {
			left = box[0];
			top = box[1];
		} else if ((st = resize_view(&v, box, oh, ow, &s->b, &s->b_cap, s))) {
			return st;
		}
		break;
	}
	default:
		return kiln_error(KILN_EINVAL, "transform: crop %d", x->crop);
	}

	/* 3-5. channels, flip, normalisation and layout, in one pass */
	int flip = x->flip && kiln_rng_uniform(seed, KILN_RNG_AUGMENT, (uint64_t)index,
					      counter(epoch, DRAW_FLIP)) < 0.5f;
	size_t lut_n = x->out_dtype == KILN_U8 ? 0 : (size_t)x->out_c * 256;
	if ((st = grow((void **)&s->w, &s->w_cap,
		       lut_n * sizeof(float) + (size_t)ow * x->out_c)))
		return st;
	/* the table depends on mean and std only: built once per scratch (a
	 * worker's), not per sample */
	int nc = (int)lut_n / 256, same = nc == s->lut_c;
	for (int c = 0; same && c < nc; c++)
		same = s->lut_mean[c] == x->mean[c] && s->lut_std[c] == x->std[c];
	if (!same) {
		for (int c = 0; c < nc; c++) {
			common_norm_lut(s->w + c * 256, x->mean[c], x->std[c]);
			s->lut_mean[c] = x->mean[c];
			s->lut_std[c] = x->std[c];
		}
		s->lut_c = nc;
	}
	emit(x, &v, top, left, flip, s->w, (uint8_t *)(s->w + lut_n), out);
	return KILN_OK;
}
