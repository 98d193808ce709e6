/* tests/device_fixture.c - the fixture and helpers of the device
 * conformance suites (tests/device_fixture.h says what each does).
 */
#include "device_fixture.h"

#include "plugins/common/half.h" /* bf16 and f16 conversions */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h> /* waitpid: the trial open of a GPU runs in a child */
#include <unistd.h>   /* fork, _exit */

const char *g_name = "cpu";

/* ---- fixture ---------------------------------------------------------- */

kiln_status fx_try_open(struct fx *f, int mode) { return fx_try_open_with(f, mode, NULL); }

kiln_status fx_try_open_with(struct fx *f, int mode, const char *cpu_override)
{
	kiln_status st;
	memset(f, 0, sizeof *f);
	if ((st = kiln_registry_open(NULL, &f->reg)) || (st = kiln_config_new(&f->cfg)))
		return st;
	if (cpu_override && !strcmp(g_name, "cpu") &&
	    (st = kiln_config_override(f->cfg, cpu_override)))
		return st;
	if (mode && !strcmp(g_name, "cpu")) {
		if ((st = kiln_config_override(f->cfg, "plugin.cpu.async=1")) ||
		    (st = kiln_config_override(f->cfg, "run.threads=3")))
			return st;
		f->async = 1;
	}
	if ((st = kiln_config_validate(f->cfg, f->reg)) ||
	    (st = kiln_device_open(f->reg, f->cfg, g_name, 0, &f->dev)))
		return st;
	return kiln_device_stream_create(f->dev, &f->s);
}

void fx_open(struct fx *f, int mode) { OK(fx_try_open(f, mode)); }

void fx_close(struct fx *f)
{
	kiln_device_stream_destroy(f->dev, f->s);
	kiln_device_close(f->dev);
	kiln_config_free(f->cfg);
	kiln_registry_close(f->reg);
}

int unsupported(struct fx *f, int type)
{
	if (!strcmp(g_name, "cpu"))
		return 0;
	struct kiln_op op;
	void *plan = NULL;
	memset(&op, 0, sizeof op);
	op.type = type;
	kiln_status st = kiln_device_prepare(f->dev, &op, &plan, NULL);
	if (plan)
		kiln_device_plan_free(f->dev, plan);
	if (st != KILN_ENOTSUP)
		return 0;
	printf("device '%s': skipping the tests of op type %d: %s\n", g_name, type,
	       kiln_last_error());
	fflush(stdout);
	return 1;
}

int refused(struct fx *f, const struct kiln_op *op, const char *what)
{
	if (!strcmp(g_name, "cpu"))
		return 0;
	void *plan = NULL;
	kiln_status st = kiln_device_prepare(f->dev, op, &plan, NULL);
	if (plan)
		kiln_device_plan_free(f->dev, plan);
	if (st != KILN_ENOTSUP)
		return 0;
	printf("device '%s': skipping %s: %s\n", g_name, what, kiln_last_error());
	fflush(stdout);
	return 1;
}

/* ---- helpers ---------------------------------------------------------- */

void *dput(struct fx *f, const void *h, size_t bytes)
{
	void *d;
	OK(kiln_device_alloc(f->dev, bytes, &d));
	if (h)
		OK(kiln_device_copy_async(f->dev, d, h, bytes, KILN_COPY_H2D, f->s));
	return d;
}

