/* cli/report_svg.c - `kiln report`: HTML escaping and inline SVG line
 * charts (no script, no external resource: the page renders offline). */
#include "build-config.h"
#include "report.h"

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

/* A step between ticks giving about five over [lo, hi]: 1, 2 or 5 x 10^k. */
static double tick_step(double lo, double hi)
{
	double raw = (hi - lo) / 5, mag = pow(10, floor(log10(raw)));
	double r = raw / mag;
	return mag * (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10);
}

struct axes {
	double x0, x1, y0, y1; /* data range shown */
};

/* The range of every point, widened when flat, y padded by 5%. */
static struct axes axes_of(const struct report_series *const *s, int n)
{
	struct axes a = { INFINITY, -INFINITY, INFINITY, -INFINITY };
	for (int k = 0; k < n; k++)
		for (int i = 0; s[k] && i < s[k]->n; i++) {
			if (!isfinite(s[k]->y[i]))
				continue;
			a.x0 = fmin(a.x0, s[k]->x[i]), a.x1 = fmax(a.x1, s[k]->x[i]);
			a.y0 = fmin(a.y0, s[k]->y[i]), a.y1 = fmax(a.y1, s[k]->y[i]);
		}
	if (!(a.x0 <= a.x1))
		a.x0 = 0, a.x1 = 1;
	if (!(a.y0 <= a.y1))
		a.y0 = 0, a.y1 = 1;
	if (a.x1 - a.x0 < 1e-12)
		a.x0 -= 1, a.x1 += 1;
	double pad = (a.y1 - a.y0) * 0.05;
	if (pad < 1e-12 * fmax(1, fabs(a.y0)))
		pad = fmax(fabs(a.y0) * 0.05, 1e-3);
	a.y0 -= pad, a.y1 += pad;
	return a;
}

static double px(const struct axes *a, double x)
{
	return ML + (x - a->x0) / (a->x1 - a->x0) * (W - ML - MR);
}

static double py(const struct axes *a, double y)
{
	return H - MB - (y - a->y0) / (a->y1 - a->y0) * (H - MT - MB);
}

/* Grid lines and tick labels on both axes, the frame, the x label. */
static void draw_axes(FILE *f, const struct axes *a)
{
	double st = tick_step(a->x0, a->x1);
	for (double t = ceil(a->x0 / st) * st; t <= a->x1 + st * 1e-9; t += st)
		fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
			   "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
			px(a, t), MT, px(a, t), H - MB, px(a, t), H - MB + 16, t);
	st = tick_step(a->y0, a->y1);
	for (double t = ceil(a->y0 / st) * st; t <= a->y1 + st * 1e-9; t += st)
		fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
			   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n",
			ML, py(a, t), W - MR, py(a, t), ML - 6, py(a, t) + 4, fabs(t) < st * 1e-9 ? 0 : t);
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
		if (isfinite(s->y[i]))
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
