/* core/transform_config.c - the [data] transform keys (core/schema.c)
 * into a struct kiln_xform (see transform.h), with every value checked and
 * errors naming the key and where it was set. */
#include "transform.h"
#include "../plugins/common/c_locale.h" /* common_strtod */
#include "../plugins/common/norm_lut.h" /* common_norm_fits */

#include <errno.h>
#include <math.h>   /* isfinite */
#include <stdio.h>

#define MAX_SIDE 65536

static const char *cfg_str(const struct kiln_config *cfg, const char *sec, const char *key,
			   const char *def)
{
	const char *v = kiln_config_get(cfg, sec, key);
	return v ? v : def;
}

static kiln_status cfg_bad(const struct kiln_config *cfg, const char *sec, const char *key,
			   const char *v, const char *expected)
{
	return kiln_error(KILN_ECONFIG, "%s: [%s] %s = '%s': expected %s",
			  kiln_config_where(cfg, sec, key), sec, key, v, expected);
}

/* A list of numbers holding one past a double's range (parse_numbers -2). */
static kiln_status cfg_out_of_range(const struct kiln_config *cfg, const char *sec,
				    const char *key, const char *v)
{
	return kiln_error(KILN_ECONFIG, "%s: [%s] %s = '%s': a number out of range (%s)",
			  kiln_config_where(cfg, sec, key), sec, key, v, KILN_DOUBLE_RANGE);
}

/* Up to `max` numbers separated by blanks or commas; the count, or -1 when
 * the text is not such a list (or has more), -2 when one of them is past a
 * double's range (1e400, 1e-400: out of range, not a bad list; a subnormal
 * is read as it is). */
static int parse_numbers(const char *v, double *out, int max)
{
	int n = 0;
	const char *p = v;
	for (;;) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			return n;
		char *end;
		errno = 0;
		double d = common_strtod(p, &end);
		if (end > p && kiln_strtod_lost(d, errno))
			return -2;
		if (end == p || n == max || !isfinite(d) ||
		    (*end && *end != ' ' && *end != '\t' && *end != ','))
			return -1;
		out[n++] = d;
		p = end;
	}
}

int kiln_xform_parse_size(const char *v, int32_t *h, int32_t *w)
{
	double d[2];
	int n = parse_numbers(v, d, 2);
	if (n < 1 || d[0] != (int)d[0] || d[n - 1] != (int)d[n - 1] || d[0] < 1 ||
	    d[n - 1] < 1 || d[0] > MAX_SIDE || d[n - 1] > MAX_SIDE)
		return -1;
	*h = (int32_t)d[0];
	*w = (int32_t)d[n - 1];
	return 0;
}

static kiln_status cfg_int(const struct kiln_config *cfg, const char *sec, const char *key,
			   int64_t def, int64_t lo, int64_t hi, const char *expected, int64_t *out)
{
	kiln_status st = kiln_config_get_int(cfg, sec, key, out);
	if (st == KILN_ENOTFOUND) {
		*out = def;
		return KILN_OK;
	}
	if (st)
		return st;
	if (*out < lo || *out > hi)
		return cfg_bad(cfg, sec, key, kiln_config_get(cfg, sec, key), expected);
	return KILN_OK;
}

/* `mean` or `std`: one value for every channel, or one per channel. */
static kiln_status cfg_per_channel(const struct kiln_config *cfg, const char *sec,
				   const char *key, const char *def, int oc, int positive,
				   float out[3], double exact[3])
{
	const char *v = cfg_str(cfg, sec, key, def);
	double d[3];
	int n = parse_numbers(v, d, 3);
	if (n == -2)
		return cfg_out_of_range(cfg, sec, key, v);
	char what[160];
	snprintf(what, sizeof what, "%s%s", oc == 1 ? "one number" : "one number or three (R G B)",
		 positive ? " > 0" : "");
	if (n != 1 && n != oc)
		return cfg_bad(cfg, sec, key, v, what);
	for (int c = 0; c < 3; c++) {
		double x = d[n == 1 ? 0 : c < oc ? c : 0];
		if (positive && !(x > 0))
			return cfg_bad(cfg, sec, key, v, what);
		out[c] = (float)x;
		exact[c] = x;
	}
	return KILN_OK;
}

/* A "lo hi" range with 0 < lo <= hi (<= 1 when `unit`). */
static kiln_status cfg_range(const struct kiln_config *cfg, const char *sec, const char *key,
			     const char *def, int unit, float out[2])
{
	const char *v = cfg_str(cfg, sec, key, def);
	double d[2];
	const int n = parse_numbers(v, d, 2);
	if (n == -2)
		return cfg_out_of_range(cfg, sec, key, v);
	if (n != 2 || !(d[0] > 0) || !(d[0] <= d[1]) || (unit && d[1] > 1))
		return cfg_bad(cfg, sec, key, v,
			       unit ? "two numbers lo hi with 0 < lo <= hi <= 1"
				    : "two numbers lo hi with 0 < lo <= hi");
	out[0] = (float)d[0];
	out[1] = (float)d[1];
	return KILN_OK;
}

kiln_status kiln_xform_from_config(const struct kiln_config *cfg, const char *section,
				   int train, int src_h, int src_w, int src_c,
				   struct kiln_xform *x)
{
	kiln_status st;
	int64_t i64;
	const char *sec = section, *v;
	memset(x, 0, sizeof *x);

