/* core/checkpoint.h - checkpoint files: write, verify, read
 * (core/checkpoint_write.c, _read.c, _load.c), and what resuming needs:
 * the config comparison and the directory of a run's checkpoints (resume
 * selection, keep_last; core/resume.c).
 *
 * One file holds the whole training state (docs/checkpoints.md has the
 * byte layout): a 64-byte header, then tagged sections, each with its own
 * header CRC and payload CRC32C.  Sections:
 *   "config"    resolved config text (kiln_config_write output)
 *   "trainer"   struct kiln_ckpt_trainer, fixed-width little-endian
 *   "versions"  "key = value" lines: kiln, plugin ABI, plugins
 *   "tensors"   one line per parameter: name region offset numel dims
 *   "weights_keys"  "section key" lines: the config keys that shape the
 *               stored tensors, the only ones eval and export compare
 *   "tracked"   i64: batchnorm's num_batches_tracked loaded with the
 *               weights (kiln_model's tracked_base), before the "step" count
 *   "epoch"     the epoch's partial training sums (struct kiln_ckpt_epoch),
 *               so a resumed epoch's summary averages the whole epoch
 *   "interval"  the log interval open at the checkpoint's step (struct
 *               kiln_ckpt_interval), when one is: the resumed run's first
 *               train line and its epoch's sums are the uninterrupted run's
 *   "stopper"   early stopping's state (struct kiln_ckpt_stopper)
 *   "best"      keep_best's K best evaluations so far (struct kiln_ckpt_best)
 *   "eval_owed" a stop cut this step's eval_every evaluation short: the
 *               resumed run evaluates it first
 *   "evaluated" the run's last checkpoint as written again after the
 *               evaluations that follow its step (the epoch's, [data.val]'s
 *               final test; written first at the step, without it): their
 *               numbers (struct kiln_ckpt_evaluated), so a resume records
 *               none of them again
 *   "clip_counts" the steps skipped (non-finite gradients) and clipped so
 *               far, when the run has the clip op: a resume continues them
 *   "plateau"   [train] schedule = plateau's state (struct kiln_plateau:
 *               f64 lr, f64 best, i64 bad, i64 cooldown, i64 evaluations),
 *               when the run has that schedule (session 43)
 *   "data_skipped" the bad samples replaced so far ([data] on_error =
 *               skip; u64: the batches trained on, over every rank, and the
 *               evaluations'), when on_error = skip or the count is not 0:
 *               a resume continues it
 *   one section per model state buffer (kiln_model_state_buffers: "params",
 *   "buffers", "momentum", "step"), the device bytes as they are.
 *
 * Reading trusts nothing: kiln_ckpt_open checks the magic, version, every
 * header and section CRC and every length against the file size before it
 * returns, and allocates nothing sized by a field it has not bounded by the
 * file size.  Errors name the file and what is wrong; a file that fails is
 * never partially applied to a model.
 *
 * Threads: one thread per object; nothing here exits.
 */
#ifndef KILN_CHECKPOINT_H
#define KILN_CHECKPOINT_H

#include "graph.h"
#include "plateau.h" /* struct kiln_plateau, the "plateau" section */

#define KILN_CKPT_VERSION 1
#define KILN_CKPT_HEADER_BYTES 64
#define KILN_CKPT_SECTION_BYTES 48
#define KILN_CKPT_TAG_BYTES 32 /* NUL-padded; at most 31 characters */

/* Where the run stands: the "trainer" section (7 x u64 little-endian). */
struct kiln_ckpt_trainer {
	int64_t epoch;   /* epoch being trained (0-based) */
	int64_t step;    /* optimizer steps done in the whole run */
	int64_t offset;  /* global samples of this epoch's order consumed: a
			  * multiple of batch x accumulate x world, at most the
			  * epoch's steps x that (then only the end-of-epoch
			  * evaluation is left) */
	int64_t seed;    /* [run] seed */
	int64_t world;   /* ranks */
	int64_t batch;   /* [train] batch (per rank) */
	int64_t samples; /* training samples in an epoch (after [data] limit) */
};
#define KILN_CKPT_TRAINER_BYTES 56

/* ---- writing ------------------------------------------------------------ */

/* The training sums of the epoch so far (the "epoch" section: 2 x f64,
 * i64): sum of the per-sample losses, of the correct predictions, and the
 * samples they cover (per rank: the ranks' sums averaged). */
