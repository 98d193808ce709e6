/* cli/cmd_predict.c - `kiln predict CONFIG [--checkpoint F] INPUT...`:
 * classify image files with a trained model through the inference API
 * (include/kiln/infer.h): each image decoded and transformed as
 * [data.eval] says (cli/predict_inputs.c), batches run through the
 * inference plan, the top-k classes with their probabilities printed as
 * JSON lines or CSV, or the logits written to .npy or safetensors
 * (docs/inference.md). */
#include "build-config.h"
#include "cli.h"
#include "predict.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char cmd_predict_usage[] =
	"usage: kiln predict CONFIG [--checkpoint F] INPUT... [--top-k K] [--format jsonl|csv]\n"
	"                    [--logits OUT.npy|OUT.safetensors] [--batch N] [--no-fold]\n"
	"                    [--quantized Q] [section.key=value ...]\n"
	"       kiln predict CONFIG --eval-set [options]\n";
const char cmd_predict_about[] =
	"Classify images with the model CONFIG describes and the weights of F (a kiln\n"
	"checkpoint or a safetensors file; default: the newest usable checkpoint in\n"
	"[run] out_dir/checkpoints, as `kiln eval`; with none, [model] init_from's, else\n"
	"the initial weights with a warning, as `kiln export`).  INPUT: image files (JPEG, PNG) or\n"
	"folders (every .jpg/.jpeg/.png below them, sorted; a link back to a folder\n"
	"above is not followed), each decoded and\n"
	"transformed exactly as [data.eval] says, then run in batches on [run] device.\n"
	"--eval-set instead: the samples of [data.eval]'s source (idx, records, tokens,\n"
	"folder...) in order, read as `kiln eval` reads them; lines name the sample\n"
	"index and its label (the first target of a token window).\n"
	"  --top-k K     the K most likely classes per image (default 5)\n"
	"  --format F    jsonl (default): {\"file\", \"top\": [{\"index\", \"class\", \"prob\"}...]};\n"
	"                (prob null where the logits are not finite; a name's bytes that\n"
	"                are not UTF-8 as \\ufffd);\n"
	"                csv: file,index1,class1,prob1,... (prob empty where jsonl's\n"
	"                is null).  Class names are the class folders of the\n"
	"                training split ([data] source = folder), else the indices\n"
	"  --logits OUT  write the logits [N, classes] (f32) to OUT (.npy or .safetensors)\n"
	"                instead of printing; not a file read (CONFIG, F, Q, an INPUT) nor a\n"
	"                kiln checkpoint (exit 2)\n"
	"  --batch N     images per run, 1 to 65536 (default [train] eval_batch, or 256\n"
	"                when that is larger)\n"
	"  --no-fold     run the model as trained (default: the inference graph,\n"
	"                batchnorm folded into its conv/linear, dropout removed)\n"
	"  --quantized Q run the INT8 model Q of `kiln quantize` (no --checkpoint; no\n"
	"                --no-fold: Q is the folded model)\n"
	"Any error (an unreadable, corrupt or wrong-size image) names the file and\n"
	"fails the command.  Exit codes: 0 ok, 1 failure, 2 usage or config error,\n"
	"3 data error.\n";

struct pred_opts {
	const char *ckpt, *logits, *quantized;
	int csv, eval_set, no_fold;
	long long top_k, batch;
};

/* Whether a, which names no file, is an override: '=' after a
 * section.key (a '.', no '/').  `imgs/x=1.png` that is not there is an
 * INPUT, refused as "no such file or folder", not an override refused as
 * "expected section.key=value" or dropped ("no INPUT"), before session 36. */
static int pred_is_override(const char *a)
{
	const size_t k = strcspn(a, "=");
	return a[k] == '=' && memchr(a, '.', k) && !memchr(a, '/', k);
}

/* argv[2..]: options into o, overrides (KEY=VALUE that is no file) into
 * over, the rest into inputs.  -1: usage error. */
