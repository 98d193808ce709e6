/* core/profile.h - the profiler behind `[run] profile = 1` (`kiln train
 * --profile`); docs/profiler.md is the user's side.
 *
 * What is timed.  While a training step runs, the core's device wrapper
 * (core/device.c) times every op run and every copy: it synchronises the
 * stream, reads the clock, enqueues the op, synchronises the stream again
 * and reads the clock.  The device is therefore serialised: every span is
 * the op's own (self) time, and the overlap the device would have (copies
 * beside compute, a CPU stream worker beside the host) is lost.  The
 * trainer adds the host-side waits (loader data wait, inline reads) and
 * the step and phase boundaries; plan_run.c says which layer and pass is
 * running through a thread-local label.
 *
 * What comes out (kiln_profile_report): a table of self time per (layer,
 * op, pass) over the steps after the first (warm-up), logged and written to
 * out_dir/profile.txt, and a Chrome trace (Trace Event Format) of the first
 * [run] profile_steps steps in out_dir/trace.json.  A row's columns: calls,
 * total ms, mean us, % step, then median us (of up to 1024 calls kept a row,
 * a uniform reservoir sample past that) and min us (over every call).
 *
 * Off (profile = 0) nothing here runs: kiln_profile_open returns NULL and
 * the device wrapper's only cost is one NULL test per call.
 *
 * Threads: the recording functions take a lock; the label is per thread.
 */
#ifndef KILN_PROFILE_H
#define KILN_PROFILE_H

#include "internal.h"

#include <stdint.h>

struct kiln_profile;

/* Passes a span is attributed to: the trainer's phases (enum kiln_phase),
 * the log point (metrics read-back) and the forwards that gradient
 * checkpointing replays during the backward. */
enum { KILN_PROF_LOG = 5, KILN_PROF_NONE = 6, KILN_PROF_RECOMPUTE = 7, KILN_PROF_PASSES };

/* Trace tracks (the "tid" of trace.json) that are not device streams. */
enum {
	KILN_PROF_TRACK_STEP = 1,  /* one slice per step */
	KILN_PROF_TRACK_PHASE = 2, /* data, forward, backward, optimizer, log */
	KILN_PROF_TRACK_LAYER = 3, /* one slice per layer and pass (plan_run.c) */
	KILN_PROF_TRACK_WAIT = 4,  /* the training thread waiting for data */
	KILN_PROF_TRACK_STREAM = 10, /* first device stream; more follow */
	KILN_PROF_TRACK_STAGE = 100  /* pipeline stage 0's busy spans; more follow */
};
#define KILN_PROF_MAX_STAGES 64

/* [run] profile and profile_steps of cfg.  *out = NULL when profile = 0
 * (not an error).  The caller frees with kiln_profile_free. */
kiln_status kiln_profile_open(const struct kiln_config *cfg, struct kiln_profile **out);
void kiln_profile_free(struct kiln_profile *p);


/* The calling thread's current label: the layer (or trainer part) whose
 * ops run next, and its pass (KILN_PHASE_FORWARD, ...).  `name` is
 * borrowed until the label changes; NULL clears it (unlabelled ops are
 * attributed to the current phase). */
void kiln_profile_label(const char *name, int pass);

/* 1 while a step is being recorded: the device wrapper times (and
 * serialises) only then, so evaluation and set-up run at full speed. */
int kiln_profile_recording(const struct kiln_profile *p);

/* ---- the device wrapper (core/device.c) ---- */
/* A plan was prepared for an op of `op_type` / is being freed. */
void kiln_profile_plan(struct kiln_profile *p, const void *plan, int op_type);
void kiln_profile_plan_forget(struct kiln_profile *p, const void *plan);
/* One op run (`plan`) or copy (`kind`, enum kiln_copy_kind) on `stream`
 * took [t0, t1) ns, synchronisation included. */
void kiln_profile_op(struct kiln_profile *p, const void *plan, const void *stream, int64_t t0,
		     int64_t t1);
void kiln_profile_copy(struct kiln_profile *p, int kind, const void *stream, int64_t t0,
		       int64_t t1);

/* Attach p to dev (NULL detaches); dev's runs and copies are then timed
 * while p records.  Attach right after opening the device, so that every
 * plan's op type is known. */
void kiln_device_set_profile(struct kiln_device *dev, struct kiln_profile *p);
struct kiln_profile *kiln_device_profile(const struct kiln_device *dev);

/* ---- the trainer and the graph ---- */
/* Name a device stream's track ("compute stream"); `name` is copied. */
void kiln_profile_stream_name(struct kiln_profile *p, const void *stream, const char *name);
/* Bracket one training step; steps are counted from 1 (the first is the
 * warm-up, left out of the table). */
void kiln_profile_step(struct kiln_profile *p, int begin);
/* The run's optimizer steps done before the first profiled step (a
 * resumed run's: its checkpoint's step; 0 by default): the trace names
 * and tags its steps step0 + 1, step0 + 2, ..., as metrics.jsonl numbers
 * them (before session 40 a resumed run's trace began at "step 1").
 * p NULL: nothing. */
void kiln_profile_first_step(struct kiln_profile *p, int64_t step0);
/* The trainer's phase hook (enum kiln_phase, or KILN_PROF_LOG). */
void kiln_profile_phase(struct kiln_profile *p, int phase, int begin);
/* A host-side span that is a table row of its own (data wait, inline
 * reads): `label` and `what` are static strings. */
void kiln_profile_span(struct kiln_profile *p, const char *label, const char *what, int pass,
		       int track, int64_t t0, int64_t t1);
/* A layer's forward or backward (plan_run.c), on the layer track only: its
 * ops are the table's rows.  `layer` is borrowed for the call. */
void kiln_profile_layer(struct kiln_profile *p, const char *layer, int pass, int64_t t0,
			int64_t t1);

/* One forward or backward of a pipeline stage (core/pipe_timing.c), as
 * its stream ran it: a slice named `what` (copied) on the stage's trace
 * track, not a table row (its ops are those). */
void kiln_profile_stage(struct kiln_profile *p, int stage, const char *what, int pass,
			int64_t t0, int64_t t1);
/* A line printed after the table (the pipeline's busy times and bubble);
 * up to 8, each copied whole. */
void kiln_profile_note(struct kiln_profile *p, const char *line);

/* The table (logged, and out_dir/profile.txt) and out_dir/trace.json;
 * out_dir NULL or "" writes no files.  A rank other than 0
 * (kiln_profile_set_rank) writes profile.rank<R>.txt and trace.rank<R>.json,
 * so ranks sharing one out_dir keep each its own. */
kiln_status kiln_profile_report(struct kiln_profile *p, const char *out_dir);
/* At the start of a profiled run: KILN_EIO naming the file when one that
 * kiln_profile_report would write in out_dir (profile.txt, trace.json
 * with a trace) is a directory, which would fail the run only at its
 * end.  p NULL (not profiling) or no out_dir: KILN_OK. */
kiln_status kiln_profile_check_out(const struct kiln_profile *p, const char *out_dir);
/* The rank whose files kiln_profile_report writes (0 by default). */
void kiln_profile_set_rank(struct kiln_profile *p, int rank);

#endif
