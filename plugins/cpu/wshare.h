/* plugins/cpu/wshare.h - what a plan makes of its weights (reordered,
 * transformed, quantized), kept from run to run and shared by the plans
 * that read the same weights (see wshare.c).  The kinds: qweights.c (INT8,
 * QCONV and QLINEAR), conv.c (oneDNN's blocked f32/bf16 weights), wino.c
 * (Winograd's transformed weights). */
#ifndef KILN_CPU_WSHARE_H
#define KILN_CPU_WSHARE_H

#include "cpu.h"

struct cpu_wkept;

/* What one kind of kept weights does; a static table per kind. */
struct cpu_wkind {
	const char *what; /* "INT8 weights", for messages */
	/* 1 when e holds the values of key k (the kind's own key struct) for
	 * the weights it is made from */
	int (*same_key)(const struct cpu_wkept *e, const void *k);
	/* A new entry for key k (frozen or not), no values yet (its base's
	 * fields are the caller's); NULL: out of memory (*lib 0), or the
	 * library's failure (*lib its status, nonzero). */
	struct cpu_wkept *(*make)(const void *k, int frozen, int *lib);
	void (*free)(struct cpu_wkept *e);
	/* Not frozen: 1 when e's values were made from w, b (compared); NULL
	 * for a kind that keeps frozen weights only. */
	int (*holds)(const struct cpu_wkept *e, const void *w, const void *b);
};

/* The base of every kind's entry (its first member). */
struct cpu_wkept {
	/* under the share's lock */
	struct cpu_wkept *next;
	int refs;                   /* plans holding it */
	int listed;                 /* in the list, found by w_src, b_src */
	const void *w_src, *b_src;  /* the weights and bias it is made from */
	/* fixed when made */
	const struct cpu_wkind *kind;
	int frozen;                 /* valid while no notice of new weights
				     * came for its source (no compare) */
	/* under lock: a run holds it to read, the run that makes the values
	 * to write (cpu_wref_acquire) */
	pthread_rwlock_t lock;
	int valid;
	uint64_t made;    /* frozen: the stamp of its weights' last notice
			   * when made (wshare.c, "Notices") */
	uint64_t filling; /* that stamp as the fill under way began */
	uint64_t ver;     /* fills so far (a plan remakes what depends on the values) */
};

/* A plan's hold on its kept weights.  The plan runs one run at a time
 * through it (its own lock: conv.c's cpu_dnn, qconv.c's cache, wino.c's). */
struct cpu_wref {
	struct cpu_wshare *sh;      /* the context's list */
	const struct cpu_wkind *kind;
	const void *key;            /* the plan's key (the kind's struct, in the plan) */
	int frozen;                 /* KILN_OPF_FROZEN and [plugin.cpu] keep_weights */
	const struct kiln_host *host;
	struct cpu_wkept *e;        /* NULL until made (frozen: the first run) */
	const void *w_at, *b_at;    /* the weights e was taken for */
	unsigned taken;             /* entries taken so far: a plan whose memory
				     * objects point into e points them anew when
				     * this moved on (a new e may lie where a
				     * freed one did) */
	/* the stamp of the weights at st_src as the list's epoch was
	 * st_epoch (st_src NULL: none read yet): while the epoch stays, a run
	 * takes it without the list's lock */
	const void *st_src;
	uint64_t st_epoch, st_gen;
};

/* r for a plan (no entry yet).  Not frozen: r's own entry, made now
 * (compared every run, never listed): KILN_ENOMEM, or KILN_EDEVICE with
 * *lib the library's status. */
kiln_status cpu_wref_init(struct cpu_wref *r, struct cpu_ctx *c, const struct cpu_wkind *kind,
			  const void *key, int frozen, int *lib);
/* The plan is freed: its entry held no more. */
void cpu_wref_drop(struct cpu_wref *r);
/* The plan ran on scratch weights (tune_time.c's timing): its next run
 * takes its entry anew. */
void cpu_wref_detach(struct cpu_wref *r);
/* A run reading w, b: r's entry taken (frozen: on the first run, or when
 * w, b moved: the listed entry of w, b and r's key, made where there is
 * none), then locked: *fill 0: it holds their values (locked to read); 1:
 * the caller makes them now (locked to write), then cpu_wref_filled.
 * Release with cpu_wref_release either way.  On failure not locked:
 * KILN_ENOMEM, or KILN_EDEVICE with *lib the library's status.  Inside a
 * cpu_wshare_private_begin section (lowp.c's inner plans, whose w is a
 * conversion in the workspace) a frozen r's entry is its own, never
 * listed, as before session 40, its notices those of the outer op's
 * weights. */
kiln_status cpu_wref_acquire(struct cpu_wref *r, const void *w, const void *b, int *fill, int *lib);
/* A frozen r that keeps its entry only for weights read before (gemm.c's
 * GEMM: the copy costs memory that a single run does not pay back): 1
 * when a run of such a plan (any of the context's) read the weights at w
 * before, with no notice of new weights there since; else 0, recorded
 * (the next run's answer is 1).  Forgotten with w's memory. */
int cpu_wref_seen(struct cpu_wref *r, const void *w);
/* The caller of an acquire that said fill made the values. */
void cpu_wref_filled(struct cpu_wref *r);
void cpu_wref_release(struct cpu_wref *r);

#endif
