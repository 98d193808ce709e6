/* core/quant.h - INT8 post-training quantization: the calibration
 * observers and rules, and per-channel symmetric weight quantization
 * (core/quant.c).  docs/inference.md, "INT8", is the user's view.
 *
 *   weights:     scale[o] = max_e |w[o,e]| / 63 (1 for an all-zero row),
 *                q[o,e] = clamp(round_half_even(w[o,e] / scale[o]), -63, 63):
 *                7 bits, as KILN_OP_QCONV's contract (kiln/ops.h) says why
 *   activations: a range amax from the calibration batches by a rule
 *                (min-max, percentile, entropy); scale = amax / 255 for an
 *                input never negative in calibration (u8), else amax / 127
 *                (s8), zero point 0 in both. */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include "internal.h"

enum kiln_quant_method {
	KILN_QUANT_MINMAX = 0,     /* amax = max |x| seen */
	KILN_QUANT_PERCENTILE = 1, /* the upper edge of the histogram bin where the
				    * cumulative count of |x| reaches pct % */
	KILN_QUANT_ENTROPY = 2,    /* TensorRT's rule: the threshold whose 256-level
				    * (u8) or 128-level (s8) quantization of the |x|
				    * histogram, its zero bin set to bin 1's count,
				    * has the least KL divergence from it; min-max
				    * when that amax is degenerate (kiln_quant_amax_ex) */
};

#define KILN_QUANT_BINS 2048

/* What the calibration batches showed of one tensor. */
struct kiln_quant_observer {
	double min, max;  /* over every value */
	double hmax;      /* the histogram's range [0, hmax) of |x|: a power of
			   * two, doubled (bins merged in pairs) when a larger
			   * value comes; 0 before the first value */
	int64_t count;
	int64_t hist[KILN_QUANT_BINS]; /* bin b: |x| in [b, b+1) * hmax / BINS (the
					* largest value lands in the last bin) */
};

/* Parse "minmax", "percentile" or "entropy"; -1 for anything else. */
int kiln_quant_method_parse(const char *s);

/* Add n host values to the observer (zeroed before the first call). */
void kiln_quant_observe(struct kiln_quant_observer *o, const float *x, int64_t n);

/* The range amax (> 0 unless nothing nonzero was seen) by `method`; pct
 * (percentile only) in (0, 100]; the result is at most max |x|. */
double kiln_quant_amax(const struct kiln_quant_observer *o, int method, double pct);
/* The same; *fell_back (may be NULL) = 1 when the entropy rule's amax was
 * degenerate (at or below every |x| seen, or one occupied bin below it:
 * every value would quantize to one level) and min-max's was taken (also
 * where its 48 KiB of scratch could not be allocated). */
double kiln_quant_amax_ex(const struct kiln_quant_observer *o, int method, double pct,
			  int *fell_back);

/* The activation scale of an observed input: amax / 255 when it was never
 * negative (*is_unsigned = 1), else amax / 127; 1 when amax is 0. */
float kiln_quant_act_scale(const struct kiln_quant_observer *o, double amax, int *is_unsigned);

/* Per-output-channel symmetric quantization of w[O][per] into q[O][per]
 * and scale[O] (the caller's). */
void kiln_quant_weights(const float *w, int64_t O, int64_t per, int8_t *q, float *scale);

/* ---- the model-level pass (core/quantize.c) ----------------------------
 * The quantized file (docs/formats.md, "INT8 model"): safetensors with
 * every parameter and buffer of the folded model by name, f32, except
 * each conv's and linear's "X.weight", I8 [O, ...] with "X.weight_scale"
 * F32 [O]; "X.input_scale" F32 [1] per conv/linear; metadata
 * "kiln.format" = "kiln-int8/1", "kiln.method", "kiln.calibrate_batches",
 * "kiln.step", "X.input" = "u8" or "s8", the model's resolved config
 * "kiln.config" with its "kiln.weights_keys" (as a checkpoint's), and
 * since session 39 "kiln.sample", the model's input sample (a
 * checkpoint's "sample" section: "f32 1,28,28"). */

struct kiln_quant_calib;

