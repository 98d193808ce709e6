/* kiln/kiln.h - the public API of libkiln.
 *
 * Include this from programs that drive kiln (the `kiln` command, tests,
 * embedding applications).  Plugin authors include <kiln/plugin.h>.
 *
 * Locale: kiln parses and writes numbers in the C locale ('.' the decimal
 * point) whatever the application's: a program that called
 * setlocale(LC_ALL, "") in de_DE (Qt and GTK applications do) loads the
 * same configs ("lr = 0.1"), gets the same files (metrics.jsonl, the CSV
 * tables, config.ini, quantized models) and messages ("loss 0.5432").
 * kiln switches the calling thread to the C locale (uselocale) only
 * inside the calls that parse or format, and back: the application's own
 * printf keeps its locale, and its other threads are never touched.
 *
 * NULL arguments: a pointer argument of a function that returns a
 * kiln_status must not be NULL unless its comment says "may be NULL" (or
 * names what NULL means); a NULL one is KILN_EINVAL, "FUNCTION: ARG is
 * NULL", never a crash (session 35).  Counts of a NULL handle are 0 and
 * getters of one NULL (a void *_get into a struct zeroes it, also for an
 * index out of range; kiln_registry_plugin_get, whose struct has a size,
 * returns KILN_EINVAL and writes nothing); *_close and *_free of NULL do
 * nothing.  The device,
 * plan and model-step calls of the training loop (kiln_device_*,
 * kiln_plan_*, kiln_model_plan*, kiln_model_optim_*) are not checked:
 * they take the handles their open/create call gave.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h> /* offsetof, for KILN_ENDS_UNPADDED */
#include <stdint.h>
#include <stdio.h>
#include "status.h"
#include "tensor.h"
#include "config.h"
#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0" */
const char *kiln_version(void);

/* ---- structs the library fills ------------------------------------------
 *
 * A public struct is either filled by the caller and read by the library
 * (the *_opts structs, struct kiln_plan_opts), or filled by the library
 * in the caller's memory.  Of the latter, those that grow from one kiln to
 * the next begin with `size_t size`, which the caller sets to its
 * sizeof before the call (each has an initialiser: KILN_TRAIN_RESULT_INIT,
 * KILN_TRAIN_CFG_INIT, KILN_MEMORY_INIT, KILN_PLUGIN_INFO_INIT; or
 * `x.size = sizeof x`): the library writes the first min(size, its own
 * sizeof) bytes and no byte past them, and sets `size` to the bytes it
 * wrote.  A program built against an older header (a smaller struct)
 * gets the members it knows; one built against a newer header than the
 * library's finds `size` lowered, and a member that ends past it was not
 * written.  A size too small to hold `size` itself (0: not set) is
 * refused with KILN_EINVAL naming the struct, and nothing is written.
 * These are struct kiln_train_result, kiln_train_cfg, kiln_memory and
 * kiln_plugin_info; new members go at their end.  None ends in padding
 * (KILN_ENDS_UNPADDED after each: sizeof == the end of its last member),
 * so every member added grows its sizeof and `size` tells the layouts
 * apart: an `int` added into 4 bytes of tail padding would have kept
 * sizeof, and a newer program would have read the padding of an older
 * library's copy as a member written.  Where a member's alignment would
 * leave padding, make it explicit (kiln_train_cfg's `reserved0`).
 *
 * Every other public struct, by who fills it:
 *  - filled by the library, no size, one layout for the shared library's
 *    version (libkiln.so.N: a member added changes N; docs/training.md,
 *    "From C"): kiln_plugin_file, kiln_device_counters, kiln_param_info,
 *    kiln_safetensors_tensor, kiln_summary and kiln_summary_layer,
 *    kiln_data_bench, kiln_dist_env (kiln/dist.h), and kiln_xform_scratch
 *    (kiln/image.h: the caller's, zeroed; the library grows its buffers).
 *    kiln_device_counters can grow no other way: it sits inside
 *    kiln_train_result (`steady`), before members an older program knows;
 *  - filled by the caller, read by the library, no size, the same rule:
 *    kiln_plan_opts, kiln_eval_opts, kiln_quantize_opts, kiln_sample_opts,
 *    kiln_infer_opts (kiln/infer.h);
 *  - the plugin ABI's (kiln/plugin.h, kiln/ops.h; versioned by
 *    KILN_ABI_MAJOR.MINOR, docs/plugins.md), which a minor may grow without
 *    a new libkiln.so.N: struct kiln_source_info, which a source plugin
 *    fills and kiln_source_info() copies out, so that getter takes the
 *    caller's size and returns the bytes it wrote, as the sized structs do
 *    (and the struct ends unpadded, below); kiln_image (the caller's, for
 *    kiln_source_read_image and kiln_infer_image), kiln_tensor_desc and
 *    kiln_key, which sit inside other structs or arrays and so change only
 *    with the ABI major (and N); the descriptors, traits, host table and
 *    ops (kiln_plugin, kiln_device_traits, kiln_host, kiln_op,
 *    kiln_op_args), which the library hands out by pointer and never
 *    copies into a caller's memory.
 * Before session 35 only kiln_train_result had a size, and the library
 * filled the others whole, writing past an older program's. */

