/* cli/cmd_pack.c - `kiln pack CONFIG --out DIR [options] [overrides]`:
 * read every sample of the source CONFIG's [data] (or [data.eval])
 * describes, through the registry and the source's read_image exactly as
 * a run would, optionally resize it once, and write records shards
 * DIR/<split>-00000.krec, ... (docs/formats.md).
 *
 * Worker threads read, resize and encode a round of samples; the main
 * thread then writes that round in sample order, so the shards are the same
 * for any worker count.  Shards are written as *.tmp files, fsynced, and
 * renamed into place only when every one of them is complete, then the
 * directory is fsynced: an interrupted pack leaves no .krec behind.
 * --format folder writes images in place instead, between creating
 * DIR/<split>.folder-partial and removing it (FOLDER_PARTIAL).
 *
 * This file: the options, the workers and the loop over the rounds.  The
 * shards are written in cli/pack_shards.c, the folder's images in
 * cli/pack_folder.c (the parts they share: cli/pack.h); the output
 * directory's steps every format takes in cli/pack_dir.c; --format tokens
 * in cli/pack_tokens.c.
 */
#include "build-config.h"
#include "cli.h"

#include <errno.h>    /* errno */
#include <stdio.h>
#include <string.h>

#ifdef KILN_WITH_PACK
#include <kiln/image.h> /* kiln_xform_resize_box, its scratch */

#include "image.h"   /* plugins/loaders: img_encode_jpeg, img_encode_png */
#include "pack.h"    /* the options, a sample, the shards; pack_shards.c, pack_folder.c */

#include <pthread.h>  /* pthread_create, pthread_join */
#include <stdlib.h>   /* strtoll, calloc, free */
#include <sys/stat.h> /* mkdir, stat */
#include <time.h>     /* clock_gettime */
#include <unistd.h>   /* sysconf */
#endif

const char cmd_pack_usage[] =
	"usage: kiln pack CONFIG --out DIR [--section data|data.eval] [--split NAME]\n"
	"                 [--shard-size SIZE] [--store raw|jpeg|png] [--quality Q]\n"
	"                 [--resize N] [--workers N] [--force] [--format records|folder]\n"
	"                 [section.key=value ...]\n"
	"       kiln pack --format tokens FILE... --out DIR [--vocab vocab.json --merges merges.txt]\n"
	"                 [--val-fraction F] [--split NAME] [--val-split NAME]\n"
	"                 [--shard-tokens N] [--force]\n";