struct kiln_ckpt_epoch {
	double loss, correct;
	int64_t samples;
};
#define KILN_CKPT_EPOCH_BYTES 24

/* The log interval open at the checkpoint's step (the "interval" section,
 * session 39): what the next log point closes, each rank's device sums as
 * they are, so that a run resumed between two log points makes the
 * uninterrupted run's first train line (its mean over the whole interval)
 * and ends its epoch with the same bits of the sums.  Written when the
 * interval holds a step: between two log points, and at a log point that
 * the run's max_steps alone put there (`closed`: off log_every's grid and
 * not an epoch's end; a resume that trains on reopens it).  Bytes: the
 * 80-byte head (i64 closed, start, samples, rows, skipped; f64 loss,
 * correct; i64 epoch_samples, pipeline, ranks), then `ranks` entries of
 * KILN_CKPT_INTERVAL_RANK_BYTES (f32 sums[3], 4 zero bytes, f64 carry[2]),
 * in rank order. */
struct kiln_ckpt_interval_rank {
	float sums[3];   /* the device's metric sums, f32 as they are: loss,
			  * correct, top-5 correct */
	double carry[2]; /* the loss and correct sums taken off the device
			  * since the log point (an evaluation's read, the
			  * 2^24 rows' read), kept for the next one */
};
#define KILN_CKPT_INTERVAL_RANK_BYTES 32
struct kiln_ckpt_interval {
	int64_t closed;        /* 1: the log point at the checkpoint's step
				* closed it early (max_steps) */
	int64_t start;         /* the step of the log point before it */
	int64_t samples;       /* the samples one rank trained in it */
	int64_t rows;          /* the rows the device's sums count */
	int64_t skipped;       /* the clip op's skipped steps at its start */
	double loss, correct;  /* the epoch's sums of the log points before
				* it (per rank: the ranks' sums averaged) */
	int64_t epoch_samples; /* ... and the samples they cover (per rank) */
	int64_t pipeline;      /* [dist] pipeline stages (1: none) */
	int64_t ranks;         /* processes: entries in rank[] */
	struct kiln_ckpt_interval_rank *rank;
};
#define KILN_CKPT_INTERVAL_BYTES 80

/* Early stopping's state (the "stopper" section: f64, i64, i64): the best
 * value of its metric so far (higher is better: a loss negated), the
 * evaluations since it improved, and whether it has a best yet. */
struct kiln_ckpt_stopper {
	double best;
	int64_t bad, have;
};
#define KILN_CKPT_STOPPER_BYTES 24

/* One of keep_best's K best evaluations (the "best" section: i64 count,
 * then per entry f64 value, i64 step): the value of best_metric (higher is
 * better: a loss negated) at the evaluation after `step`, whose checkpoint
 * is best/ckpt-<step>.kiln.  In a best/ checkpoint the list holds that
 * checkpoint's own entry too (a resume from a checkpoint without the
 * section reads each best/ file's value from it). */
struct kiln_ckpt_best {
	double v;
	int64_t step;
};
#define KILN_CKPT_BEST_ENTRY_BYTES 16

/* The "evaluated" section (u64 step, f64 loss, acc, acc5, u64 samples of
 * the epoch's evaluation, then u64 has_test and the same four of the
 * final test): the evaluations after the checkpoint's step, done and
 * recorded before it was written.  samples 0: no such evaluation. */
struct kiln_ckpt_evaluated {
	double loss, acc, acc5;
	int64_t samples;
	int64_t has_test;
	double test_loss, test_acc, test_acc5;
	int64_t test_samples;
};
#define KILN_CKPT_EVALUATED_BYTES 80

/* What a checkpoint holds besides the model's state buffers.  Strings are
 * borrowed for the call. */