static int pred_args(int argc, char **argv, struct pred_opts *o, char **over, int *n_over,
		     char **inputs, int *n_in)
{
	struct stat sb;
	int printing = 0; /* --format or --top-k given: they shape what is printed */
	o->top_k = 5;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i], *fmt = NULL;
		int r;
		if ((r = cli_opt(argc, argv, &i, "--checkpoint", &o->ckpt)) ||
		    (r = cli_opt(argc, argv, &i, "--logits", &o->logits)) ||
		    (r = cli_opt(argc, argv, &i, "--format", &fmt)) ||
		    (r = cli_opt(argc, argv, &i, "--quantized", &o->quantized)) ||
		    (r = cli_opt_int(argc, argv, &i, "--top-k", 1, 1000000, &o->top_k)) ||
		    (r = cli_opt_int(argc, argv, &i, "--batch", 1, 65536, &o->batch))) {
			if (r < 0)
				return -1;
			printing |= fmt || !strncmp(a, "--top-k", 7);
			if (fmt && strcmp(fmt, "csv") && strcmp(fmt, "jsonl")) {
				fprintf(stderr, "kiln: error: --format '%s': choose jsonl or csv\n", fmt);
				return -1;
			}
			if (fmt)
				o->csv = !strcmp(fmt, "csv");
		} else if (!strcmp(a, "--eval-set")) {
			o->eval_set = 1;
		} else if (!strcmp(a, "--no-fold")) {
			o->no_fold = 1;
		} else if (a[0] == '-') {
			cli_bad_arg_usage(argc, argv, i, cmd_predict_usage);
			return -1;
		} else if (pred_is_override(a) && stat(a, &sb) != 0) {
			over[(*n_over)++] = argv[i];
		} else {
			inputs[(*n_in)++] = argv[i];
		}
	}
	if (!*n_in == !o->eval_set) {
		fprintf(stderr, "kiln: error: %s\n", o->eval_set ? "--eval-set reads [data.eval]: no INPUT with it"
								: "no INPUT: give image files or folders (or --eval-set)");
		return -1;
	}
	if (o->no_fold && o->quantized) { /* run folded silently before session 31 */
		fprintf(stderr, "kiln: error: --no-fold with --quantized %s: an INT8 model is the folded model (kiln quantize folds it before quantizing) and has no unfolded form; drop --no-fold\n",
			o->quantized);
		return -1;
	}
	if (o->logits && printing) { /* ignored before session 31 */
		fprintf(stderr, "kiln: error: --logits writes the logits and prints nothing: --format and --top-k have no effect with it\n");
		return -1;
	}
	if (o->logits) {
		size_t n = strlen(o->logits);
		if (!(n > 4 && !strcmp(o->logits + n - 4, ".npy")) &&
		    !(n > 12 && !strcmp(o->logits + n - 12, ".safetensors"))) {
			fprintf(stderr, "kiln: error: --logits %s: name a .npy or .safetensors file\n", o->logits);
			return -1;
		}
	}
	return 0;
}

/* --logits OUT is none of the files read: CONFIG, the weights (--checkpoint,
 * --quantized, [model] init_from), an INPUT named, nor a kiln checkpoint
 * (the newest in out_dir, read when no --checkpoint is given): before
 * session 31 `--checkpoint W --logits W` replaced W and exited 0. */
static kiln_status logits_not_input(const struct pred_opts *o, const char *config,
				    const struct kiln_config *cfg, char **inputs, int n_in)
{
	const char **in = malloc(sizeof *in * (size_t)(n_in + 4));
	if (!in)
		return kiln_error(KILN_ENOMEM, "out of memory");
	in[0] = config, in[1] = o->ckpt, in[2] = o->quantized;
	in[3] = kiln_config_get(cfg, "model", "init_from");
	for (int i = 0; i < n_in; i++)
		in[4 + i] = inputs[i];
	kiln_status st = kiln_output_check(o->logits, in, n_in + 4);
	free(in);
	if (!st) /* nor a file of [data.eval] (--eval-set), refused as it opens */
		kiln_output_watch(o->logits);
	return st;
}

/* What fill_npy writes: the header and n floats. */
struct npy_bytes {
	const char *hdr; /* the padded header, '\n' ended */
	size_t hdr_len;
	const float *v;
	size_t n;
};

static int fill_npy(FILE *f, void *ctx)
{
	const struct npy_bytes *b = ctx;
	if (fwrite(b->hdr, 1, b->hdr_len, f) != b->hdr_len || fwrite(b->v, sizeof *b->v, b->n, f) != b->n)
		return errno ? errno : EIO;
	return 0;
}

/* The logits as NumPy's .npy (format 1.0, little-endian f32, C order),
 * written whole or not at all (kiln_file_write: before session 32 the
 * file was opened in place, so a write that failed midway, a full disk or
 * a file size limit, left the earlier OUT cut short). */
