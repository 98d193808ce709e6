/* plugins/loaders/synthetic.c - the `synthetic` data source: generated
 * images, for benchmarks (the loader and the model without disk or decode
 * cost) and tests.
 *
 * Sample i is an h x w x c u8 image whose bytes are a hash of (i, byte
 * position) - splitmix64 of the pair, 8 bytes per hash - and its label
 * i % classes.  The split the run asks for is mixed into the hash, so the
 * evaluation images differ from the training ones with the same keys.
 * Pure functions of the index: thread-safe, no files, no state.
 */
#include "loaders.h"
#include "image.h"

#include <ctype.h>    /* isspace, isdigit */
#include <inttypes.h> /* PRId64 */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* calloc, free */
#include <string.h>   /* memcpy, strcmp */

#define SYN_WHO "synthetic"
#define SYN_MAX_SIDE 65536

struct syn_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	int32_t h, w, c;
	uint64_t salt;    /* the split, mixed into every hash */
};

/* splitmix64's finaliser: a cheap, well-mixed 64-bit hash. */
static uint64_t syn_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key syn_keys[] = {
	{ "samples", KILN_KEY_INT, "60000", 1, 1e12, NULL,
	  "Number of generated samples." },
	{ "image_size", KILN_KEY_STR, "28 28", 0, 0, NULL,
	  "Image height and width, \"H W\" (also \"HxW\" or \"H,W\"), or one number for a square." },
	{ "image_channels", KILN_KEY_ENUM, "1", 0, 0, "1|3",
	  "Channels of the images: 1 (gray) or 3 (RGB)." },
	{ "classes", KILN_KEY_INT, "10", 1, 2147483647.0, NULL,
	  "Number of classes; sample i has label i % classes." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* "H W", "HxW", "H,W" or "S" into h, w.  Returns 0 or -1. */
static int syn_parse_size(const char *s, int32_t *h, int32_t *w)
{
	int64_t v[2] = { 0, 0 };
	int k = 0;
	const char *p = s;
	while (isspace((unsigned char)*p))
		p++;
	while (*p) {
		if (k == 2 || !isdigit((unsigned char)*p))
			return -1;
		while (isdigit((unsigned char)*p)) {
			v[k] = v[k] * 10 + (*p++ - '0');
			if (v[k] > SYN_MAX_SIDE)
				return -1;
		}
		k++;
		while (isspace((unsigned char)*p))
			p++;
		if ((*p == 'x' || *p == 'X' || *p == ',') && k == 1) {
			p++;
			while (isspace((unsigned char)*p))
				p++;
			if (!*p)
				return -1;
		}
	}
	if (k == 0 || v[0] < 1 || (k == 2 && v[1] < 1))
		return -1;
	*h = (int32_t)v[0];
	*w = (int32_t)(k == 2 ? v[1] : v[0]);
	return 0;
}

/* ---- the source ------------------------------------------------------- */

static void syn_close(void *vctx)
{
	free(vctx);
}

static kiln_status syn_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **out)
{
	int64_t n = 60000, classes = 10;
	kiln_status st;
	*out = NULL;
	if ((st = host->config_get_int(cfg, section, "samples", &n)) && st != KILN_ENOTFOUND)
		return st;
	if ((st = host->config_get_int(cfg, section, "classes", &classes)) && st != KILN_ENOTFOUND)
		return st;
	const char *size = host->config_get(cfg, section, "image_size");
	const char *ch = host->config_get(cfg, section, "image_channels");
	if (!size)
		size = syn_keys[1].def;
	if (!ch)
		ch = syn_keys[2].def;
	if (n < 1 || n > (int64_t)1e12)
		return host->error(KILN_ECONFIG, "%s: [%s] samples = %" PRId64 ": 1 or more",
				   host->config_where(cfg, section, "samples"), section, n);
	if (classes < 1 || classes > INT32_MAX)
		return host->error(KILN_ECONFIG, "%s: [%s] classes = %" PRId64 ": 1 or more",
				   host->config_where(cfg, section, "classes"), section, classes);
	struct syn_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	c->src.n = n;
	c->src.classes = classes;
	if (syn_parse_size(size, &c->h, &c->w)) {
		st = host->error(KILN_ECONFIG, "%s: [%s] image_size = '%s': expected \"H W\" or one number, each 1..%d",
				 host->config_where(cfg, section, "image_size"), section, size, SYN_MAX_SIDE);
		goto fail;
	}
	if (strcmp(ch, "1") && strcmp(ch, "3")) {
		st = host->error(KILN_ECONFIG, "%s: [%s] image_channels = '%s': 1 or 3",
				 host->config_where(cfg, section, "image_channels"), section, ch);
		goto fail;
	}
	c->c = ch[0] - '0';
	if ((int64_t)c->h * c->w > IMG_MAX_PIXELS) {
		st = host->error(KILN_ECONFIG, "%s: [%s] image_size = %dx%d is larger than the limit of %" PRId64 " pixels",
				 host->config_where(cfg, section, "image_size"), section, c->h, c->w,
				 (int64_t)IMG_MAX_PIXELS);
		goto fail;
	}
	/* train keeps salt 0; any other split name hashes to its own images */
	c->salt = 0;
	if (split && strcmp(split, "train"))
		for (const char *p = split; *p; p++)
			c->salt = syn_mix(c->salt ^ (uint8_t)*p) + 1;
	host->log(KILN_LOG_INFO, SYN_WHO, "[%s] %" PRId64 " samples of %dx%dx%d, %" PRId64 " classes",
		  section, c->src.n, c->h, c->w, c->c, c->src.classes);
	c->src.who = "synthetic";
	*out = c;
	return KILN_OK;
fail:
	free(c);
	return st;
}

static kiln_status syn_info(void *vctx, struct kiln_source_info *info)
{
	const struct syn_ctx *c = vctx;
	loaders_varying_info(vctx, info);
	loaders_fixed_info(info, KILN_U8, c->h, c->w, c->c, c->h, c->w, c->c);
	return KILN_OK;
}

/* image: u8 [h, w, c]; label: i32 [] = index % classes. */
static kiln_status syn_read_image(void *vctx, int64_t index, struct kiln_image *img,
				  void *label)
{
	const struct syn_ctx *c = vctx;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	size_t bytes = (size_t)c->h * (size_t)c->w * (size_t)c->c;
	st = img_reserve(c->src.host, img, bytes);
	if (st)
		return st;
	uint64_t base = syn_mix((uint64_t)index * 0x9e3779b97f4a7c15ull ^ c->salt);
	size_t i = 0;
	for (uint64_t k = 0; i < bytes; k++) {
		uint64_t x = syn_mix(base + k * 0x9e3779b97f4a7c15ull);
		size_t m = bytes - i < 8 ? bytes - i : 8;
		for (size_t b = 0; b < m; b++)
			img->data[i + b] = (uint8_t)(x >> (8 * b));
		i += m;
	}
	img->h = c->h;
	img->w = c->w;
	img->c = c->c;
	if (label)
		*(int32_t *)label = (int32_t)(index % c->src.classes);
	return KILN_OK;
}

LOADERS_SOURCE(synthetic, "synthetic",
	       "Generated images (a hash of index and position), label = index % classes",
	       syn_keys, syn_open, syn_close, syn_info, NULL, syn_read_image);
