/* core/infer_passes.h - inference graph passes (core/infer_passes.c):
 * a trained model rewritten for evaluation only.  See docs/inference.md,
 * "Folding".
 *
 *   conv + batchnorm    -> conv with bias, W' = W * g, b' = beta + (b - mean) * g
 *   linear + batchnorm  -> linear with bias, the same per output feature
 *                          (g = gamma / sqrt(running_var + eps))
 *   dropout             -> removed (identity in evaluation)
 *   bias + activation   -> the conv/GEMM epilogue: the folded config sets
 *                          [run] fuse = 1, and a conv or linear now read
 *                          only by its ReLU/GELU takes it as a post-op
 *   conv (+ bn) + add   -> with KILN_FOLD_RESIDUAL: the conv takes the
 *                          add's other input as its residual (`inputs =
 *                          x, r`: y = act(conv(x) + b + r)), the add goes,
 *                          and the ReLU after it fuses into the conv
 *
 * A batchnorm folds only when it alone reads a conv or linear that feeds
 * nothing else.  The passes work on the config (the model's [layer.*]
 * sections) and the weights, so the folded model is an ordinary kiln
 * model: the same planner, devices and precision policies run it. */
#ifndef KILN_INFER_PASSES_H
#define KILN_INFER_PASSES_H

#include "graph.h"

/* The folded config of model m (built from m->cfg): its sections in the
 * same order, without the folded batchnorms and the dropouts, every
 * remaining layer's input named explicitly, bias = 1 on the layers that
 * took a batchnorm, [run] fuse = 1, [model] layout = auto (the device's:
 * nhwc on the CPU) unless a layer refuses that layout's shapes (a
 * layernorm on a 4-d tensor refuses nhwc): then m's own layout, which
 * every layer took, logged with the refusal.  *out is new
 * (kiln_config_free), validated against reg.  *n_folded (may be NULL):
 * layers removed. */
kiln_status kiln_infer_fold_config(const struct kiln_model *m, struct kiln_registry *reg,
				   struct kiln_config **out, int *n_folded);
/* The same with flags: KILN_FOLD_RESIDUAL also moves each two-input add
 * whose later input is a conv (after the folds) that feeds only it into
 * that conv (its second input, the residual; evaluation only), and counts
 * the adds in *n_folded.  Not for the INT8 path, which quantizes the adds. */
#define KILN_FOLD_RESIDUAL 1
/* KILN_FOLD_INT8: the layout asked for is nhwc, not auto (for
 * kiln_quant_config: oneDNN's int8 convolutions have direct kernels for
 * channels-last only), with the same retreat to m's layout. */
#define KILN_FOLD_INT8 2
kiln_status kiln_infer_fold_config_ex(const struct kiln_model *m, struct kiln_registry *reg,
				      int flags, struct kiln_config **out, int *n_folded);

/* The weights of dst (a model built from src's folded config) from src's:
 * every parameter and buffer copied by name, the folded layers' weight
 * and bias computed in double from the batchnorm they took.  Reads src's
 * buffers on src_stream, writes dst's on dst_stream (the two models may
 * live on different devices), and waits for both. */
kiln_status kiln_infer_fold_weights(const struct kiln_model *src, void *src_stream,
				    struct kiln_model *dst, void *dst_stream);
/* The same in two steps, so that src's device weights can be freed
 * (kiln_model_weights_free) before dst is built (`kiln predict`, the C
 * API: the trained and the folded model never both held, session 38):
 * _read copies src's weights to host memory (*out, freed with
 * kiln_infer_fold_host_free, NULL too; src's stream waited for); _write
 * computes dst's from that copy and src's layers and parameter table
 * (its device weights are not read), frees the copy's arrays (h itself
 * stays the caller's) and writes dst's on dst_stream, waiting for it. */
struct kiln_fold_host;
kiln_status kiln_infer_fold_read(const struct kiln_model *src, void *src_stream,
				 struct kiln_fold_host **out);
kiln_status kiln_infer_fold_write(const struct kiln_model *src, struct kiln_fold_host *h,
				  struct kiln_model *dst, void *dst_stream);
void kiln_infer_fold_host_free(struct kiln_fold_host *h);

/* m's params and buffers regions (f32, n_elems and n_buf_elems) copied
 * to host params/buffers (up = 0) or from them (up = 1) on stream;
 * waits for it. */
kiln_status kiln_model_regions_copy(const struct kiln_model *m, float *params, float *buffers,
				    int up, void *stream);

/* core/infer.c: the model an inference handle runs (folded, INT8 with
 * kiln_infer_opts.quantized) and its stream; the handle owns both. */
struct kiln_infer;
struct kiln_model *kiln_infer_model(const struct kiln_infer *m, void **stream);

/* core/infer.c: the rows of one run of the handle's plan (its cache
 * block, kiln_infer_block_rows, else kiln_infer_opts.batch). */
int64_t kiln_infer_run_rows(const struct kiln_infer *m);

/* Batch blocking for cache ([run] infer_block = auto): the rows of one
 * run of an inference plan on a device that computes in host memory, for
 * a batch of `batch` rows whose plan holds act_row bytes of activations
 * a row (its arena over its rows) and whose weights are weight_bytes.
 * When batch rows of activations exceed `budget` (the CPU: twice the L2 of a
 * core times the threads) and the weights are small (at most what one block
 * of activations is, so reading them again each block costs less than
 * the activations' trips out of the cache), the largest power of two of
 * rows whose activations fit in budget (at least 1); else batch. */
int64_t kiln_infer_block_rows(int64_t batch, size_t act_row, size_t weight_bytes, size_t budget);

#endif