struct kiln_ckpt_meta {
	const char *config;   /* resolved config text */
	const char *versions; /* "key = value" lines (kiln_ckpt_versions) */
	struct kiln_ckpt_trainer trainer;
	const struct kiln_ckpt_epoch *epoch; /* NULL: no "epoch" section */
	/* NULL: no "interval" section (no log interval open) */
	const struct kiln_ckpt_interval *interval;
	const struct kiln_ckpt_stopper *stopper; /* NULL: no "stopper" section */
	const struct kiln_ckpt_best *best; /* n_best entries; NULL: no "best" section */
	int64_t n_best;
	int eval_owed; /* nonzero: an "eval_owed" section (i64: the trainer step) */
	const struct kiln_ckpt_evaluated *evaluated; /* NULL: no "evaluated" section */
	/* the clip op's counts (i64 steps skipped, i64 steps clipped); NULL:
	 * no "clip_counts" section (no clip op) */
	const int64_t *clip_counts;
	/* the bad samples replaced so far; NULL: no "data_skipped" section */
	const int64_t *data_skipped;
	/* schedule = plateau's state; NULL: no "plateau" section */
	const struct kiln_plateau *plateau;
};
#define KILN_CKPT_PLATEAU_BYTES 40

/* Write dir/ckpt-<trainer.step>.kiln: the state buffers of `m` are copied
 * device->host on `stream` (which is synchronised: a checkpoint is a host
 * sync point), everything goes to dir/ckpt-<step>.kiln.tmp, which is
 * fsynced, renamed over the final name, and the directory fsynced.  `dir`
 * must exist.  On failure the temp file is removed and KILN_EIO names the
 * path and the reason.  The final path goes to path[0..path_len). */
kiln_status kiln_ckpt_save(const char *dir, const struct kiln_ckpt_meta *meta,
			   struct kiln_model *m, void *stream, char *path, size_t path_len);

/* The piece a device section goes to the file in, through one host buffer
 * of this size (and a source's reads). */
#define KILN_CKPT_PIECE_BYTES ((size_t)256 * 1024)

/* A source of state sections other than the model's own device buffers
 * (core/dist_pipe_ckpt.c: a pipeline stage's rank holds its slice alone,
 * the others' slices come from their ranks).  owns(ctx, tag): nonzero
 * when section `tag` is read through read(ctx, tag, off, host, n), bytes
 * [off, off + n) into host memory, in order from offset 0 in pieces of
 * KILN_CKPT_PIECE_BYTES (the last shorter); the optimizer's slots, which
 * a model without its whole state (state_d NULL) does not list, are
 * written from the source at slot_bytes each (0: none). */
struct kiln_ckpt_src {
	void *ctx;
	int (*owns)(void *ctx, const char *tag);
	kiln_status (*read)(void *ctx, const char *tag, size_t off, void *host, size_t n);
	size_t slot_bytes;
};

/* kiln_ckpt_save with the sections `src` owns read from it (NULL: none);
 * the same file. */
kiln_status kiln_ckpt_save_src(const char *dir, const struct kiln_ckpt_meta *meta,
			       struct kiln_model *m, void *stream, const struct kiln_ckpt_src *src,
			       char *path, size_t path_len);

/* "key = value" lines describing this build and the plugins in use
 * (malloc'd; the caller frees). */
char *kiln_ckpt_versions(const struct kiln_registry *reg, const struct kiln_device *dev);

/* The resolved config of cfg as text (malloc'd; the caller frees), or NULL
 * with KILN_ENOMEM/KILN_EIO set. */
char *kiln_ckpt_config_text(const struct kiln_config *cfg, const struct kiln_registry *reg);
/* cfg's sections with every key at its default (kiln_config_write_defaults):
 * the `defaults` of kiln_ckpt_config_check.  malloc'd; NULL on failure. */
char *kiln_ckpt_config_defaults(const struct kiln_config *cfg, const struct kiln_registry *reg);

/* ---- reading ------------------------------------------------------------ */

struct kiln_ckpt; /* an open, verified checkpoint file */

/* Open and verify `path` completely (see above).  KILN_EDATA naming the file
 * and the fault for anything malformed (truncated, bad magic, unsupported
 * version, a checksum mismatch, a bad length or tag), KILN_EIO when it
 * cannot be read.  On success *out owns the open file. */
kiln_status kiln_ckpt_open(const char *path, struct kiln_ckpt **out);
/* The same for the regular file open on fd (borrowed: ck reads a duplicate
 * of it), named path in messages: the file opened once, for a reader that
 * looked at its first bytes already ([model] init_from), so that a file
 * replaced or removed at path meanwhile is not read instead. */