const char cmd_pack_about[] =
	"Pack the samples of the source CONFIG's [data] section describes (any source with\n"
	"images: idx, folder, tar, lmdb, records) into kiln's records shards\n"
	"DIR/<split>-00000.krec, DIR/<split>-00001.krec, ... (docs/formats.md), which the\n"
	"`records` source reads with `path = DIR`.\n\n"
	"  --out DIR          output directory (created if missing)\n"
	"  --section S        data (default) or data.eval: which section's source to read\n"
	"  --split NAME       the split passed to the source and the shards' name prefix\n"
	"                     (default: train for data, test for data.eval; another\n"
	"                     must exist as path/NAME with folder, tar and lmdb)\n"
	"  --shard-size SIZE  start a new shard past about SIZE bytes (default 64M;\n"
	"                     K, M, G are powers of 1024; a split has at most 50000\n"
	"                     shards, which a reader maps at once)\n"
	"  --store FORMAT     raw (default: u8 pixels as decoded), jpeg or png\n"
	"  --quality Q        JPEG quality 1..100 (default 90; --store jpeg only)\n"
	"  --resize N         resize every image once so its shorter side is N pixels\n"
	"                     (antialiased bilinear, PIL's filter; the longer side is\n"
	"                     scaled and truncated as torchvision's Resize(N))\n"
	"  --workers N        threads that read, resize and encode (default: the cores, at\n"
	"                     most 16); the shards are the same for any number\n"
	"  --force            replace the split's shards already in DIR, or with --format\n"
	"                     folder the images an earlier pack wrote into DIR/<split>\n"
	"                     (other files stay)\n"
	"  --format F         records (default), or folder: an ImageFolder tree\n"
	"                     DIR/<split>/<class>/<index>.png|jpg (needs --store png or\n"
	"                     jpeg) that `source = folder` and torchvision read;\n"
	"                     DIR/<split>.folder-partial exists until the last image is\n"
	"                     written and synced (the folder source refuses the split\n"
	"                     beside it: a failed or killed pack)\n\n"
	"Arguments with '=' override config keys, as for kiln train (data.limit=1000).\n"
	"Shards are written as *.tmp, fsynced, and renamed into place when all are\n"
	"complete; the split's *.tmp that a killed pack left are removed first (said on\n"
	"stderr), and DIR/<split>.krec-partial exists while shards are placed (a reader\n"
	"refuses the split beside it).  The last line on stdout sums up: samples, shards,\n"
	"bytes, samples/s.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error (naming the\n"
	"sample).\n\n"
	"--format tokens encodes text files (no CONFIG) into token shards in llm.c's format\n"
	"(docs/formats.md) DIR/<split>-000000.bin, ..., which the `tokens` source reads with\n"
	"`path = DIR` (cli/pack_tokens.c):\n"
	"  --vocab, --merges   GPT-2's vocab.json and merges.txt: byte-pair encoding (the\n"
	"                      pre-tokenizer's approximation for non-ASCII text: docs/data.md;\n"
	"                      <|endoftext|> precedes each file); without: bytes, vocab 256\n"
	"  --val-fraction F    the last fraction F (0..0.99) of each file's tokens goes to\n"
	"                      the held-out shards (default 0)\n"
	"  --split, --val-split  the shards' name prefixes (default train and val)\n"
	"  --shard-tokens N    tokens per shard at most (default 100000000)\n"
	"  --force             replace the shards already in DIR (they stay as they were\n"
	"                      until the new ones are complete: a failed pack keeps them)\n"
	"Each shard is written as .tmp and fsynced when full; when every input is encoded\n"
	"they are renamed into place.  DIR/<split>.bin-partial (and the val split's) exists\n"
	"while they are, and the `tokens` source refuses a split beside one (a killed\n"
	"pack); the splits' *.bin.tmp that a killed pack left are removed first.\n";

/* `--format tokens` (or --format=tokens) among the arguments. */
static int wants_tokens(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--format=tokens") ||
		    (!strcmp(argv[i], "--format") && i + 1 < argc && !strcmp(argv[i + 1], "tokens")))
			return 1;
	return 0;
}

#ifndef KILN_WITH_PACK
static int pack_source(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "%skiln: error: this kiln was built without the data loaders (configure found no libturbojpeg or libpng), so it cannot pack\n",
		cmd_pack_usage);
	return 1;
}
#else

/* Samples a worker handles per round: about ROUND_BYTES of pixels, within
 * [ROUND_MIN, ROUND_MAX] (small images: fewer rounds and thread starts;
 * large ones: bounded memory). */
#define ROUND_BYTES ((int64_t)4 << 20)
#define ROUND_MIN 8
#define ROUND_MAX 1024

/* ---- options ------------------------------------------------------------- */

/* After the error line (usage_error's, or cli_opt's): the usage; 2. */
static int usage_tail(void)
{
	fprintf(stderr, "%s(kiln pack --help describes every option)\n", cmd_pack_usage);
	return 2;
}

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "kiln: error: ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return usage_tail();
}

/* The values of kiln pack's options that pack_values checks. */
struct pack_given {
	const char *shard_size, *store, *format;
	long long quality, resize, workers; /* -1: not given */
};

/* g's values, and those pack_option read into *o, checked into *o: 0 or
 * the exit code of a usage error. */
