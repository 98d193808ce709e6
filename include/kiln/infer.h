/* include/kiln/infer.h - the inference API: load a trained model (a config
 * and a checkpoint or safetensors file) and run it on host buffers, so an
 * application embeds a kiln model in a few lines (docs/inference.md,
 * examples/embed/).  `kiln predict` is built on it.
 *
 *   struct kiln_infer *m;
 *   char *err;
 *   if (kiln_model_load("net.ini", "ckpt-1000.kiln", NULL, &m, &err)) {
 *           fprintf(stderr, "%s\n", err ? err : "out of memory"); free(err); return 1;
 *   }
 *   float logits[10];
 *   kiln_infer(m, x, 1, logits);      // x: one f32 sample, the model's input
 *   kiln_infer_free(m);
 *
 * The model is the config's [layer.*] graph, evaluated as `kiln eval`
 * evaluates it (the same planner and forward passes, on the config's
 * [run] device), minus the loss layer: the output is its input, the
 * logits.  Batchnorm uses its running statistics, dropout does nothing.
 *
 * Threads: a model may be shared by threads.  Its calls are serialised
 * by a lock the model holds (one inference runs at a time per model; the
 * device's own threads, [run] threads, work inside it).  Separate models
 * run in parallel.  Nothing here exits.
 *
 * OpenMP: loading the first model (kiln_registry_open, before any plugin
 * brings libgomp in) sets OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT to
 * kiln's rule (a bounded spin; 0 when the machine is oversubscribed) where
 * the program set neither, as the `kiln` command does.  Once libgomp is in
 * the process nothing is changed.  setenv is not thread-safe: load models
 * before other threads read or write the environment.  The calling
 * thread's OpenMP thread count (omp_get_max_threads) is as it was when
 * each call here returns: the CPU device sets its own ([run] threads)
 * where its work runs and puts the caller's back (plugins/cpu/cpu.h,
 * cpu_omp_enter), so a program's own parallel regions keep their team.
 *
 * Errors: kiln_status (status.h), with a message naming the file, key,
 * layer or sample in kiln_last_error() of the calling thread.  Ownership:
 * the caller owns every buffer it passes; the model owns what it holds
 * until kiln_infer_free.
 */
#ifndef KILN_INFER_H
#define KILN_INFER_H

#include <kiln/kiln.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_infer;

struct kiln_infer_opts {
	int64_t batch;        /* rows per device run; 0: 64.  kiln_infer splits
			       * larger n into runs of this many rows */
	int config_is_text;   /* kiln_model_load: `config` is the INI text
			       * itself, not a path */
	const char *plugin_path; /* plugin directories; NULL: KILN_PLUGIN_PATH and
			       * the installed ones (a config file's [run]
			       * plugin_path is not trusted: docs/plugins.md) */
	int no_fold;          /* 1: run the model as trained; 0 (default): the
			       * inference graph of kiln_infer_prepare (batchnorm
			       * folded into its conv/linear, dropout removed,
			       * bias + activation as the epilogue).  Not with
			       * quantized (KILN_EUSAGE): an INT8 model is the
			       * folded one */
	const char *quantized; /* an INT8 model written by `kiln quantize`
			       * (docs/inference.md, "INT8"): the config's model
			       * folded, its conv/linear layers on the INT8 ops,
			       * the weights this file's (`weights` must be NULL);
			       * NULL: none ("": KILN_EUSAGE) */
	int no_residual;      /* 1: with the folds, keep each residual add a layer
			       * of its own; 0 (default): a conv that alone feeds
			       * a two-input add takes the add's other input as
			       * its residual, the add and the ReLU after it in
			       * the conv's epilogue (f32; core/infer_passes.h) */
};

/* Load `config` (a path, or the INI text with opts->config_is_text) and
 * the weights of `weights`: a kiln checkpoint (ckpt-N.kiln, verified whole;
 * the config's [layer.*] keys must equal the ones it was trained with) or a
 * safetensors file (kiln export's, PyTorch's names and layouts); NULL: the
 * newest usable checkpoint in the config's [run] out_dir, else (none
 * there) [model] init_from or the seeded initial weights with a warning,
 * as `kiln export` takes them ("": KILN_EUSAGE).  The model's input shape is the one the
 * checkpoint records, or opts->quantized's INT8 file (its kiln.sample,
 * since session 39); without one (a safetensors file, an older kiln's
 * checkpoint or INT8 file) the sample shape training reads, told by the
 * config's [data] source's peek (a header; the set opened whole for a
 * source without one), so that source must then be there.  opts may be NULL; out
 * may not (KILN_EINVAL).  On failure *out is NULL and, when err is not
 * NULL, *err a malloc()ed copy of the message (free it), or NULL when
 * no memory was left even for that copy; on success *err is NULL.  Then kiln_infer_prepare. */
kiln_status kiln_model_load(const char *config, const char *weights,
			    const struct kiln_infer_opts *opts, struct kiln_infer **out,
			    char **err);