/* Observers for every conv and linear input of model m (the folded one). */
kiln_status kiln_quant_calib_new(const struct kiln_model *m, struct kiln_quant_calib **out);
void kiln_quant_calib_free(struct kiln_quant_calib *q);
/* One calibration batch, after a forward of keep_all plan p on the data
 * x (device, rows full rows) has completed: every observed input copied
 * to the host and observed. */
kiln_status kiln_quant_calib_batch(struct kiln_quant_calib *q, struct kiln_plan *p, const void *x,
				   int64_t rows, void *stream);
/* Write the quantized file of m (its weights read on stream) with the
 * activation ranges by method (pct: the percentile rule's) and `config`,
 * the resolved config (kiln_ckpt_config_text) of the model quantized. */
kiln_status kiln_quant_write(const struct kiln_quant_calib *q, const struct kiln_model *m,
			     void *stream, int method, double pct, int64_t step, const char *config,
			     const char *path);

/* 1 when f is an INT8 model of `kiln quantize` (metadata kiln.format =
 * kiln-int8/1). */
int kiln_quant_is_model(const struct kiln_safetensors *f);
/* cfg's [run] precision fp32 (or unset): an INT8 model computes in f32
 * (its QCONV/QLINEAR take f32 or u8, its other layers' activations f32)
 * and calibration reads f32 activations; else KILN_ECONFIG at the key's
 * line, `what` (who needs fp32) in the message, before a device is
 * opened (before session 39 the op's prepare refused bf16 inputs, and
 * kiln quantize refused after timing the convolutions). */
kiln_status kiln_quant_need_fp32(const struct kiln_config *cfg, const char *what);
/* A quantized model carries its weights: KILN_EUSAGE when `weights` (a
 * checkpoint or weights file) is given beside `quantized` (either NULL: OK). */
kiln_status kiln_quant_no_weights(const char *quantized, const char *weights);
/* Open the INT8 model `path` (`kiln quantize`'s safetensors file) into
 * *out (the caller closes it), opened once: KILN_EUSAGE naming it when it
 * is a kiln checkpoint (before session 31 the safetensors reader said only
 * "header length ... exceeds ..."), else kiln_safetensors_open's errors,
 * or KILN_EDATA where the header does not match its CRC32C; each tensor's
 * is checked as kiln_safetensors_read reads it (kiln_safetensors_crc_reads:
 * read from the opening thread, each tensor before its values are used). */
kiln_status kiln_quant_open(const char *path, struct kiln_safetensors **out);
/* The keys of cfg (the unfolded config) that shape the tensors, and the
 * layers' types, against those f was quantized with (its "kiln.config";
 * kiln_ckpt_config_check's rule): KILN_ECONFIG naming the first key that
 * differs and both values.  A file of a kiln before session 29 has no
 * config: a warning, its tensors alone are checked (kiln_quant_load). */
kiln_status kiln_quant_config_check(const struct kiln_safetensors *f, const struct kiln_config *cfg,
				    const struct kiln_registry *reg);
/* The model's input sample f records (its "kiln.sample"), into *out, so
 * that the INT8 model is built without opening [data]: KILN_ENOTFOUND
 * (with a message) for a file of a kiln before session 39, which records
 * none (the caller reads [data]'s), KILN_EDATA for a malformed one. */
kiln_status kiln_quant_sample(const struct kiln_safetensors *f, struct kiln_tensor_desc *out);

/* `kiln eval --quantized`: the int8 keys of every layer the file
 * quantized, set on the folded config cfg (kiln_infer_fold_config_ex
 * with KILN_FOLD_INT8, which chose its layout; [layer.X] int8_scale,
 * int8_unsigned, and on the CPU int8_out_scale where the layer's u8
 * output can go straight to the INT8 layers after it: core/quantize.c,
 * "chaining"), and the file's weights into m (built from that config:
 * I8 weights dequantized, q * scale, which the INT8 ops quantize back to
 * q exactly).  A tensor of the file that m does not take is KILN_EDATA
 * naming it, as is one m needs that the file lacks. */
kiln_status kiln_quant_config(struct kiln_config *cfg, const struct kiln_safetensors *f);
kiln_status kiln_quant_load(struct kiln_model *m, const struct kiln_safetensors *f, void *stream);

#endif