kiln_status kiln_ckpt_open_fd(const char *path, int fd, struct kiln_ckpt **out);
void kiln_ckpt_close(struct kiln_ckpt *ck);
const char *kiln_ckpt_path(const struct kiln_ckpt *ck);
/* The step in the header (equal to the trainer section's). */
int64_t kiln_ckpt_step(const struct kiln_ckpt *ck);
/* The step in path's header, its magic, version and header checksum
 * checked, nothing else read (64 bytes; a FIFO is not waited on); -1 when
 * it cannot be read or is no checkpoint's header. */
int64_t kiln_ckpt_header_step(const char *path);
/* 1 when path (a checkpoint named by step `named`, ckpt-<named>.kiln)
 * holds another step in its header (a copied or renamed file), logged at
 * `level` naming the file and both steps and saying that `whom` leaves it
 * alone; 0 when it holds `named`, or its header cannot be read (its full
 * open says why).  core/resume.c. */
int kiln_ckpt_misnamed(const char *path, int64_t named, int level, const char *whom);

int kiln_ckpt_section_count(const struct kiln_ckpt *ck);
/* Section i's tag (owned by ck), length and payload CRC32C. */
void kiln_ckpt_section_get(const struct kiln_ckpt *ck, int i, const char **tag, uint64_t *bytes,
			   uint32_t *crc);
/* Length of section `tag`; KILN_ENOTFOUND (with a message naming the file)
 * when it has none. */
kiln_status kiln_ckpt_find(const struct kiln_ckpt *ck, const char *tag, uint64_t *bytes);
/* Read section `tag` into buf, which must be exactly its length; the CRC is
 * checked again (the file may have changed since open). */
kiln_status kiln_ckpt_read(struct kiln_ckpt *ck, const char *tag, void *buf, size_t bytes);
/* Read a text section into a malloc'd NUL-terminated string (the caller
 * frees). */
kiln_status kiln_ckpt_read_text(struct kiln_ckpt *ck, const char *tag, char **out);
/* The model input's one-sample shape and dtype the checkpoint was trained
 * with (its "sample" section), so that eval, predict and export need not
 * open [data] for it; KILN_ENOTFOUND when the file has none (an older
 * kiln's). */
kiln_status kiln_ckpt_sample(struct kiln_ckpt *ck, struct kiln_tensor_desc *out);
/* The "sample" section's text of d, "DTYPE D0,D1,...\n" ("f32 1,28,28\n"),
 * into out (len bytes; 160 hold any; checkpoint_write.c); `kiln quantize`
 * records the same line, its newline cut, in an INT8 file (core/quantize.c,
 * "kiln.sample"). */
void kiln_ckpt_sample_text(const struct kiln_tensor_desc *d, char *out, size_t len);
/* That text back into *out: the dtype's name, a space, positive dims
 * separated by commas, then end_char ('\n' and the end of the string for
 * a checkpoint's section, '\0' for an INT8 file's metadata), at most
 * KILN_MAX_DIMS dims and 2^31 elements; -1 (out untouched) for anything
 * else. */
int kiln_ckpt_sample_parse(const char *text, int end_char, struct kiln_tensor_desc *out);
/* m's parameter table (laid out, allocated or not) equals ck's "tensors",
 * or holds the same tensors at other offsets (read by name:
 * kiln_ckpt_load_model); else KILN_EDATA naming ck, its "sample" section
 * (m->sample) and the first difference (kiln_trained_open's check before
 * anything is allocated). */
kiln_status kiln_ckpt_check_sample(struct kiln_ckpt *ck, const struct kiln_model *m);
/* The trainer section, with its values range-checked. */
kiln_status kiln_ckpt_trainer_get(struct kiln_ckpt *ck, struct kiln_ckpt_trainer *out);

/* The "epoch" section; KILN_ENOTFOUND when the checkpoint has none (written
 * by an older kiln), KILN_EDATA naming the file and the section for values
 * no run trains (the "interval" section's rules for the sums before its
 * interval, session 41: a rank's samples past the "trainer" section's
 * epoch, a correct count not finite, negative or past the samples, a loss
 * sum not finite with no step skipped by the "clip_counts" section). */
