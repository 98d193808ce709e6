/* cli/report_svg.c - `kiln report`: HTML escaping and inline SVG line
 * charts (no script, no external resource: the page renders offline). */
#include "build-config.h"
#include "report.h"

#include <float.h> /* DBL_MAX */
#include <math.h>
#include <string.h>

void report_html_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		case '\'': fputs("&#39;", f); break;
		default: fputc(*s, f);
		}
	}
}

enum { W = 720, H = 300, ML = 72, MR = 150, MT = 34, MB = 42 };

static const char *const colors[] = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
				      "#8c564b" };

/* The chart's arithmetic works on halves (x / 2 - x0 / 2): a range from
 * -1e308 to 1e308 overflows to inf whole, and every point became "-nan"
 * (issue of session 33); halved, any two finite doubles have a finite
 * difference. */

/* A step between ticks giving about five over [lo, hi]: 1, 2 or 5 x 10^k. */
static double tick_step(double lo, double hi)
{
	double raw = (hi / 2 - lo / 2) / 2.5, mag = pow(10, floor(log10(raw)));
	double r = raw / mag;
	return mag * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
}

/* At most this many ticks on an axis (about five are asked of tick_step,
 * up to 9 come out of its rounding): a bound that holds whatever the
 * floating point does. */
enum { MAX_TICKS = 16 };

/* The ticks over [lo, hi]: k * st for the whole k from ceil(lo / st) to
 * floor(hi / st), counted by an integer.  `t += st` stopped advancing
 * where st is below half the spacing of doubles at t (steps near 2^53, or
 * 1e17 and 1e17 + 16) and wrote grid lines until the disk was full. */
static int ticks(double lo, double hi, double t[MAX_TICKS], double *step)
{
	const double st = tick_step(lo, hi), k0 = ceil(lo / st), k1 = floor(hi / st + 1e-9);
	int n = 0;
	for (int i = 0; i < MAX_TICKS && k0 + i <= k1; i++)
		t[n++] = (k0 + i) * st;
	*step = st;
	return n;
}

struct axes {
	double x0, x1, y0, y1; /* data range shown */
};

/* [lo, hi] padded by frac of its span on each side; a flat range (a span
 * below 1e-12 of its magnitude: one point, or two at 1e17 and 1e17 + 16)
 * by 5% of its magnitude, at least min_pad; kept within the doubles. */
static void widen(double *lo, double *hi, double frac, double min_pad)
{
	const double mag = fmax(fabs(*lo), fabs(*hi)), half = *hi / 2 - *lo / 2;
	double pad = half * 2 * frac;
	if (half < 0.5e-12 * fmax(1, mag))
		pad = fmax(mag * 0.05, min_pad);
	*lo = fmax(*lo - pad, -DBL_MAX), *hi = fmin(*hi + pad, DBL_MAX);
}

/* The range of every finite point, widened when flat, y padded by 5%. */
static struct axes axes_of(const struct report_series *const *s, int n)
{
	struct axes a = { INFINITY, -INFINITY, INFINITY, -INFINITY };
	for (int k = 0; k < n; k++)
		for (int i = 0; s[k] && i < s[k]->n; i++) {
			if (!isfinite(s[k]->x[i]) || !isfinite(s[k]->y[i]))
				continue;
			a.x0 = fmin(a.x0, s[k]->x[i]), a.x1 = fmax(a.x1, s[k]->x[i]);
			a.y0 = fmin(a.y0, s[k]->y[i]), a.y1 = fmax(a.y1, s[k]->y[i]);
		}
	if (!(a.x0 <= a.x1))
		a.x0 = 0, a.x1 = 1;
	if (!(a.y0 <= a.y1))
		a.y0 = 0, a.y1 = 1;
	widen(&a.x0, &a.x1, 0, 1);
	widen(&a.y0, &a.y1, 0.05, 1e-3);
	return a;
}

static double px(const struct axes *a, double x)
{
	return ML + (x / 2 - a->x0 / 2) / (a->x1 / 2 - a->x0 / 2) * (W - ML - MR);
}

static double py(const struct axes *a, double y)
{
	return H - MB - (y / 2 - a->y0 / 2) / (a->y1 / 2 - a->y0 / 2) * (H - MT - MB);
}

/* Grid lines and tick labels on both axes, the frame, the x label. */
static void draw_axes(FILE *f, const struct axes *a)
{
	double t[MAX_TICKS], st;
	for (int i = 0, n = ticks(a->x0, a->x1, t, &st); i < n; i++)
		fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
			   "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
			px(a, t[i]), MT, px(a, t[i]), H - MB, px(a, t[i]), H - MB + 16, t[i]);
	for (int i = 0, n = ticks(a->y0, a->y1, t, &st); i < n; i++)
		fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
			   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n",
			ML, py(a, t[i]), W - MR, py(a, t[i]), ML - 6, py(a, t[i]) + 4,
			fabs(t[i]) < st * 1e-9 ? 0 : t[i]);
	fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>\n"
		   "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
		ML, MT, W - ML - MR, H - MT - MB, (ML + W - MR) / 2, H - 6);
}

/* One series: its polyline, a circle per point, its legend entry. */
static void draw_series(FILE *f, const struct axes *a, const struct report_series *s,
			const char *label, int k)
{
	const char *c = colors[k % (int)(sizeof colors / sizeof *colors)];
	fprintf(f, "<polyline class=\"line\" stroke=\"%s\" data-series=\"", c);
	report_html_text(f, s->name);
	fputs("\" points=\"", f);
	for (int i = 0; i < s->n; i++)
		if (isfinite(s->x[i]) && isfinite(s->y[i]))
			fprintf(f, "%s%.1f,%.1f", i ? " " : "", px(a, s->x[i]), py(a, s->y[i]));
	fputs("\"/>\n", f);
	for (int i = 0; i < s->n; i++) {
		fputs("<circle class=\"pt\" data-series=\"", f);
		report_html_text(f, s->name);
		fprintf(f, "\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>step %g: %g</title></circle>\n",
			px(a, s->x[i]), isfinite(s->y[i]) ? py(a, s->y[i]) : (double)MT, c, s->x[i],
			s->y[i]);
	}
	const int ly = MT + 8 + 18 * k;
	fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
		   "<text x=\"%d\" y=\"%d\">",
		W - MR + 10, ly, W - MR + 28, ly, c, W - MR + 32, ly + 4);
	report_html_text(f, label);
	fprintf(f, " (%d)</text>\n", s->n);
}

void report_svg_chart(FILE *f, const char *id, const char *title,
		      const struct report_series *const *series, const char *const *labels, int n)
{
	const struct axes a = axes_of(series, n);
	fprintf(f, "<svg class=\"plot\" id=\"plot-%s\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
		id, W, H, W, H);
	fprintf(f, "<text class=\"title\" x=\"%d\" y=\"20\">", ML);
	report_html_text(f, title);
	fputs("</text>\n", f);
	draw_axes(f, &a);
	for (int k = 0, shown = 0; k < n; k++)
		if (series[k])
			draw_series(f, &a, series[k], labels[k], shown++);
	fputs("</svg>\n", f);
}