/* Fails the build where struct T ends in padding (see above). */
#ifdef __cplusplus
#define KILN_ENDS_UNPADDED(T, last)                                                     \
	static_assert(sizeof(struct T) == offsetof(struct T, last) + sizeof(((struct T *)0)->last), \
		      "struct " #T " ends in padding: a member added there would keep its sizeof")
#else
#define KILN_ENDS_UNPADDED(T, last)                                                     \
	_Static_assert(sizeof(struct T) == offsetof(struct T, last) + sizeof(((struct T *)0)->last), \
		       "struct " #T " ends in padding: a member added there would keep its sizeof")
#endif
KILN_ENDS_UNPADDED(kiln_source_info, classes_from);

/* ---- plugin registry --------------------------------------------------
 *
 * A registry finds plugin files named kiln-*.so, in this order (the first
 * file of a given name wins): the directories of `plugin_path` (colon-
 * separated, normally [run] plugin_path), of $KILN_PLUGIN_PATH, the build
 * tree's plugin directory when libkiln itself runs from the build tree, and
 * the installed $(pkglibdir).  Files are loaded lazily: kiln_registry_find
 * dlopen()s (RTLD_NOW|RTLD_LOCAL) and initialises kiln-<name>.so for a
 * plugin called name; only a name no file is named after, and listing
 * (kiln_registry_file_count, kiln_registry_plugin_count), load the other
 * files, each first loaded in a child process so that one whose loading
 * crashes is reported (its error) and never loaded into this one.  A file
 * that fails is kept in the list with the first reason it gave.  Built-in
 * layer types are registered as plugins of kind layer with file
 * "(built-in)".  Plugins are never unloaded before kiln_registry_close().
 * Threads: the registry is used from one thread at a time (lookups may
 * load files).
 */
struct kiln_registry;

/* Filled by kiln_registry_plugin_get; its `size` set by the caller
 * ("Structs the library fills" above). */
struct kiln_plugin_info {
	size_t size;         /* set by the caller: sizeof(struct kiln_plugin_info) */
	const char *file;    /* path of the .so, or "(built-in)" */
	int kind;            /* enum kiln_plugin_kind */
	const char *name;
	const char *summary;
	unsigned abi_major, abi_minor;
	int available;       /* 1 if usable here */
	const char *why;     /* reason when not available ("" otherwise) */
	const struct kiln_key *keys; /* its [plugin.NAME] / layer / source keys, available or not */
	const struct kiln_plugin *desc; /* its descriptor (ops: a device's traits), available or not */
	/* (new members go here, at the end: see `size`) */
};
KILN_ENDS_UNPADDED(kiln_plugin_info, desc);

/* An info ready for kiln_registry_plugin_get: its size set, the rest 0. */
#define KILN_PLUGIN_INFO_INIT { .size = sizeof(struct kiln_plugin_info) }

struct kiln_plugin_file {
	const char *path;
	const char *error;   /* NULL when the file loaded, else dlerror()/ABI text */
	int n_plugins;
};

/* `plugin_path` may be NULL.  On success *out is a new registry.  Failing
 * files are not an error of this call.  Before any plugin loads, and only
 * while libgomp is not yet in the process, sets OMP_WAIT_POLICY=PASSIVE and
 * GOMP_SPINCOUNT (kiln's spin rule, plugins/common/spin_rule.h) in the
 * environment where unset: not thread-safe against other threads' getenv. */
kiln_status kiln_registry_open(const char *plugin_path, struct kiln_registry **out);
void kiln_registry_close(struct kiln_registry *reg);

/* The directories searched, in order (for messages and `kiln plugins`). */
int kiln_registry_dir_count(const struct kiln_registry *reg);
const char *kiln_registry_dir(const struct kiln_registry *reg, int i);

/* Index i in [0, count); out of range (or reg NULL) zeroes *out. */
int kiln_registry_file_count(const struct kiln_registry *reg);
void kiln_registry_file_get(const struct kiln_registry *reg, int i,
			    struct kiln_plugin_file *out);
int kiln_registry_plugin_count(const struct kiln_registry *reg);
/* The plugins registered so far, loading nothing more (the built-ins and
 * those lookups loaded); indices as kiln_registry_plugin_get's. */
int kiln_registry_loaded_count(const struct kiln_registry *reg);
/* Plugin i (0 <= i < the count) into *out, the caller's, its `size` set
 * (KILN_PLUGIN_INFO_INIT); the strings and tables are the registry's,
 * valid until kiln_registry_close.  KILN_EINVAL (nothing written) for a
 * size not set or an index out of range. */
kiln_status kiln_registry_plugin_get(const struct kiln_registry *reg, int i,
				     struct kiln_plugin_info *out);

/* Find the available plugin of `kind` called `name`.  KILN_ENOTFOUND with a
 * message listing what exists (and why a same-named plugin is unavailable,
 * or which file failed to load) otherwise. */
kiln_status kiln_registry_find(const struct kiln_registry *reg, int kind, const char *name,
			       const struct kiln_plugin **out);

const char *kiln_plugin_kind_name(int kind);

/* The host table handed to plugins (static, never NULL). */
const struct kiln_host *kiln_host_table(void);

/* ---- devices ------------------------------------------------------------
 *
 * struct kiln_device wraps an opened device plugin: the wrappers below apply
 * the defaults of optional members and count host synchronisations and
 * device-to-host copies, so tests can assert that a training step has none.
 * Threads: as struct kiln_device_ops says; the counters are atomic.
 */
struct kiln_device;

struct kiln_device_counters {
	uint64_t host_syncs;  /* event_sync + stream_sync calls */
	uint64_t d2h_copies;  /* copy_async with KILN_COPY_D2H */
	uint64_t allocs;      /* alloc + host_alloc calls */
	uint64_t runs;        /* kernel launches */
	uint64_t staging_waits; /* loader waits for a staging buffer's copy to
				 * finish (backpressure), or on a device of
				 * host memory, which reads the batch in place,
				 * for the step that read it */
	uint64_t replays;     /* graph_launch calls: captured steps replayed */
};

/* Open the available device plugin `name` ("auto": the available one with
 * the highest traits.auto_score) with the [run] options of cfg and its
 * [plugin.NAME] section (cfg may be NULL: defaults). */
kiln_status kiln_device_open(const struct kiln_registry *reg, const struct kiln_config *cfg,
			     const char *name, int ordinal, struct kiln_device **out);
void kiln_device_close(struct kiln_device *dev);
/* The device plugin `device = auto` opens: the available one with the
 * highest traits.auto_score.  KILN_EPLUGIN when there is none. */
kiln_status kiln_device_auto(const struct kiln_registry *reg, const struct kiln_plugin **out);
/* The device opened ("cuda" when "auto" chose it). */
const char *kiln_device_name(const struct kiln_device *dev);
/* Its plugin's traits (type, auto score, caps, communicator); static. */
const struct kiln_device_traits *kiln_device_traits(const struct kiln_device *dev);
/* "cpu", "gpu", "other" for an enum kiln_device_type; "?" otherwise. */
const char *kiln_device_type_name(int type);
void kiln_device_counters_get(const struct kiln_device *dev, struct kiln_device_counters *c);

kiln_status kiln_device_alloc(struct kiln_device *dev, size_t bytes, void **ptr);
void kiln_device_free(struct kiln_device *dev, void *ptr);
kiln_status kiln_device_host_alloc(struct kiln_device *dev, size_t bytes, void **ptr);
void kiln_device_host_free(struct kiln_device *dev, void *ptr);
kiln_status kiln_device_stream_create(struct kiln_device *dev, void **stream);
void kiln_device_stream_destroy(struct kiln_device *dev, void *stream);
kiln_status kiln_device_event_create(struct kiln_device *dev, void **event);
void kiln_device_event_destroy(struct kiln_device *dev, void *event);
kiln_status kiln_device_copy_async(struct kiln_device *dev, void *dst, const void *src,
				   size_t bytes, int kind, void *stream);
kiln_status kiln_device_event_record(struct kiln_device *dev, void *event, void *stream);
kiln_status kiln_device_stream_wait(struct kiln_device *dev, void *stream, void *event);
kiln_status kiln_device_event_sync(struct kiln_device *dev, void *event);
/* event_sync for the loader's staging ring: counted as staging_waits, not
 * host_syncs.  Use only to wait for a copy out of a host staging buffer. */
kiln_status kiln_device_staging_wait(struct kiln_device *dev, void *event);
kiln_status kiln_device_stream_sync(struct kiln_device *dev, void *stream);
kiln_status kiln_device_prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan,
				size_t *workspace);
kiln_status kiln_device_run(struct kiln_device *dev, void *plan, const struct kiln_op_args *args,
			    void *stream);
void kiln_device_plan_free(struct kiln_device *dev, void *plan);
void *kiln_device_proc(struct kiln_device *dev, const char *name);
size_t kiln_device_aux_bytes(struct kiln_device *dev, void *plan);
/* Captured steps (struct kiln_device_ops version 3, docs/plugins.md).
 * capture_begin: KILN_ENOTSUP when the device does not capture (no such
 * members, its config says no, or profiling is on).  capture_end returns
 * the graph the caller frees with graph_free, after its last launch has
 * completed.  graph_launch enqueues one replay on stream. */
kiln_status kiln_device_capture_begin(struct kiln_device *dev, void *stream);
kiln_status kiln_device_capture_end(struct kiln_device *dev, void *stream, void **graph);
kiln_status kiln_device_graph_launch(struct kiln_device *dev, void *graph, void *stream);
void kiln_device_graph_free(struct kiln_device *dev, void *graph);

/* ---- data sources -------------------------------------------------------
 *
 * A data source opened outside the trainer (`kiln pack`, tools, tests),
 * exactly as the trainer opens it: the source plugin `[section] source`
 * names, opened with `split` ("train" for [data], "test" for [data.eval];
 * the section's keys may override it), with `[section] limit` applied to
 * its length.  An unreadable file is KILN_EDATA (exit 3), like a corrupt
 * one; a file the config names (`path`, `shards`, `split`, IDX `images`
 * and `labels`) that is not there is KILN_ECONFIG (exit 2) naming the key
 * and where it was set (KILN_EDATA before session 37).  The tokens
 * source holds one open descriptor per shard for the source's life
 * (within ulimit -n; it refuses shards that leave fewer than 64 of it);
 * records maps each shard (one mapping, no descriptor).  Threads: open/close from one thread; kiln_source_read_image is
 * thread-safe (the source contract).
 */
struct kiln_source;

/* `section` is "data" or "data.eval" of a validated cfg.  On success *out
 * is a new handle (free with kiln_source_close). */
kiln_status kiln_source_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *section, const char *split, struct kiln_source **out);
void kiln_source_close(struct kiln_source *src);
/* What the plugin's info() said, len reduced to [section] limit, into the
 * caller's *info of `size` bytes (sizeof *info): the first min(size, the
 * library's sizeof) bytes, none past them; returns how many it wrote (a
 * member ending past that was not written).  struct kiln_source_info grows
 * with the plugin ABI's minor, without a new libkiln.so.N ("Structs the
 * library fills"); before session 35 the library's whole struct was
 * copied, past an older program's. */
size_t kiln_source_info(const struct kiln_source *src, struct kiln_source_info *info, size_t size);
/* The plugin's name ("idx", "records", ...); static. */
const char *kiln_source_name(const struct kiln_source *src);
/* 1 when the source decodes images (source ops version 2 read_image). */
int kiln_source_has_images(const struct kiln_source *src);
/* Sample `index` (0 <= index < len) as 8-bit HWC pixels in *img (grown
 * with realloc as struct kiln_image says; the caller frees img->data) and
 * its label.  KILN_ENOTSUP when the source has no read_image. */
kiln_status kiln_source_read_image(struct kiln_source *src, int64_t index,
				   struct kiln_image *img, int32_t *label);

/* ---- model, plans, training ---------------------------------------------
 *
 * A model is the static graph of the [layer.NAME] sections (file order;
 * `input =` / `inputs =` wire edges, default: the previous layer) with its
 * parameters, gradients and optimizer state in one flat device buffer each
 * (trainable parameters first, so the fused optimizer is one launch over one
 * range).  A plan binds the model to one batch size and mode: it holds the
 * layers' prepared device ops and one activation arena whose offsets the
 * planner packed by lifetime over the forward+backward schedule.  Running a
 * plan allocates nothing and never waits on the host.
 * Threads: one driving thread per model.
 */
struct kiln_model;
struct kiln_plan;

struct kiln_param_info {
	const char *name;              /* "fc1.weight" (PyTorch names and layouts) */
	struct kiln_tensor_desc desc;
	float *param;                  /* device pointer into the flat buffer (f32):
					* the caller may write through it before
					* the next run; a write after a run is
					* seen once kiln_model_params_written
					* (below) is called */
	float *grad;                   /* device pointer, NULL when frozen */
	int trainable;
};

/* Build the model described by cfg for samples shaped like `sample` (no
 * batch dimension).  Parameters are allocated but not initialised. */
kiln_status kiln_model_create(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
			      struct kiln_model **out);
void kiln_model_free(struct kiln_model *m);

/* Compute in `dtype` (KILN_F32, KILN_BF16 or KILN_F16): activations,
 * their gradients and the weights layers read; parameters, gradients and
 * optimizer state stay f32 (docs/precision.md).  [run] precision sets it
 * in the trainer; call it before the first plan.  Allocates the compute
 * copy of the parameters.  KILN_EINVAL for another dtype or after a plan. */
kiln_status kiln_model_set_compute_dtype(struct kiln_model *m, int dtype);
int kiln_model_compute_dtype(const struct kiln_model *m);

int kiln_model_param_count(const struct kiln_model *m);
/* Parameter (or buffer) i: its name, shape and device pointers.  The
 * call counts one write of m's weights: the caller may write the values
 * through the pointer (on the stream the runs go to, or synchronised)
 * before the next run, which takes them (the compute copy of
 * low-precision compute is cast again, and a device's own converted copy
 * of a frozen plan's weights, kiln_plan_opts.frozen, made again, once).
 * Runs after that keep those copies, so a get that only reads costs one
 * conversion, not one per run.  A write through the pointer after a run
 * must be followed by kiln_model_params_written (below) before the next
 * run, or that run may use the weights as they were (get, run, write,
 * params_written, run gives the new weights' outputs). */
void kiln_model_param_get(const struct kiln_model *m, int i, struct kiln_param_info *out);
/* The caller has written m's weights through pointers of
 * kiln_model_param_get or kiln_model_param_find after a run: counts one
 * write, so the next forward of every plan of m takes the weights as they
 * are now (the compute copy cast again, a frozen plan's kept weights made
 * again, once); later runs keep the copies made then.  Call it after each
 * such write, before the next run.  NULL: nothing.  (libkiln.so.2.5) */
void kiln_model_params_written(struct kiln_model *m);
/* KILN_ENOTFOUND if no parameter has that name. */
kiln_status kiln_model_param_find(const struct kiln_model *m, const char *name,
				  struct kiln_param_info *out);
size_t kiln_model_param_elems(const struct kiln_model *m);

/* PyTorch's default init (kaiming-uniform weights, uniform biases) drawn
 * from (seed, parameter, element); copies to the device and waits.  A
 * parameter or buffer loaded from a file since the last call
 * (kiln_model_init_from, kiln_model_load_safetensors*) keeps its values
 * and is not drawn; every other one gets the same values either way. */
kiln_status kiln_model_init_params(struct kiln_model *m, uint64_t seed, void *stream);