void dget(struct fx *f, void *h, const void *d, size_t bytes)
{
	OK(kiln_device_copy_async(f->dev, h, d, bytes, KILN_COPY_D2H, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
}

void dfree_n(struct fx *f, void *const *d, size_t n)
{
	for (size_t i = 0; i < n; i++)
		kiln_device_free(f->dev, d[i]);
}

struct kiln_tensor_desc td(int dtype, int ndim, int64_t d0, int64_t d1)
{
	struct kiln_tensor_desc d;
	int64_t dims[2] = { d0, d1 };
	kiln_tensor_desc_init(&d, dtype, ndim, dims);
	return d;
}

kiln_status run_op(struct fx *f, const struct kiln_op *op, const void *const *in,
		   void *const *out)
{
	void *plan = NULL, *ws = NULL;
	size_t wsb = 0;
	kiln_status st = kiln_device_prepare(f->dev, op, &plan, &wsb);
	if (st)
		return st;
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	for (int i = 0; i < op->n_in; i++)
		a.in[i] = in[i];
	for (int i = 0; i < op->n_out; i++)
		a.out[i] = out[i];
	a.workspace = ws;
	a.workspace_bytes = wsb;
	st = kiln_device_run(f->dev, plan, &a, f->s);
	if (!st)
		st = kiln_device_stream_sync(f->dev, f->s);
	kiln_device_plan_free(f->dev, plan);
	kiln_device_free(f->dev, ws);
	return st;
}

static uint64_t g_rng = 88172645463325252ull;

float frand(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (float)((g_rng >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

float *frandv(size_t n)
{
	float *v = malloc(n * sizeof *v);
	ck_assert_ptr_nonnull(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

/* ---- convolutional ops: shared helpers -------------------------------- */

struct kiln_tensor_desc td4(int64_t n, int64_t c, int64_t h, int64_t w, int nhwc)
{
	struct kiln_tensor_desc d;
	int64_t dims[4] = { n, c, h, w };
	kiln_tensor_desc_init(&d, KILN_F32, 4, dims);
	d.layout = nhwc ? KILN_NHWC : KILN_NCHW;
	return d;
}

size_t at4(int nhwc, int C, int H, int W, int n, int c, int h, int w)
{
	return nhwc ? (((size_t)n * H + h) * W + w) * C + c : (((size_t)n * C + c) * H + h) * W + w;
}

void restore(float *dst, const float *src, int N, int C, int H, int W, int nhwc,
	     int to_stored)
{
	size_t i = 0;
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			for (int h = 0; h < H; h++)
				for (int w = 0; w < W; w++, i++) {
					size_t s = at4(nhwc, C, H, W, n, c, h, w);
					if (to_stored)
						dst[s] = src[i];
					else
						dst[i] = src[s];
				}
}

void *dput4(struct fx *f, const float *h, int N, int C, int H, int W, int nhwc, float **keep)
{
	size_t n = (size_t)N * C * H * W;
	float *s = malloc(n * 4);
	restore(s, h, N, C, H, W, nhwc, 1);
	*keep = s; /* freed by the caller after the next sync */
	return dput(f, s, n * 4);
}

float *dget4(struct fx *f, const void *d, int N, int C, int H, int W, int nhwc)
{
	size_t n = (size_t)N * C * H * W;
	float *s = malloc(n * 4), *l = malloc(n * 4);
	dget(f, s, d, n * 4);
	restore(l, s, N, C, H, W, nhwc, 0);
	free(s);
	return l;
}

size_t aux_bytes(struct fx *f, void *plan)
{
	return kiln_device_aux_bytes(f->dev, plan);
}


void conv_op(struct kiln_op *op, int type, const struct conv_g *q, int OH, int OW, int nhwc)
{
	memset(op, 0, sizeof *op);
	op->type = type;
	struct kiln_tensor_desc x = td4(q->N, q->C, q->H, q->W, nhwc);
	struct kiln_tensor_desc y = td4(q->N, q->O, OH, OW, nhwc);
	struct kiln_tensor_desc w = td4(q->O, q->C / q->g, q->KH, q->KW, 0);
	w.layout = KILN_ROW;
	struct kiln_tensor_desc b = td(KILN_F32, 1, q->O, 0);
	if (type == KILN_OP_CONV) {
		op->n_in = q->bias ? 3 : 2, op->n_out = 1;
		op->in[0] = x, op->in[1] = w, op->in[2] = b, op->out[0] = y;
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		op->n_in = 2, op->n_out = 1;
		op->in[0] = y, op->in[1] = w, op->out[0] = x;
	} else {
		op->n_in = 2, op->n_out = q->bias ? 2 : 1;
		op->in[0] = x, op->in[1] = y, op->out[0] = w, op->out[1] = b;
	}
	op->i[0] = q->sh, op->i[1] = q->sw, op->i[2] = q->ph, op->i[3] = q->pw;
	op->i[4] = q->dh, op->i[5] = q->dw, op->i[6] = q->g;
}

/* ---- bf16 and f16 ----------------------------------------------------- */

uint16_t h_bf16(float f)
{
	return half_f32_bf16(f);
}

float h_wide(uint16_t h, int dt)
{
	return dt == KILN_F16 ? half_f16_f32(h) : half_bf16_f32(h);
}

uint16_t h_round(float f, int dt)
{
	return dt == KILN_F16 ? half_f32_f16(f) : half_f32_bf16(f);
}

/* ---- the suite -------------------------------------------------------- */

/* The trial open.  A GPU runtime must not be initialised in a process that
 * forks afterwards (CUDA is not fork-safe, and Check forks every test), so
 * for any device but the cpu it happens in a child of its own. */
int dfx_probe(void)
{
	const char *name = getenv("KILN_TEST_DEVICE");
	if (name && *name)
		g_name = name;
	if (!strcmp(g_name, "cpu")) {
		struct fx f;
		if (fx_try_open(&f, 0)) {
			printf("device '%s' not available, skipping: %s\n", g_name, kiln_last_error());
			return 77;
		}
		fx_close(&f);
		return 0;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		struct fx f;
		if (fx_try_open(&f, 0)) {
			printf("device '%s' not available, skipping: %s\n", g_name, kiln_last_error());
			fflush(stdout);
			_exit(77);
		}
		fx_close(&f);
		_exit(0);
	}
	int ws = 0;
	if (waitpid(pid, &ws, 0) < 0 || !WIFEXITED(ws)) {
		printf("device '%s': the trial open crashed\n", g_name);
		return 1;
	}
	if (WEXITSTATUS(ws))
		return WEXITSTATUS(ws);
	printf("device '%s' is available: running the conformance suite on it\n", g_name);
	return 0;
}

Suite *dfx_suite(const struct dfx_case *cases)
{
	Suite *s = suite_create("device");
	for (; cases->name; cases++) {
		TCase *tc = tcase_create(cases->name);
		if (cases->once_timeout) {
			tcase_set_timeout(tc, cases->once_timeout);
			tcase_add_test(tc, cases->fn);
		} else {
			tcase_set_timeout(tc, 120);
			tcase_add_loop_test(tc, cases->fn, 0, 2); /* _i: 0 sync, 1 async */
		}
		suite_add_tcase(s, tc);
	}
	return s;
}
