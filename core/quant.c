/* core/quant.c - calibration observers, the range rules and per-channel
 * weight quantization (the math is in quant.h). */
#include "quant.h"

#include <math.h>
#include <stdlib.h> /* malloc, free */

int kiln_quant_method_parse(const char *s)
{
	static const char *const names[] = { "minmax", "percentile", "entropy" };
	for (int i = 0; s && i < 3; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

/* Double the histogram's range until v fits: bins merge in pairs. */
static void grow(struct kiln_quant_observer *o, double v)
{
	while (v >= o->hmax) {
		for (int b = 0; b < KILN_QUANT_BINS / 2; b++)
			o->hist[b] = o->hist[2 * b] + o->hist[2 * b + 1];
		memset(o->hist + KILN_QUANT_BINS / 2, 0, sizeof o->hist / 2);
		o->hmax *= 2;
	}
}

void kiln_quant_observe(struct kiln_quant_observer *o, const float *x, int64_t n)
{
	float lo = INFINITY, hi = -INFINITY, amax = 0;
	if (n <= 0)
		return;
	for (int64_t i = 0; i < n; i++) {
		lo = x[i] < lo ? x[i] : lo;
		hi = x[i] > hi ? x[i] : hi;
	}
	amax = fmaxf(fabsf(lo), fabsf(hi));
	if (!o->count || lo < o->min)
		o->min = lo;
	if (!o->count || hi > o->max)
		o->max = hi;
	o->count += n;
	if (amax == 0 && o->hmax == 0) {
		o->hist[0] += n;
		return;
	}
	if (o->hmax == 0) /* the first nonzero batch: the power of two above it */
		o->hmax = ldexp(1.0, ilogb(amax) + 1);
	if (amax >= o->hmax)
		grow(o, amax);
	const double per = KILN_QUANT_BINS / o->hmax;
	for (int64_t i = 0; i < n; i++) {
		int64_t b = (int64_t)(fabs((double)x[i]) * per);
		o->hist[b < KILN_QUANT_BINS ? b : KILN_QUANT_BINS - 1]++;
	}
}

static double max_abs(const struct kiln_quant_observer *o)
{
	return fmax(fabs(o->min), fabs(o->max));
}

static double percentile_amax(const struct kiln_quant_observer *o, double pct)
{
	const double want = pct / 100.0 * (double)o->count, width = o->hmax / KILN_QUANT_BINS;
	int64_t cum = 0;
	for (int b = 0; b < KILN_QUANT_BINS; b++) {
		cum += o->hist[b];
		if ((double)cum >= want)
			return fmin((b + 1) * width, max_abs(o));
	}
	return max_abs(o);
}

/* KL(p || q) of two histograms of n bins, each normalised by its sum, as
 * scipy.stats.entropy: a bin with p > 0 and q = 0 makes it infinite. */
static double kl(const double *p, const double *q, int n)
{
	double sp = 0, sq = 0, d = 0;
	for (int i = 0; i < n; i++)
		sp += p[i], sq += q[i];
	for (int i = 0; i < n; i++) {
		if (p[i] <= 0)
			continue;
		if (q[i] <= 0)
			return INFINITY;
		d += p[i] / sp * log((p[i] / sp) / (q[i] / sq));
	}
	return d;
}

/* Q of the cut at bin i (entropy_amax): h[0, i) merged into `levels`
 * levels, each level's sum spread evenly over its nonzero bins.  Bin b is
 * in level l when l * i / levels <= b < (l + 1) * i / levels (numpy's
 * digitize over linspace(0, i, levels + 1), exact: levels is a power of
 * two), so level l starts at bin ceil(l * i / levels). */
static void entropy_q(const double *h, int i, int levels, double *q)
{
	for (int l = 0; l < levels; l++) {
		const int b0 = (int)(((int64_t)l * i + levels - 1) / levels);
		const int b1 = (int)(((int64_t)(l + 1) * i + levels - 1) / levels);
		double sum = 0;
		int nz = 0;
		for (int b = b0; b < b1; b++)
			sum += h[b], nz += h[b] > 0;
		for (int b = b0; b < b1; b++)
			q[b] = h[b] > 0 ? sum / nz : 0;
	}
}

/* TensorRT's entropy calibration (pytorch-quantization's
 * _compute_amax_entropy, stride 1, start bin 128) over the |x|
 * histogram h, whose bin 0 takes bin 1's count first: the zeros a ReLU
 * writes are no part of the shape to keep (with them, every cut that
 * merges bin 0 with its neighbours looks far worse than the shortest
 * cuts, and the rule clipped the ResNet's ReLU outputs to 1/8-1/4 of
 * their range).  Levels: 256 for a tensor never negative (u8), else 128
 * (s8 without its sign).  For each cut i from 128 to every bin,
 * P = h[0, i) with the clipped tail added to bin i - 1, Q = entropy_q;
 * the cut with the least KL(P || Q) wins (the last of equals), amax =
 * its upper edge.  tests/data/gen_quant_refs.py is the reference. */
static double entropy_amax(const struct kiln_quant_observer *o)
{
	enum { START = 128 };
	const int levels = o->min >= 0 ? 256 : 128;
	/* (48 KiB: on the heap, see configure.ac's KILN_FRAME_CFLAGS; -1
	 * without it, and the caller falls back to the max) */
	double *h = malloc(3 * KILN_QUANT_BINS * sizeof *h), *p = h + KILN_QUANT_BINS,
	       *q = p + KILN_QUANT_BINS, best = INFINITY;
	if (!h)
		return -1;
	const double width = o->hmax / KILN_QUANT_BINS;
	int cut = KILN_QUANT_BINS;
	for (int b = 0; b < KILN_QUANT_BINS; b++)
		h[b] = (double)o->hist[b];
	h[0] = h[1];
	double tail = 0;
	for (int b = START; b < KILN_QUANT_BINS; b++)
		tail += h[b];
	for (int i = START; i <= KILN_QUANT_BINS; i++) {
		memcpy(p, h, (size_t)i * sizeof *p);
		p[i - 1] += tail;
		entropy_q(h, i, levels, q);
		const double d = kl(p, q, i);
		if (d <= best)
			best = d, cut = i;
		if (i < KILN_QUANT_BINS)
			tail -= h[i];
	}
	free(h);
	return fmin(cut * width, max_abs(o));
}

/* Is the entropy rule's amax degenerate: at or below every |x| seen (the
 * least |x| is min for a tensor never negative, -max for one never
 * positive, else 0), or keeping one occupied bin below it?  Values all in
 * a few bins far from 0 (a sigmoid's output in [0.44, 0.56]): the cut
 * just above the lowest occupied bin leaves P one bin, Q the same, KL 0,
 * and that cut wins; every value then quantizes to the same level. */
static int entropy_degenerate(const struct kiln_quant_observer *o, double amax)
{
	const double least = o->min >= 0 ? o->min : o->max <= 0 ? -o->max : 0;
	const int cut = (int)ceil(amax / (o->hmax / KILN_QUANT_BINS));
	int occupied = 0;
	for (int b = 0; b < cut && b < KILN_QUANT_BINS; b++)
		occupied += o->hist[b] > 0;
	return amax <= least || occupied <= 1;
}

double kiln_quant_amax_ex(const struct kiln_quant_observer *o, int method, double pct,
			  int *fell_back)
{
	if (fell_back)
		*fell_back = 0;
	if (!o->count || o->hmax == 0)
		return 0;
	if (method == KILN_QUANT_PERCENTILE)
		return percentile_amax(o, pct);
	if (method == KILN_QUANT_ENTROPY) {
		const double a = entropy_amax(o);
		if (a >= 0 && !entropy_degenerate(o, a))
			return a;
		if (fell_back)
			*fell_back = 1;
	}
	return max_abs(o);
}

double kiln_quant_amax(const struct kiln_quant_observer *o, int method, double pct)
{
	return kiln_quant_amax_ex(o, method, pct, NULL);
}

float kiln_quant_act_scale(const struct kiln_quant_observer *o, double amax, int *is_unsigned)
{
	*is_unsigned = o->count > 0 && o->min >= 0;
	if (amax <= 0)
		return 1.0f;
	return (float)(amax / (*is_unsigned ? 255.0 : 127.0));
}

void kiln_quant_weights(const float *w, int64_t O, int64_t per, int8_t *q, float *scale)
{
	for (int64_t o = 0; o < O; o++) {
		const float *row = w + o * per;
		float amax = 0;
		for (int64_t e = 0; e < per; e++)
			amax = fmaxf(amax, fabsf(row[e]));
		scale[o] = amax > 0 ? amax / 63.0f : 1.0f;
		for (int64_t e = 0; e < per; e++) {
			float v = nearbyintf(row[e] / scale[o]);
			q[o * per + e] = (int8_t)fmaxf(-63.0f, fminf(63.0f, v));
		}
	}
}