/* Enqueue the advance of the model's step counters (device i64s): the
 * micro-steps done (batchnorm's num_batches_tracked) and dropout's step
 * (its masks: a caller stepping the model itself calls it after every
 * optimizer step of one micro-batch; the trainer keeps both itself,
 * dropout's per optimizer step with each row's place in the global batch,
 * kiln/ops.h KILN_OP_DROPOUT). */
kiln_status kiln_model_step_advance(struct kiln_model *m, void *stream);

/* Plan for `batch` rows.  training: forward + backward; else forward only,
 * keeping no activation longer than its consumers need it. */
kiln_status kiln_model_plan(struct kiln_model *m, int64_t batch, int training,
			    struct kiln_plan **out);
/* Plans for tests and debugging: input_grad also computes the gradient of
 * the data input (the first layers' dx); keep_all gives every activation
 * and gradient its own bytes for the plan's lifetime (no lifetime packing),
 * so kiln_plan_tensor can read any of them after a run. */
struct kiln_plan_opts {
	int training;
	int input_grad;
	int keep_all;
	int dry;        /* lay out the memory, allocate none of it (arena and
			 * workspace stay NULL: such a plan cannot run) */
	int64_t decode; /* > 0 (not training): a decode plan for generation
			 * (docs/generate.md) of a model on token sequences:
			 * one token per row and run, at the position the run
			 * names, with the layers' key/value caches of `decode`
			 * positions kept in the plan from run to run; run it
			 * with kiln_plan_decode, read kiln_plan_logits */
	int logits;     /* 1 (not training): an inference plan (include/kiln/
			 * infer.h): the loss layer does not run (no labels,
			 * no metrics) and its input, the logits, is kept
			 * for kiln_plan_logits after the run */
	int frozen;     /* 1 (an inference plan, .logits): the caller does not
			 * train the model while the plan exists, so its
			 * weights change only where the core sees it (loading
			 * a checkpoint or safetensors file, init, quantize,
			 * kiln_model_param_get, kiln_model_params_written
			 * after a write through its pointers), and the device may keep its
			 * own converted copy of the weights from run to run
			 * (KILN_OPF_FROZEN, docs/plugins.md "ABI 2.15"); the
			 * next run after such a write takes the new weights */
};
kiln_status kiln_model_plan_ex(struct kiln_model *m, int64_t batch,
			       const struct kiln_plan_opts *opts, struct kiln_plan **out);

/* After a run has completed (sync first): the device pointer and descriptor
 * of layer `layer`'s output (`which` = "y") or of its gradient ("dy"), or of
 * the data input's gradient (layer NULL, which "dx"; input_grad plans).
 * Only keep_all plans guarantee the bytes were not reused by a later layer.
 * KILN_ENOTFOUND when the plan has no such tensor. */
kiln_status kiln_plan_tensor(const struct kiln_plan *p, const char *layer, const char *which,
			     void **ptr, struct kiln_tensor_desc *desc);

/* Enqueue one step of a decode plan: tokens (device i32[batch]) at
 * position pos (device i32[1], the same for every row), after the steps
 * at positions 0..pos-1 of the same sequences ran on this plan (the
 * caches hold what they wrote; a step at position 0 starts new
 * sequences).  Loss layers do not run.  A position outside [0, decode)
 * fails the run (KILN_EDATA).  The plan cannot tell a position past those
 * its caches hold (pos is device memory, read by the device): such a step
 * attends over cache rows no step wrote; kiln_generator_step, which knows
 * them, refuses it. */
kiln_status kiln_plan_decode(struct kiln_plan *p, const void *tokens, const void *pos,
			     void *stream);
/* A decode or inference plan's output after a run has completed: the
 * device pointer and descriptor (the compute dtype; [batch, 1, V] for a
 * decode plan) of the loss layer's input, the logits (of the next token). */
kiln_status kiln_plan_logits(const struct kiln_plan *p, void **ptr, struct kiln_tensor_desc *desc);

/* Free a plan.  The caller first synchronises every stream that ran it. */
void kiln_plan_free(struct kiln_plan *p);
size_t kiln_plan_arena_bytes(const struct kiln_plan *p);
/* Layers whose output a training plan recomputes in the backward ([train]
 * recompute, [layer.X] recompute); 0 for other plans. */
int kiln_plan_recomputed(const struct kiln_plan *p);
size_t kiln_plan_naive_bytes(const struct kiln_plan *p); /* without lifetime packing */

/* Enqueue one pass on stream: x (device, [batch, sample...]), labels
 * (device i32[batch]), metrics (device f32[2], accumulated: loss sum and
 * correct count).  Training plans also run backward, writing gradients
 * (beta = 0 on the first write: no zeroing needed). */
kiln_status kiln_plan_run(struct kiln_plan *p, const void *x, const void *labels, void *metrics,
			  void *stream);
/* The two halves of kiln_plan_run (backward only for training plans). */
kiln_status kiln_plan_forward(struct kiln_plan *p, const void *x, const void *labels,
			      void *metrics, void *stream);
kiln_status kiln_plan_backward(struct kiln_plan *p, const void *x, const void *labels,
			       void *metrics, void *stream);

/* Prepare the fused optimizer step of [train] optimizer (sgd, adam, adamw,
 * lamb and their keys; kiln_model_create already checked them and allocated
 * the state) and reset the optimizer: zero its state (momentum, or Adam's
 * moments), its step count and the gradients, and copy the [train]
 * no_decay weight-decay multiplier to the device.  Waits for the stream.
 * A second call replaces the plan and resets again. */
kiln_status kiln_model_optim_prepare(struct kiln_model *m, void *stream);
/* Enqueue one optimizer step over every trainable parameter: advance the
 * model's optimizer step count (device i64, separate from the micro-step
 * counter, so gradient accumulation calls this once per N micro-steps),
 * then run the one fused op, which reads lr (a device f32[1]) and the step
 * count from device memory.  No host sync. */
kiln_status kiln_model_optim_step(struct kiln_model *m, const float *lr, void *stream);

/* What kiln_train, kiln_train_run, kiln_evaluate and kiln_evaluate_ex
 * report.  Owned by the caller, which allocates it and sets `size` before
 * the call (KILN_TRAIN_RESULT_INIT, or `r.size = sizeof r`); the library
 * writes the first min(size, its own sizeof) bytes of it and no byte
 * past them, whether the call succeeds or fails (on failure with the
 * numbers so far), and sets `size` to the bytes it wrote.  The struct
 * grows only at the end: a program built against an older header (a
 * smaller struct) gets its members and nothing written past them; one
 * built against a newer header than the library's finds `size` lowered
 * to the library's, and a member that ends past it was not written.  A
 * size too small to hold `size` itself (0: not set) is refused with
 * KILN_EINVAL and nothing is written.  Before session 34 the struct had
 * no `size` and the library cleared sizeof(its struct) bytes: a program
 * built against an older header had bytes written past its struct.
 * Threads: written by the calling thread during the call alone; read it
 * after the call returns. */
struct kiln_train_result {
	size_t size;                /* set by the caller: sizeof(struct kiln_train_result) */
	int epochs;
	int64_t steps;
	double train_loss;          /* mean loss of the last epoch */
	double train_acc;
	double test_loss, test_acc; /* last evaluation; -1 when none ran */
	double test_acc5;           /* its top-5 accuracy */
	double val_loss, val_acc;   /* last [data.val] evaluation; -1 when none ran
				     * (kiln_evaluate runs none) */
	double val_acc5;            /* its top-5 accuracy */
	int64_t val_samples;
	int early_stopped;          /* [train] early_stop_patience ended the run */
	double train_samples_per_s; /* over the timed epochs (all but the first, if >1),
				     * their steps' time (evaluations and checkpoint
				     * writes left out, since session 40); one
				     * data-parallel rank's: the run's is
				     * samples_per_s at the end */
	double eval_samples_per_s;  /* the last evaluation's set, its samples over
				     * the pass's wall time, data loading
				     * included; under kiln launch the whole
				     * group's rate (each rank evaluates its
				     * share of the set since session 43; every
				     * one of [dist] pipeline's P x D ranks on
				     * a gathered model since session 44), not
				     * one rank's as train_samples_per_s */
	double wall_s;
	int64_t test_samples;
	struct kiln_device_counters steady; /* counters over steps 2..N between log points */
	int64_t data_skipped;       /* bad samples replaced ([data] on_error = skip):
				     * the training set's and the evaluations'
				     * summed over the ranks (each sample
				     * counted once, as one process counts
				     * it; the evaluations' this rank's alone
				     * before session 43) */
	size_t device_peak_bytes;   /* kiln_device_mem's peak over the run */
	/* What the operating system saw: the process's peak resident memory
	 * (VmHWM) minus its resident memory just before the model was built
	 * (the data sets already open), 0 where /proc is missing.  On the CPU
	 * device this is the run's memory independent of kiln's counters. */
	size_t rss_growth_bytes;
	int64_t steps_skipped;      /* optimizer steps skipped: non-finite gradients
				     * (0 with skip_nonfinite = 0: such steps are taken) */
	int64_t steps_clipped;      /* optimizer steps whose gradients clip_norm scaled */
	double data_wait_s;         /* training thread's wait for loader workers */
	/* checkpoints (docs/checkpoints.md) */
	int stopped;                /* 1: kiln_train_request_stop() ended the run early */
	char stop_cause[600];       /* a stop not the user's (kiln_train_request_stop_cause):
				     * "rank R of W (node N, host H): CAUSE" with
				     * data-parallel ranks, CAUSE alone without; "" else */
	int64_t resumed_step;       /* the step the run resumed at, -1 when it started fresh */
	char checkpoint[4200];      /* the checkpoint of the final step: the last one
				     * written, or the one a resume with no step left
				     * started from; "" if none (one of an earlier step
				     * is not named: session 32) */
	/* mixed precision ([run] precision; docs/precision.md) */
	double loss_scale;          /* the loss scale at the last log point (1 without scaling) */
	int64_t overflows;          /* steps whose scaled gradients overflowed (all skipped) */
	/* captured steps ([plugin.cuda] graph = 1, [plugin.cpu] graph = 1) */
	int64_t steps_replayed;     /* optimizer steps run as a replay of a captured graph */
	int graphs_captured;        /* graphs captured (one per device input buffer) */
	/* 1: [run] out_dir was removed, renamed or replaced mid-run; rank 0
	 * recreated it (lock, config.ini, metrics.jsonl) and stopped with a
	 * checkpoint there (`kiln train` exits 4: docs/checkpoints.md) */
	int out_dir_lost;
	/* the run's training samples/s: every data-parallel rank's samples,
	 * train_samples_per_s x the data-parallel ranks D (the world, or
	 * world / P with [dist] pipeline = P: a sample passes every stage);
	 * train_samples_per_s in one process (session 39) */
	double samples_per_s;
	/* (new members go here, at the end: see `size`) */
};
KILN_ENDS_UNPADDED(kiln_train_result, samples_per_s);