static int pack_values(struct pack_opts *o, const struct pack_given *g)
{
	size_t sz; /* [run] memory_limit's sizes (kiln_parse_size) */
	if (o->out && !*o->out)
		return usage_error("%s", "--out needs a directory");
	if (strcmp(o->section, "data") && strcmp(o->section, "data.eval"))
		return usage_error("--section '%s': choose data or data.eval", o->section);
	if (o->split && (!*o->split || strchr(o->split, '/') || o->split[0] == '.'))
		return usage_error("--split '%s': a plain name such as train or test", o->split);
	if (g->shard_size) {
		if (kiln_parse_size(g->shard_size, &sz) || sz < 4096)
			return usage_error("--shard-size '%s': a size such as 64M, 1G or 500000 (at least 4096 bytes)",
					   g->shard_size);
		o->shard_size = sz;
	}
	if (g->store && !strcmp(g->store, "raw"))
		o->store = REC_RAW;
	else if (g->store && (!strcmp(g->store, "jpeg") || !strcmp(g->store, "jpg")))
		o->store = REC_JPEG;
	else if (g->store && !strcmp(g->store, "png"))
		o->store = REC_PNG;
	else if (g->store)
		return usage_error("--store '%s': choose raw, jpeg or png", g->store);
	if (g->format && strcmp(g->format, "records") && strcmp(g->format, "folder"))
		return usage_error("--format '%s': choose records or folder", g->format);
	o->folder = g->format && !strcmp(g->format, "folder");
	o->quality_given = g->quality >= 0;
	if (g->quality >= 0)
		o->quality = (int)g->quality;
	if (g->resize >= 0)
		o->resize = (int)g->resize;
	if (g->workers >= 0)
		o->workers = (int)g->workers;
	return 0;
}

/* One option at argv[*i] (*i advanced past its value): 1 read, 0 not
 * one of kiln pack's, -1 after cli_opt's error. */
static int pack_option(int argc, char **argv, int *i, struct pack_opts *o, struct pack_given *g)
{
	int r;
	if ((r = cli_flag(argv, *i, "--force")) > 0)
		o->force = 1;
	if (r ||
	    (r = cli_opt(argc, argv, i, "--out", &o->out)) ||
	    (r = cli_opt(argc, argv, i, "--section", &o->section)) ||
	    (r = cli_opt(argc, argv, i, "--split", &o->split)) ||
	    (r = cli_opt(argc, argv, i, "--shard-size", &g->shard_size)) ||
	    (r = cli_opt(argc, argv, i, "--store", &g->store)) ||
	    (r = cli_opt(argc, argv, i, "--format", &g->format)) ||
	    (r = cli_opt_int(argc, argv, i, "--quality", 1, 100, &g->quality)) ||
	    (r = cli_opt_int(argc, argv, i, "--resize", 1, 65535, &g->resize)) ||
	    (r = cli_opt_int(argc, argv, i, "--workers", 1, 256, &g->workers)))
		return r;
	return 0;
}

/* Returns 0 or the exit code of a usage error.  The options by the parser
 * every command shares (cli/kiln.c: cli_opt, cli_opt_int, cli_flag; a loop
 * of kiln pack's own before session 33). */
static int parse_args(int argc, char **argv, struct pack_opts *o)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	struct pack_given g = { .quality = -1, .resize = -1, .workers = -1 };
	memset(o, 0, sizeof *o);
	o->section = "data";
	o->shard_size = 64ull << 20;
	o->store = REC_RAW;
	o->quality = 90;
	o->workers = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
	o->over = calloc((size_t)argc, sizeof *o->over);
	if (!o->over)
		return usage_error("%s", "out of memory");
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int r;
		if (a[0] != '-' || !a[1]) {
			if (strchr(a, '='))
				o->over[o->nover++] = argv[i];
			else if (!o->config)
				o->config = a;
			else
				return usage_error("unexpected argument '%s' (overrides look like data.limit=1000)", a);
			continue;
		}
		if ((r = pack_option(argc, argv, &i, o, &g)) < 0)
			return usage_tail();
		if (!r) {
			if (!pack_option_elsewhere(a, 0))
				cli_bad_arg(a);
			return usage_tail();
		}
	}
	int rc = pack_values(o, &g);
	if (rc)
		return rc;
	if (!o->config)
		return usage_error("%s", "no CONFIG file given");
	if (!o->out)
		return usage_error("%s", "--out DIR is required");
	if (!o->split)
		o->split = strcmp(o->section, "data") ? "test" : "train";
	if (o->folder && o->store == REC_RAW)
		return usage_error("%s", "--format folder writes image files: choose --store png or jpeg");
	/* silently ignored before session 29 */
	if (o->quality_given && o->store != REC_JPEG)
		return usage_error("--quality is the JPEG quality: --store %s ignores it (pass --store jpeg, or drop --quality)",
				   rec_encoding_name(o->store));
	return 0;
}

