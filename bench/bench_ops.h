/* bench/bench_ops.h - what the C benches of single kiln ops (drop_ops,
 * pool_ops, fftconv_ops) share: the check of a kiln call, the common
 * options, a cpu device with one stream, a 4-d f32 description and a
 * filled device buffer.  A bench is a program: a failed call prints
 * where and why and exits 1 (only benches do that; kiln's code never
 * exits).  The clocks and the median's sort order are bench_time.h's. */
#ifndef KILN_BENCH_OPS_H
#define KILN_BENCH_OPS_H
#include <kiln/kiln.h>
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
#endif