/* A result ready for the call: its size set, every other member 0. */
#define KILN_TRAIN_RESULT_INIT { .size = sizeof(struct kiln_train_result) }

/* Test hook: called on the training thread once per optimizer step, after
 * the backward of its last micro-step and before the non-finite check
 * (clip or unscale), with the device, the compute stream, the flat
 * gradients (device f32[n], n the trainable elements) and the 1-based step
 * number.  It may enqueue device ops on the stream (tests inject an
 * overflow this way) and must not wait for the device.  A nonzero return
 * stops the run with that status.  NULL removes it.  Not thread-safe
 * against a running kiln_train.  With [dist] pipeline a rank holds its
 * stage's gradients alone: only that stage's elements of grads[0, n) are
 * allocated there (docs/pipeline.md, "Parameters and gradients per
 * stage"). */
struct kiln_device;
typedef kiln_status (*kiln_grad_hook_fn)(void *user, struct kiln_device *dev, void *stream,
					 float *grads, size_t n, int64_t step);
void kiln_set_grad_hook(kiln_grad_hook_fn fn, void *user);

/* [train] as the trainer reads it: every key once, with the schema's
 * defaults (core/schema.c is the only place a default lives).  The
 * optimizer's own hyper-parameters are read by the optimizer.  Strings are
 * borrowed from the config and live as long as it does.  Filled by
 * kiln_train_cfg_read into the caller's struct, its `size` set
 * (KILN_TRAIN_CFG_INIT; "Structs the library fills" above), and read back
 * by kiln_train_run: there the members past the caller's size (a program
 * built against an older header) are the config's, as
 * kiln_train_cfg_read would read them. */
struct kiln_train_cfg {
	size_t size;              /* set by the caller: sizeof(struct kiln_train_cfg) */
	int64_t epochs;
	int64_t batch;            /* samples per step and rank; 0 while `auto` is unresolved */
	int batch_auto;           /* [train] batch = auto (resolved into `batch`) */
	int64_t eval_batch;       /* 0: `batch` */
	int64_t accumulate;
	int64_t max_steps;        /* 0: no limit */
	const char *optimizer;
	double lr;
	const char *schedule;     /* constant, cosine, step, multistep, onecycle,
				   * exponential, linear, polynomial, plateau
				   * (whose plateau_* keys the trainer reads) */
	int64_t warmup, step_size;
	double lr_min, gamma, pct_start, div_factor, final_div_factor;
	const char *milestones;   /* multistep: the list as written */
	const char *lr_scale;     /* none, linear, sqrt */
	int64_t base_batch;
	double clip_norm, clip_value;
	int skip_nonfinite;
	int64_t log_every;
	int eval;
	int64_t eval_every;       /* 0: after every epoch */
	int64_t keep_best;
	int best_on_loss;         /* best_metric = loss (else acc) */
	int64_t early_stop_patience;
	int early_stop_on_loss;   /* early_stop_metric = loss (else acc) */
	double early_stop_min_delta;
	int64_t checkpoint_every, keep_last;
	int checkpoint_last;      /* a checkpoint after the last step, whatever checkpoint_every */
	int resume;
	int overwrite;            /* a fresh run deletes an earlier run's files in out_dir */
	int reserved0;            /* 0; what was 4 bytes of tail padding, so that
				   * the next member grows sizeof (session 35;
				   * "Structs the library fills") */
	/* session 43: the schedules linear and polynomial, onecycle's options */
	double start_factor, end_factor; /* linear */
	int64_t total_iters;      /* linear, polynomial */
	double power;             /* polynomial */
	int three_phase;          /* onecycle: three_phase = 1 */
	int anneal_linear;        /* onecycle: anneal_strategy = linear (else cos) */
	/* (new members go here, at the end: see `size`) */
};
KILN_ENDS_UNPADDED(kiln_train_cfg, anneal_linear);

/* A struct ready for kiln_train_cfg_read: its size set, the rest 0. */
#define KILN_TRAIN_CFG_INIT { .size = sizeof(struct kiln_train_cfg) }

/* Read cfg's [train] into *out.  `batch = auto` is resolved when reg is
 * not NULL: the largest multiple of 8 (at most the training set) whose
 * kiln_memory_report total fits in [run] memory_limit, or in the memory
 * the device reports free, logged with its prediction (KILN_ENOMEM naming
 * the limit when even 8 does not fit); with reg NULL it is left at 0 with
 * batch_auto set.  The config is not changed: the run records the number
 * it chose (out_dir/config.ini, checkpoints).  KILN_ECONFIG for a bad
 * value (file:line).  out: the caller's, its `size` set
 * (KILN_TRAIN_CFG_INIT): KILN_EINVAL without it, nothing written. */
kiln_status kiln_train_cfg_read(const struct kiln_config *cfg, const struct kiln_registry *reg,
				struct kiln_train_cfg *out);

/* The whole `kiln train`: open device and data, build, train, evaluate,
 * write out_dir/metrics.jsonl.  Progress goes to the log, and to
 * `progress` (may be NULL; kiln_progress_fn says when it is called).
 * Checkpoints: [train] checkpoint_every writes out_dir/checkpoints/
 * ckpt-<step>.kiln, and [train] checkpoint_last (default 1) one after the
 * last step; [train] resume = 1 continues from the newest usable one
 * there (a fresh start when there is none).  After a stop request the run
 * ends after its current step with a checkpoint, returns KILN_OK and sets
 * res->stopped and res->checkpoint.  kiln_train reads [train] itself
 * (kiln_train_cfg_read, resolving batch = auto); kiln_train_run takes it
 * read (tc is borrowed for the call; its batch must be resolved). */
/* The progress callback, on the calling thread of kiln_train or
 * kiln_train_run; status is borrowed for the call.  epoch counts from 1;
 * steps_per_epoch is the epoch's optimizer steps.  It is called:
 *  - after every optimizer step, with step = the steps done in this epoch
 *    (1 .. steps_per_epoch) and status "loss L acc A" (the means over the
 *    steps since the last such call) at a log point (every [train]
 *    log_every steps, and the last step of an epoch or of the run), NULL
 *    between log points;
 *  - at the end of each epoch that ran, with step = -1 and status the
 *    epoch's line ("epoch E/N: train loss ... acc ... (S s, R samples/s)",
 *    with the evaluation's numbers when one ran there).  With a callback
 *    this line goes to it and not to the log (`kiln train` prints it);
 *    an epoch cut short by a stop request has none, and a resumed run
 *    with no step left has none unless it evaluated;
 *  - once before a resumed run's owed evaluation (eval_owed:
 *    docs/checkpoints.md), or its evaluation again for numbers its
 *    checkpoint lacks, with step = the steps of the epoch the checkpoint
 *    had done and a NULL status.
 * After any call with step >= 0, a stop request (kiln_train_request_stop)
 * ends the run with a checkpoint. */
typedef void (*kiln_progress_fn)(void *user, int epoch, int64_t step, int64_t steps_per_epoch,
				 const char *status);
/* Where the run stands, for a progress callback to call while it runs:
 * *step = the optimizer steps the run has done (counted over its epochs
 * and over the runs it resumed from: the checkpoint's "step"), *last_step
 * = the step it will end at unless stopped sooner (a stop request, early
 * stopping): the rest of its epochs in this run's steps per epoch, or
 * [train] max_steps when that comes first (INT64_MAX when the count
 * overflows).  A run resumed with another global batch (batch x
 * accumulate x ranks) has other steps per epoch than its checkpoint had,
 * so neither follows from the callback's own arguments (step - epoch's
 * step is then no multiple of steps_per_epoch): `kiln train`'s bar and
 * ETA use these.  Either pointer may be NULL.  KILN_EINVAL outside a
 * progress callback (on another thread, or after it returned).  Since
 * session 38. */
kiln_status kiln_train_progress_steps(int64_t *step, int64_t *last_step);
/* res: the caller's, its `size` set (struct kiln_train_result): KILN_EINVAL
 * without it.  tc (kiln_train_run): its `size` set too, as
 * kiln_train_cfg_read leaves it (KILN_EINVAL without it). */
kiln_status kiln_train(const struct kiln_config *cfg, const struct kiln_registry *reg,
		       kiln_progress_fn progress, void *user, struct kiln_train_result *res);
kiln_status kiln_train_run(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   const struct kiln_train_cfg *tc, kiln_progress_fn progress, void *user,
			   struct kiln_train_result *res);

/* The program's hook for a call that failed (kiln_train, kiln_train_run,
 * kiln_evaluate, kiln_evaluate_ex, kiln_quantize): called once for every
 * failing call, whatever failed (a NULL argument, a struct's size not
 * set, a config the run refuses, a data file missing, the run itself),
 * once its error is final and before its teardown (draining and freeing
 * the device, the communicator's and the store's goodbyes), which may
 * take seconds: a program that may be ended meanwhile (`kiln train`,
 * whose second stop signal 5 s after the first ends it at once, the
 * SIGTERM `kiln launch` sends when another rank failed) prints the error
 * there, not after the call returns.  Called on the thread that runs the
 * call, with its status and the message kiln_last_error() gives after it
 * returns (msg borrowed for the call).  Process-wide, as
 * kiln_set_grad_hook; NULL (the default): none.  Since session 36; before,
 * `kiln train` printed a rank's error after its teardown, and a stop
 * signal then could end it unprinted.  Before session 37 a failure
 * before the run opened (the checks above) did not call it.
 *
 * Threads: kiln_set_error_hook may be called from any thread, also while
 * other threads' calls fail.  A call gets fn and user of one
 * kiln_set_error_hook, never one's fn with another's user (before session
 * 37 a reset on one thread could hand another's failing run the new fn
 * with the old user, or NULL).  kiln_set_error_hook returns once no
 * other thread is still in the hook it replaced, so the old user may be
 * freed then; called from inside a hook it does not wait at all (a hook
 * may set the hook; two hooks on two threads each setting it would
 * otherwise wait for each other), and it must not be called while
 * holding a lock the hook takes (it would wait for that hook forever).
 * Hooks on several threads run concurrently. */
