/* bench/bench_ops.h - what the C benches of single kiln ops (drop_ops,
 * pool_ops, fftconv_ops, convthin_ops) share: the check of a kiln call,
 * the common options, a cpu device with one stream, a 4-d f32
 * description, a filled device buffer and one op on a device of its own
 * (bench_op).  A bench is a program: a failed call prints where and why
 * and exits 1 (only benches do that; kiln's code never exits).  The
 * clocks and the median's sort order are bench_time.h's. */
#ifndef KILN_BENCH_OPS_H
#define KILN_BENCH_OPS_H
#include <kiln/kiln.h>
#include "bench_time.h" /* cpu_now, now: bench_op_run */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A kiln call that returns non-zero ends the bench, naming the call. */
#define TRY(call)                                                                         \
	do {                                                                              \
		if ((call) != 0) {                                                        \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,     \
				kiln_last_error());                                       \
			exit(1);                                                          \
		}                                                                         \
	} while (0)

/* The options every op bench takes.  The caller sets the defaults first. */
struct bench_opts {
	int iters, batch, threads;
};

/* Reads argv[*i] (and its value) into o when it is one of --iters N,
 * --batch B, --threads T: 1 when it was (*i moved past the value), 0 when
 * not. */
static inline int bench_opt(int argc, char **argv, int *i, struct bench_opts *o)
{
	int *v = NULL;
	if (!strcmp(argv[*i], "--iters"))
		v = &o->iters;
	else if (!strcmp(argv[*i], "--batch"))
		v = &o->batch;
	else if (!strcmp(argv[*i], "--threads"))
		v = &o->threads;
	if (!v || *i + 1 >= argc)
		return 0;
	*v = atoi(argv[++*i]);
	return 1;
}

/* A cpu device with run.threads = threads and one stream. */
struct bench_cpu {
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *stream;
};

static inline void bench_cpu_open(struct bench_cpu *c, int threads)
{
	char ov[64];
	TRY(kiln_registry_open(NULL, &c->reg));
	TRY(kiln_config_new(&c->cfg));
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	TRY(kiln_config_override(c->cfg, ov));
	TRY(kiln_device_open(c->reg, c->cfg, "cpu", 0, &c->dev));
	TRY(kiln_device_stream_create(c->dev, &c->stream));
}

static inline void bench_cpu_close(struct bench_cpu *c)
{
	kiln_device_stream_destroy(c->dev, c->stream);
	kiln_device_close(c->dev);
	kiln_config_free(c->cfg);
	kiln_registry_close(c->reg);
}

/* An f32 [a,b,c,d] description in layout (KILN_NCHW, KILN_NHWC). */
static inline struct kiln_tensor_desc bench_d4(int64_t a, int64_t b, int64_t c, int64_t d, int layout)
{
	struct kiln_tensor_desc t;
	memset(&t, 0, sizeof t);
	t.dtype = KILN_F32, t.ndim = 4, t.layout = layout;
	t.dims[0] = a, t.dims[1] = b, t.dims[2] = c, t.dims[3] = d;
	return t;
}

/* n bytes of device memory (64 when n is 0) holding floats spread over
 * [-1, 1] by a fixed hash of their index. */
static inline void *bench_buf(struct kiln_device *dev, size_t n)
{
	void *p;
	TRY(kiln_device_alloc(dev, n ? n : 64, &p));
	for (size_t i = 0; i < n / 4; i++)
		((float *)p)[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
	return p;
}
/* One op on a cpu device of its own (fftconv_ops, convthin_ops): the
 * plan, a stream, inputs filled as bench_buf's values (bf16 tensors with
 * their top halves), outputs zeroed, the workspace; cpu and wall the
 * least process CPU and wall seconds of its runs (bench_op_run), from
 * 1e30. */
struct bench_op {
	struct kiln_device *dev;
	void *plan, *stream, *ws, *in[KILN_OP_MAX_IN], *out[KILN_OP_MAX_OUT];
	size_t wsb;
	double cpu, wall;
};

/* Opens b on run.threads = threads and the overrides ov[] (NULL-ended,
 * or NULL) and prepares op. */
static inline void bench_op_open(struct bench_op *b, struct kiln_registry *reg, int threads,
				 const char *const *ov, const struct kiln_op *op)
{
	struct kiln_config *cfg;
	char t[64];
	memset(b, 0, sizeof *b);
	b->cpu = b->wall = 1e30;
	TRY(kiln_config_new(&cfg));
	snprintf(t, sizeof t, "run.threads=%d", threads);
	TRY(kiln_config_override(cfg, t));
	for (int k = 0; ov && ov[k]; k++)
		TRY(kiln_config_override(cfg, ov[k]));
	TRY(kiln_device_open(reg, cfg, "cpu", 0, &b->dev));
	TRY(kiln_device_prepare(b->dev, op, &b->plan, &b->wsb));
	TRY(kiln_device_stream_create(b->dev, &b->stream));
	for (int k = 0; k < op->n_in; k++) {
		const size_t n = kiln_tensor_bytes(&op->in[k]);
		const int bf16 = op->in[k].dtype == KILN_BF16;
		TRY(kiln_device_alloc(b->dev, n ? n : 64, &b->in[k]));
		for (size_t i = 0; i < (bf16 ? n / 2 : n / 4); i++) {
			const float v = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
			uint32_t u;
			memcpy(&u, &v, 4);
			if (bf16)
				((uint16_t *)b->in[k])[i] = (uint16_t)(u >> 16);
			else
				((float *)b->in[k])[i] = v;
		}
	}
	for (int k = 0; k < op->n_out; k++) {
		const size_t n = kiln_tensor_bytes(&op->out[k]);
		TRY(kiln_device_alloc(b->dev, n ? n : 64, &b->out[k]));
		memset(b->out[k], 0, n);
	}
	if (b->wsb)
		TRY(kiln_device_alloc(b->dev, b->wsb, &b->ws));
	kiln_config_free(cfg);
}

/* One run of b's plan on args (b's workspace added), synchronised; its
 * times kept when least. */
static inline void bench_op_run_args(struct bench_op *b, const struct kiln_op_args *args)
{
	struct kiln_op_args a = *args;
	a.workspace = b->ws, a.workspace_bytes = b->wsb;
	const double c0 = cpu_now(), w0 = now();
	TRY(kiln_device_run(b->dev, b->plan, &a, b->stream));
	TRY(kiln_device_stream_sync(b->dev, b->stream));
	const double c = cpu_now() - c0, w = now() - w0;
	b->cpu = c < b->cpu ? c : b->cpu;
	b->wall = w < b->wall ? w : b->wall;
}

/* One run of b's plan on its own tensors. */
static inline void bench_op_run(struct bench_op *b)
{
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	for (int k = 0; k < KILN_OP_MAX_IN; k++)
		a.in[k] = b->in[k];
	for (int k = 0; k < KILN_OP_MAX_OUT; k++)
		a.out[k] = b->out[k];
	bench_op_run_args(b, &a);
}

static inline void bench_op_close(struct bench_op *b)
{
	for (int k = 0; k < KILN_OP_MAX_IN; k++)
		kiln_device_free(b->dev, b->in[k]);
	for (int k = 0; k < KILN_OP_MAX_OUT; k++)
		kiln_device_free(b->dev, b->out[k]);
	kiln_device_free(b->dev, b->ws);
	kiln_device_plan_free(b->dev, b->plan);
	kiln_device_stream_destroy(b->dev, b->stream);
	kiln_device_close(b->dev);
}
#endif