static kiln_status write_npy(const char *path, const float *v, int ndim, const int64_t *dims)
{
	char hdr[384], shape[160] = "";
	size_t len = 0, n = 1;
	for (int i = 0; i < ndim; i++) {
		len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld%s", i ? ", " : "",
					(long long)dims[i], ndim == 1 ? "," : ""); /* Python's tuple */
		n *= (size_t)dims[i];
	}
	/* magic, version, length, the dict; padded with spaces to 64, '\n' */
	int h = snprintf(hdr + 10, sizeof hdr - 10,
			 "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", shape);
	int total = (10 + h + 1 + 63) / 64 * 64;
	const unsigned char pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
					(unsigned char)((total - 10) & 0xff),
					(unsigned char)((total - 10) >> 8) };
	memcpy(hdr, pre, sizeof pre);
	memset(hdr + 10 + h, ' ', (size_t)(total - 1 - 10 - h));
	hdr[total - 1] = '\n';
	struct npy_bytes b = { hdr, (size_t)total, v, n };
	int err = kiln_file_write(path, fill_npy, &b);
	if (err)
		return kiln_error(KILN_EIO, "%s: cannot write the logits: %s", path, strerror(err));
	return KILN_OK;
}

static kiln_status write_logits(const char *path, const float *v, int64_t n,
				const struct kiln_infer *m)
{
	int64_t dims[KILN_MAX_DIMS + 1];
	int nd = kiln_infer_output_shape(m, dims + 1) + 1;
	dims[0] = n;
	if (strlen(path) > 4 && !strcmp(path + strlen(path) - 4, ".npy"))
		return write_npy(path, v, nd, dims);
	struct kiln_safetensors_writer *w;
	kiln_status st = kiln_safetensors_writer_new(&w);
	if (st)
		return st;
	if (!(st = kiln_safetensors_writer_add(w, "logits", KILN_F32, nd, dims, v)))
		st = kiln_safetensors_writer_write(w, path);
	kiln_safetensors_writer_free(w);
	return st;
}

/* One image's line: the top-k classes of its logits l[0..C) by softmax
 * probability (ties: the lower index first). */
static void print_top(const struct pred_opts *o, const char *file, int64_t sample, int32_t label,
		      const float *l, int64_t C, const struct pred_names *names, int64_t *order)
{
	double mx = -INFINITY, sum = 0;
	for (int64_t c = 0; c < C; c++)
		mx = l[c] > mx ? l[c] : mx;
	for (int64_t c = 0; c < C; c++)
		sum += exp((double)l[c] - mx);
	int64_t k = o->top_k < C ? o->top_k : C;
	for (int64_t j = 0; j < k; j++) { /* selection: k is small */
		int64_t best = -1;
		for (int64_t c = 0; c < C; c++) {
			int taken = 0;
			for (int64_t q = 0; q < j && !taken; q++)
				taken = order[q] == c;
			if (!taken && (best < 0 || l[c] > l[best]))
				best = c;
		}
		order[j] = best;
	}
	if (o->csv && file)
		cli_csv_str(stdout, file);
	else if (o->csv)
		printf("%lld,%d", (long long)sample, label);
	else if (file)
		fputs("{\"file\": ", stdout), cli_json_str(stdout, file), fputs(", \"top\": [", stdout);
	else
		printf("{\"sample\": %lld, \"label\": %d, \"top\": [", (long long)sample, label);
	for (int64_t j = 0; j < k; j++) {
		const int64_t c = order[j];
		const double p = exp((double)l[c] - mx) / sum;
		char idx[32];
		snprintf(idx, sizeof idx, "%lld", (long long)c);
		const char *name = (size_t)c < names->n ? names->v[c] : idx;
		if (o->csv) {
			printf(",%lld,", (long long)c);
			cli_csv_str(stdout, name);
			if (isfinite(p)) /* non-finite logits: an empty field, as jsonl's null
					  * (printf's "-nan" before session 34) */
				printf(",%.6g", p);
			else
				fputc(',', stdout);
		} else {
			printf("%s{\"index\": %lld, \"class\": ", j ? ", " : "", (long long)c);
			cli_json_str(stdout, name);
			if (isfinite(p)) /* NaN logits: null, JSON has no NaN */
				printf(", \"prob\": %.6g}", p);
			else
				fputs(", \"prob\": null}", stdout);
		}
	}
	fputs(o->csv ? "\n" : "]}\n", stdout);
}

/* What a pass prints or keeps, for the files or the eval set. */
struct pred_out {
	const struct pred_opts *o;
	struct pred_names names;  /* class names, or none */
	int64_t *order;           /* top-k scratch */
	size_t C;                 /* floats per sample */
	float *all;               /* --logits: every row so far */
	int64_t n, cap;
};