typedef void (*kiln_error_hook_fn)(void *user, kiln_status st, const char *msg);
void kiln_set_error_hook(kiln_error_hook_fn fn, void *user);

/* Whose failure the one told last on this thread was (the error hook's,
 * above; call it in the hook or after the call returned): 1, this
 * process's own (a file, the device, out of memory, a bad config: where
 * the failure began), or 0 in a data-parallel run where it followed from
 * another rank's (a peer lost, failed with its own error or stuck, the
 * store gone, an outcome every rank agreed on such as configs that
 * differ, a stop asked for, a rendezvous that timed out).  1 before any
 * failure and in a run of one process.  `kiln train` under `kiln launch`
 * tells the launcher its own failures, so that the launcher names the
 * rank a failure began on, not the one that exited first
 * (docs/distributed.md, "kiln launch").  Since session 39. */
int kiln_train_failed_own(void);

/* ---- safetensors files ---------------------------------------------------
 *
 * The format of Hugging Face's safetensors (docs/safetensors.md): an 8-byte
 * little-endian header length N, N bytes of JSON (an object: tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of strings), then the tensors' bytes, little-endian,
 * row-major, offsets relative to the end of the header.
 *
 * Opening reads the header and checks all of it before anything is used:
 * the header length against the file size, the JSON, every entry's dtype,
 * shape and offsets, the offsets within the data, sorted, without overlaps
 * or holes and covering it to the end, shape x dtype size = bytes.
 * Failures are KILN_EIO (cannot open or read) or KILN_EDATA (anything
 * else), with a message naming the file and, where one is at fault, the
 * tensor.
 *
 * Ownership: a reader (kiln_safetensors_open's) is the caller's, freed
 * with kiln_safetensors_close; it holds one file descriptor from open to
 * close (a program that keeps many readers open counts them against
 * `ulimit -n`), and the file's size and modification time as open saw
 * them.  Strings and `data` it hands out are borrowed until close.
 *
 * A tensor's bytes are read with kiln_safetensors_read (pread into the
 * caller's buffer: a file cut short since open, or rewritten in place,
 * is KILN_EDATA naming the file), or through `data`.  Opening maps
 * nothing (since session 40; before, every open mapped the file whole and
 * failed, "cannot map", where the address space could not hold it:
 * `ulimit -v`, a batch system's h_vmem): the file is mapped, whole and
 * read-only, the first time kiln_safetensors_get or _find is called on
 * the reader, and stays mapped until close; where it cannot be mapped
 * `data` is NULL, kiln_safetensors_find returns KILN_EIO and
 * kiln_safetensors_get sets kiln_last_error() ("PATH: cannot map:
 * REASON"), and the next get or find tries again (since session 40's
 * review: before, find returned KILN_OK with `data` NULL, no message, and
 * no later call mapped).  A page of the mapping past the file's end,
 * once it is truncated under the reader (re-exported in place, a network
 * file system), raises SIGBUS on access, which the library cannot turn
 * into an error, and bytes rewritten in place show through it
 * unannounced.
 * kiln's own loaders read, and never map (since session 39 and 40).
 * Threads: a reader is read-only after open (reads and gets of several
 * threads may overlap: the first mapping wins); a writer belongs to one
 * thread.
 */
struct kiln_safetensors;

struct kiln_safetensors_tensor {
	const char *name;       /* borrowed from the reader, valid until close */
	const char *dtype_name; /* the file's: "F32", "I64", "F64", "BOOL", ... */
	int dtype;              /* enum kiln_dtype, or -1 for a dtype kiln has not (F64, U16, ...) */
	int ndim;               /* 0 is a scalar */
	int64_t dims[KILN_MAX_DIMS];
	int64_t numel;
	const void *data;       /* bytes inside the file's mapping (made by the first
				 * get or find), valid until close; NULL where the
				 * file cannot be mapped (the address space: find is
				 * KILN_EIO, get sets kiln_last_error(); use
				 * kiln_safetensors_read).  Aligned to the element
				 * size in files kiln writes, not necessarily in
				 * others; SIGBUS where the file was cut short since
				 * (kiln_safetensors_read is safe) */
	size_t bytes;
};

/* Open and check `path` (the header alone is read; nothing is mapped).
 * On success *out is a new reader, the caller's (free with
 * kiln_safetensors_close; it holds the file open until then).  Tensors
 * are counted in the order of their data. */
kiln_status kiln_safetensors_open(const char *path, struct kiln_safetensors **out);
void kiln_safetensors_close(struct kiln_safetensors *f);
const char *kiln_safetensors_path(const struct kiln_safetensors *f);
int kiln_safetensors_count(const struct kiln_safetensors *f);
/* Tensor i, mapping the file if it is not yet (`data`); all zeros where
 * i is out of range.  Where the file cannot be mapped, `data` is NULL,
 * the rest filled, and kiln_last_error() says why. */
void kiln_safetensors_get(const struct kiln_safetensors *f, int i,
			  struct kiln_safetensors_tensor *out);
/* Tensor `name`, as kiln_safetensors_get.  KILN_ENOTFOUND (message naming
 * the file) when there is no tensor `name`; KILN_EIO ("PATH: cannot map:
 * REASON", since session 40's review) where the file cannot be mapped,
 * *out filled but `data` NULL. */
kiln_status kiln_safetensors_find(const struct kiln_safetensors *f, const char *name,
				  struct kiln_safetensors_tensor *out);
/* The index (kiln_safetensors_get's i) of tensor `name`, or -1 (none; f
 * or name NULL).  Since libkiln.so.2.2.0. */
int kiln_safetensors_index(const struct kiln_safetensors *f, const char *name);
/* Read tensor i's bytes (kiln_safetensors_get's `bytes`, little-endian
 * as in the file) into dst, which holds dst_bytes, with pread() from the
 * file open since kiln_safetensors_open: no mapping is made or touched.
 * KILN_OK; KILN_EINVAL for f or dst NULL, no tensor i, or dst_bytes below
 * the tensor's bytes; KILN_EDATA when the file ends before the tensor
 * does (truncated or rewritten since open: the message names the file,
 * the tensor, its bytes, how many were there and the file's size at open
 * and now), or, since session 40, when after the read the file's size or
 * modification time (ns) is no longer what open saw (rewritten in place:
 * the bytes read may be the new file's or a mix; the message names the
 * file and both; any change of the time counts, a `touch` of the same
 * bytes included: read again from a new open); KILN_EIO when a read
 * fails.  Since libkiln.so.2.2.0. */
kiln_status kiln_safetensors_read(const struct kiln_safetensors *f, int i, void *dst,
				  size_t dst_bytes);
/* The "__metadata__" value of `key`, or NULL; NULL too for a value that
 * holds an escaped NUL (\u0000), which a C string cannot carry (the file
 * is read all the same).  Borrowed until close. */
const char *kiln_safetensors_meta(const struct kiln_safetensors *f, const char *key);

/* A file being written: tensors and metadata are collected, then written at
 * once, in the order the reference implementation uses (dtype alignment
 * descending, then name), the header padded with spaces to a multiple of 8
 * so every tensor is aligned to its element size. */
struct kiln_safetensors_writer;

kiln_status kiln_safetensors_writer_new(struct kiln_safetensors_writer **out);
void kiln_safetensors_writer_free(struct kiln_safetensors_writer *w);
/* Add tensor `name` (copied) of `dtype` (any enum kiln_dtype) and shape
 * dims[0..ndim) (ndim 0: a scalar).  `data` (row-major, host memory) is
 * borrowed: it must stay valid and unchanged until writer_write returns.
 * KILN_EINVAL for a duplicate, empty or reserved ("__metadata__") name. */
kiln_status kiln_safetensors_writer_add(struct kiln_safetensors_writer *w, const char *name,
					int dtype, int ndim, const int64_t *dims,
					const void *data);
/* Set "__metadata__" key to value (both copied; a second call replaces). */
kiln_status kiln_safetensors_writer_meta(struct kiln_safetensors_writer *w, const char *key,
					 const char *value);
/* Write the file: to a temporary name next to `path`, fsynced and renamed
 * over `path` once complete (a failed write leaves no partial file); when
 * `path` is a symlink, next to and over its target; a device or FIFO
 * (/dev/stdout) is written straight to.  KILN_EIO. */
kiln_status kiln_safetensors_writer_write(struct kiln_safetensors_writer *w, const char *path);

/* ---- model weights in safetensors ---------------------------------------
 *
 * Names are the model's parameter names, "<layer>.<suffix>" ([layer.NAME]
 * plus the layer's parameter: "conv1.weight", "bn1.running_mean"), shapes
 * PyTorch's (linear [out, in], conv OIHW), so a PyTorch module whose
 * submodules are named like kiln's layers shares its state_dict with kiln.
 */

/* Write every parameter and buffer of m (f32) to `path`, plus, for every
 * layer with a `running_mean` buffer (batchnorm), "<layer>.num_batches_tracked"
 * (i64 scalar: the batches tracked when loaded plus the model's micro-steps
 * since), so that torch's load_state_dict(strict=True) accepts the file.
 * Metadata: format = pt, kiln_version, config_hash (of the resolved
 * [layer.*] sections, each value by meaning: docs/safetensors.md) and,
 * since session 41, kiln.layers (those sections themselves, since
 * session 42 without the keys left unset), which `kiln eval`,
 * `predict`, `generate`, `export` with --checkpoint FILE and [model]
 * init_from compare with their model's (a key that differs warned of,
 * never refused; kiln_model_load_safetensors does not compare), and
 * kiln.crc32c (CRC32Cs of the header and of each tensor, which every
 * loader checks as it reads the tensor).  Waits for `stream`. */
kiln_status kiln_model_save_safetensors(struct kiln_model *m, const char *path, void *stream);

/* The names and layouts of a weights file (docs/safetensors.md). */
enum kiln_weights_format {
	KILN_WEIGHTS_PYTORCH = 0, /* the layers' names, PyTorch's layouts (linear [out, in]) */
	/* the GPT-2 release's (Hugging Face's GPT2LMHeadModel): the same names,
	 * the weights of linear layers named c_attn, c_proj, c_fc or q_attn
	 * (GPT-2's Conv1D) stored [in, out]; on load the "transformer." prefix
	 * may be absent, the attention's mask buffers (*.attn.bias,
	 * *.attn.masked_bias) are skipped and an embedding table may have fewer
	 * rows than the model's (a padded vocabulary: the rest become 0) */
	KILN_WEIGHTS_GPT2 = 1,
};
/* "pytorch" or NULL -> KILN_WEIGHTS_PYTORCH, "gpt2" -> KILN_WEIGHTS_GPT2, else -1. */
int kiln_weights_format(const char *name);
/* kiln_model_save_safetensors in `format` (enum kiln_weights_format). */
kiln_status kiln_model_save_safetensors_as(struct kiln_model *m, const char *path, int format,
					   void *stream);