/* The same from a loaded and validated config and its registry, which
 * must outlive the model (`kiln predict` uses this).  cfg is only read,
 * success or failure (the model's own settings, [plugin.cpu] conv_impl =
 * auto where unset, go into a copy it keeps).  A safetensors
 * `weights` is read as [model] init_from reads one ([model] init_format,
 * init_strict), in its place. */
kiln_status kiln_infer_open(struct kiln_config *cfg, const struct kiln_registry *reg,
			    const char *weights, const struct kiln_infer_opts *opts,
			    struct kiln_infer **out);

/* THE place the inference graph is prepared, once, after the weights are
 * loaded and before anything runs: the graph passes (core/infer_passes.h:
 * batchnorm folded into the conv/linear before it, dropout removed, bias
 * and activation fused; unless opts->no_fold), the INT8 model of
 * opts->quantized (core/quant.h), then the inference plans (the
 * planner's fusions, one plan of opts->batch rows).
 * kiln_model_load and kiln_infer_open call it; calling it again is a
 * no-op.  After a fold it returns the freed host copies of the weights to
 * the system with malloc_trim(0), which takes each of the process's malloc
 * arenas' locks once (a multi-threaded host program's allocations wait
 * for it; without it glibc kept the copies: 64 MB peak RSS for predict of
 * one image, 51 with it). */
kiln_status kiln_infer_prepare(struct kiln_infer *m);

/* One sample's input (the data input as training stages it: f32 [C, H, W]
 * for images, normalised; i32 [T] token ids; f32 [...] otherwise) and one
 * sample's output (the logits, always f32: [classes], or [T, V]).  dims
 * gets up to KILN_MAX_DIMS sizes; returns the rank.  *dtype: KILN_F32 or
 * KILN_I32 (may be NULL). */
int kiln_infer_input_shape(const struct kiln_infer *m, int64_t *dims, int *dtype);
int kiln_infer_output_shape(const struct kiln_infer *m, int64_t *dims);
/* Bytes of one input sample; floats of one output sample.  These four
 * return 0 for a NULL m. */
size_t kiln_infer_input_bytes(const struct kiln_infer *m);
size_t kiln_infer_output_elems(const struct kiln_infer *m);

/* Run n samples: x holds n input samples back to back (host memory,
 * kiln_infer_input_bytes each), out gets n * kiln_infer_output_elems
 * floats.  Returns when out is written.  KILN_EINVAL for n < 0 or a NULL
 * buffer; n = 0 does nothing.  On a device that computes on host memory
 * (the CPU), an x aligned to 64 bytes is read where it is (posix_memalign
 * or aligned_alloc); any other x is first copied. */
kiln_status kiln_infer(struct kiln_infer *m, const void *x, int64_t n, float *out);

/* One decoded image (8-bit HWC, 1 or 3 channels) into one input sample
 * (kiln_infer_input_bytes at x), transformed as the config's [data.eval]
 * says (resize, centre crop, channels, mean/std: core/transform.h), the
 * pixels `kiln eval` would feed (f32; with [data.eval] dtype = bf16,
 * rounded to bf16 values, as the loader's bf16 samples are).  When [data.eval]'s source has one image
 * size and the config sets none of size/resize (nor channels), an image
 * of another size (channel count) is refused: KILN_EDATA naming `what`
 * (the file).  The first call reads of [data.eval] only that size and
 * channel count, through the source's peek (a header: plugin ABI 2.24),
 * or opens the set where the source has none.  When that source cannot be
 * read (its files absent), its images are taken to be of the model's
 * input size and channels.
 * KILN_ENOTSUP when the model does not read images (a token model: i32
 * token ids, whatever its config's [data.eval]).  KILN_EINVAL for a
 * NULL m, img or x, img->data NULL, h or w below 1, or img->cap below
 * h * w * c; what may be NULL ("image"). */
kiln_status kiln_infer_image(struct kiln_infer *m, const struct kiln_image *img,
			     const char *what, void *x);

/* The samples of the config's [data.eval] source, in order, read as
 * `kiln eval` reads them (the same source, transforms and [data.eval]
 * limit), through the model in batches: fn gets each batch's first sample
 * index, its row count, the logits (rows * kiln_infer_output_elems) and
 * the labels (rows * label_elems i32; label_elems is 1 for a class, T for
 * a token window's targets).  A nonzero status from fn stops the pass and
 * is returned.  `kiln predict --eval-set`. */
typedef kiln_status (*kiln_infer_rows_fn)(void *user, int64_t first, int64_t rows,
					  const float *logits, const int32_t *labels,
					  int64_t label_elems);
kiln_status kiln_infer_eval_set(struct kiln_infer *m, kiln_infer_rows_fn fn, void *user);

/* Free the model (NULL is fine).  No call on it may be running. */
void kiln_infer_free(struct kiln_infer *m);

#ifdef __cplusplus
}
#endif

#endif /* KILN_INFER_H */
