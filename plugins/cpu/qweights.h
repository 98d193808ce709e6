/* plugins/cpu/qweights.h - INT8 weights quantized and reordered once,
 * kept and shared by the plans that read them (see qweights.c; the
 * sharing: wshare.h).  Only files that include oneDNN include this. */
#ifndef KILN_CPU_QWEIGHTS_H
#define KILN_CPU_QWEIGHTS_H

#include "dnn.h"
#include "wshare.h"

/* What the quantized values depend on besides the f32 weights (engine
 * and host: what they are made with, not compared). */
struct cpu_qkey {
	int64_t O, per;   /* output channels, weights per channel */
	float sx, so;     /* the input's scale, the u8 output's (else 1) */
	int adj;          /* 2: oneDNN halves the weights (qconv.c's top) */
	int has_bias;
	dnnl_memory_desc_t w_user, w_kern; /* plain s8, the kernel's layout */
	dnnl_engine_t engine;
	const struct kiln_host *host;
};

/* One weight tensor quantized for one key (struct cpu_wkept's kind
 * cpu_qw_kind): its own plan's, or (frozen) every plan's of the context
 * that reads the same weights with the same key. */
struct cpu_qweights {
	struct cpu_wkept base; /* the values under base.lock */
	struct cpu_qkey k;
	float *w, *b;   /* not frozen: the f32 weights [O][per] and bias [O] it
			 * was made from (compared every run), else NULL;
			 * w, wq and wk cpu_huge_alloc's */
	int8_t *wq;     /* plain [O][per] (doubled where oneDNN halves them) */
	void *wk;       /* the kernel's layout; wq itself when that is plain */
	float *sc;      /* output scales [O] */
	float *bq;      /* the bias over the scales [O] (0 without a bias) */
	dnnl_primitive_t rw;    /* wq -> wk, or NULL */
	dnnl_memory_t mwp, mwk; /* its operands */
};

extern const struct cpu_wkind cpu_qw_kind;

/* r's entry holding w and b, made from them unless it holds them already
 * (cpu_wref_acquire; the entry is the listed one of w, b and the key for
 * a frozen plan), and locked for a run: cpu_wref_release after it.  On
 * failure not locked.  d: the plan whose stream runs the weights'
 * reorder.  The entry: (struct cpu_qweights *)r->e. */
kiln_status cpu_qw_acquire(struct cpu_wref *r, const float *w, const float *b, struct cpu_dnn *d,
			   const char *what, struct cpu_err *e);

#endif