/* Load tensors by name from `path` into m's parameters and buffers (host to
 * device copies on `stream`, waited for).  Tensors may be F32, F16, BF16 or
 * F64 (converted to f32).  A shape that differs from the parameter's is
 * always an error.  strict: every parameter and buffer must be in the file,
 * and the file must hold nothing else but "*.num_batches_tracked";
 * otherwise the matching tensors are loaded, the rest keep their values and
 * what was skipped is logged.  Mismatches are KILN_ECONFIG with the first
 * missing, unexpected and mismatched names; nothing is loaded then.  A
 * file with kiln's CRC32Cs (metadata kiln.crc32c) has each tensor checked
 * as it is read, before it is copied: one that does not match is
 * KILN_EDATA naming the file and the tensor (a header that does not,
 * before any tensor is read).  After such a failure, a read that failed,
 * or a value that is not finite, the tensors before it are m's already:
 * m's weights are then part the file's, part its own, and not to be used
 * (kiln's commands exit 3). */
kiln_status kiln_model_load_safetensors(struct kiln_model *m, const char *path, int strict,
					void *stream);
/* kiln_model_load_safetensors from a file in `format` (enum kiln_weights_format). */
kiln_status kiln_model_load_safetensors_as(struct kiln_model *m, const char *path, int format,
					   int strict, void *stream);

/* [model] init_from / init_strict of the model's config: load init_from
 * when it is set; else nothing.  Called before kiln_model_init_params, it
 * spares that the draw of what the file gives (the trainer's order);
 * after it, the file's values replace the drawn ones.  init_from
 * may be a safetensors file (in [model] init_format), a kiln checkpoint or
 * llm.c's model file (both told apart by their magic bytes): a checkpoint
 * gives its parameters and buffers alone, which must be exactly the
 * model's; llm.c's file GPT-2's parameters, under GPT-2's names.  The
 * [layer.*] sections a kiln export records (kiln.layers) or a checkpoint
 * was trained with (its config, since session 42) are compared with the
 * model's: each key that differs is logged as a warning, never refused
 * (docs/safetensors.md). */
kiln_status kiln_model_init_from(struct kiln_model *m, void *stream);

/* Whether `out`, a file about to be written, may be: KILN_OK, or
 * KILN_EUSAGE naming it when it is the same file (device and inode,
 * symbolic links followed) as one of inputs[0..n) (the files the caller
 * reads: config, checkpoint, weights, INT8 model; NULL or "" entries
 * skipped), or when it is a kiln checkpoint, which only training writes.
 * A missing `out` passes.  kiln export, kiln predict --logits and kiln
 * quantize --out check theirs; kiln_export_* and kiln_quantize check their
 * own arguments.  The strings are borrowed for the call; nothing is opened
 * or written (stat and the checkpoint's magic bytes); any thread. */
kiln_status kiln_output_check(const char *out, const char *const *inputs, int n);
/* The output file `out` this process is about to write (NULL or "":
 * none), the string copied: from then on kiln_source_open refuses to open
 * a data source one of whose files (its source's `files`, source ops
 * version 4: shards, image and label files) is that file, KILN_EUSAGE
 * naming both, before anything is written (before session 34 `kiln
 * quantize --out` could replace the calibration images it had just
 * read).  kiln predict --logits, kiln quantize --out and kiln export set
 * it before they open the data.  Process-wide: call it from the main
 * thread before any data source opens. */
void kiln_output_watch(const char *out);
/* KILN_EUSAGE ("the output O is the file PATH, which READER reads") when
 * `path` is the same file as kiln_output_watch's output (device and
 * inode, links followed); KILN_OK otherwise, or when either is missing. */
kiln_status kiln_output_read_check(const char *path, const char *reader);

/* Write the output's bytes to fp (not closing it): 0, or the errno of the
 * write that failed (EIO when it set none). */
typedef int (*kiln_file_fill)(FILE *fp, void *ctx);
/* Write `path` with fill, whole or not at all: a regular file (or none
 * yet) through path.kiln-tmp<pid>.<n> in its directory (created exclusively,
 * given the old file's permission bits), fsynced and renamed over it, the
 * directory fsynced, so an earlier file at path stays whole when the
 * write fails (full disk, a file size limit) and no temporary is left; a
 * symbolic link's target is replaced, the link kept; a device or FIFO
 * (/dev/stdout) is written straight to.  A temporary of path that a
 * killed writer left (path.kiln-tmp<pid>.<n> whose process is gone, or an
 * older kiln's path.tmp<pid>.<n>) is removed first, and logged.  0 or an errno; the caller says which file.  The
 * safetensors and ONNX writers, `kiln predict --logits` and `kiln report`
 * share it (core/out_file.c); any thread. */
int kiln_file_write(const char *path, kiln_file_fill fill, void *ctx);

/* `kiln export`: open [run] device, read the sample shape from [data] as
 * training would, build the model, load the weights of `checkpoint` (NULL:
 * the newest usable one in [run] out_dir/checkpoints; [model] init_from is
 * then not read), or when there is none initialise it ([run] seed, then
 * [model] init_from, logging a warning), and write it with
 * kiln_model_save_safetensors.  A checkpoint must hold this model: the
 * config keys that shape its tensors (checkpoint.h's weights keys) equal
 * cfg's.  KILN_EUSAGE, nothing written, when path is checkpoint, [model]
 * init_from or any kiln checkpoint (kiln_output_check). */
kiln_status kiln_export_safetensors(const struct kiln_config *cfg,
				    const struct kiln_registry *reg, const char *checkpoint,
				    const char *path);
/* kiln_export_safetensors in `format` (enum kiln_weights_format). */
kiln_status kiln_export_safetensors_as(const struct kiln_config *cfg,
				       const struct kiln_registry *reg, const char *checkpoint,
				       const char *path, int format);
/* `kiln export --onnx`: the model of cfg with the weights kiln_export_
 * safetensors would write, its evaluation graph (fp32, up to the logits the
 * loss layer reads) written to path as an ONNX model: IR version 8, opset
 * 17, weights as initializers under their kiln/PyTorch names, images NCHW
 * (docs/inference.md).  KILN_ECONFIG naming the layer and its config line
 * for a layer with no ONNX mapping; KILN_ENOTSUP when kiln was built without
 * libonnx-dev's onnx.proto; KILN_EUSAGE as kiln_export_safetensors's.  The
 * file is written whole or not at all (an earlier one at path is kept when
 * the write fails). */
kiln_status kiln_export_onnx(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *checkpoint, const char *path);
/* `kiln export --onnx --quantized Q`: the INT8 model Q (`kiln quantize`'s
 * file; cfg's model, folded) in ONNX's QDQ format: each INT8 conv/linear
 * reads its input through QuantizeLinear/DequantizeLinear (the calibrated
 * scale, u8 or i8, zero point 0) and its int8 weight through
 * DequantizeLinear (per-output-channel scales, axis 0); opset 17.
 * KILN_EUSAGE when path is `quantized` or a kiln checkpoint. */
kiln_status kiln_export_onnx_quantized(const struct kiln_config *cfg,
				       const struct kiln_registry *reg, const char *quantized,
				       const char *path);
/* Ask the running kiln_train (or, if none runs, the next one) to stop after
 * its current step and write a checkpoint.  Async-signal-safe: call it from
 * a SIGTERM handler.  The request is consumed when honoured. */
void kiln_train_request_stop(void);
/* The same stop for a reason other than the user's (cause, a static
 * string: "its launcher (parent process 42) went away", a hangup): the
 * run stops as for kiln_train_request_stop, checkpoint included, and its
 * result's stop_cause names it (on every data-parallel rank, with the
 * rank that took it).  Async-signal-safe. */
void kiln_train_request_stop_cause(const char *cause);

/* `kiln eval --checkpoint`: evaluate the parameters and buffers of
 * checkpoint file `checkpoint` (NULL: the newest usable one in [run]
 * out_dir/checkpoints) on cfg's [data.eval].  The checkpoint is
 * verified completely first, and the keys that shape its tensors (the
 * [layer.*] keys; not [model] init_from or layout) must equal cfg's.  Fills test_loss, test_acc, test_samples, eval_samples_per_s,
 * wall_s, steps (the checkpoint's) and checkpoint of res (the caller's, its
 * `size` set: struct kiln_train_result). */
kiln_status kiln_evaluate(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  const char *checkpoint, struct kiln_train_result *res);
/* kiln_evaluate with inference passes (docs/inference.md).  fold: the
 * model is evaluated with its batchnorms folded into the conv/linear
 * before them, dropout removed and bias + activation in the layers'
 * epilogues ([run] fuse = 1): `kiln eval --fold`.  opts NULL: all
 * zero, as kiln_evaluate (before session 37 a crash). */
struct kiln_eval_opts {
	int fold;
	/* with fold: keep each residual add a layer of its own (kiln_quantize
	 * calibrates the adds); 0: a conv that alone feeds a two-input add
	 * takes it into its epilogue (core/infer_passes.h) */
	int no_residual;
	/* a file of kiln_quantize (docs/formats.md, "INT8 model"): the
	 * config's model folded, with that file's weights, its conv and
	 * linear layers run by the INT8 ops (KILN_OP_QCONV, QLINEAR); no
	 * checkpoint is read.  NULL: none */
	const char *quantized;
};
kiln_status kiln_evaluate_ex(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *checkpoint, const struct kiln_eval_opts *opts,
			     struct kiln_train_result *res);

/* `kiln quantize`: INT8 post-training quantization (docs/inference.md,
 * "INT8") of checkpoint `checkpoint` (NULL: the newest in [run] out_dir):
 * the model folded, per-channel symmetric int8 weights, the input range
 * of every conv and linear from the first `batches` full batches of
 * [data.eval] (all of them when it has fewer: the file's metadata
 * kiln.calibrate_batches says how many ran) by `method` ("minmax", the
 * default for NULL; "percentile" with `percentile`; "entropy"), written
 * to `out`, which must not be a checkpoint (KILN_EUSAGE naming it). */
