/* kiln/plugin.h - the plugin ABI.  Include this to write a kiln plugin.
 * The ops a device runs, and their contracts, are in kiln/ops.h, which
 * this header includes.
 *
 * A plugin file is a shared object named `kiln-<name>.so` that exports exactly
 * one symbol, kiln_plugin_init (build with -fvisibility=hidden and mark it
 * KILN_PLUGIN_EXPORT).  The core dlopen()s it with RTLD_NOW | RTLD_LOCAL,
 * calls kiln_plugin_init once with the host table, and receives a
 * NULL-terminated array of descriptors, each describing one plugin of one
 * kind.  One file may carry several plugins (kiln-loaders.so holds every
 * data source).
 *
 * Versioning.  abi_major must equal KILN_ABI_MAJOR exactly or the plugin is
 * refused (both numbers are printed), and abi_minor must be at most
 * KILN_ABI_MINOR: a newer minor may have grown a struct the core allocates
 * and the plugin fills (kiln_source_info, kiln_layer's outputs), and the
 * plugin would write past this core's smaller copy, so such a file is
 * refused too, naming both versions (before session 35 it was loaded).  A
 * plugin of an older minor loads: it writes less than the core allocated,
 * and the core asks it nothing its version has not.  Every ops table begins with
 * `uint32_t version` and only ever grows at the end: the core calls a member
 * only when the table's version says it exists and the pointer is non-NULL.
 * Members marked (optional) may be NULL; the default the core's wrapper then
 * applies is stated beside them.
 *
 * Ownership.  Descriptors, ops tables and key tables are static data of the
 * plugin and must stay valid until the file is unloaded (process exit).
 * Objects a plugin creates (contexts, plans, streams) are freed by the same
 * plugin through the matching member.
 *
 * Errors.  Members return kiln_status; on failure they set the message with
 * host->error() naming what failed (file:line of a library call, the sample,
 * the shape).  Plugins never call exit() or abort() on a user or environment
 * error, and never print directly: they use host->log().
 *
 * Threads.  Unless a member says otherwise the core calls a context from one
 * thread at a time.
 */
#ifndef KILN_PLUGIN_H
#define KILN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "tensor.h"
#include "config.h"
#include "ops.h" /* the op catalogue: enum kiln_op_type, struct kiln_op */