kiln_status kiln_ckpt_epoch_get(struct kiln_ckpt *ck, struct kiln_ckpt_epoch *out);
/* The "interval" section into *out, its entries malloc'd into out->rank
 * (the caller frees; NULL when it fails).  KILN_ENOTFOUND when the
 * checkpoint has none (no log interval was open, or an older kiln's),
 * KILN_EDATA naming the file when it is malformed or a value out of range
 * (the start past the checkpoint's step, a count negative or past 2^62,
 * a correct count not finite or negative, ranks not stages x pipes), or
 * more than its run could have trained (session 40: a rank's samples past
 * the "trainer" section's epoch, rows past the samples, correct counts
 * past the samples they count, a loss sum not finite with no step skipped
 * for non-finite gradients by the "clip_counts" section). */
kiln_status kiln_ckpt_interval_get(struct kiln_ckpt *ck, struct kiln_ckpt_interval *out);
/* The "stopper" section: KILN_ENOTFOUND when the checkpoint has none (a
 * run without early stopping, or an older kiln's), KILN_EDATA when its
 * values are out of range. */
kiln_status kiln_ckpt_stopper_get(struct kiln_ckpt *ck, struct kiln_ckpt_stopper *out);
/* The "best" section: *out (malloc'd, the caller frees; NULL when *n is 0)
 * and its *n entries.  KILN_ENOTFOUND when the checkpoint has none (no
 * keep_best, or an older kiln's), KILN_EDATA when it is malformed or a value
 * out of range (not finite, a step past the checkpoint's). */
kiln_status kiln_ckpt_best_get(struct kiln_ckpt *ck, struct kiln_ckpt_best **out, int64_t *n);
/* *owed = 1 when the checkpoint owes its step's eval_every evaluation (an
 * "eval_owed" section naming its step), 0 when it has none (none owed, or
 * an older kiln's); KILN_EDATA naming the file when the section is
 * malformed or names another step. */
kiln_status kiln_ckpt_eval_owed_get(struct kiln_ckpt *ck, int *owed);
/* *done = 1 and *out filled when the checkpoint has an "evaluated"
 * section naming its step (the evaluations after it are recorded), else
 * *done = 0 (none: a checkpoint written before them, or an older kiln's);
 * KILN_EDATA naming the file when the section is malformed, names another
 * step or holds a count out of range. */
kiln_status kiln_ckpt_evaluated_get(struct kiln_ckpt *ck, struct kiln_ckpt_evaluated *out,
				    int *done);

/* The "clip_counts" section: out[0] the steps skipped, out[1] the steps
 * clipped.  KILN_ENOTFOUND when the checkpoint has none (a run without the
 * clip op, or an older kiln's), KILN_EDATA naming the file when a count is
 * past the checkpoint's step. */
kiln_status kiln_ckpt_clip_counts_get(struct kiln_ckpt *ck, int64_t out[2]);
/* The "data_skipped" section: KILN_ENOTFOUND when the checkpoint has none
 * (on_error = fail and nothing skipped, or an older kiln's), KILN_EDATA
 * naming the file when it is malformed. */
kiln_status kiln_ckpt_data_skipped_get(struct kiln_ckpt *ck, int64_t *out);
/* The "plateau" section: KILN_ENOTFOUND when the checkpoint has none (a
 * run of another schedule, or a kiln's before session 43), KILN_EDATA
 * naming the file when a value is out of range (a rate not finite or
 * below 0, a count below 0). */
kiln_status kiln_ckpt_plateau_get(struct kiln_ckpt *ck, struct kiln_plateau *out);

/* 1 when `path` starts with a checkpoint's magic (KILNCKPT), else 0 (also
 * when it cannot be read: opening it will say why). */
int kiln_ckpt_is_checkpoint(const char *path);
/* The same for the file open on fd (read with pread: its offset is kept). */
int kiln_ckpt_is_checkpoint_fd(int fd);

enum { KILN_CKPT_LOAD_ALL = 0, KILN_CKPT_LOAD_WEIGHTS = 1 };

/* Load the checkpoint's state into `m`: every state buffer (LOAD_ALL, for
 * resuming) or only "params" and "buffers" (LOAD_WEIGHTS: evaluation,
 * export, [model] init_from).  m's batchnorm count (tracked_base) becomes
 * the checkpoint's: with LOAD_WEIGHTS its micro-step count is added, as
 * the "step" buffer stays behind.
 * The "tensors" section must describe the same parameters as m (names,
 * shapes; at other offsets, a kiln's older layout of a tie naming a later
 * layer or the same model with other layers frozen, they are read by
 * name: checkpoint_layout.c), and each buffer's section have exactly its
 * length; when the optimizer slots are read (LOAD_ALL with m->state_d),
 * the checkpoint's trainable tensors must be m's (KILN_ECONFIG naming
 * one that is not: its slots hold the trainable tensors alone);
 * all of them are read and checked into host memory before the first byte
 * is copied to the device, so on failure m is unchanged.  Synchronises
 * `stream`. */