struct kiln_quantize_opts {
	int64_t batches;
	const char *method;
	double percentile;
	const char *out;
};
kiln_status kiln_quantize(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  const char *checkpoint, const struct kiln_quantize_opts *opts);

/* Device bytes allocated through kiln_device_alloc and not yet freed, and
 * their peak since the device was opened: counted at the core's wrapper
 * (what the device was asked for), independent of any plan. */
void kiln_device_mem(struct kiln_device *dev, size_t *live, size_t *peak);

/* The device's free and total memory now, as the device reports it
 * (kiln_device_ops.mem_info); KILN_ENOTSUP when it cannot. */
kiln_status kiln_device_mem_info(struct kiln_device *dev, size_t *free_bytes, size_t *total_bytes);

/* ---- memory, from the plans (`kiln memory`) ---- */

/* What a training run of cfg will allocate on the device, from the static
 * plans alone (the model, its training and evaluation plans and the
 * trainer's input buffers are built; nothing runs).  Bytes.  Filled by
 * kiln_memory_report into the caller's struct, its `size` set
 * (KILN_MEMORY_INIT; "Structs the library fills" above). */
struct kiln_memory {
	size_t size;                 /* set by the caller: sizeof(struct kiln_memory) */
	int64_t batch;
	size_t params, grads, optim_state, buffers;
	size_t activations;          /* the training plan's arena, packed by lifetime */
	size_t activations_unpacked; /* the same without packing */
	size_t workspace;            /* the training plan's shared workspace */
	size_t eval;                 /* the evaluation plan's arena and workspace */
	size_t inputs;               /* device input slots */
	size_t other;                /* optimizer extras, counters, lr, metrics */
	size_t total;                /* device memory: the sum of the above */
	size_t host;                 /* the loaders' pinned staging rings, the
				      * trainer's two host input slots and its
				      * sample orders (host memory; on the CPU
				      * device the same RAM) */
	size_t library;              /* host memory the device's library objects
				      * took (oneDNN's JIT kernels and primitive
				      * state): how much the process's resident
				      * memory grew while this report prepared
				      * the plans (0 where /proc is missing) */
	size_t peak_live;            /* activations live at the worst schedule point */
	int peak_layer;              /* ... at this layer's */
	int peak_pass;               /* 0 forward, 1 recomputation, 2 backward */
	int recompute_segments;      /* [train] recompute: 0 = none */
	int recomputed;              /* layers whose output is recomputed */
	size_t cache;                /* [data] cache = ram: the decoded images
				      * of the training and evaluation sets
				      * and their heap overhead, once every
				      * sample has been read (host memory, not
				      * in `host`); 0 without the cache */
	/* (new members go here, at the end: see `size`) */
};
KILN_ENDS_UNPADDED(kiln_memory, cache);

/* A report ready for kiln_memory_report: its size set, the rest 0. */
#define KILN_MEMORY_INIT { .size = sizeof(struct kiln_memory) }

/* "512M", "2G", "1.5GiB", "64kB", "4096": bytes (K, M, G, T are powers of
 * 1024; "iB" or "B" after them optional): a decimal number (digits, at most
 * one '.') with whitespace around it.  KILN_EINVAL for anything else (a
 * sign, an exponent, hex, inf, a space inside, 2^64 bytes or more), *out
 * untouched. */
kiln_status kiln_parse_size(const char *s, size_t *out);

/* Fill *out and, when f is not NULL, print the report (a table per layer:
 * output, saved-for-backward and gradient bytes) to f.  `batch = auto` is
 * resolved first, as kiln_train_cfg_read resolves it (and logged).  out:
 * the caller's, its `size` set (KILN_MEMORY_INIT): KILN_EINVAL without
 * it, nothing written; on another failure its members so far (zeros). */
kiln_status kiln_memory_report(const struct kiln_config *cfg, const struct kiln_registry *reg,
			       FILE *f, struct kiln_memory *out);

/* ---- model summary (`kiln summary`, docs/report.md) ----
 *
 * Per layer: output shape, parameters and forward FLOPs, like torchinfo.
 * FLOPs are counted from the device ops each layer prepares and runs in its
 * forward (so a plugin layer is counted like a built-in one): a plan's ops
 * are noted with kiln_op_flops as they are prepared, then the forward is
 * issued with the device counting instead of running. */

/* The FLOPs of one run of op, a multiply-add counting 2: GEMM 2*M*N*K per
 * batch (+ M*N with a bias); CONV 2 * numel(y) * C/g*KH*KW (+ numel(y)
 * with a bias); POOL numel(y)*KH*KW; ATTENTION 4*B*C*P, its backward
 * 10*B*C*P, P the (query, key) pairs computed per head: T(T+1)/2 causal,
 * T*T otherwise; BN_INFER, BN_APPLY, NORMALIZE_U8
 * 2 per output element; copies and layout changes (REORDER, CAST, CONCAT,
 * SPLIT, FILL, COUNTER_ADD) 0; every other op (elementwise, losses,
 * optimizers, op types the core does not know) one per element of its
 * first output. */
double kiln_op_flops(const struct kiln_op *op);

struct kiln_summary_layer {
	const char *name, *type;  /* copies: freed by kiln_summary_free */
	struct kiln_tensor_desc out; /* the output, batch first (4-d: N, C, H, W) */
	int is_view;              /* the output is its input reshaped (flatten) */
	int is_loss;              /* a loss layer (its output: the metric sums) */
	int64_t trainable, frozen; /* parameter elements ([layer] trainable = 0: frozen) */
	int64_t buffers;          /* non-trained state (batchnorm running stats) */
	double flops;             /* the layer's forward at the summary's batch */
};

struct kiln_summary {
	int64_t batch;            /* the batch the shapes and FLOPs are for */
	int training;             /* 1: the forward of a training plan (batch
				   * statistics, dropout), 0: evaluation */
	int n_layers;
	struct kiln_summary_layer *layers;
	int64_t params, trainable, frozen, buffers; /* totals, elements */
	double flops;             /* the whole forward (layers only, not the
				   * input conversion) */
	int no_flops;             /* 1: FLOPs not counted (a training plan with
				   * [dist] sync_bn: its forward calls the group) */
	double param_mib;         /* parameters' bytes (f32) / 2^20 */
};

/* The summary of model m at `batch` rows, from a plan of its own (evaluation
 * mode, nothing allocated for activations); nothing runs on the device.
 * Free *out with kiln_summary_free. */
kiln_status kiln_model_summary(struct kiln_model *m, int64_t batch, struct kiln_summary *out);
/* The table (one row per layer, then the totals) to f. */
void kiln_summary_print(const struct kiln_summary *s, FILE *f);
void kiln_summary_free(struct kiln_summary *s);
/* Build cfg's model as `kiln train` would and print its summary at `batch`
 * rows to f (when not NULL); *out filled (free with kiln_summary_free). */
kiln_status kiln_summary_report(const struct kiln_config *cfg, const struct kiln_registry *reg,
				int64_t batch, FILE *f, struct kiln_summary *out);

/* ---- text generation (`kiln generate`, docs/generate.md) ----
 *
 * A generator holds a model with its weights and a decode plan of it at
 * batch 1 (kiln_plan_opts.decode = the context): each step feeds one token
 * at its position and gives the next token's logits, the attention layers
 * keeping the keys and values of the earlier positions, so the prefix is
 * never recomputed; a prompt's positions but its last are prefilled, up
 * to 256 a run of a plan that takes them at once (where the device and
 * every layer can, ABI 2.31; else a step each: docs/generate.md,
 * "Prefill"), so a prompt costs a few runs and one copy of logits to
 * the host; that plan is held for the next prompt of its run length (a
 * second copy of the caches, no logits: docs/generate.md; not under [run]
 * memory_limit) until kiln_generator_close.  Sampling draws from the core's counter-based RNG
 * keyed by (seed, the draw's index, the sample's index): the same seed
 * gives the same tokens.  kiln_generate_samples decodes N continuations
 * of one prompt at once, in a plan of N rows (each its own caches).
 * Threads: one thread per generator.  Every function here refuses a NULL
 * pointer argument it reads or writes with KILN_EINVAL naming it (before
 * session 42 kiln_generate, kiln_generator_step, kiln_generator_new and
 * kiln_sample_token dereferenced it), but where a NULL is documented
 * (kiln_generator_open's checkpoint, kiln_generator_allow's mask, the
 * callbacks, kiln_generator_close). */
struct kiln_generator;

struct kiln_sample_opts {
	double temperature; /* softmax(logits / temperature); 0: greedy (argmax) */
	int64_t top_k;      /* draw among the k largest logits only; 0: all */
	int64_t vocab;      /* draw ids < vocab only (a tokenizer smaller than
			     * the model's padded output); 0: all */
	uint64_t seed;
};

/* Open [run] device, build cfg's model for the sample shape of [data] (a
 * `tokens` source: i32[T]; the context is T) and load the weights of
 * `checkpoint` (NULL: the newest usable one in [run] out_dir/checkpoints,
 * else [model] init_from; neither: KILN_ECONFIG), take [run] precision's
 * compute dtype (as kiln eval and kiln predict do), then plan decoding.
 * The device must implement KILN_OP_ATTENTION_DECODE (the CUDA device
 * does not yet): a device `auto` chose without it gives way to the CPU
 * device; [run] device naming one is KILN_ECONFIG before any weight is
 * read ("generation needs the CPU device: set run.device=cpu"). */
kiln_status kiln_generator_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
				const char *checkpoint, struct kiln_generator **out);
/* A generator of model m (borrowed: it outlives the generator) on stream
 * (borrowed, of m's device), for sequences of up to `context` tokens (>= 1,
 * else KILN_EINVAL). */
kiln_status kiln_generator_new(struct kiln_model *m, void *stream, int64_t context,
			       struct kiln_generator **out);
void kiln_generator_close(struct kiln_generator *g);
/* (These three: 0 for a NULL g.) */
int64_t kiln_generator_context(const struct kiln_generator *g);
int64_t kiln_generator_vocab(const struct kiln_generator *g); /* the logits' V */
/* The ids kiln_generate draws from: below the loss layer's `classes`
 * ([layer.loss] classes: the columns past it are a padded vocabulary's,
 * which training never taught), else below V.  (libkiln.so.2.3) */