/* ---- reading and encoding, in worker threads ------------------------------ */

struct job {
	struct kiln_source *src;
	const struct pack_opts *o;
	int64_t first, count;  /* samples [first, first + count) */
	struct item *items;    /* count */
	struct kiln_image img; /* scratch, kept across rounds */
	uint8_t *buf;          /* resized pixels */
	size_t buf_cap;
	struct kiln_xform_scratch xs;
	kiln_status st;
	int64_t failed;        /* the sample that failed */
	char msg[KILN_ERROR_MAX];
};

static int grow(uint8_t **p, size_t *cap, size_t n)
{
	if (*cap >= n)
		return 0;
	uint8_t *q = realloc(*p, n);
	if (!q)
		return -1;
	*p = q;
	*cap = n;
	return 0;
}

static kiln_status pack_one(struct job *j, int64_t index, struct item *it)
{
	const struct kiln_host *host = kiln_host_table();
	kiln_status st = kiln_source_read_image(j->src, index, &j->img, &it->label);
	if (st)
		return st == KILN_EIO ? KILN_EDATA : st; /* an unreadable sample is a data error */
	int h = j->img.h, w = j->img.w, c = j->img.c;
	if (h <= 0 || w <= 0 || (c != 1 && c != 3))
		return kiln_error(KILN_EDATA, "the source gave an image of %dx%dx%d (expected h, w > 0, 1 or 3 channels)",
				  h, w, c);
	if (it->label < 0)
		return kiln_error(KILN_EDATA, "negative label %d", it->label);
	const uint8_t *px = j->img.data;
	if (j->o->resize) {
		/* torchvision's Resize(n) with PIL's filter: the transforms' own
		 * resize, so packing offline gives the pixels training online would */
		int oh, ow;
		if ((st = kiln_xform_resize_shorter(h, w, j->o->resize, &oh, &ow)))
			return st; /* "too long and thin", as training would say */
		if (oh != h || ow != w) {
			const int box[4] = { 0, 0, w, h };
			const size_t bytes = (size_t)oh * ow * c;
			if (grow(&j->buf, &j->buf_cap, bytes))
				return kiln_error(KILN_ENOMEM, "resizing a %dx%d image (width x height) to %dx%d (%zu bytes): out of memory",
						  w, h, ow, oh, bytes);
			if ((st = kiln_xform_resize_box(&j->img, box, oh, ow, j->buf, &j->xs)))
				return st;
			px = j->buf;
			h = oh;
			w = ow;
		}
	}
	it->h = h, it->w = w, it->c = c;
	switch (j->o->store) {
	case REC_JPEG:
		return img_encode_jpeg(host, px, h, w, c, j->o->quality, &it->payload, &it->n);
	case REC_PNG:
		return img_encode_png(host, px, h, w, c, &it->payload, &it->n);
	default:
		it->n = (size_t)h * w * c;
		if (!(it->payload = malloc(it->n)))
			return kiln_error(KILN_ENOMEM, "out of memory");
		memcpy(it->payload, px, it->n);
		return KILN_OK;
	}
}

static void *pack_worker(void *arg)
{
	struct job *j = arg;
	j->st = KILN_OK;
	for (int64_t k = 0; k < j->count; k++) {
		if ((j->st = pack_one(j, j->first + k, &j->items[k]))) {
			j->failed = j->first + k;
			snprintf(j->msg, sizeof j->msg, "%s", kiln_last_error());
			break;
		}
	}
	return NULL;
}

/* ---- packing ------------------------------------------------------------- */

/* mkdir -p --out, and hold its lock; an error when it is there but not a
 * directory, or another pack holds it */
static kiln_status make_out_dir(const struct pack_opts *o)
{
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", o->out);
	for (char *p = dir + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			mkdir(dir, 0777);
			*p = '/';
		}
	if (mkdir(dir, 0777) && errno != EEXIST)
		return kiln_error(KILN_EIO, "%s: cannot create the output directory: %s", o->out,
				  strerror(errno));
	struct stat sb;
	if (stat(o->out, &sb) || !S_ISDIR(sb.st_mode))
		return kiln_error(KILN_EUSAGE, "--out %s is not a directory", o->out);
	return pack_lock_out(o->out);
}