static kiln_status out_open(struct pred_out *po, const struct pred_opts *o,
			    const struct kiln_config *cfg, const struct kiln_infer *m, int eval_set)
{
	int64_t dims[KILN_MAX_DIMS];
	memset(po, 0, sizeof *po);
	po->o = o;
	po->C = kiln_infer_output_elems(m);
	if (o->logits)
		return KILN_OK;
	const int nd = kiln_infer_output_shape(m, dims);
	if (nd != 1) {
		int64_t in[KILN_MAX_DIMS];
		int dtype = KILN_F32;
		kiln_infer_input_shape(m, in, &dtype);
		char shape[96] = "";
		for (int i = 0, k = 0; i < nd && k < (int)sizeof shape; i++)
			k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%lld", i ? ", " : "", (long long)dims[i]);
		return kiln_error(KILN_EUSAGE, "the model's output per sample is f32[%s]%s, not a vector of classes: use --logits OUT (.npy or .safetensors) for the logits",
				  shape, dtype == KILN_I32 ? " (a token model's [T, V])" : "");
	}
	if (!(po->order = malloc(sizeof(int64_t) * po->C)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (o->csv) {
		fputs(eval_set ? "sample,label" : "file", stdout);
		for (long long j = 1; j <= o->top_k && j <= (long long)po->C; j++)
			printf(",index%lld,class%lld,prob%lld", j, j, j);
		fputc('\n', stdout);
	}
	return pred_class_names(cfg, &po->names);
}

/* rows samples' logits: printed, or kept for --logits.  files: their
 * names, else the samples first.. of the eval set with their labels. */
static kiln_status out_rows(struct pred_out *po, const char *const *files, int64_t first,
			    int64_t rows, const float *l, const int32_t *labels, int64_t label_elems)
{
	if (po->o->logits) {
		if (po->n + rows > po->cap) {
			int64_t nc = po->cap ? 2 * po->cap : 1024;
			while (nc < po->n + rows)
				nc *= 2;
			float *a = realloc(po->all, sizeof(float) * po->C * (size_t)nc);
			if (!a)
				return kiln_error(KILN_ENOMEM, "out of memory for the logits of %lld samples",
						  (long long)nc);
			po->all = a;
			po->cap = nc;
		}
		memcpy(po->all + (size_t)po->n * po->C, l, sizeof(float) * po->C * (size_t)rows);
		po->n += rows;
		return KILN_OK;
	}
	for (int64_t i = 0; i < rows; i++)
		print_top(po->o, files ? files[i] : NULL, first + i,
			  labels ? labels[i * label_elems] : 0, l + (size_t)i * po->C,
			  (int64_t)po->C, &po->names, po->order);
	/* the reader gone (`| head`) or the disk full: stop here, not after
	 * the whole input (cmd_predict exits 1, check_stdout says why) */
	if (cli_stdout_lost())
		return kiln_error(KILN_EIO, "standard output cannot be written: stopped after sample %lld",
				  (long long)(first + rows - 1));
	return KILN_OK;
}

static void out_close(struct pred_out *po)
{
	pred_names_free(&po->names);
	free(po->order);
	free(po->all);
}

static kiln_status eval_rows(void *user, int64_t first, int64_t rows, const float *logits,
			     const int32_t *labels, int64_t label_elems)
{
	return out_rows(user, NULL, first, rows, logits, labels, label_elems);
}

/* Threads decoding a batch's images: the loader's ([data] workers, `auto`:
 * every CPU) or, when more, [run] threads (0: every CPU), which sit idle
 * while a batch is decoded. */
static int decode_threads(const struct kiln_config *cfg)
{
	const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	const char *w = kiln_config_get(cfg, "data", "workers"); /* validated */
	int64_t threads = 0;
	const int workers = w && !strcmp(w, "auto") ? (int)cpus : w ? atoi(w) : 1;
	kiln_config_get_int(cfg, "run", "threads", &threads);
	if (threads <= 0)
		threads = cpus;
	return threads > workers ? (int)threads : workers;
}

/* Image files for a model that reads token ids: refused, naming what
 * reads tokens instead (before session 31 the message spoke of the
 * output's shape, or, with --logits, of images alone). */
static kiln_status images_for_tokens(const struct kiln_infer *m, const char *first)
{
	int64_t dims[KILN_MAX_DIMS];
	int dtype = KILN_F32;
	if (kiln_infer_input_shape(m, dims, &dtype) != 1 || dtype != KILN_I32)
		return KILN_OK;
	return kiln_error(KILN_EUSAGE, "%s: this model reads token ids (i32[%lld] a sample), not images: `kiln generate` writes text from a prompt, `kiln predict --eval-set --logits OUT` the logits of [data.eval]'s token windows, and the C API's kiln_infer takes token ids (docs/inference.md)",
			  first, (long long)dims[0]);
}

/* The files (or, files NULL, [data.eval]) through the model, batch by
 * batch, each batch's images decoded on decode_threads; the rate on
 * stderr. */
static kiln_status predict(struct kiln_infer *m, const struct kiln_config *cfg,
			   const struct pred_opts *o, const struct pred_names *files, int64_t batch)
{
	struct pred_out po = { 0 };
	const size_t in = kiln_infer_input_bytes(m);
	int64_t max_pixels = 0;
	const int threads = decode_threads(cfg);
	kiln_config_get_int(cfg, "data.eval", "max_image_pixels", &max_pixels);
	void *x = NULL; /* 64-byte aligned: kiln_infer reads it in place on the CPU */
	if (files && posix_memalign(&x, 64, in * (size_t)batch))
		x = NULL;
	float *logits = files ? malloc(sizeof(float) * kiln_infer_output_elems(m) * (size_t)batch) : NULL;
	kiln_status st = files && (!x || !logits) ? kiln_error(KILN_ENOMEM, "out of memory")
			 : files ? images_for_tokens(m, files->v[0]) : KILN_OK;
	if (!st)
		st = out_open(&po, o, cfg, m, !files);
	const double t0 = cli_now_s();
	if (!st && !files)
		st = kiln_infer_eval_set(m, eval_rows, &po);
	for (int64_t off = 0; files && off < (int64_t)files->n && !st; off += batch) {
		const int64_t N = (int64_t)files->n, rows = N - off < batch ? N - off : batch;
		st = pred_load_images(m, (const char *const *)files->v + off, rows, max_pixels,
				      threads, x);
		if (!st && !(st = kiln_infer(m, x, rows, logits)))
			st = out_rows(&po, (const char *const *)files->v + off, off, rows, logits, NULL, 0);
	}
	const double wall = cli_now_s() - t0;
	if (!st && files)
		kiln_log(KILN_LOG_INFO, "predict", "%zu images in %.3f s: %.1f images/s, %.4f ms per image (batch %lld; read, decode, transform, run)",
			 files->n, wall, (double)files->n / wall, 1e3 * wall / (double)files->n,
			 (long long)batch);
	if (!st && o->logits)
		st = write_logits(o->logits, po.all, po.n, m);
	out_close(&po);
	free(x);
	free(logits);
	return st;
}

int cmd_predict(int argc, char **argv)
{
	if (argc < 2 || argv[1][0] == '-') {
		if (argc >= 2)
			cli_bad_arg_usage(argc, argv, 1, cmd_predict_usage);
		fputs(cmd_predict_usage, stderr);
		return 2;
	}
	struct pred_opts o = { 0 };
	char **over = calloc((size_t)argc, sizeof *over), **inputs = calloc((size_t)argc, sizeof *inputs);
	int n_over = 0, n_in = 0;
	if (!over || !inputs) {
		free(over);
		free(inputs);
		return 1;
	}
	if (pred_args(argc, argv, &o, over, &n_over, inputs, &n_in)) {
		fputs(cmd_predict_usage, stderr);
		free(over);
		free(inputs);
		return 2;
	}
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	struct kiln_infer *m = NULL;
	struct pred_names files = { 0 };
	int64_t eb = 256;
	kiln_status st = cli_named_file("checkpoint", o.ckpt);
	if (!st)
		st = cli_named_file("--quantized", o.quantized);
	if (!st)
		st = cli_load(argv[1], n_over, over, 0, &cfg, &reg);
	if (!st && o.logits)
		st = logits_not_input(&o, argv[1], cfg, inputs, n_in);
	if (!st && n_in)
		st = pred_list_inputs(inputs, n_in, &files);
	if (!st && !o.batch) {
		kiln_config_get_int(cfg, "train", "eval_batch", &eb);
		o.batch = eb > 0 && eb < 256 ? eb : 256;
	}
	/* no more rows per run than there are images */
	struct kiln_infer_opts io = { .batch = o.batch, .no_fold = o.no_fold,
				      .quantized = o.quantized };
	if (n_in && io.batch > (int64_t)files.n)
		io.batch = (int64_t)files.n;
	if (!st)
		st = kiln_infer_open(cfg, reg, o.ckpt, &io, &m);
	if (!st)
		st = predict(m, cfg, &o, n_in ? &files : NULL, io.batch);
	/* stdout lost: check_stdout names why (quiet for a reader gone) */
	int rc = 0;
	if (st && cli_stdout_lost())
		kiln_log(KILN_LOG_DEBUG, "predict", "%s", kiln_last_error()), rc = 1;
	else if (st)
		rc = cli_fail(st);
	kiln_infer_free(m);
	pred_names_free(&files);
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(over);
	free(inputs);
	return rc;
}