int64_t kiln_generator_classes(const struct kiln_generator *g);
/* Let kiln_generate draw only the ids i < n with allowed[i] nonzero (a
 * tokenizer's vocabulary with gaps among its ids: the ids it lacks are
 * never drawn), besides the bound of kiln_generator_classes and of
 * kiln_sample_opts.vocab; allowed (host u8[n]) is copied.  NULL: every
 * id again.  KILN_EINVAL when n < 0 or no id below
 * kiln_generator_classes is allowed (nothing could be drawn); on any
 * error the earlier mask stays in force.  (libkiln.so.2.3) */
kiln_status kiln_generator_allow(struct kiln_generator *g, const uint8_t *allowed, int64_t n);
/* Let kiln_generate and kiln_generate_samples draw from the nucleus of
 * top_p only (top-p sampling, HuggingFace's TopPLogitsWarper): of the ids
 * kiln_generator_classes and kiln_generator_allow let through, after
 * top_k, sorted by probability under softmax(logits / temperature) (ties:
 * the lower id first), the smallest leading set whose probabilities sum
 * to top_p or more, at least one id; the draw renormalises over it.
 * 0 < top_p <= 1; 1 (a new generator's) keeps every id: the draws are
 * those of a generator before this function, to the bit.  Greedy
 * decoding (temperature 0, top_k 1) ignores it.  KILN_EINVAL for any
 * other value (0, > 1, NaN), and the earlier one stays in force.
 * (libkiln.so.2.4) */
kiln_status kiln_generator_top_p(struct kiln_generator *g, double top_p);

/* Feed `token` at position pos (0 <= pos < context; the steps at 0..pos-1
 * of this sequence came before, pos = 0 starts a new one) and wait for
 * the logits of the next token: *logits, host f32[V], valid until the
 * next call.  The generator's one-row decode holds the positions fed
 * since its last position 0: those of the caller's steps, else of
 * kiln_generate (the prompt and every new token but the last: the next
 * step is at n_prompt + n_new - 1) or of kiln_generate_samples with
 * n_samples > 1 (the prompt but its last token, n_prompt - 1 positions;
 * for a model fed in every row, below, what it held before).  A pos past
 * them (a new generator's 1 and on) is KILN_EINVAL naming the positions
 * held, nothing fed (before session 42 the step ran on caches no step
 * wrote: after kiln_generate_samples, empty ones).  A step that fails
 * keeps positions 0..pos-1.  NULL g or logits: KILN_EINVAL. */
kiln_status kiln_generator_step(struct kiln_generator *g, int64_t pos, int32_t token,
				const float **logits);

/* Draw a token from logits[0..V) (host): greedy (the first largest) when
 * temperature is 0 or top_k 1, else from softmax(logits / temperature)
 * over the top_k largest (ties: the lower id) by inverting the cumulative
 * distribution at u = kiln_rng_uniform(seed, sampling stream, draw).  A
 * logit of -inf has a probability of 0 (never drawn); a NaN or +inf
 * logit, or every one -inf, is KILN_EDATA naming the id (nothing can be
 * drawn: torch.multinomial refuses such a distribution too; before
 * session 40 the draw gave id V - 1). */
kiln_status kiln_sample_token(const float *logits, int64_t V, const struct kiln_sample_opts *o,
			      uint64_t draw, int32_t *token); /* NULL logits, o, token: KILN_EINVAL */
/* kiln_sample_token with a nucleus and a stream: from the top_p nucleus
 * (kiln_generator_top_p's rule; 1: all) of the top_k largest, by
 * inverting the cumulative distribution at u = kiln_rng_uniform(seed,
 * sampling stream, draw, sample_stream), the stream of one of several
 * samples of a seed (kiln_generate_samples' sample s is stream s).
 * kiln_sample_token is top_p 1 on stream 0.  KILN_EINVAL for a top_p
 * outside (0, 1] and a NULL logits, o or token; the rest as
 * kiln_sample_token.  (libkiln.so.2.4) */
kiln_status kiln_sample_token_ex(const float *logits, int64_t V, const struct kiln_sample_opts *o,
				 double top_p, uint64_t draw, uint32_t sample_stream, int32_t *token);
/* The distribution kiln_sample_token_ex draws from into probs[0..V) (the
 * caller's, host): each id's probability, 0 outside the top_k and the
 * nucleus of top_p (renormalised: the kept ids' sum to 1); greedy
 * decoding's id 1.  Errors as kiln_sample_token_ex's (probs then not
 * written).  (libkiln.so.2.4) */
kiln_status kiln_sample_probs(const float *logits, int64_t V, const struct kiln_sample_opts *o,
			      double top_p, double *probs);

/* Called with each new token as it is drawn; nonzero stops generation
 * with that status. */
typedef kiln_status (*kiln_token_fn)(void *user, int32_t token);

/* Feed prompt[0..n_prompt) (n_prompt >= 1) from position 0, then draw
 * n_new tokens into out[] (draw k is the k-th new token, by
 * kiln_sample_token_ex with kiln_generator_top_p's nucleus on stream 0,
 * over the ids kiln_generator_classes and kiln_generator_allow let
 * through; top_p 1, the default, is kiln_sample_token's draw), feeding
 * each back; a draw's error names the new token and its position.  prompt + new tokens must fit the context: KILN_EINVAL naming the
 * most that fit otherwise (no sliding window: the positions of a learned
 * positional embedding would shift, and the caches with them).  A prompt
 * id at or past kiln_generator_classes (an embedding row no training
 * taught, of a padded vocabulary) is KILN_EINVAL naming its position,
 * nothing fed (since session 41: before, it was fed).  NULL g, prompt, o
 * or out: KILN_EINVAL. */
kiln_status kiln_generate(struct kiln_generator *g, const int32_t *prompt, int64_t n_prompt,
			  int64_t n_new, const struct kiln_sample_opts *o, int32_t *out,
			  kiln_token_fn fn, void *user);

/* Called with each new token of sample `sample` as it is drawn: new
 * token k of samples 0..N-1 in turn, then token k + 1.  Nonzero stops
 * generation with that status. */
typedef kiln_status (*kiln_samples_fn)(void *user, int64_t sample, int32_t token);

/* n_samples continuations of one prompt (HuggingFace's
 * num_return_sequences), decoded at once: a decode plan of n_samples
 * rows, each row its own key/value caches (memory: n_samples times one
 * sequence's, besides the generator's one-row plan and, held between
 * prompts unless [run] memory_limit is set, its prefill plan: another
 * copy of the full-context caches, docs/generate.md), the prompt fed once
 * (its first n_prompt - 1 tokens to the one-row decode, prefilled there,
 * whose caches' positions of those tokens are copied into every row, then its last
 * token to every row: the same
 * logits as feeding it to every row, one row's compute instead of
 * n_samples'; a model with a layer that does not lay its caches out by
 * row, kiln_layer.decode_caches of a plugin built before ABI 2.26, is fed
 * it in every row, as every model before session 42), then n_new tokens
 * drawn for each into out[s * n_new + k] (the caller's, n_samples *
 * n_new): new token k of sample s by kiln_sample_token_ex at draw k on
 * stream s, so
 * sample 0 is kiln_generate's draws, and the others differ from it and
 * from one another as other seeds do.  kiln_generator_classes,
 * kiln_generator_allow and kiln_generator_top_p apply as to
 * kiln_generate.  A row's logits do not depend on the other rows (on the
 * CPU device they are a one-row plan's to the bit: docs/generate.md).
 * The generator keeps the plan of n_samples > 1 rows until a call with
 * another n_samples > 1 makes another, its caches empty, a one-row call
 * (kiln_generate, kiln_generator_step, n_samples = 1) frees it, or
 * kiln_generator_close.  1 <= n_samples <= INT32_MAX, else KILN_EINVAL;
 * a plan of n_samples > 1 rows that does not fit the device's memory is
 * KILN_EUSAGE (exit 2, as for a bad argument) naming n_samples, the bytes
 * the plan needs and a sample's share, and where the device tells its
 * free memory (kiln_device_mem_info) about how many fit (or that not one
 * does), refused before
 * any allocation when it needs more than that (before session 42: the
 * allocation's KILN_ENOMEM, naming "the evaluation plan");
 * NULL g, prompt, o or out: KILN_EINVAL; with n_samples > 1 a draw's
 * error names the sample too (with 1, as kiln_generate's); the other
 * errors as kiln_generate's.  (libkiln.so.2.4) */
kiln_status kiln_generate_samples(struct kiln_generator *g, const int32_t *prompt, int64_t n_prompt,
				  int64_t n_new, int64_t n_samples, const struct kiln_sample_opts *o,
				  int32_t *out, kiln_samples_fn fn, void *user);
/* Make now the decode plan kiln_generate_samples of n_samples would make
 * (and keep it for that call, as it keeps its own): a caller learns that
 * n_samples rows do not fit (KILN_EUSAGE, as kiln_generate_samples says)
 * before it allocates their tokens (`kiln generate --num-samples`; before
 * session 43 it allocated them first, and a count whose tokens did not
 * fit in memory was "out of memory", exit 1).  n_samples = 1 frees the
 * plan of several rows, as a one-row call does.  1 <= n_samples <=
 * INT32_MAX, else KILN_EINVAL; NULL g: KILN_EINVAL.  (libkiln.so.2.6) */
kiln_status kiln_generator_plan_samples(struct kiln_generator *g, int64_t n_samples);

/* ---- the loader alone (`kiln bench data`) ---- */

struct kiln_data_bench {
	int workers;            /* threads used (after `auto`) */
	int64_t batch;          /* [train] batch */
	int64_t batches;        /* timed batches */
	int64_t samples;
	double wall_s;          /* the timed batches, as the consumer saw them */
	double samples_per_s;
	double mb_per_s;        /* staged bytes (what is copied to the device) */
	double read_us;         /* per sample: source read + decode (thread time) */
	double xform_us;        /* per sample: transforms (thread time) */
	double copy_us;         /* per batch: host-to-device copy of the staged bytes */
	double wait_frac;       /* share of wall_s the consumer waited for workers */
	int64_t sample_bytes;
	int64_t skipped;        /* bad samples replaced (on_error = skip) */
};

/* Run the [data] loader of `cfg` exactly as training would (workers,
 * prefetch, transforms, cache, copies to the device) for `batches`
 * batches after two of warm-up (0: one epoch), without a model. */
kiln_status kiln_bench_data(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    int64_t batches, struct kiln_data_bench *out);

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