/* Samples a worker handles per round: about ROUND_BYTES of pixels. */
static int64_t round_per_worker(const struct pack_opts *o, const struct kiln_source_info *info)
{
	int64_t img_bytes = info->image_h > 0 && info->image_w > 0 ?
			    (int64_t)info->image_h * info->image_w * (info->image_c ? info->image_c : 3) :
			    (int64_t)256 * 256 * 3; /* sizes vary: assume ImageNet-like */
	if (o->resize) /* the size after resizing a square image */
		img_bytes = (int64_t)o->resize * o->resize * 3;
	int64_t per = ROUND_BYTES / (img_bytes > 0 ? img_bytes : 1);
	return per < ROUND_MIN ? ROUND_MIN : per > ROUND_MAX ? ROUND_MAX : per;
}

/* Pack src per o; t0: when the source began to open (the rate counts it). */
static kiln_status pack(const struct pack_opts *o, struct kiln_source *src, double t0)
{
	struct kiln_source_info info;
	kiln_status st = KILN_OK;
	kiln_source_info(src, &info, sizeof info);

	if (!kiln_source_has_images(src))
		return kiln_error(KILN_ECONFIG, "[%s] source = %s yields tensors, not images: kiln pack needs a source with read_image (idx, folder, tar, lmdb, records)",
				  o->section, kiln_source_name(src));
	if (info.len <= 0)
		return kiln_error(KILN_EDATA, "[%s] source '%s' has no samples to pack", o->section,
				  kiln_source_name(src));
	if ((st = make_out_dir(o)))
		return st;
	char old[512];
	int nold = o->folder ? 0 : existing_shards(o, REC_SUFFIX, old, sizeof old, -1);
	uint8_t *seen = NULL; /* --format folder: the classes a sample had */
	if (o->folder) {
		if (info.classes <= 0 || info.classes > 1000000)
			return kiln_error(KILN_EDATA, "[%s] source '%s' reports %lld classes: --format folder needs a classifier's labels",
					  o->section, kiln_source_name(src), (long long)info.classes);
		if ((st = pack_folder_prepare(o)))
			return st;
		if (!(seen = calloc((size_t)info.classes, 1)))
			return kiln_error(KILN_ENOMEM, "out of memory");
	}
	if (nold && !o->force)
		return kiln_error(KILN_EUSAGE, "%s already holds %d shard(s) of split '%s' (%s, ...): pass --force to replace them, or choose another --out or --split",
				  o->out, nold, o->split, old);
	if (!o->folder && (st = shard_count_check(o, &info)))
		return st;
	if (!o->folder) /* the split is this run's now: an interrupted pack's *.tmp go */
		pack_remove_stale_tmp(o->out, o->split, REC_SUFFIX);

	int T = o->workers;
	const int64_t per = round_per_worker(o, &info), round = per * T;
	struct job *jobs = calloc((size_t)T, sizeof *jobs);
	struct item *items = calloc((size_t)round, sizeof *items);
	pthread_t *th = calloc((size_t)T, sizeof *th);
	int *running = calloc((size_t)T, sizeof *running);
	struct shards sh = { .o = o, .classes = info.classes };
	int tty = cli_redraws();
	double last_print = t0;
	if (!jobs || !items || !th || !running) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	for (int t = 0; t < T; t++) {
		jobs[t].src = src;
		jobs[t].o = o;
		jobs[t].items = items + (int64_t)t * per;
	}

	for (int64_t base = 0; base < info.len; base += round) {
		for (int t = 0; t < T; t++) {
			struct job *j = &jobs[t];
			j->first = base + (int64_t)t * per;
			j->count = j->first >= info.len ? 0 : info.len - j->first < per ? info.len - j->first : per;
			j->st = KILN_OK;
			running[t] = 0;
			if (!j->count)
				continue;
			if (T > 1 && !pthread_create(&th[t], NULL, pack_worker, j))
				running[t] = 1;
			else
				pack_worker(j); /* one worker, or no thread to be had: here */
		}
		for (int t = 0; t < T; t++)
			if (running[t])
				pthread_join(th[t], NULL);
		for (int t = 0; t < T && !st; t++) {
			struct job *j = &jobs[t];
			if (j->st) {
				st = kiln_error(j->st, "[%s] source '%s', sample %lld: %s", o->section,
						kiln_source_name(src), (long long)j->failed, j->msg);
				break;
			}
			for (int64_t k = 0; k < j->count && !st; k++)
				st = o->folder ? folder_add(o, info.classes, j->first + k, &j->items[k], seen)
					       : shards_add(&sh, &j->items[k], o->store);
		}
		for (int64_t k = 0; k < round; k++) {
			free(items[k].payload);
			items[k].payload = NULL;
		}
		if (st)
			goto out;
		double t = cli_now_s();
		if (tty && t - last_print > 0.5) {
			int64_t done = base + round < info.len ? base + round : info.len;
			if (o->folder) /* (no shards: the images' directory) */
				fprintf(stderr, "\r\033[Kpacked %lld/%lld samples into %s/%s/<class>/",
					(long long)done, (long long)info.len, o->out, o->split);
			else
				fprintf(stderr, "\r\033[Kpacked %lld/%lld samples, %d shard(s)",
					(long long)done, (long long)info.len, sh.n);
			last_print = t;
		}
	}
	if (o->folder) {
		if ((st = pack_folder_done(o, info.classes, seen, tty)))
			goto out;
		double dt = cli_now_s() - t0;
		printf("wrote %lld %s images into %s/%s/<class>/, in %.2f s: %.0f samples/s\n",
		       (long long)info.len, rec_encoding_name(o->store), o->out, o->split, dt,
		       dt > 0 ? info.len / dt : 0.0);
		goto out;
	}
	if ((st = shards_finish(&sh)) || (st = shards_stamp(&sh)))
		goto out;

	if ((st = shards_place(o, &sh, old, sizeof old)))
		goto out;
	if (tty)
		fprintf(stderr, "\r\033[K");
	double dt = cli_now_s() - t0;
	char first[4200], last[4200];
	shard_name(o, 0, 0, first, sizeof first);
	shard_name(o, sh.n - 1, 0, last, sizeof last);
	printf("packed %lld samples into %d shard(s), %llu bytes (%.1f MiB), %s store, in %.2f s (opening the source included): %.0f samples/s (%s%s%s)\n",
	       (long long)info.len, sh.n, (unsigned long long)sh.bytes, sh.bytes / 1048576.0,
	       rec_encoding_name(o->store), dt, dt > 0 ? info.len / dt : 0.0, first,
	       sh.n > 1 ? " .. " : "", sh.n > 1 ? strrchr(last, '/') + 1 : "");

out:
	if (st) {
		if (tty)
			fprintf(stderr, "\n");
		shards_discard(&sh);
	}
	for (int k = 0; k < sh.n; k++)
		free(sh.tmp[k]);
	free(sh.tmp);
	free(sh.sizes);
	for (int t = 0; jobs && t < T; t++) {
		free(jobs[t].img.data);
		free(jobs[t].buf);
		kiln_xform_scratch_free(&jobs[t].xs);
	}
	free(jobs);
	free(seen);
	free(items);
	free(th);
	free(running);
	return st;
}

static int pack_source(int argc, char **argv)
{
	struct pack_opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc) {
		free(o.over);
		return rc;
	}
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	struct kiln_source *src = NULL;
	kiln_status st = cli_load(o.config, o.nover, o.over, 0, &cfg, &reg);
	double t0 = cli_now_s();
	if (!st)
		st = kiln_source_open(cfg, reg, o.section, o.split, &src);
	if (!st)
		st = pack(&o, src, t0);
	rc = st ? cli_fail(st) : 0;
	kiln_source_close(src);
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(o.over);
	return rc;
}
#endif /* KILN_WITH_PACK */

int cmd_pack(int argc, char **argv)
{
	return wants_tokens(argc, argv) ? cmd_pack_tokens(argc, argv) : pack_source(argc, argv);
}
