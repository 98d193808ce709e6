/* plugins/cpu/qweights.h - INT8 weights quantized and reordered once,
 * shared by the plans that read them (see qweights.c).  Only files that
 * include oneDNN include this. */
#ifndef KILN_CPU_QWEIGHTS_H
#define KILN_CPU_QWEIGHTS_H

#include "dnn.h"

/* What the quantized values depend on besides the f32 weights. */
struct cpu_qkey {
	int64_t O, per;   /* output channels, weights per channel */
	float sx, so;     /* the input's scale, the u8 output's (else 1) */
	int adj;          /* 2: oneDNN halves the weights (qconv.c's top) */
	int has_bias;
	dnnl_memory_desc_t w_user, w_kern; /* plain s8, the kernel's layout */
};

/* One weight tensor quantized for one key: its own plan's, or (frozen)
 * every plan's of the context that reads the same weights with the same
 * key (struct cpu_qshare's list). */
struct cpu_qweights {
	/* under the cpu_qshare's lock */
	struct cpu_qweights *next;
	int refs;                   /* plans holding it */
	int listed;                 /* in the list, found by w_src, b_src */
	const float *w_src, *b_src; /* the weights and bias it is made from */
	struct cpu_qkey k;
	int frozen;                 /* valid while *gen is made (no compare) */
	const uint64_t *gen;        /* the device's KILN_PROC_WEIGHTS_CHANGED count */
	const struct kiln_host *host;
	dnnl_engine_t engine;
	/* under lock: a run reads them holding it to read, a fill writes them
	 * holding it to write (cpu_qw_acquire) */
	pthread_rwlock_t lock;
	int valid;
	uint64_t made;  /* frozen: *gen when made */
	uint64_t ver;   /* fills so far (a plan remakes its primitive on a new one) */
	float *w, *b;   /* not frozen: the f32 weights [O][per] and bias [O] it
			 * was made from (compared every run), else NULL */
	int8_t *wq;     /* plain [O][per] (doubled where oneDNN halves them) */
	void *wk;       /* the kernel's layout; wq itself when that is plain */
	float *sc;      /* output scales [O] */
	float *bq;      /* the bias over the scales [O] (0 without a bias) */
	dnnl_primitive_t rw;    /* wq -> wk, or NULL */
	dnnl_memory_t mwp, mwk; /* its operands */
};

/* A new unlisted entry of one holder for k on engine e (no values yet);
 * NULL: out of memory (*s_out dnnl_success) or oneDNN's failure. */
struct cpu_qweights *cpu_qw_new(const struct cpu_qkey *k, int frozen, dnnl_engine_t e,
				const uint64_t *gen, const struct kiln_host *host,
				dnnl_status_t *s_out);
/* One holder fewer; freed with the last unless listed (then with its
 * weights' memory, cpu_qshare_freed, or the context). */
void cpu_qw_drop(struct cpu_qshare *sh, struct cpu_qweights *s);
/* A frozen plan's weights are w, b (their first run, or other pointers):
 * *sp becomes the listed entry of w, b and *sp's key (another plan's,
 * whose values are then not made again), or *sp itself listed under w, b
 * (values to be made), or a new one where *sp is another plan's too.
 * ENOMEM: *sp unchanged. */
kiln_status cpu_qw_attach(struct cpu_qshare *sh, struct cpu_qweights **sp, const float *w,
			  const float *b);
/* s holding w and b, made from them unless it holds them already, and
 * locked for a run (to read; to write where this call made the values):
 * cpu_qw_release after the run.  On failure (the reorder) not locked.
 * d: the plan whose stream runs the weights' reorder. */
kiln_status cpu_qw_acquire(struct cpu_qweights *s, const float *w, const float *b,
			   struct cpu_dnn *d, const char *what, struct cpu_err *e);
void cpu_qw_release(struct cpu_qweights *s);

#endif