#ifdef __cplusplus
extern "C" {
#endif

/* 2.0: the op catalogue moved to kiln/ops.h; a device's ops table carries
 * its traits (type, auto score, memory, communicator) and open() receives
 * struct kiln_device_options; source get/set_position and precision
 * grad_dtype, which nothing called, are gone (docs/plugins.md, "ABI 2").
 * 2.1: the transformer ops (kiln/ops.h: EMBEDDING, EMBEDDING_BWD, LAYERNORM,
 * LAYERNORM_BWD, ATTENTION, ATTENTION_BWD), KILN_ACT_GELU_TANH,
 * SOFTMAX_XENT's ignore_index and row count, KILN_INIT_NORMAL,
 * kiln_layer.compute_dtype.
 * 2.2: decoding with a key/value cache: KILN_OP_ATTENTION_DECODE,
 * kiln_layer.decode_len, kiln_layer_run.pos (docs/generate.md).
 * 2.3: fused epilogue activations: KILN_OPF_ACT on GEMM, CONV and the
 * batchnorm ops (kiln/ops.h); kiln_layer.fuse_act and act_fused.
 * 2.4: SOFTMAX_XENT may write its gradient over its logits (out0 = in0)
 * and takes the class count i[5] (a padded vocabulary);
 * kiln_layer.dx_over_input.
 * 2.5: recurrent layers: KILN_OP_RNN, KILN_OP_RNN_BWD (kiln/ops.h); point-
 * to-point send and recv in the communicator (comm ops version 4).
 * 2.6: INT8 inference ops KILN_OP_QCONV and KILN_OP_QLINEAR (kiln/ops.h).
 * 2.7: sub-communicators: split in the communicator (comm ops version 5).
 * 2.8: chained INT8: QCONV/QLINEAR with u8 in0 and/or out0, max POOL on
 *      u8 in inference (kiln/ops.h).
 * 2.9: kiln_layer.dx_is_dy (a residual add's input gradients share its
 *      output gradient's storage).
 * 2.9: accumulated weight gradients: KILN_OP_CONV_BWD_WEIGHTS takes
 *      KILN_OPF_ACCUMULATE (adds into dw and db; the core asks no device
 *      built before 2.9, and a device may refuse it with KILN_ENOTSUP);
 *      the core sets kiln_layer_run.dw_accum (a layer built for 2.9 or
 *      later must honour it: add into every dw[k]) on the micro-steps
 *      after an optimizer step's first, for layers built for 2.9 or later
 *      (kiln/ops.h, docs/plugins.md "ABI 2.9").
 * 2.9: kept copies between a layer's convolution ops: KILN_OPF_KEEP on
 *      CONV, CONV_BWD_WEIGHTS and CONV_BWD_DATA (kiln/ops.h), their size
 *      through aux_bytes; KEEP and ACCUMULATE may be set together on
 *      CONV_BWD_WEIGHTS.
 * 2.9: RELU_BWD may take a second output, out1 f32 [N]: the sum over rows
 *      of the masked gradient (the bias gradient of the layer before the
 *      ReLU, in the same pass; kiln/ops.h).  A device that has not got it
 *      returns KILN_ENOTSUP and the caller runs BIAS_GRAD apart.
 * 2.10: KILN_OP_ADD may write a u8 out0 in inference (two f32 inputs, the
 *      output scale in f[0], the ReLU implied; kiln/ops.h).
 * 2.11: source ops version 3: prefetch (a hint that a sample will be read
 *      soon; NULL in a source built before); KILN_OPF_RESIDUAL on CONV, a
 *      residual input added before the fused activation (inference;
 *      kiln/ops.h).
 * 2.12: comm ops version 6: send_now (a send on the calling thread that
 *      need not wait for the peer; NULL in a communicator built before).
 * 2.13: comm ops version 7: sendrecv (a send and a recv that progress
 *      together, one NCCL group; NULL in a communicator built before: the
 *      core pairs a send and a recv in rank order).
 * 2.14: KILN_PROC_WORKLOAD and struct kiln_workload: the trainer tells a
 *      device what one training step holds (gradient bytes, forward
 *      FLOPs) once its plan is made, before the first step, so that a
 *      default left to `auto` can follow the model (the CPU's async
 *      streams; docs/plugins.md "ABI 2.14").
 * 2.15: frozen weights: KILN_OPF_FROZEN on CONV, QCONV and QLINEAR
 *      (and, since session 46 without a minor, a linear layer's f32 GEMM)
 *      (kiln/ops.h), set by the core in inference plans only on a device
 *      that exports
 *      KILN_PROC_WEIGHTS_CHANGED, which the core calls when it wrote new
 *      bytes into weights such a plan reads; kiln_layer.frozen
 *      (docs/plugins.md "ABI 2.15").
 * 2.16: KILN_OPF_ACT (ReLU) on a training max POOL: the ReLU before the
 *      pooling, its backward folded into POOL_BWD through the aux
 *      (kiln/ops.h KILN_OP_POOL); the core asks no device built before.
 * 2.17: a max POOL and its POOL_BWD whose x (dx) is NHWC and y (dy) NCHW,
 *      f32 (kiln/ops.h KILN_OP_POOL): a one-channel conv's NHWC output
 *      pooled into an NCHW model; KILN_ENOTSUP where the device has it
 *      not, and the core asks no device built before (docs/plugins.md
 *      "ABI 2.17").
 * 2.18: comm ops version 8: map_shared (host memory that every rank of a
 *      communicator maps, every rank's slice reachable from every rank: a
 *      pipeline's crossing tensors, written by one stage's rank and read
 *      in place by the next's) and p2p_buffered (the bytes a send may
 *      leave in the transport without its receive posted); NULL in a
 *      communicator built before.
 * 2.19: comm ops version 9: reduce_scatter_in_place (reduce_scatter may
 *      write this rank's slice over its own slice of the input: ZeRO-1's
 *      averaged gradient pieces need no buffer of their own); 0 in a
 *      communicator built before.
 * 2.20: dropout by the global batch (docs/plugins.md "ABI 2.20").
 * 2.21: kiln_source_info.classes_from (where a source found its largest
 *      label), which the core zeroes, so a source built before leaves it
 *      NULL (docs/plugins.md "ABI 2.21").
 * 2.22: KILN_PARAM_NONNEG or-ed into kiln_param_spec.is_buffer (a running
 *      variance must be >= 0); a core built before reads it as 1
 *      (docs/plugins.md "ABI 2.22").
 * 2.23: kiln_layer_run.loss_scale also carries the mean over the step's
 *      micro-batches ([train] accumulate, a pipeline's), in f32 too: a
 *      loss layer multiplies its gradient by *loss_scale whenever
 *      l->loss_scaled is set.  A plugin loss layer built before is
 *      refused in such a plan (docs/plugins.md "ABI 2.23").
 * 2.24: source ops version 5: peek (what info() would say of the images,
 *      told from a header or the config without opening the set: `kiln
 *      predict` of image files; NULL in a source built before, which is
 *      opened as before; docs/plugins.md "ABI 2.24").
 * 2.25: KILN_OP_RNN / RNN_BWD's i[4] ("last"): y and dy [B,H], each row's
 *      final hidden state (PyTorch's h_n; kiln/ops.h); the core asks no
 *      device built before (docs/plugins.md "ABI 2.25").
 * 2.26: kiln_layer.decode_caches, decode_row_bytes and decode_pos_bytes
 *      (a decode plan's caches laid out by row and position, whose
 *      filled positions the core may copy from one row to others: a
 *      prompt fed once for several samples); 0 in a layer built before,
 *      whose rows are each fed (docs/plugins.md "ABI 2.26").
 * 2.27: kiln_layer.eval_sums and eval_counted: in the trainer's
 *      evaluation plans a loss layer that sets eval_counted in its plan
 *      adds plain sums over the rows it counts and [3] their count, so an
 *      evaluation is one mean over every row of the set; a loss layer
 *      that does not (one built before, or rebuilt unchanged) is divided
 *      by samples, as before (docs/plugins.md "ABI 2.27").
 * 2.28: KILN_OP_ADAMW's f[4], an L2 weight decay added to the gradient
 *      before the moments (torch.optim.Adam's weight_decay; `optimizer =
 *      adam`); the core asks no device built before for f[4] != 0
 *      (docs/plugins.md "ABI 2.28").
 * 2.29: KILN_OP_SGD's f[3], torch.optim.SGD's dampening (with it, the
 *      step count t as in2), and KILN_OP_ADAMW's i[1], amsgrad (a fourth
 *      output, the largest second moment so far; kiln/ops.h); the core
 *      asks no device built before for either (docs/plugins.md "ABI
 *      2.29").
 * 2.30: KILN_OP_LR_SCHEDULE's schedules exponential, linear and
 *      polynomial (KILN_SCHED_EXPONENTIAL..POLYNOMIAL) and onecycle's
 *      i[5] three_phase and i[6] anneal_strategy; the core asks no
 *      device built before for them (docs/plugins.md "ABI 2.30").
 * 2.31: a decode plan's runs may take T > 1 positions a row (a prompt's
 *      prefill: kiln_layer.decode_len's in[] [B, T, ...] at positions
 *      kiln_layer_run.pos[0..T)), only where every layer that keeps
 *      decoding state and every layer not built in sets
 *      kiln_layer.decode_runs in its plan (a layer built before, or
 *      rebuilt unchanged, leaves it 0); KILN_OP_ATTENTION_DECODE_RUN, the
 *      decoding attention of T positions a run (kiln/ops.h), which a
 *      device built before, or rebuilt unchanged, refuses.  Else the
 *      prompt is fed a position a step (docs/plugins.md "ABI 2.31").
 * 2.32: KILN_OP_GRAD_SUMSQ, GRAD_CLIP's block sums over a range of
 *      blocks, run by the core where the backward completes them, and
 *      GRAD_CLIP's in1 taking those sums (kiln/ops.h); the core asks no
 *      device built before for either, and where a device refuses them
 *      (KILN_ENOTSUP) GRAD_CLIP makes its one pass as before
 *      (docs/plugins.md "ABI 2.32"). */
#define KILN_ABI_MAJOR 2
#define KILN_ABI_MINOR 32

#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))

enum kiln_plugin_kind {
	KILN_PLUGIN_DEVICE = 1,
	KILN_PLUGIN_COMM = 2,
	KILN_PLUGIN_PRECISION = 3,
	KILN_PLUGIN_SOURCE = 4,
	KILN_PLUGIN_OPTIM = 5,
	KILN_PLUGIN_LAYER = 6
};

struct kiln_device;   /* core wrapper of an opened device */
struct kiln_store;    /* core TCP key-value store (rendezvous) */

/* ---- the host table: what the core offers every plugin ------------------ */

#define KILN_HOST_VERSION 8

struct kiln_host {
	uint32_t version; /* KILN_HOST_VERSION of the core that loaded the plugin */

	/* Log through the core's sink.  `who` is usually the plugin's name.
	 * log and error format numbers in the C locale ("0.5"), whatever
	 * the embedding application's; a plugin that parses or formats
	 * numbers itself does so in the C locale too (strtod_l, uselocale:
	 * docs/plugins.md, "Rules"). */
	void (*log)(int level, const char *who, const char *fmt, ...) KILN_PRINTF(3, 4);

	/* Set the calling thread's error message; returns st. */
	kiln_status (*error)(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);

	/* Config access for the plugin's own section ([plugin.NAME], or the
	 * [data] section a source was opened for).  Same contracts as the
	 * kiln_config_get_* functions of config.h. */
	const char *(*config_get)(const struct kiln_config *cfg, const char *section,
				  const char *key);
	kiln_status (*config_get_int)(const struct kiln_config *cfg, const char *section,
				      const char *key, int64_t *out);
	kiln_status (*config_get_float)(const struct kiln_config *cfg, const char *section,
					const char *key, double *out);
	kiln_status (*config_get_bool)(const struct kiln_config *cfg, const char *section,
				       const char *key, int *out);
	const char *(*config_where)(const struct kiln_config *cfg, const char *section,
				    const char *key);

	/* Device access for layer and optim plugins: the core's wrappers of
	 * struct kiln_device_ops (defaults applied, syncs counted). */
	kiln_status (*device_prepare)(struct kiln_device *dev, const struct kiln_op *op,
				      void **plan, size_t *workspace);
	kiln_status (*device_run)(struct kiln_device *dev, void *plan,
				  const struct kiln_op_args *args, void *stream);
	void (*device_plan_free)(struct kiln_device *dev, void *plan);

	/* The calling thread's last error message (kiln_last_error()), so a
	 * plugin can carry a message from the thread that failed to the one
	 * that reports it. */
	const char *(*last_error)(void);

	/* The device's aux_bytes for a prepared plan (0 when the device has
	 * no such member). */
	size_t (*device_aux_bytes)(struct kiln_device *dev, void *plan);

	/* ---- version 2 ---- */

	/* CRC32C (Castagnoli) of buf[0..n), continuing from `crc` (0 to
	 * start): the checksum of kiln's records and checkpoint files.
	 * Thread-safe. */
	uint32_t (*crc32c)(uint32_t crc, const void *buf, size_t n);

	/* ---- version 3 ---- */

	/* The name of an op type ("GEMM", "CONV_BWD_DATA", ...; "unknown op"
	 * past the table), for messages.  Thread-safe. */
	const char *(*op_name)(int type);

	/* ---- version 4 (ABI 1.3: distributed training) ---- */

	/* The rendezvous store a comm plugin's open() receives (kiln/dist.h's
	 * kiln_store_set/get/add): how Gloo exchanges addresses and NCCL its
	 * unique id.  store_get waits up to timeout_ms for the key and returns
	 * a malloc'd value the plugin releases with host->free.  Thread-safe.
	 * KILN_ENOMEM: this process had no memory for the store's answer (the
	 * connection stays usable): the rank's own failure, which a plugin
	 * returns as it is, not as an I/O error or a peer's silence (since
	 * session 39; the core takes it as the rank's own either way). */
	kiln_status (*store_set)(struct kiln_store *s, const char *key, const void *val,
				 size_t len);
	kiln_status (*store_get)(struct kiln_store *s, const char *key, int timeout_ms,
				 void **val, size_t *len);
	kiln_status (*store_add)(struct kiln_store *s, const char *key, int64_t delta,
				 int64_t *out);
	void (*free)(void *p);
	/* Enqueue fn(arg) on a device stream: it runs after the work enqueued
	 * before it and before the work enqueued after it (cudaLaunchHostFunc;
	 * the CPU device's stream worker in async mode).  A nonzero return
	 * (with host->error set on the calling thread) fails the stream: later
	 * syncs and waits on it report the message.  Where the device has no
	 * such facility the core synchronises the stream and calls fn at once.
	 * This is how host-memory communicators (Gloo, MPI) run "on the comm
	 * stream". */
	kiln_status (*device_host_fn)(struct kiln_device *dev, void *stream,
				      kiln_status (*fn)(void *arg), void *arg);
	kiln_status (*device_event_record)(struct kiln_device *dev, void *event, void *stream);
	kiln_status (*device_stream_sync)(struct kiln_device *dev, void *stream);
	/* The device plugin's name ("cpu", "cuda"), and its extension entry
	 * point `name` (get_proc_address; NULL when absent). */
	const char *(*device_name)(struct kiln_device *dev);
	void *(*device_proc)(struct kiln_device *dev, const char *name);
	/* An unrecoverable failure seen on a plugin's own thread, where no
	 * status can be returned (MPI's watchdog: a collective past its
	 * timeout cannot be cancelled).  The core logs the message and calls
	 * the program's fatal handler (kiln_set_fatal_handler: the CLI exits
	 * non-zero, which ends the job); it returns only when there is none. */
	void (*fatal)(const char *who, const char *fmt, ...) KILN_PRINTF(2, 3);

	/* ---- version 5 (ABI 1.4: synchronised batch normalisation) ---- */

	/* Collectives for layers, over the ranks of kiln_layer_run.group
	 * (a training run's data-parallel group; never NULL when a layer's
	 * kiln_layer.sync_ranks > 1).  Ordered on `stream` like device work:
	 * the core makes its communication stream wait for the work enqueued
	 * on `stream` so far, runs the collective there and makes `stream`
	 * wait for it; nothing synchronises the host.  Every rank must make
	 * the same calls in the same order (layers do, since every rank runs
	 * the same plan).  Buffers: device memory; `op` enum kiln_reduce_op;
	 * allgather's recv[ranks * count] gets every rank's send[count] in
	 * rank order.  Errors name the rank. */
	kiln_status (*group_allreduce)(void *group, void *buf, size_t count, int dtype, int op,
				       void *stream);
	kiln_status (*group_allgather)(void *group, const void *send, void *recv, size_t count,
				       int dtype, void *stream);

	/* ---- version 6 (ABI 1.6) ---- */

	/* 1 while a training step is being captured on dev (between the
	 * device's capture_begin and capture_end, docs/plugins.md "Captured
	 * steps"), else 0.  What is enqueued then on any of dev's streams is
	 * recorded and replayed with the same arguments until the graph is
	 * freed: a host function's `arg` must stay valid and unchanged that
	 * long, so a comm plugin gives such a collective storage of its own
	 * rather than a slot it reuses (kept until close()).  Called on the
	 * thread that enqueues. */
	int (*device_capturing)(struct kiln_device *dev);

	/* ---- version 7 ---- */

	/* The run clock in nanoseconds: CLOCK_MONOTONIC less the time the
	 * whole process stood still (stopped or suspended with its job,
	 * noticed as a late wake-up of a thread of the core's; a busy
	 * machine's delays under a second are not counted).  A comm plugin
	 * measures its [dist] timeout on it, so that a job suspended whole
	 * past the timeout and continued does not fail its pending
	 * collectives; a single stuck peer does not stall this process, so
	 * it is still named within the timeout.  Thread-safe. */
	int64_t (*run_ns)(void);

	/* ---- version 8 ---- */

	/* A best-effort read of the store: key's value as it is now
	 * (malloc'd, released with host->free; *val NULL where unset), with
	 * no wait for it (the store's answer within [dist] timeout).  For
	 * what the plugin does without (a host name for its messages, an
	 * address it has a default for): an answer this process had no
	 * memory for is KILN_ENOMEM, but not the rank's own failure, as
	 * store_get's is (before it, such a read that failed made a peer's
	 * later failure read as this rank's out of memory).  Thread-safe. */
	kiln_status (*store_check)(struct kiln_store *s, const char *key, void **val, size_t *len);
};

/* ---- descriptors ------------------------------------------------------ */

struct kiln_plugin {
	uint32_t abi_major;  /* KILN_ABI_MAJOR the plugin was built against */
	uint32_t abi_minor;  /* KILN_ABI_MINOR the plugin was built against */
	int32_t kind;        /* enum kiln_plugin_kind */
	const char *name;    /* unique within its kind: "cpu", "idx", ... */
	const char *summary; /* one line for `kiln plugins` */
	const void *ops;     /* struct kiln_<kind>_ops * */
	/* Keys of the plugin's own config section: [plugin.NAME] for devices,
	 * comms and precisions; the extra [data]/[data.eval] keys for a
	 * source; the [layer.X] keys for a layer type; the extra [train] keys
	 * for the selected optimizer.  (optional: NULL means no keys) */
	const struct kiln_key *keys;
	/* Can this plugin run here?  Return 0, or write a reason ("no CUDA
	 * driver") into why[0..n) and return nonzero.  Must be cheap and
	 * side-effect free.  (optional: NULL means always available) */
	int (*probe)(const struct kiln_host *host, char *why, size_t n);
};

/* The one exported symbol.  Called once per process, from one thread.
 * Returns a NULL-terminated array of static descriptors, or NULL after
 * setting an error through host->error. */
typedef const struct kiln_plugin *const *(*kiln_plugin_init_fn)(const struct kiln_host *host);
#define KILN_PLUGIN_INIT_SYMBOL "kiln_plugin_init"

/* ======================================================================
 * Device: memory, streams, events, and kernels as prepare/run pairs (the
 * ops themselves are kiln/ops.h's).
 * ====================================================================== */

#define KILN_PROC_DESCRIBE "kiln.describe"
/* KILN_PROC_HOST_FN  kiln_status (*)(void *ctx, void *stream,
 *   kiln_status (*fn)(void *arg), void *arg): enqueue a host function on a
 *   stream (host->device_host_fn's contract).  The CPU device has it. */
#define KILN_PROC_HOST_FN "kiln.host_fn"
/* KILN_PROC_HOST_FN_SKIP  kiln_status (*)(void *ctx, void *stream,
 *   kiln_status (*fn)(void *arg), void (*skip)(void *arg), void *arg):
 *   KILN_PROC_HOST_FN, and where the stream passes the call without running
 *   fn (a failed stream skips what was queued on it behind the failure),
 *   skip(arg) runs instead, on the stream's thread, in fn's place: every call
 *   the device accepted ends in exactly one of fn and skip, on the stream's
 *   way through its queue (before a stream_sync of it returns, before its
 *   destroy returns).  A call refused (a nonzero return) runs neither.  ctx
 *   may be NULL (the stream's device's).  Looked up by name (no ABI minor:
 *   a device before it has none, and the caller falls back on
 *   host->device_host_fn): a comm plugin gives a collective's job slot back
 *   there (docs/distributed.md, "No allocation per collective").  The CPU
 *   device has it. */
#define KILN_PROC_HOST_FN_SKIP "kiln.host_fn_skip"
/* KILN_PROC_STREAMS_ASYNC  int (*)(void *ctx): 1 where the device's streams
 *   run their work on threads of their own now (the thread that issues it
 *   only enqueues), 0 where that thread runs it.  Looked up by name (no ABI
 *   minor: a device without it is taken as unknown).  The core's loader
 *   reads it at open: a batch is filled on the training thread only where
 *   that thread is one of the compute threads (docs/data.md, the
 *   consumer-fill rule).  The CPU device has it (session 48): [plugin.cpu]
 *   async, as set or as its auto rule chose. */
#define KILN_PROC_STREAMS_ASYNC "kiln.streams_async"
/* KILN_PROC_STREAM_SIDE  kiln_status (*)(void *ctx, void *stream, void
 *   **side): a side stream of `stream` (session 49): runs, copies and
 *   event records issued on it run in their order, each no earlier than
 *   everything issued on `stream` before it, on `stream`'s own thread
 *   when that stream reaches a wait for an event not yet complete (one
 *   group at a time: up to and including the side's next event record)
 *   and until the event completes or the side has nothing ready.  A wait
 *   of `stream` on an event recorded on the side therefore runs the side
 *   up to it; only `stream`'s own waits run it: another stream's wait or
 *   an event_sync on a side's event sleeps until `stream` reaches a wait
 *   (and forever where `stream` has none left: issue one on `stream`).
 *   No waits, host functions or syncs on a side.  Destroying `stream`
 *   first drains it (its waits run the side), then destroys the side
 *   (destroying the side afterwards is a double free); a side destroyed
 *   on its own waits until `stream` is not running its work, drops its
 *   work not run yet and completes its pending event records with an
 *   error (a wait on one fails, not hangs).  The streams' mode (async)
 *   does not switch while a side is open.  Looked up by name (no ABI
 *   minor); where the device's streams have no threads of their own
 *   (KILN_PROC_STREAMS_ASYNC 0) the side's work runs when issued.  The
 *   pipeline's deferred weight gradients use it ([pipeline]
 *   defer_wgrad, docs/pipeline.md); the CPU device has it. */
#define KILN_PROC_STREAM_SIDE "kiln.stream_side"
/* KILN_PROC_RUN_WAIT  int64_t (*)(void *ctx): the nanoseconds this
 *   process's threads have waited for a CPU (in a run queue) since some
 *   fixed origin, summed over the threads alive now: it drops when a
 *   thread exits (a reader takes a drop as no wait); < 0 where the
 *   device cannot tell.
 *   Two readings over a wall-clock interval give the seconds a second the
 *   process waited: the signal of contention (session 50).  Looked up by
 *   name (no ABI minor).  The pipeline's [pipeline] defer_wgrad = auto
 *   reads it (docs/pipeline.md); the CPU device has it (schedstat; its
 *   tests' hook KILN_CPU_RUNWAIT=r reads r seconds a second). */
#define KILN_PROC_RUN_WAIT "kiln.run_wait"
/* KILN_PROC_NATIVE_STREAM  void *(*)(void *ctx, void *stream): the
 *   library's own stream behind a kiln stream (the CUDA device: its
 *   cudaStream_t), for communicators that enqueue on it (NCCL). */
#define KILN_PROC_NATIVE_STREAM "kiln.native_stream"
/* KILN_PROC_WORKLOAD  kiln_status (*)(void *ctx, const struct kiln_workload
 *   *w) (ABI 2.14): what one training step of this process holds, told by
 *   `kiln train` once after the training plan is made and before the first
 *   step (not on a pipeline's stage devices).  No stream has work queued
 *   then and no other thread issues any, so the device may change a
 *   default its config left to `auto` (the CPU device: [plugin.cpu] async;
 *   docs/distributed.md, item 6).  Optional: a device without it, or a
 *   caller that never calls it, keeps what open() chose.  An error fails
 *   the run. */
#define KILN_PROC_WORKLOAD "kiln.workload"
/* KILN_PROC_WEIGHTS_CHANGED  void (*)(void *ctx) (ABI 2.15): the core has
 *   written new bytes into weights that ops prepared with KILN_OPF_FROZEN
 *   read (a checkpoint or safetensors file loaded into a model that has
 *   inference plans, kiln_model_param_get's pointer handed out,
 *   kiln_model_params_written, ...).
 *   Every such op of this device takes its weights from in1 again on its
 *   next run (whatever copy it made of them is stale).  The core calls it
 *   from the thread that runs the plans, after it enqueued the write and
 *   before it enqueues the next run of a frozen plan, on the stream the
 *   write went to or after synchronising it.  Once per write for all the
 *   frozen plans of a model, also before the first run of one prepared
 *   after the write (since session 39): so a device may share what it made
 *   of the weights between the ops of several plans, a plan prepared later
 *   included (the CPU's INT8 weights, one copy for a model's plans of
 *   every row count).  Optional: the core sets KILN_OPF_FROZEN only on a
 *   device that has it. */
#define KILN_PROC_WEIGHTS_CHANGED "kiln.weights_changed"
/* KILN_PROC_WEIGHTS_WRITTEN  void (*)(void *ctx, const void *ptr, size_t
 *   bytes) (since session 41; looked up by name, so no ABI minor: a core
 *   before it never asks, a device without it gets
 *   KILN_PROC_WEIGHTS_CHANGED as before): KILN_PROC_WEIGHTS_CHANGED for
 *   the weights in [ptr, ptr + bytes) alone.  Where the device has it, the
 *   core calls it instead, when and from where it would call that, once
 *   for each range of device memory the model's frozen ops read weights
 *   from (its parameters, its buffers, its compute copy when there is
 *   one), and never KILN_PROC_WEIGHTS_CHANGED for the model.  Ops whose
 *   in1 lies in none of those ranges take it again as they do after
 *   KILN_PROC_WEIGHTS_CHANGED; ops of another model (other ranges) may keep
 *   their copies: one model's load makes no other model's copies again.
 *   A later call for a range that overlaps an earlier one's replaces it.
 *   Optional: requires KILN_PROC_WEIGHTS_CHANGED. */
#define KILN_PROC_WEIGHTS_WRITTEN "kiln.weights_written"
#define KILN_WORKLOAD_VERSION 1
struct kiln_workload {
	uint32_t version;     /* KILN_WORKLOAD_VERSION of the core */
	int32_t ranks;        /* data-parallel ranks that all-reduce the gradients */
	int64_t batch;        /* samples of one step of this rank */
	int64_t grad_elems;   /* gradient elements all-reduced each step */
	int64_t grad_bytes;   /* their bytes (the gradients' dtype) */
	/* the training plan's forward, one step of this rank, in FLOPs (a
	 * multiply-add is 2; kiln_op_flops); 0: not counted ([dist] sync_bn) */
	double fwd_flops;
};

enum kiln_copy_kind {
	KILN_COPY_H2D = 0,
	KILN_COPY_D2H = 1,
	KILN_COPY_D2D = 2
};

/* What kind of processor a device is (`kiln plugins` shows it). */
enum kiln_device_type {
	KILN_DEVICE_CPU = 1,   /* the host's own cores */
	KILN_DEVICE_GPU = 2,   /* an accelerator with memory of its own */
	KILN_DEVICE_OTHER = 3
};

/* What a device's memory and streams can do. */
enum kiln_device_caps {
	/* alloc() returns host memory the CPU reads and writes directly, so
	 * host communicators (Gloo, MPI) use its buffers in place */
	KILN_DEVICE_HOST_MEMORY = 1,
	/* 4-d activations run faster channels-last (NHWC) than NCHW: what
	 * `[model] layout = auto` (the default) picks; a plugin that does not
	 * set it gets NCHW */
	KILN_DEVICE_PREFER_NHWC = 2
};

/* What a device is, as data the core chooses by (ABI 2.0): no device is
 * named in the core.  Static, part of the device's ops table. */
struct kiln_device_traits {
	int32_t type;       /* enum kiln_device_type */
	/* `[run] device = auto` opens the available device (its probe passed)
	 * with the highest score, the first found on a tie; 0 or less: never
	 * chosen by auto.  kiln's own devices: cuda 100, cpu 10. */
	int32_t auto_score;
	uint32_t caps;      /* enum kiln_device_caps */
	/* `[run] comm = auto` in a multi-process run: the comm plugin that
	 * moves this device's memory ("nccl" for cuda); NULL for a device with
	 * KILN_DEVICE_HOST_MEMORY, whose run takes the host communicators (mpi
	 * when started by Open MPI's mpirun, else gloo). */
	const char *comm;
};

#define KILN_DEVICE_OPTIONS_VERSION 4

/* The [run] keys a device acts on, read once by the core (core/device.c)
 * from the config, where the schema holds their defaults, and handed to
 * open(): a device never reads [run] itself.  Its own keys stay in
 * [plugin.NAME], read through host->config_*.  Owned by the core and
 * borrowed for the duration of open() (copy what you keep); never NULL,
 * filled with the defaults when there is no config.  Grows at the end: a
 * device reads a member only when `version` says it exists. */
struct kiln_device_options {
	uint32_t version;      /* KILN_DEVICE_OPTIONS_VERSION of the core */
	/* [run] threads: compute threads, >= 0; 0 = one per CPU this process
	 * may run on (its affinity mask), counted by the device */
	int32_t threads;
	/* [run] deterministic: bit-identical runs for a seed and thread count;
	 * no atomics in reductions, no choice made by timing */
	int32_t deterministic;
	/* [run] autotune: time the algorithms a shape can use when it is
	 * prepared and keep the fastest (cudnn.benchmark) */
	int32_t autotune;
	/* ---- version 2 (ABI 2.3) ---- */
	/* processes of the run (the data-parallel world size from the
	 * environment: kiln launch, torchrun, Slurm, Open MPI); 1 alone.  For
	 * defaults that pay only with several ranks (the CPU's async streams,
	 * which let the gradients' allreduce overlap the backward). */
	int32_t ranks;
	/* ---- version 3 ---- */
	/* device instances of this process that run at the same time, each
	 * with its own `threads` ([run] devices: one per pipeline stage,
	 * docs/pipeline.md); 1 alone.  For defaults that pay only then (the
	 * CPU's async streams, so that the stages overlap).  Streams and
	 * events of instances of one device plugin in a process may wait on
	 * each other (a stage's stream waits for its neighbour's event). */
	int32_t peers;
	/* ---- version 4 ---- */
	/* 1: this instance runs one pipeline stage ([run] devices, with its
	 * share of [run] threads: core/pipe_devices.c), beside the run's own
	 * device ([run] device), whose events the stages wait on too (the
	 * step's start); 0: the run's own device, or a device alone.  What an
	 * event's recorder is, whatever the teams' sizes (the CPU device's
	 * spin back-off learns from a stage's waits on a peer stage's events
	 * only, cpu_spin_learns). */
	int32_t stage;
};

#define KILN_DEVICE_OPS_VERSION 3

/* Threads: open/close/alloc/free/host_alloc/stream_create/prepare are called
 * from the thread that drives training.  run/copy_async/event_record/
 * stream_wait enqueue work on a stream and may be called from the driving
 * thread and the loader's copy thread (for its own stream). */
struct kiln_device_ops {
	uint32_t version;
	/* What the device is: how `device = auto` and `comm = auto` choose. */
	struct kiln_device_traits traits;

	/* Open device `ordinal` (ranks open their local rank's) with the
	 * core's options and the [plugin.NAME] section of cfg (cfg may be
	 * NULL: `kiln plugins` opens devices with no config; then every
	 * plugin key has its default).  *ctx receives the plugin's context.
	 * Errors: KILN_EINVAL for a bad ordinal, KILN_ECONFIG naming the key,
	 * KILN_EDEVICE for a library failure (file:line). */
	kiln_status (*open)(const struct kiln_host *host, const struct kiln_config *cfg,
			    int ordinal, const struct kiln_device_options *opts, void **ctx);
	void (*close)(void *ctx);

	/* Device memory, at least 64-byte aligned.  free(NULL) is a no-op. */
	kiln_status (*alloc)(void *ctx, size_t bytes, void **ptr);
	void (*free)(void *ctx, void *ptr);
	/* Page-locked host memory for staging. (optional: default aligned
	 * malloc/free; both or neither must be set) */
	kiln_status (*host_alloc)(void *ctx, size_t bytes, void **ptr);
	void (*host_free)(void *ctx, void *ptr);

	/* Streams execute their work in order; different streams may overlap.
	 * The NULL stream is not allowed: the core always creates streams. */
	kiln_status (*stream_create)(void *ctx, void **stream);
	void (*stream_destroy)(void *ctx, void *stream);
	kiln_status (*event_create)(void *ctx, void **event);
	void (*event_destroy)(void *ctx, void *event);
	/* Enqueue a copy of `bytes` on stream.  The host side must stay valid
	 * until the stream has passed the copy. */
	kiln_status (*copy_async)(void *ctx, void *dst, const void *src, size_t bytes,
				  int kind, void *stream);
	/* Mark the current end of `stream`; the event completes when all work
	 * enqueued before it has. */
	kiln_status (*event_record)(void *ctx, void *event, void *stream);
	/* Work enqueued on `stream` after this call waits for `event`. */
	kiln_status (*stream_wait)(void *ctx, void *stream, void *event);
	/* Block the host until the event completed. */
	kiln_status (*event_sync)(void *ctx, void *event);
	/* Block the host until the stream is idle. */
	kiln_status (*stream_sync)(void *ctx, void *stream);

	/* Choose the algorithm and create library objects for `op`; report the
	 * workspace it needs (the caller owns workspace memory).  KILN_ENOTSUP
	 * when this device cannot run the op or shape, with a message. */
	kiln_status (*prepare)(void *ctx, const struct kiln_op *op, void **plan,
			       size_t *workspace);
	/* Enqueue one run of a prepared plan on stream.  Allocates nothing. */
	kiln_status (*run)(void *ctx, void *plan, const struct kiln_op_args *args,
			   void *stream);
	/* Free a plan.  The core calls it only after the work that uses the
	 * plan has completed (it synchronises first); a device may also wait
	 * for queued work itself.  Same for event_destroy and stream_destroy. */
	void (*plan_free)(void *ctx, void *plan);

	/* Named extension entry points. (optional: default returns NULL)
	 * Names kiln itself looks up:
	 *   KILN_PROC_DESCRIBE  const char *(*)(void): one line on what
	 *   the device computes with here (the CPU device: oneDNN's version,
	 *   the ISA its kernels dispatch to, how bf16 is done); `kiln plugins`
	 *   prints it.  Static storage, valid until the next call. */
	void *(*get_proc_address)(void *ctx, const char *name);

	/* Bytes of per-run state a prepared forward op leaves for its backward
	 * (oneDNN's max-pooling workspace): the caller keeps that much memory
	 * from forward to backward and passes it as the op's aux argument.
	 * (optional: default 0) */
	size_t (*aux_bytes)(void *ctx, void *plan);

	/* ---- version 2 ---- */

	/* The device memory free now and in all, in bytes (CUDA:
	 * cudaMemGetInfo; the CPU: the operating system's available and
	 * physical memory), for `[train] batch = auto` without a `[run]
	 * memory_limit`.  Thread-safe.  (optional: KILN_ENOTSUP) */
	kiln_status (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);

	/* ---- version 3 (ABI 1.5: captured training steps) ----
	 * A device may record the work of one training step once and replay
	 * it (CUDA graphs: stream capture, cudaGraphLaunch).  The core calls
	 * these from the driving thread only, never while profiling, and
	 * only around work that reads every per-step value from device
	 * memory (docs/plugins.md, "Captured steps").  The four members are
	 * set together or not at all.  (optional: without them, or when
	 * capture_begin returns KILN_ENOTSUP, the core issues every step) */

	/* Start recording the work enqueued on `stream` instead of running
	 * it.  A stream that waits (stream_wait) on an event recorded on a
	 * capturing stream during the capture joins it; every joined stream
	 * must be waited on again by a capturing stream before capture_end
	 * (the core's event pairs do this).  While capturing, no host may
	 * wait on a capturing stream or on an event recorded in the capture
	 * (stream_sync, event_sync fail), and a capturing stream may not wait
	 * on an event recorded outside the capture.  KILN_ENOTSUP (with a
	 * message) when the device does not capture here: the device's
	 * config turned it off ([plugin.cuda] graph = 0), or it cannot. */
	kiln_status (*capture_begin)(void *ctx, void *stream);
	/* End the capture begun on `stream` (same stream) and return the
	 * executable graph in *graph, owned by the caller (graph_free).
	 * Nothing recorded has run.  On failure the capture ends, what was
	 * recorded is dropped, *graph is NULL and the streams are usable. */
	kiln_status (*capture_end)(void *ctx, void *stream, void **graph);
	/* Enqueue one replay of `graph` on `stream`: ordered after the work
	 * enqueued on stream before it, and before the work enqueued after
	 * it, with every pointer and plan exactly as captured.  Allocates
	 * nothing. */
	kiln_status (*graph_launch)(void *ctx, void *graph, void *stream);
	/* Free a graph (NULL: nothing).  The core calls it after the work of
	 * its last launch has completed, before freeing the plans, buffers,
	 * streams and events the graph uses. */
	void (*graph_free)(void *ctx, void *graph);

	/* 1 when this device implements op `type` (enum kiln_op_type), 0 when
	 * it does not implement it yet.  The core asks before it checks an
	 * op, so an op family a device lacks is KILN_ENOTSUP naming the op
	 * whatever its operands; a device that implements every op leaves it
	 * NULL.  The core asks only about the types of the plugin's abi_minor:
	 * an op a later minor added is one the device lacks, never asked
	 * (before session 45 a 2.31 device was asked about GRAD_SUMSQ, 53).
	 * Thread-safe, no side effects.  (optional: every op)
	 *
	 * Op checks: the core checks every op before prepare (core/opcheck.c:
	 * operand counts, shapes and layouts that fit together, parameters in
	 * range, the dtypes the op's contract above fixes), so prepare may
	 * assume a well-formed op and refuses only what the device cannot run
	 * (a floating-point dtype or combination it has no kernel for, a size
	 * beyond its limits) with KILN_ENOTSUP. */
	int (*has_op)(void *ctx, int type);
};

/* ======================================================================
 * Communicator: collectives among the ranks of a data-parallel run, on a
 * device stream.  (ABI 1.3; docs/plugins.md, docs/distributed.md)
 *
 * The core opens one communicator per run on every rank, after its own
 * rendezvous through the store, and calls each collective from the thread
 * that drives training, in the same order on every rank.  Buffers are
 * device memory of the device given to open() (host memory for the CPU
 * device).  A collective is asynchronous: it is enqueued on `stream`
 * after the work already there, and `done` (an event of that device, may
 * be NULL) is recorded after it; the core orders later work with
 * stream_wait(done).  A failure that happens after the call returned (a
 * peer died, the timeout passed) fails the stream, so the core's next
 * sync or wait reports it.  Every collective is bounded by the open()'s
 * timeout_ms ([dist] timeout): a dead or stuck peer yields KILN_ETIMEOUT
 * or KILN_EIO with a message, never a hang.  Where a library cannot
 * cancel (MPI), the plugin's watchdog calls host->fatal.
 * ====================================================================== */

enum kiln_reduce_op { KILN_REDUCE_SUM = 0, KILN_REDUCE_AVG = 1 };

#define KILN_COMM_OPS_VERSION 9

/* split's color for a rank that joins no group (MPI_UNDEFINED) */
#define KILN_COMM_NO_GROUP (-1)

struct kiln_comm_ops {
	uint32_t version;
	/* Join the group of `world` ranks as `rank`, bootstrapping through the
	 * store (keys under the plugin's name).  Collective: every rank calls
	 * it. timeout_ms bounds the wait here and every later collective. */
	kiln_status (*open)(const struct kiln_host *host, const struct kiln_config *cfg,
			    struct kiln_store *store, struct kiln_device *dev, int rank,
			    int world, int timeout_ms, void **ctx);
	/* Leave the group (waits for queued collectives). */
	void (*close)(void *ctx);
	/* Each enqueues on `stream` and records `done` (may be NULL) after it.
	 * count is in elements of dtype: KILN_F32, KILN_BF16, KILN_F16 for
	 * the reductions (op KILN_REDUCE_SUM or _AVG), any dtype for
	 * broadcast and allgather.  In place: buf is input and output. */
	kiln_status (*allreduce)(void *ctx, void *buf, size_t count, int dtype, int op,
				 void *stream, void *done);
	kiln_status (*broadcast)(void *ctx, void *buf, size_t count, int dtype, int root,
				 void *stream, void *done);
	/* recv[world * count] = every rank's send[count], in rank order.
	 * May be in place: send == recv + rank * count (elements). */
	kiln_status (*allgather)(void *ctx, const void *send, void *recv, size_t count,
				 int dtype, void *stream, void *done);
	/* recv[count] = the reduction of every rank's send[world * count]
	 * slice `rank`.  In place only where reduce_scatter_in_place (version
	 * 9) says so. */
	kiln_status (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t count,
				      int dtype, int op, void *stream, void *done);
	/* Blocks the calling thread until every rank arrived (or the timeout). */
	kiln_status (*barrier)(void *ctx);

	/* ---- version 2 ---- */

	/* One line for the run log: library version and transport
	 * ("gloo 0.5.0, tcp on 127.0.0.1").  (optional) */
	const char *(*describe)(void *ctx);

	/* ---- version 3 (ABI 1.7) ---- */

	/* Host memory of `bytes` that every rank's collectives can reach
	 * directly (kiln-mpi: one MPI_Win_allocate_shared window; kiln-gloo: a
	 * POSIX shared-memory object; both when every rank shares the node),
	 * zeroed, 64-byte aligned, for a buffer the core
	 * allreduces slice by slice at the same offsets on every rank (the
	 * gradients): such an allreduce moves no data through staging
	 * buffers.  Collective: every rank calls it with the same bytes, from
	 * the training thread, before any collective is enqueued.  The memory
	 * belongs to the communicator and is unmapped by close (the caller
	 * must not free it or touch it after close).  KILN_ENOTSUP (with a
	 * message saying why) when the communicator has no such memory: ranks
	 * on several nodes, switched off by its keys, or already given once;
	 * the caller then keeps its own memory; the plugin makes every rank
	 * give the same answer.  Other errors (a store or MPI failure) end the
	 * run.  (optional: NULL means KILN_ENOTSUP) */
	kiln_status (*alloc_shared)(void *ctx, size_t bytes, void **ptr);

	/* ---- version 4 (ABI 2.4) ---- */

	/* Point to point (pipeline stages on different ranks): send `count`
	 * elements of dtype (any) from buf to rank `peer`, or receive them
	 * from it into buf.  Enqueued on `stream` as the collectives are,
	 * `done` (may be NULL) recorded after.  Messages between two ranks
	 * are matched in order: the k-th send from a to b is the k-th recv on
	 * b from a, with the same count and dtype.  Only the two ranks take
	 * part.  A peer that is gone, or silent past the communicator's
	 * timeout, fails the call (KILN_EIO, KILN_ETIMEOUT) with a message
	 * naming the peer's rank.  (optional: NULL means KILN_ENOTSUP) */
	kiln_status (*send)(void *ctx, const void *buf, size_t count, int dtype, int peer,
			    void *stream, void *done);
	kiln_status (*recv)(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			    void *done);

	/* ---- version 5 (ABI 2.7) ---- */

	/* Sub-communicators (a pipeline's stages combined with data
	 * parallelism): as MPI_Comm_split, the ranks of this communicator
	 * that give the same `color` (>= 0) form a new one, ranked by
	 * (key, rank here); *rank and *world are this rank's place in it.
	 * color KILN_COMM_NO_GROUP: this rank joins none (*out = NULL, *rank
	 * = -1, *world = 0).  Collective over this communicator: every rank
	 * calls it, from the training thread, in the same order among its
	 * other calls, with no collective of this communicator in flight.
	 * The new communicator has this one's device, timeout and plugin
	 * keys, works as one that open() returned (its ranks in every call
	 * are its own), and is freed by close(), before or after this one.
	 * (optional: NULL means KILN_ENOTSUP) */
	kiln_status (*split)(void *ctx, int color, int key, void **out, int *rank, int *world);

	/* ---- version 6 (ABI 2.12) ---- */

	/* A send run now on the calling thread, not enqueued (a host function
	 * may call it; buf is host memory, so only for a device with
	 * KILN_DEVICE_HOST_MEMORY): matched in order with send and recv as a
	 * send is.  wait = 1: returns once the message is handed over, as an
	 * enqueued send's host function does, *sent = 1.  wait = 0: never
	 * waits for the peer: *sent = 1 when the whole message went now (into
	 * a shared-memory channel with room for it), *sent = 0 and nothing
	 * sent when it would have waited or the transport cannot tell (the
	 * caller then sends it otherwise).  The caller orders it against its
	 * other sends to `peer`: none of them may be in flight.  A transport
	 * that cannot call its library from the caller's thread sends nothing
	 * with wait = 0 and refuses wait = 1 (KILN_ENOTSUP, the reason named:
	 * kiln-mpi below thread_level = multiple).  (optional: NULL means the
	 * core enqueues every send) */
	kiln_status (*send_now)(void *ctx, const void *buf, size_t count, int dtype, int peer,
				int wait, int *sent);

	/* ---- version 7 (ABI 2.13) ---- */

	/* A send of send_count elements of dtype from send_buf to rank dst and
	 * a recv of recv_count from rank src into recv_buf, enqueued on
	 * `stream` as one operation whose two halves progress together: it
	 * completes (and `done`, may be NULL, is recorded) when both have,
	 * and neither waits for the other to finish first, so two ranks that
	 * exchange messages of any size at once (1f1b's steady state, a ring
	 * shift) cannot deadlock.  (NCCL: ncclSend and ncclRecv in one
	 * ncclGroupStart/End, which NCCL requires of p2p calls that must
	 * progress together.)  In the per-pair order of send and recv the
	 * send counts as this rank's next send to dst and the recv as its
	 * next recv from src; dst may equal src.  Either count may be 0 (that
	 * half is skipped: no message, its rank not looked at), not both.  The buffers belong to the caller and must not
	 * overlap or be touched until the stream passes the call; the
	 * communicator keeps no pointer after.  Called from the thread that
	 * drives the communicator, as send and recv.  Errors as send and
	 * recv: a bad rank KILN_EINVAL (the core's kiln_comm_sendrecv, the
	 * only caller, refuses an empty call and a rank below 0 or this
	 * rank before calling; the plugin checks that ranks are below its
	 * world size); a peer gone or silent past the
	 * timeout fails the call or the stream (KILN_EIO, KILN_ETIMEOUT)
	 * naming it.  (optional: NULL means the core issues a send and a recv
	 * in rank order, which is deadlock-free only for dst == src: core/
	 * comm_p2p.c, kiln_comm_sendrecv) */
	kiln_status (*sendrecv)(void *ctx, const void *send_buf, size_t send_count, int dst,
				void *recv_buf, size_t recv_count, int src, int dtype, void *stream,
				void *done);

	/* ---- version 8 (ABI 2.18) ---- */

	/* Host memory that every rank of this communicator maps: `bytes` a
	 * rank, zeroed, 64-byte aligned; base[r] (the caller's array of world
	 * entries) is rank r's slice as this rank sees it, readable and
	 * writable here, so that what one rank writes another reads in place
	 * (a pipeline's crossing tensors: core/pipe_window.c).  The
	 * communicator synchronizes nothing in it: the caller orders its
	 * writes and reads by its own messages (a message sent after a write
	 * is received before the read).  Collective: every rank calls it with
	 * the same bytes, from the training thread, before any collective is
	 * enqueued.  The memory belongs to the communicator and is unmapped by
	 * close (the caller must not free it or touch it after).  At most one
	 * of alloc_shared and map_shared, once, on one communicator.
	 * KILN_ENOTSUP (with a message saying why) when it has no such
	 * memory (ranks on several nodes, switched off by its keys, no room,
	 * already given), every rank giving the same answer; the caller then
	 * moves the tensors by messages.  Other errors (a store failure) end
	 * the run.  (optional: NULL means KILN_ENOTSUP) */
	kiln_status (*map_shared)(void *ctx, size_t bytes, void **base);

	/* The bytes a send to rank `peer` may put in the transport's own
	 * buffer: a send of at most that many (with its messages before it
	 * to peer, that it waits to be received) never waits for peer to post
	 * its receive, only for the receives of the earlier ones, so a
	 * send_now with wait = 1 of so few bytes cannot wait on a receive
	 * the peer will post after a receive of its own from this rank
	 * (kiln-gloo's shared-memory channels: their ring less a frame;
	 * kiln-mpi: 64, a copy sent by MPI_Isend, 32 in flight to a peer).
	 * The caller's buffer is its own again when send_now returns.  0: a
	 * send may wait for its receive (a rendezvous: Gloo's TCP).  Any
	 * thread; no communication.  (optional: NULL means 0) */
	size_t (*p2p_buffered)(void *ctx, int peer);

	/* ---- version 9 (ABI 2.19) ---- */

	/* Nonzero: reduce_scatter may run in place, recv == send + rank *
	 * count (elements): this rank's slice of the reduction written over
	 * its own slice of the input, the rest of send left undefined
	 * (NCCL's in-place ncclReduceScatter; MPI_IN_PLACE).  ZeRO-1 then
	 * keeps no buffer of its own for the averaged gradient pieces
	 * (core/dist_zero.c).  0 (and a communicator built before): send and
	 * recv never overlap. */
	uint32_t reduce_scatter_in_place;
};

/* ======================================================================
 * Precision policy.  (implemented by the mixed-precision issue)
 * ====================================================================== */

#define KILN_PRECISION_OPS_VERSION 2

/* A policy's loss-scaling rule in full (precision ops version 2). */
struct kiln_scaler_config {
	int32_t dynamic;        /* 1: the scale follows KILN_OP_SCALER_UPDATE */
	int32_t enabled;        /* 0: no loss scaling at all (fp32, bf16) */
	double init_scale;      /* the scale of the first step (the static one) */
	double growth_factor;
	double backoff_factor;
	int64_t growth_interval;
	double min_scale;
	int64_t hysteresis;     /* overflowing steps tolerated before a backoff */
	double max_scale;       /* 0: none */
};

struct kiln_precision_ops {
	uint32_t version;
	/* Open the policy `policy`, the value of [run] precision ("fp32",
	 * "bf16", "fp16", ...; read by the core, borrowed for the call),
	 * with the plugin's own [plugin.NAME] keys of cfg.  A policy it does
	 * not know: KILN_ECONFIG naming it (host->config_where(cfg, "run",
	 * "precision") gives the line for messages). */
	kiln_status (*open)(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *policy, void **ctx);
	void (*close)(void *ctx);
	int (*compute_dtype)(void *ctx); /* dtype of activations and low-precision weights */
	/* Initial loss scale (1 for no scaling) and the dynamic-scaling rule:
	 * after `growth_interval` finite steps multiply by growth, on overflow
	 * multiply by backoff and skip the step. */
	kiln_status (*scaling)(void *ctx, float *init, float *growth, float *backoff,
			       int *growth_interval);

	/* ---- version 2 ---- */

	/* The whole rule, minimum scale and hysteresis included, read from
	 * the policy's config (errors name file:line).  (optional: default
	 * built from scaling(), min_scale 0, hysteresis 1, dynamic when
	 * growth or backoff differ from 1, enabled when any differs from 1) */
	kiln_status (*scaler)(void *ctx, struct kiln_scaler_config *out);
	/* One line for the run log: what runs in which dtype on `dev`
	 * ("bf16 compute, f32 master weights").  (optional) */
	const char *(*describe)(void *ctx);
};

/* ======================================================================
 * Data source.  Map-style sources implement len/read; every member that
 * touches data is thread-safe for distinct indices (workers call read()
 * concurrently).
 * ====================================================================== */

struct kiln_source_info {
	int64_t len;                    /* samples; -1 for a streamed source */
	struct kiln_tensor_desc sample; /* one sample of read(), e.g. f32[1,28,28],
					 * or i32[T] token ids */
	struct kiln_tensor_desc label;  /* one label: i32[] (a class), or i32[T]
					 * (a token window's targets; sources
					 * without read_image only) */
	int64_t classes;                /* number of classes, 0 if not a classifier */
	/* ---- version 2 (the core zeroes the struct before calling info) ---- */
	/* The images read_image() yields: height, width (0 when they vary
	 * from sample to sample) and channels (1 or 3; 0 when they vary). */
	int32_t image_h, image_w, image_c;
	int32_t flags;                  /* enum kiln_source_flags */
	/* ---- ABI 2.21 (zeroed by the core as well) ---- */
	/* Where the largest label was found when `classes` is that label + 1
	 * (not a configured count), for the core's messages about a model too
	 * small for the data: e.g. "DIR/train-000003.bin: token offset 1234
	 * (byte 3492)".  Borrowed from ctx until close; NULL: not known. */
	const char *classes_from;
};

enum kiln_source_flags {
	/* every worker and process shares its files' pages through the page
	 * cache ([data] cache = mmap asks for it): records maps its shards
	 * (a truncation under the run kills the process with SIGBUS, past any
	 * error path); tokens keeps them open and pread()s them */
	KILN_SOURCE_MAPPED = 1
};

/* A decoded image: 8-bit pixels, row-major HWC (h rows of w pixels of c
 * channels), c = 1 (gray) or 3 (RGB).  `data` is malloc()ed memory of
 * `cap` bytes owned by the caller; a source whose image needs more grows
 * it with realloc() and updates data and cap (and leaves both valid on
 * failure). */
struct kiln_image {
	uint8_t *data;
	size_t cap;
	int32_t h, w, c;
	int32_t reserved;
};

#define KILN_SOURCE_OPS_VERSION 5

struct kiln_source_ops {
	uint32_t version;
	/* Open the source described by config section `section` ("data" or
	 * "data.eval") with `split` = "train" or "test" (the section's own keys
	 * may override it).  Errors name the file and what is wrong: KILN_EIO,
	 * KILN_EDATA; KILN_ENOTFOUND for a file the config names that is not
	 * there (ENOENT, ENOTDIR at its open), naming the key and where it
	 * was set, which the core reports as KILN_ECONFIG, exit 2
	 * (docs/plugins.md, "Errors"; since session 37). */
	kiln_status (*open)(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **ctx);
	void (*close)(void *ctx);
	kiln_status (*info)(void *ctx, struct kiln_source_info *info);
	/* Copy sample `index` (0 <= index < len) into `sample` (info.sample
	 * bytes) and its label into `label`.  Thread-safe. */
	kiln_status (*read)(void *ctx, int64_t index, void *sample, void *label);

	/* ---- version 2 ---- */

	/* Decode sample `index` (0 <= index < len) into *img and its label
	 * (i32) into `label`.  Sources of images implement this; the core
	 * then applies the [data] transforms (crop, flip, resize, normalize,
	 * layout, dtype) in its loader workers, with every random draw a
	 * function of (seed, epoch, index).  A source that has read_image
	 * may leave read NULL.  Errors name the file (and the record or
	 * member) and the reason: KILN_EIO for an unreadable file, KILN_EDATA
	 * for a corrupt one (bad checksum, truncated, undecodable image), so
	 * [data] on_error = skip can tell them apart.  Thread-safe. */
	kiln_status (*read_image)(void *ctx, int64_t index, struct kiln_image *img, void *label);

	/* ---- version 3 (ABI 2.11) ---- */

	/* A hint that sample `index` will be read soon: the core's loader
	 * calls it a few samples ahead of read/read_image within a batch.  A
	 * source may start bringing the sample's bytes into the cache (e.g.
	 * prefetch instructions over a mapped or inflated file); it reads
	 * nothing the caller sees and cannot fail (an index out of range is
	 * ignored).  NULL: no hint.  Thread-safe. */
	void (*prefetch)(void *ctx, int64_t index);

	/* ---- version 4 (ABI 2.21) ---- */

	/* Call each(arg, path) for every file the opened source reads (its
	 * resolved shards, image and label files; the strings borrowed for
	 * the call), so the core can refuse an output file that is one of
	 * them before anything is written (kiln_output_watch).  NULL: the
	 * source names none (generated data).  Called from the opening
	 * thread after info, and only when that output exists already
	 * (else no file can be it: nothing listed, nothing stat'ed); in a
	 * run of several ranks also twice after the sets open, the files'
	 * paths (as given, in the same order on every rank), sizes and ends
	 * being the set's identity the ranks compare
	 * (kiln_dist_agree_data). */
	void (*files)(void *ctx, void (*each)(void *arg, const char *path), void *arg);

	/* ---- version 5 (ABI 2.24) ---- */

	/* (optional) What info() would write into `info` after open() with
	 * the same arguments, for a source of images (read_image), told
	 * without opening the set: from the config alone, or a header (the
	 * first bytes of an image file, each shard's header), never the
	 * samples nor a listing of them.  The core zeroes `info` first; fill
	 * label, image_h, image_w, image_c and flags exactly as info() would
	 * (sample too where info() sets it); len, classes and classes_from may
	 * stay 0 (the core reads none of them from a peek).  It serves what
	 * needs only the images' shape: [data.eval]'s transforms for `kiln
	 * predict` of image files and kiln_infer_image, which before ABI 2.24
	 * opened the whole evaluation set (a folder's every file listed, an
	 * IDX file inflated) for three numbers.  Errors as open()'s for what
	 * it reads (KILN_ENOTFOUND for a file the config names that is not
	 * there, KILN_EIO, KILN_EDATA, KILN_ECONFIG for a key open() refuses);
	 * KILN_ENOTSUP when it cannot tell without opening, and the core then
	 * opens the set.  NULL: the core opens the set.  Any thread, no
	 * context: it keeps nothing. */
	kiln_status (*peek)(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, struct kiln_source_info *info);
};

/* ======================================================================
 * Optimizer (ops version 2).  `[train] optimizer = NAME` selects one by
 * name, built-in or plugin alike: the built-ins (core/optim/sgd.c, adamw.c
 * with adam, lamb.c) are this same table.  An optimizer steps over the flat trainable
 * buffers (or, under ZeRO-1, over a slice of them) and composes device ops
 * through host->device_prepare/run, so it runs on any device.  Its
 * hyper-parameters are the `keys` of its descriptor: [train] keys, checked
 * and defaulted by the core when it is the one selected.
 *
 * Threads: the core calls every member from its training thread.  Errors:
 * a kiln_status with a message through host->error, naming the [train] key
 * (host->config_where) for a bad value.  Ownership: the core owns every
 * buffer in kiln_optim_args; the optimizer owns its ctx and plans.
 * ====================================================================== */

#define KILN_OPTIM_OPS_VERSION 2
#define KILN_OPTIM_MAX_SLOTS 4

/* How ZeRO-1 ([dist] zero = 1) may shard the optimizer. */
enum kiln_optim_shard {
	/* every element's update reads only that element (and device
	 * scalars): each rank steps its own slice of the flat buffers, with
	 * its slice of the state */
	KILN_OPTIM_SHARD_SLICE = 0,
	/* the update reads whole tensors (LAMB's per-tensor trust ratio):
	 * ZeRO-1 refuses it */
	KILN_OPTIM_SHARD_NONE = 1
};

/* What open() says about the optimizer; the core sizes the state from it. */
struct kiln_optim_info {
	int32_t state_slots;   /* f32 state slots per trainable element, 0..KILN_OPTIM_MAX_SLOTS;
				* the core allocates them zeroed, checkpoints them
				* and (ZeRO-1) shards them */
	const char *slot_names[KILN_OPTIM_MAX_SLOTS]; /* their checkpoint names,
						       * "optim.exp_avg" (static strings) */
	int32_t needs_step;    /* 1: the step reads args.step */
	int32_t needs_offsets; /* 1: the step reads args.offsets (whole tensors) */
	int32_t shard;         /* enum kiln_optim_shard */
	int32_t decay_modes;   /* 1: the optimizer reads [train] weight_decay_mode
				* itself; 0: it always decouples the weight decay
				* (the core refuses weight_decay_mode = l2) */
};

/* The step a plan is for: plan() is called once for the whole trainable
 * range and, under ZeRO-1, once per distinct shard length. */
struct kiln_optim_shape {
	int64_t n;          /* f32 elements of params, grads, each state slot */
	int64_t n_tensors;  /* T, when needs_offsets: args.offsets has T+1 */
	int32_t decay_mult; /* 1: args.decay_mult is given ([train] no_decay) */
	int32_t gated;      /* 1: args.gate is given: a step with *gate == 0
			     * must change nothing (params, state, copy) */
	int32_t copy_dtype; /* 0, or KILN_BF16/KILN_F16: the step also writes
			     * args.copy, the compute copy of the new params */
};

/* One step's buffers, all device memory of the shape's sizes. */
struct kiln_optim_args {
	const float *grads;      /* [n], averaged over ranks and micro-steps */
	const float *lr;         /* f32[1]: this step's learning rate */
	const int64_t *step;     /* i64[1]: the 1-based number of this step (needs_step) */
	const int64_t *offsets;  /* i64[T+1]: tensor starts, then n (needs_offsets) */
	const float *decay_mult; /* [n]: 1 decays, 0 does not, or NULL */
	const float *gate;       /* f32[1]: 0 skips the step, or NULL */
	float *params;           /* [n], updated in place */
	float *state[KILN_OPTIM_MAX_SLOTS]; /* [n] each, zero before the first step */
	void *copy;              /* [n] of copy_dtype, or NULL */
	void *workspace;         /* what plan() asked for, or NULL */
	size_t workspace_bytes;
};

struct kiln_optim_ops {
	uint32_t version;
	/* Read the hyper-parameters (host->config_get_* on "train": defaults
	 * come from the descriptor's keys), fill *info and create *ctx. */
	kiln_status (*open)(const struct kiln_host *host, const struct kiln_config *cfg,
			    struct kiln_optim_info *info, void **ctx);
	void (*close)(void *ctx);
	/* Prepare the device ops of one step of shape *s; *workspace: the
	 * bytes of scratch device memory each step needs (0: none). */
	kiln_status (*plan)(void *ctx, struct kiln_device *dev, const struct kiln_optim_shape *s,
			    void **plan, size_t *workspace);
	/* Enqueue one step on `stream`: no host sync, nothing per step from
	 * the host (every per-step scalar is device memory), so a captured
	 * graph replays it. */
	kiln_status (*step)(void *ctx, struct kiln_device *dev, void *plan,
			    const struct kiln_optim_args *a, void *stream);
	void (*plan_free)(void *ctx, struct kiln_device *dev, void *plan);
};

/* ======================================================================
 * Layer type.  A built-in layer is one file in core/layers/ plus one row in
 * the layer table, and that row is this struct: a layer plugin provides
 * exactly what the built-ins do.
 * ====================================================================== */

#define KILN_LAYER_MAX_PARAMS 4
#define KILN_LAYER_MAX_INPUTS 8

enum kiln_init {
	KILN_INIT_ZERO = 0,
	KILN_INIT_ONE = 1,
	KILN_INIT_KAIMING_UNIFORM = 2, /* U(-b, b), b = 1/sqrt(fan_in): PyTorch Linear/Conv default */
	KILN_INIT_BIAS_UNIFORM = 3,    /* U(-b, b), b = 1/sqrt(fan_in) of the weight */
	KILN_INIT_NORMAL = 4           /* N(0, 0.02^2): GPT-2's embeddings (ABI 2.1) */
};

/* A parameter the layer asks for in infer(). */
struct kiln_param_spec {
	const char *suffix;            /* "weight" -> "fc1.weight" */
	struct kiln_tensor_desc desc;  /* f32 */
	int32_t init;                  /* enum kiln_init */
	int64_t fan_in;
	int32_t is_buffer;             /* 1: non-trained state in `buffers`;
					* | KILN_PARAM_NONNEG (below) */
};

/* Or-ed into a buffer's is_buffer (ABI 2.22; an older core reads it as 1):
 * every value must be >= 0, as a running variance must (batchnorm takes
 * its square root).  A weights file or checkpoint holding a negative one
 * is refused naming the tensor and element, like a NaN: its outputs
 * would be NaN. */
#define KILN_PARAM_NONNEG 2

/* The core's view of one layer, owned by the core, given to every member. */
struct kiln_layer {
	const char *name;   /* section suffix: [layer.fc1] -> "fc1" */
	const char *type;
	int n_in;
	struct kiln_tensor_desc in[KILN_LAYER_MAX_INPUTS]; /* set before infer */
	struct kiln_tensor_desc out;                       /* set by infer */
	int n_params;
	struct kiln_param_spec params[KILN_LAYER_MAX_PARAMS]; /* set by infer */
	int trainable;       /* [layer.X] trainable (default 1) */
	int is_loss;         /* set by configure for loss layers */
	int needs_input;     /* set by infer: backward reads forward inputs */
	int needs_output;    /* set by infer: backward reads forward output */
	int inplace_ok;      /* set by infer: bit k set = the output may alias
			      * input k (1: input 0).  The planner decides
			      * whether it does, from the lifetimes: only when
			      * nothing reads that input later, forward or
			      * backward, and the sizes match. */
	int is_view;         /* set by infer: output is input 0 reinterpreted (same
			      * bytes, new shape); forward/backward do nothing and
			      * the gradient of the output is the input's */
	size_t saved_bytes;  /* set by plan: bytes the forward of a training plan
			      * leaves for the backward (r->saved) */
	int index;           /* position in the model (RNG key), set by the core */
	int before_norm;     /* set by the core: the output feeds only a batchnorm
			      * (a convolution then needs no bias of its own) */
	uint64_t seed;       /* [run] seed, set by the core */
	void *priv;          /* the layer type's private state */
	/* ---- ABI 1.2 ---- */
	int loss_scaled;     /* set by the core before plan: a loss layer's
			      * backward multiplies its gradient by the device
			      * scalar kiln_layer_run.loss_scale as well
			      * (KILN_OP_SOFTMAX_XENT's in2), whatever the
			      * dtype: f32 too (since ABI 2.23 it carries the
			      * step's mean over micro-batches; a loss layer
			      * built before is refused in such a plan) */
	/* ---- ABI 1.4 ---- */
	int sync_ranks;      /* set by the core before plan: > 1 when batch
			      * statistics are to be taken over the batches
			      * of that many ranks together ([dist] sync_bn),
			      * through host->group_* with kiln_layer_run.group
			      * in training; 0 or 1: this batch alone */
	/* ---- ABI 2.1 ---- */
	int compute_dtype;   /* set by the core before infer: the model's compute
			      * dtype (KILN_F32, KILN_BF16, KILN_F16), the dtype
			      * the matrix products run in: a built-in linear
			      * layer on an f32 input converts it and writes
			      * this dtype (torch.autocast's linear).  Other
			      * layers follow their inputs (an embedding writes
			      * f32, an add of f32 and this dtype f32: the
			      * residual stream stays f32 as under autocast;
			      * before session 40 the embedding wrote this
			      * dtype) */
	/* ---- ABI 2.2 ---- */
	int64_t decode_len;  /* set by the core before configure: > 0 in a
			      * decode plan (kiln_plan_opts.decode, text
			      * generation, docs/generate.md): in[] hold T new
			      * positions per row ([B, T, ...]; T = 1 a step,
			      * more a prompt's prefill, only where the layer
			      * sets decode_runs, ABI 2.31), those
			      * kiln_layer_run.pos says, and a layer whose
			      * output depends on other positions keeps what
			      * it needs of up to decode_len positions in its
			      * r->saved memory (saved_bytes), which a decode
			      * plan keeps for the plan's lifetime; 0: the
			      * whole sequence is in the input */
	/* ---- ABI 2.3 ---- */
	int fuse_act;        /* set by the core before configure: 1 + enum
			      * kiln_act of the activation layer that alone
			      * reads this layer's output ([run] fuse), 0 when
			      * none.  A layer that applies it to its own
			      * output (KILN_OPF_ACT, or its own op) sets
			      * act_fused in infer; the activation layer then
			      * becomes a view, and this layer's backward gets
			      * the gradient of the activation's output. */
	int act_fused;       /* set by infer: this layer applies fuse_act.  Set
			      * by the core before configure on an activation
			      * layer whose producer applied it: that layer is
			      * a view (is_view) with nothing to run. */
	/* ---- ABI 2.4 ---- */
	int dx_over_input;   /* set by infer: the backward may write input 0's
			      * gradient over input 0 (dx[0] == x[0]: the loss
			      * layers' logits).  The planner decides whether
			      * it does, from the lifetimes: only when this
			      * backward is the input's last reader and the
			      * first writer of its gradient, the sizes match
			      * and the device is built for ABI 2.4 or later. */
	/* ---- ABI 2.9 ---- */
	int dx_is_dy;        /* set by infer: bit k set = input k's gradient
			      * is the output's gradient unchanged (add,
			      * pos_embedding).  The planner may then give
			      * input k's gradient the output gradient's
			      * storage (dx[k] == dy with
			      * dx_accum[k] = 0): the backward skips that
			      * copy.  It does only when this backward writes
			      * the input's gradient first and no later write
			      * into either gradient precedes a read of the
			      * other (plan_memory.c plan_grad_alias). */
	/* ---- ABI 2.15 ---- */
	int frozen;          /* set by the core before plan: 1 in an inference
			      * plan (kiln_plan_opts.frozen) on a device that
			      * takes KILN_OPF_FROZEN: the weights' values do not
			      * change between the plan's runs except where the
			      * core tells the device (KILN_PROC_WEIGHTS_CHANGED).
			      * A layer may then set KILN_OPF_FROZEN on the ops
			      * that read its weights (kiln/ops.h). */
	/* ---- ABI 2.26 ---- */
	int decode_caches;   /* set by plan in a decode plan (decode_len > 0):
			      * > 0 when the saved memory (saved_bytes) begins
			      * with that many caches of one layout, cache c
			      * at byte c * S, S = B * decode_row_bytes rounded
			      * up to a multiple of 64 (B = in[0].dims[0], the
			      * rows), and row b of a cache at byte b *
			      * decode_row_bytes of it, everything the layer
			      * keeps of row b (every position) in those
			      * bytes.  The core may then give rows the state
			      * of another row, of this plan or of the same
			      * layer's one-row decode plan, by copying those
			      * bytes (kiln_generate_samples feeds its prompt
			      * once, in one row, docs/generate.md); 0 (the
			      * default; a layer built before ABI 2.26): it
			      * does not, and feeds every row instead */
	size_t decode_row_bytes; /* ... the bytes of one row of one cache */
	size_t decode_pos_bytes; /* ... > 0: the bytes of one position of a
				  * run of decode_len positions, a row being
				  * decode_row_bytes / (decode_len *
				  * decode_pos_bytes) such runs one after the
				  * other (attention: one a head, D * 4 bytes
				  * a position): the core copies only a run's
				  * first positions, those fed; 0: the row is
				  * copied whole */
	/* ---- ABI 2.27 ---- */
	int eval_sums;       /* set by the core before plan, read by loss
			      * layers: 1 in the trainer's evaluation plans
			      * (`kiln train`'s evaluations and final test,
			      * `kiln eval`, `kiln quantize`'s calibration),
			      * where a loss layer may count rows (below); 0
			      * (a training plan, the API's plans): f32[3],
			      * the loss layer's own per-sample sums, which
			      * the caller divides by samples. */
	int eval_counted;    /* set by a loss layer's plan, where eval_sums
			      * is set, to say that r->metrics is f32[4] and
			      * its forward adds { sum of the rows' losses,
			      * correct count, top-5 count, rows counted }
			      * over the rows it counts (a token row, a
			      * sample; ignore_index's rows left out):
			      * KILN_OP_SOFTMAX_XENT with i[4] = 0 and a
			      * fourth metric.  The trainer then divides the
			      * set's sums by the set's count: one mean over
			      * every row, whatever [train] eval_batch.  Left
			      * 0 (the core clears it before plan; a layer
			      * built before 2.27, or rebuilt unchanged): the
			      * layer writes its f32[3] per-sample sums and
			      * the trainer divides them by samples. */
	/* ---- ABI 2.31 ---- */
	int decode_runs;     /* set by plan in a decode plan (decode_len > 0)
			      * to say the layer takes runs of T > 1
			      * positions a row (in[] [B, T, ...] at positions
			      * kiln_layer_run.pos[0..T), a prompt's prefill):
			      * its outputs are those of T runs of one
			      * position, in order.  A run may be padded past
			      * the prompt (id 0) and may repeat positions an
			      * earlier run fed (the last run of a long
			      * prompt overlaps the one before): a layer's
			      * state for a position must be rewritten, not
			      * added to, by a run that feeds it again.  Left
			      * 0 (the core clears it before plan; a layer
			      * built before 2.31, or rebuilt unchanged): the
			      * core plans no run of T > 1 with the layer
			      * where it keeps decoding state (saved_bytes)
			      * or is not built in, and feeds a prompt a
			      * position a step. */
};

/* Everything one forward or backward call may touch.  Pointers are device
 * memory.  dx_accum[i]/dw_accum: 0 = write, 1 = add into (the first writer
 * of a buffer in a step writes, later ones accumulate).  dw_accum covers
 * every dw[k]; the core sets it (gradient accumulation, a pipeline's
 * micro-batches) only for layers built for ABI 2.9 or later, 0 before. */
struct kiln_layer_run {
	struct kiln_device *dev;
	void *stream;
	int training;
	int64_t batch;           /* rows actually valid (<= in[0].dims[0]) */
	const void *x[KILN_LAYER_MAX_INPUTS];
	void *y;
	const void *dy;
	void *dx[KILN_LAYER_MAX_INPUTS]; /* NULL: no gradient needed for input i */
	int dx_accum[KILN_LAYER_MAX_INPUTS];
	void *w[KILN_LAYER_MAX_PARAMS];
	void *dw[KILN_LAYER_MAX_PARAMS]; /* NULL when frozen */
	int dw_accum;
	void *workspace;
	size_t workspace_bytes;
	/* Loss layers: labels (i32[batch]), metric sums (f32[3]: loss sum,
	 * correct count, top-5 count; f32[4], [3] the rows counted, where
	 * l->eval_sums is set (the layer adds [3] only where it sets
	 * l->eval_counted); always accumulated) and the gradient scale. */
	const void *labels;
	void *metrics;
	float grad_scale;
	/* saved_bytes of memory kept from this layer's forward to its backward
	 * (training plans only; NULL when saved_bytes is 0). */
	void *saved;
	/* Device i64[KILN_DROP_CTR] = { step, row0, rstride } (ABI 2.20; was
	 * i64[1], the micro-steps done): dropout's RNG counter, which a layer
	 * passes to DROPOUT and ATTENTION as it is.  step counts optimizer
	 * steps (the same on every rank and micro-step); row n of this run's
	 * batch is row row0 + n * rstride of the step's global batch (kiln/
	 * ops.h KILN_OP_DROPOUT).  Training plans only; the trainer keeps it. */
	const void *step;
	/* ---- ABI 1.2 ---- */
	/* 1 when this forward replays one already run in the same micro-step
	 * (gradient checkpointing, [train] recompute): it must produce the
	 * same bytes (same inputs, same RNG counters) and must not repeat its
	 * side effects (batchnorm leaves the running statistics alone). */
	int recompute;
	/* Loss layers with l->loss_scaled: device f32[1], the loss scale the
	 * gradient is multiplied by (NULL otherwise): fp16's scale, and in a
	 * training plan whose step averages n micro-batches ([train]
	 * accumulate, a pipeline's micro-batches) that scale (1 without
	 * one) / n, PyTorch's scaler.scale(loss / n); the layer need not
	 * know which, and must not skip it in f32 (ABI 2.23: before, a
	 * plugin was told only fp16 set it, and the core refuses a loss
	 * layer built before 2.23 where n > 1). */
	const float *loss_scale;
	/* ---- ABI 1.3 ---- */
	/* Low-precision compute (the layer's input in[0] or its output is in
	 * the compute dtype, bf16 or f16; the output alone: a linear layer
	 * converting an f32 input, since session 40): wc[k] is parameter k in
	 * that dtype (the optimizer's compute copy, rounded to nearest even),
	 * for the matrix products; NULL with f32 compute and for buffers.
	 * w[k] stays the f32 master, which batchnorm's scale and shift, the
	 * biases and the layer norm's affine read. */
	const void *wc[KILN_LAYER_MAX_PARAMS];
	/* ---- ABI 1.4 ---- */
	/* The data-parallel group for host->group_allreduce/allgather
	 * (training plans of layers with sync_ranks > 1; NULL otherwise). */
	void *group;
	/* ---- ABI 2.2 ---- */
	/* Decode plans (l->decode_len > 0): device i32[T], the positions of
	 * the run's T tokens in their sequence (in[0].dims[1]; 1 a step, more
	 * a prompt's prefill, ABI 2.31), pos[t] = pos[0] + t, 0 <= pos[t] <
	 * decode_len (the same for every row); the positions before pos[0]
	 * were fed by earlier runs.  NULL otherwise. */
	const void *pos;
};

#define KILN_LAYER_OPS_VERSION 1

struct kiln_layer_ops {
	uint32_t version;
	int min_inputs, max_inputs;
	/* Read the type's keys from section "layer.NAME". (optional) */
	kiln_status (*configure)(const struct kiln_host *host, struct kiln_layer *l,
				 const struct kiln_config *cfg, const char *section);
	/* From l->in[] compute l->out and l->params[]; KILN_ECONFIG on a bad
	 * shape, naming the layer. */
	kiln_status (*infer)(const struct kiln_host *host, struct kiln_layer *l);
	/* Prepare device ops for the inferred shapes (both training and
	 * evaluation batch sizes go through infer+plan on separate layer
	 * objects) and report the workspace size. */
	kiln_status (*plan)(const struct kiln_host *host, struct kiln_layer *l,
			    struct kiln_device *dev, size_t *workspace);
	kiln_status (*forward)(const struct kiln_host *host, struct kiln_layer *l,
			       const struct kiln_layer_run *r);
	/* (optional for layers with no inputs needing gradients) */
	kiln_status (*backward)(const struct kiln_host *host, struct kiln_layer *l,
				const struct kiln_layer_run *r);
	/* Free l->priv and every plan made in plan() (dev is NULL when plan()
	 * never ran).  (optional: default frees nothing) */
	void (*destroy)(const struct kiln_host *host, struct kiln_layer *l,
			struct kiln_device *dev);
};

#ifdef __cplusplus
}
#endif
#endif /* KILN_PLUGIN_H */
