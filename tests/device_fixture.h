/* tests/device_fixture.h - the fixture of the device conformance suites
 * (tests/check_device_*.c, one per op family).
 *
 * Each suite runs its device ops against straightforward reference loops.
 * The device is $KILN_TEST_DEVICE (default "cpu"); a suite exits 77
 * (skipped) when that device is not available here (dfx_probe).  Each test
 * runs twice (loop index = mode): mode 0 is the default config; mode 1, on
 * the cpu device, sets [plugin.cpu] async = 1 and [run] threads = 3, so
 * every stream has its own worker thread.
 *
 * Tests touch device memory only through copies, so they also hold for a
 * device whose memory the host cannot read.
 */
#ifndef KILN_TESTS_DEVICE_FIXTURE_H
#define KILN_TESTS_DEVICE_FIXTURE_H

#include <check.h>     /* Suite, TTest, ck_assert_* */
#include <kiln/kiln.h> /* registry, config, device wrappers */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* the device under test: $KILN_TEST_DEVICE, set by dfx_probe */
extern const char *g_name;

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s failed: %s", #x, kiln_last_error())

/* ---- fixture ---------------------------------------------------------- */

struct fx {
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *s;    /* the stream every helper uses */
	int async;  /* worker threads: cpu in mode 1 */
};

kiln_status fx_try_open(struct fx *f, int mode);
/* the same with one more config override (KEY=VALUE) on the cpu device */
kiln_status fx_try_open_with(struct fx *f, int mode, const char *cpu_override);
void fx_open(struct fx *f, int mode);
void fx_close(struct fx *f);

/* A device other than the reference may not implement an op family yet:
 * when it refuses the family's op with KILN_ENOTSUP at prepare (an empty op:
 * a device that has the op says KILN_EINVAL), the test is skipped with a
 * printed note.  Never on cpu: the reference device implements every op. */
int unsupported(struct fx *f, int type);

/* The same for one variant of an op the device has (a fused activation, a
 * u8 activation, ...): 1 (with a printed note naming WHAT and the device's
 * reason) when the device refuses OP itself with KILN_ENOTSUP at prepare,
 * as the core then plans the variant apart; 0 otherwise.  Never on cpu. */
int refused(struct fx *f, const struct kiln_op *op, const char *what);

#define SKIP_UNSUPPORTED(f, type)                                                         \
	do {                                                                              \
		if (unsupported((f), (type))) {                                           \
			fx_close(f);                                                      \
			return;                                                           \
		}                                                                         \
	} while (0)

/* A test (DFX_CASE(name) runs it in both modes) whose body, written after
 * it as a function's, gets the fixture f (struct fx *) opened in the
 * mode and closes nothing: the test closes f after the body returns.
 *     DFX_TEST(xent_wide)
 *     {
 *             xent_wide_case(f, 1040, 1030);
 *     }
 * A body skips an op family the device lacks with
 * `if (unsupported(f, type)) return;` (not SKIP_UNSUPPORTED, which
 * closes f). */