kiln_status kiln_ckpt_load_model(struct kiln_ckpt *ck, struct kiln_model *m, void *stream,
				 int what);

/* A resume on a rank that holds the slice [lo, hi) of the trainables alone
 * ([dist] pipeline, core/dist_pipe_ckpt.c): the "tensors" must describe m's
 * parameters (as kiln_ckpt_load_model's; [lo, hi) is m's layout, read by
 * name from another; with state, the trainable tensors m's); "params" [lo, hi) to
 * m->params_d + lo, "buffers" whole (every rank has them), each optimizer
 * slot's [lo, hi) to state + slot x (hi - lo) (state NULL: none), the
 * counters, m's batchnorm count (LOAD_ALL; LOAD_WEIGHTS: the parameters'
 * slice and the buffers alone, the batchnorm count as kiln_ckpt_load_model's,
 * for [model] init_from); read piece by piece (KILN_CKPT_PIECE_BYTES
 * of host memory).  The file's checksums were verified when it was opened;
 * a failure (a read error) may leave part of the slice loaded: the resume
 * fails. */
kiln_status kiln_ckpt_load_stage(struct kiln_ckpt *ck, struct kiln_model *m, void *stream,
				 size_t lo, size_t hi, float *state, int what);
/* How ck lays out m's tensors, for kiln_ckpt_load_slot, found once for
 * all the slots of a resume: its "tensors" checked as
 * kiln_ckpt_load_model's with the optimizer slots (the same tensors, the
 * same ones trainable: KILN_ECONFIG naming the first difference,
 * KILN_EDATA a malformed table); *lay NULL when as m's, else malloc'd
 * (the caller frees): each m->params[i]'s offset in ck. */
kiln_status kiln_ckpt_slot_layout(struct kiln_ckpt *ck, const struct kiln_model *m, size_t **lay);
/* Floats [lo, hi) of optimizer slot k (m->optim_info.slot_names[k],
 * n_trainable floats) to dst (device memory, float lo's place), piece by
 * piece as kiln_ckpt_load_stage reads: ZeRO-1's resume, whose ranks hold
 * no whole state (core/dist_zero.c; [0, n_trainable): the whole slot,
 * with [dist] pipeline a stage's slice; read by name where lay, the
 * kiln_ckpt_slot_layout of ck and m, says).  KILN_EDATA naming the file
 * when the section is missing or of another length. */
kiln_status kiln_ckpt_load_slot(struct kiln_ckpt *ck, struct kiln_model *m, const size_t *lay,
				int k, size_t lo, size_t hi, float *dst, void *stream);

/* Compare the checkpoint's resolved config text with `current` (both
 * kiln_config_write output), key by key in file order.  KILN_ECONFIG naming
 * the checkpoint and the first key that differs (both values).  For a
 * resume (weights_keys NULL) every key but those safe to change on resume
 * (kiln_ckpt_safe_key) and [run] fuse, which the trainer compares as
 * resolved for its device and model (core/train_ckpt.c resume_fuse);
 * values by meaning: by each key's schema type in cfg, the current
 * config (kiln_config_values_same: numbers as numbers, booleans by truth,
 * a built-in layer's pair keys as the pair get_pair reads, milestones as
 * their step counts, a layer plugin's keys by its schema; cfg NULL: none
 * of these), and the forms older kilns wrote (core/resume.c ckpt_same);
 * for the weights alone (eval, export) only the keys
 * that shape the stored tensors: those listed in weights_keys (the
 * checkpoint's "weights_keys" section; "" for a checkpoint without one)
 * and those kiln_ckpt_weights_keys picks from either text, less those this
 * kiln knows shape nothing (core/resume.c weightless_keys: an older
 * checkpoint listed the dropout rates).  A key the
 * checkpoint's text lacks (it was written by a kiln before the key
 * existed) is equal when its value here is what the key, not set, reads
 * as: its default in `defaults` (kiln_ckpt_config_defaults of the current
 * config; NULL: no such rule), or where that default is another key's
 * value (a pooling's stride, its kernel) that key's in the checkpoint's
 * text, as a fresh config resolves it. */