	if ((st = cfg_int(cfg, sec, "resize", 0, 0, MAX_SIDE, "an integer in [0, 65536]", &i64)))
		return st;
	x->resize = (int32_t)i64;
	/* images of one size (src_h, src_w): a resize none of them survives
	 * is refused here, before a batch is sized from it */
	int rh = src_h, rw = src_w;
	if (x->resize > 0 && src_h > 0 && src_w > 0 &&
	    (st = kiln_xform_resize_shorter(src_h, src_w, x->resize, &rh, &rw)))
		return kiln_error_wrap(KILN_ECONFIG, "%s: [%s] resize",
				       kiln_config_where(cfg, sec, "resize"), sec);
	if ((st = cfg_int(cfg, sec, "pad", 0, 0, MAX_SIDE, "an integer in [0, 65536]", &i64)))
		return st;
	x->pad = (int32_t)i64;
	if ((st = cfg_int(cfg, sec, "channels", 0, 0, 3, "0 (as the source), 1 or 3", &i64)))
		return st;
	if (i64 == 2)
		return cfg_bad(cfg, sec, "channels", kiln_config_get(cfg, sec, "channels"),
			       "0 (as the source), 1 or 3");
	x->out_c = (int32_t)(i64 ? i64 : src_c);
	if (x->out_c != 1 && x->out_c != 3) {
		/* unset: the section is where to set it */
		const char *at = kiln_config_where(cfg, sec, "channels");
		if (!strcmp(at, "default"))
			at = kiln_config_where(cfg, sec, NULL);
		if (!src_c)
			return kiln_error(KILN_ECONFIG, "%s: [%s] channels = 0 (as the source), but the source does not say how many its images have (it decodes each as it is, gray or colour): set channels = 1 or 3",
					  at, sec);
		return kiln_error(KILN_ECONFIG, "%s: [%s] channels = 0 (as the source), but the source's images have %d channels: set channels = 1 or 3",
				  at, sec, src_c);
	}

	v = cfg_str(cfg, sec, "crop", "none");
	static const char *const crops[] = { "none", "center", "random", "resized" };
	x->crop = -1;
	for (int i = 0; i < 4; i++)
		if (!strcmp(v, crops[i]))
			x->crop = i;
	if (x->crop < 0)
		return cfg_bad(cfg, sec, "crop", v, "none, center, random or resized");
	int flip = 0;
	if ((st = kiln_config_get_bool(cfg, sec, "flip", &flip)) && st != KILN_ENOTFOUND)
		return st;
	x->flip = flip;
	if ((st = cfg_range(cfg, sec, "scale", "0.08 1.0", 1, x->scale)) ||
	    (st = cfg_range(cfg, sec, "ratio", "0.75 1.3333333333", 0, x->ratio)))
		return st;
	if (!train) { /* evaluation: deterministic */
		if (x->crop == KILN_CROP_RANDOM || x->crop == KILN_CROP_RESIZED)
			x->crop = KILN_CROP_CENTER;
		x->flip = 0;
	}

	/* output size: `size`, else the source's (after `resize`) */
	v = kiln_config_get(cfg, sec, "size");
	if (v && *v) {
		if (kiln_xform_parse_size(v, &x->out_h, &x->out_w))
			return cfg_bad(cfg, sec, "size", v, "H W or N (pixels, 1 to 65536)");
	} else if (src_h > 0 && src_w > 0) {
		x->out_h = rh; /* after `resize`, checked above */
		x->out_w = rw;
	} else {
		return kiln_error(KILN_ECONFIG, "%s: [%s] size is not set and the source's images vary in size: set size = H W (or N for a square)",
				  kiln_config_where(cfg, sec, NULL), sec);
	}
	if ((int64_t)x->out_h * x->out_w * x->out_c > ((int64_t)1 << 28))
		return kiln_error(KILN_ECONFIG, "%s: [%s] size = %dx%d x %d channels is too large",
				  kiln_config_where(cfg, sec, "size"), sec, x->out_h, x->out_w,
				  x->out_c);

	double mean[3], sd[3];
	if ((st = cfg_per_channel(cfg, sec, "mean", "0", x->out_c, 0, x->mean, mean)) ||
	    (st = cfg_per_channel(cfg, sec, "std", "1", x->out_c, 1, x->std, sd)))
		return st;
	for (int c = 0; c < x->out_c; c++)
		if (!common_norm_fits(mean[c], sd[c]))
			return kiln_error(KILN_ECONFIG, "%s: [%s] mean = %s, std = %s: channel %d's (u8/255 - %g) / %g is not finite in f32 (mean and std must be f32 numbers, std > 0, and the normalised values within +-3.4e38)",
					  kiln_config_where(cfg, sec, "std"), sec,
					  cfg_str(cfg, sec, "mean", "0"), cfg_str(cfg, sec, "std", "1"), c,
					  mean[c], sd[c]);

	v = cfg_str(cfg, sec, "transform_on", "host");
	if (!strcmp(v, "device"))
		x->out_dtype = KILN_U8; /* mean/std stay in x for the device */
	else if (!strcmp(v, "host"))
		x->out_dtype = KILN_F32;
	else
		return cfg_bad(cfg, sec, "transform_on", v, "host or device");

	v = kiln_config_get(cfg, "model", "layout");
	x->nhwc = v && !strcmp(v, "nhwc");
	return KILN_OK;
}