#define DFX_TEST(name)                                                                     \
	static void name##_body(struct fx *f);                                             \
	START_TEST(test_##name)                                                            \
	{                                                                                  \
		struct fx fx_;                                                             \
		fx_open(&fx_, _i);                                                         \
		name##_body(&fx_);                                                         \
		fx_close(&fx_);                                                            \
	}                                                                                  \
	END_TEST                                                                           \
	static void name##_body(struct fx *f)

/* Skip (77) when the device cannot be opened here, else 0: check_main's
 * setup of every device suite (sets g_name from $KILN_TEST_DEVICE). */
int dfx_probe(void);

/* A suite named "device" of these tests (up to { NULL }), each in a test
 * case of its name: DFX_CASE(gemm) runs test_gemm in both modes (loop index
 * 0 sync, 1 async), 120 s each; DFX_ONCE(x, 60) runs test_x once (it sets
 * up its own devices), 60 s. */
struct dfx_case {
	const char *name;
	const TTest *fn;
	int once_timeout; /* 0: both modes */
};
#define DFX_CASE(name) { #name, test_##name, 0 }
#define DFX_ONCE(name, timeout) { #name, test_##name, timeout }
Suite *dfx_suite(const struct dfx_case *cases);

/* A device test file's suite, make_device_AREA_suite() of these cases, and
 * check_main's description of it (tests/check_main.h). */
#define DEVICE_SUITE(area, ...)                                                            \
	static Suite *make_device_##area##_suite(void)                                    \
	{                                                                                  \
		return dfx_suite((const struct dfx_case[]){ __VA_ARGS__, { NULL, NULL, 0 } }); \
	}                                                                                  \
	static const struct check_main check_suite = { .suite = make_device_##area##_suite, \
						       .setup = dfx_probe }

/* ---- helpers ---------------------------------------------------------- */

/* Device buffer of `bytes`, filled from `h` when h is not NULL.  h must stay
 * unchanged until the next sync of f->s. */
void *dput(struct fx *f, const void *h, size_t bytes);
void dget(struct fx *f, void *h, const void *d, size_t bytes);
/* kiln_device_free of the n device buffers d[]; DFREE(f, a, b, ...) lists
 * them inline. */
void dfree_n(struct fx *f, void *const *d, size_t n);
#define DFREE(f, ...)                                                                     \
	dfree_n((f), (void *const[]){ __VA_ARGS__ },                                      \
		sizeof((void *const[]){ __VA_ARGS__ }) / sizeof(void *))
struct kiln_tensor_desc td(int dtype, int ndim, int64_t d0, int64_t d1);

/* Prepare, run once on f->s with a workspace of the size asked for, sync,
 * free.  Returns the first failing status (prepare, run or sync). */
kiln_status run_op(struct fx *f, const struct kiln_op *op, const void *const *in,
		   void *const *out);

/* Uniform in [-1, 1): one fixed sequence per process (each test forks). */
float frand(void);
float *frandv(size_t n);

/* |got - want| within rel of the magnitude that produced want. */
#define NEAR(got, want, mag, rel, ...)                                                    \
	ck_assert_msg(fabs((double)(got) - (double)(want)) <= (rel) * ((mag) + 1e-3),     \
		      __VA_ARGS__)

/* libkiln's op names (core/internal.h), exported for the messages */
const char *kiln_op_name(int type);

/* ---- convolutional ops: shared helpers -------------------------------- */

/* Reference tensors are kept in logical NCHW order; the device gets them in
 * the op's layout. */
struct kiln_tensor_desc td4(int64_t n, int64_t c, int64_t h, int64_t w, int nhwc);
/* Stored offset of logical element (n, c, h, w) of [N, C, H, W]. */
size_t at4(int nhwc, int C, int H, int W, int n, int c, int h, int w);
/* NCHW <-> stored order of a [N, C, H, W] tensor; to_stored 1: logical in
 * src, stored out. */
void restore(float *dst, const float *src, int N, int C, int H, int W, int nhwc,
	     int to_stored);
/* Device copy of logical [N,C,H,W] data h in the stored order. */
void *dput4(struct fx *f, const float *h, int N, int C, int H, int W, int nhwc, float **keep);
/* Logical [N,C,H,W] copy of device data d. */
float *dget4(struct fx *f, const void *d, int N, int C, int H, int W, int nhwc);
/* The device's aux_bytes for a prepared plan. */
size_t aux_bytes(struct fx *f, void *plan);

/* A convolution's geometry, and its op (CONV, CONV_BWD_DATA or the
 * filter gradient) for an output of OH x OW. */
struct conv_g {
	int N, C, O, H, W, KH, KW, sh, sw, ph, pw, dh, dw, g, bias;
};
void conv_op(struct kiln_op *op, int type, const struct conv_g *q, int OH, int OW, int nhwc);

/* ---- bf16 and f16 (docs/plugins.md, "Low-precision dtypes") ------------ */

uint16_t h_bf16(float f);
float h_wide(uint16_t h, int dt);       /* bf16 or f16 (dt) to f32 */
uint16_t h_round(float f, int dt);      /* f32 to bf16 or f16, nearest even */

#endif