kiln_status kiln_ckpt_config_check(const char *path, const char *saved, const char *current,
				   const char *weights_keys, const char *defaults,
				   const struct kiln_config *cfg);
/* kiln_ckpt_config_check's comparison alone: *differs, and the first key
 * that differs into *d (config_diff.h), for a caller that words its own
 * message (core/weights.c: a weights file's [layer.*] sections). */
struct kiln_config_delta;
kiln_status kiln_ckpt_config_delta(const char *saved, const char *current, const char *wkeys,
				   const char *defaults, const struct kiln_config *cfg,
				   int *differs, struct kiln_config_delta *d);
/* The "section key" lines of the keys of a resolved config text that shape
 * the stored tensors: every key of [model] and the [layer.*] sections but
 * those that only say how to compute or where the first values come from
 * ([model] layout, init_from, init_strict; a layer's inplace, recompute,
 * dropout rate; core/resume.c weightless_keys).
 * malloc'd; NULL with KILN_ENOMEM set. */
char *kiln_ckpt_weights_keys(const char *config_text);
/* 1 when [section] key may differ between a checkpoint and the run that
 * resumes it: it changes neither the state nor the path of training. */
int kiln_ckpt_safe_key(const char *section, const char *key);

/* ---- a run's checkpoint directory ---------------------------------------- */

/* The newest checkpoint in `dir` (files ckpt-<step>.kiln) that verifies,
 * warning (log, naming the file and the fault) about each newer one that
 * does not.  A file whose header holds another step than its name is no
 * checkpoint of that step (kiln_ckpt_misnamed: warned of, skipped).
 * *out = NULL and KILN_OK when dir has no checkpoint (or does not exist);
 * KILN_EDATA when it has some but none verifies, or only misnamed ones. */
kiln_status kiln_ckpt_newest(const char *dir, struct kiln_ckpt **out);

/* The checkpoint whose weights `kiln eval` and `kiln export` use: `path`,
 * or (path NULL) the newest usable one in cfg's [run] out_dir/checkpoints,
 * whose name goes to dir[0..dir_len) for messages.  Its weights keys are
 * checked against cfg (kiln_ckpt_config_check).  *out = NULL and KILN_OK
 * when path is NULL and there is none (dir "" when [run] out_dir is
 * empty). */
kiln_status kiln_ckpt_open_weights(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   const char *path, struct kiln_ckpt **out, char *dir,
				   size_t dir_len);
/* The same for the checkpoint open on fd (borrowed: the checkpoint reads
 * a duplicate of it), named path: a file a command names, opened once
 * (kiln_given_open, core/trained.c). */
kiln_status kiln_ckpt_open_weights_fd(const struct kiln_config *cfg,
				      const struct kiln_registry *reg, const char *path, int fd,
				      struct kiln_ckpt **out);

/* The step of a checkpoint file name as kiln writes it: "ckpt-<step>.kiln"
 * (*tmp = 0) or "ckpt-<step>.kiln.tmp" (*tmp = 1), the step in %lld's
 * digits; -2 for a leading zero (ckpt-05.kiln is no name of kiln's: its
 * callers open and delete files by the step's name), -1 for any other
 * name.  Used for checkpoints/ and best/. */
int64_t kiln_ckpt_name_step(const char *name, int *tmp);

/* After a successful write of step `written`: delete all but the `keep`
 * newest ckpt-*.kiln at or below that step (keep = 0: keep all), so the
 * file just written always stays, and any leftover ckpt-*.kiln.tmp.  A
 * checkpoint above `written` is one a resume skipped as unusable (kiln's
 * lock keeps other runs out): it is neither counted nor deleted (before
 * session 32 it was counted, and a resume past a corrupt newest
 * checkpoint with keep_last = 1 deleted every file it wrote).  Nor is a
 * file whose header holds another step than its name (a copy, a rename:
 * kiln_ckpt_misnamed).  Failures to delete are logged, not returned. */
void kiln_ckpt_prune(const char *dir, int64_t keep, int64_t written);

#endif /* KILN_CHECKPOINT_H */
