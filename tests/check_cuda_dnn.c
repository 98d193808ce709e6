/* tests/check_cuda_dnn.c - the host-only logic of the CUDA device's
 * convolution (plugins/cuda/dnn_map.c), on any machine: cuDNN strides of
 * NCHW and NHWC against the layouts' address formulas, the geometry of the
 * three convolution ops, autotune keys, and the autotune cache file
 * (round trip, another device's file, corruption, truncation, save/load).
 */
#include "dnn_map.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* CRC32C, bitwise (the plugin uses the core's, through the host table) */
static uint32_t crc32c(uint32_t crc, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	crc = ~crc;
	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
	}
	return ~crc;
}

START_TEST(test_crc_reference)
{
	/* the CRC32C check value */
	ck_assert_uint_eq(crc32c(0, "123456789", 9), 0xe3069283u);
}
END_TEST

START_TEST(test_strides)
{
	const int64_t d[4] = { 2, 3, 4, 5 }; /* N C H W */
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		int64_t s[4];
		cuda_dnn_strides(d, nhwc, s);
		for (int64_t n = 0; n < 2; n++)
			for (int64_t c = 0; c < 3; c++)
				for (int64_t h = 0; h < 4; h++)
					for (int64_t w = 0; w < 5; w++) {
						const int64_t want = nhwc ? ((n * 4 + h) * 5 + w) * 3 + c
									  : ((n * 3 + c) * 4 + h) * 5 + w;
						const int64_t got = n * s[0] + c * s[1] + h * s[2] + w * s[3];
						ck_assert_int_eq(got, want);
					}
	}
	int64_t s[4];
	cuda_dnn_strides(d, 1, s);
	ck_assert_int_eq(s[0], 60);
	ck_assert_int_eq(s[1], 1);
	ck_assert_int_eq(s[2], 15);
	ck_assert_int_eq(s[3], 3);
}
END_TEST

static struct kiln_tensor_desc t1(int dt, int64_t a)
{
	struct kiln_tensor_desc t;
	memset(&t, 0, sizeof t);
	t.dtype = dt, t.ndim = 1, t.dims[0] = a;
	return t;
}

/* x [2,4,9,9] (NHWC), w [6,2,3,3] groups 2, stride 2, pad 1: y [2,6,5,5] */
static void conv_op(struct kiln_op *op, int type, int nhwc, int dt)
{
	const int L = nhwc ? KILN_NHWC : KILN_NCHW;
	const struct kiln_tensor_desc x = test_desc4(dt, 2, 4, 9, 9, L), y = test_desc4(dt, 2, 6, 5, 5, L);
	const struct kiln_tensor_desc w = test_desc4(type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : dt, 6, 2, 3, 3, KILN_ROW);
	memset(op, 0, sizeof *op);
	op->type = type;
	op->i[0] = op->i[1] = 2, op->i[2] = op->i[3] = 1, op->i[4] = op->i[5] = 1, op->i[6] = 2;
	if (type == KILN_OP_CONV)
		op->n_in = 3, op->n_out = 1, op->in[0] = x, op->in[1] = w, op->in[2] = t1(KILN_F32, 6),
		op->out[0] = y;
	else if (type == KILN_OP_CONV_BWD_DATA)
		op->n_in = 2, op->n_out = 1, op->in[0] = y, op->in[1] = w, op->out[0] = x;
	else
		op->n_in = 2, op->n_out = 2, op->in[0] = x, op->in[1] = y, op->out[0] = w,
		op->out[1] = t1(KILN_F32, 6);
}

START_TEST(test_geom)
{
	struct kiln_op op;
	struct cuda_conv_geom g;
	char why[200];
	/* which argument each tensor is, per op */
	static const struct {
		int type, x, w, y, b;
	} want[] = {
		{ KILN_OP_CONV, 0x000, 0x001, 0x100, 0x002 },
		{ KILN_OP_CONV_BWD_DATA, 0x100, 0x001, 0x000, -1 },
		{ KILN_OP_CONV_BWD_WEIGHTS, 0x000, 0x100, 0x001, 0x101 },
	};
	for (int k = 0; k < 3; k++) {
		conv_op(&op, want[k].type, 1, KILN_BF16);
		ck_assert_int_eq(cuda_conv_geom(&op, &g, why, sizeof why), 0);
		ck_assert_int_eq(g.arg_x, want[k].x);
		ck_assert_int_eq(g.arg_w, want[k].w);
		ck_assert_int_eq(g.arg_y, want[k].y);
		ck_assert_int_eq(g.arg_b, want[k].b);
		ck_assert_int_eq(g.bias, want[k].b >= 0);
		ck_assert_int_eq(g.nhwc, 1);
		ck_assert_int_eq(g.groups, 2);
		ck_assert_int_eq(g.x[1], 4);
		ck_assert_int_eq(g.w[1], 2);
		ck_assert_int_eq(g.y[2], 5);
		ck_assert_int_eq(g.stride[0], 2);
		ck_assert_int_eq(g.pad[1], 1);
		ck_assert_int_eq(g.dil[0], 1);
		ck_assert_int_eq(g.dt_x, KILN_BF16);
		ck_assert_int_eq(g.dt_w, want[k].type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : KILN_BF16);
		/* activations channels-last, weights OIHW */
		ck_assert_int_eq(g.xs[1], 1);
		ck_assert_int_eq(g.ys[1], 1);
		ck_assert_int_eq(g.ws[0], 18);
		ck_assert_int_eq(g.ws[3], 1);
	}
	/* groups 0 means 1 */
	conv_op(&op, KILN_OP_CONV, 0, KILN_F32);
	op.i[6] = 0;
	ck_assert_int_eq(cuda_conv_geom(&op, &g, why, sizeof why), 0);
	ck_assert_int_eq(g.groups, 1);
	ck_assert_int_eq(g.xs[3], 1);
	/* refused: a 3-d input, mixed layouts, not a convolution */
	conv_op(&op, KILN_OP_CONV, 0, KILN_F32);
	op.in[0].ndim = 3;
	ck_assert_int_eq(cuda_conv_geom(&op, &g, why, sizeof why), -1);
	ck_assert_ptr_nonnull(strstr(why, "4-d"));
	conv_op(&op, KILN_OP_CONV, 0, KILN_F32);
	op.out[0].layout = KILN_NHWC;
	ck_assert_int_eq(cuda_conv_geom(&op, &g, why, sizeof why), -1);
	op.type = KILN_OP_GEMM;
	ck_assert_int_eq(cuda_conv_geom(&op, &g, why, sizeof why), -1);
}
END_TEST

START_TEST(test_key)
{
	struct kiln_op op;
	struct cuda_conv_geom g;
	char why[200], k1[CUDA_ATC_KEY], k2[CUDA_ATC_KEY];
	conv_op(&op, KILN_OP_CONV_BWD_WEIGHTS, 1, KILN_BF16);
	ck_assert_int_eq(cuda_conv_geom(&op, &g, why, sizeof why), 0);
	cuda_conv_key(&g, 0, 1024, k1, sizeof k1);
	ck_assert_str_eq(k1, "CONV_BWD_WEIGHTS bf16/f32/bf16 NHWC x 2,4,9,9 w 6,2,3,3 s 2,2 p 1,1 d 1,1 g 2 b1 det0 ws 1024");
	/* everything the choice depends on changes the key */
	cuda_conv_key(&g, 1, 1024, k2, sizeof k2);
	ck_assert_str_ne(k1, k2);
	cuda_conv_key(&g, 0, 512, k2, sizeof k2);
	ck_assert_str_ne(k1, k2);
	conv_op(&op, KILN_OP_CONV_BWD_WEIGHTS, 0, KILN_BF16);
	cuda_conv_geom(&op, &g, why, sizeof why);
	cuda_conv_key(&g, 0, 1024, k2, sizeof k2);
	ck_assert_str_ne(k1, k2);
	/* truncation is snprintf's */
	char small[8];
	ck_assert_int_eq(cuda_conv_key(&g, 0, 1024, small, sizeof small), (int)strlen(k2));
	ck_assert_str_eq(small, "CONV_BW");
}
END_TEST

static void entry(struct cuda_atc_entry *e, const char *key, int64_t engine, uint32_t knobs)
{
	memset(e, 0, sizeof *e);
	snprintf(e->key, sizeof e->key, "%s", key);
	e->engine = engine;
	e->workspace = engine * 1000 + 7;
	e->ms = 0.25f * (float)engine;
	e->n_knobs = knobs;
	for (uint32_t k = 0; k < knobs; k++)
		e->knob_type[k] = (int32_t)(k + 1), e->knob_value[k] = -(int64_t)k * 3 + (1LL << 40);
}

static void fill(struct cuda_atc *a)
{
	struct cuda_atc_entry e;
	memset(a, 0, sizeof *a);
	snprintf(a->device, sizeof a->device, "NVIDIA H200 sm_90 132 SMs driver 13000 cudnn 91900");
	for (int i = 0; i < 40; i++) {
		char key[64];
		snprintf(key, sizeof key, "CONV key %d", i);
		entry(&e, key, i, (uint32_t)(i % 5));
		ck_assert_int_eq(cuda_atc_put(a, &e), 0);
	}
}

START_TEST(test_cache_roundtrip)
{
	struct cuda_atc a, b;
	uint8_t *buf;
	size_t len;
	char why[300];
	fill(&a);
	ck_assert_uint_eq(a.n, 40);
	/* put replaces an entry of the same key */
	struct cuda_atc_entry e;
	entry(&e, "CONV key 3", 99, 2);
	ck_assert_int_eq(cuda_atc_put(&a, &e), 0);
	ck_assert_uint_eq(a.n, 40);
	ck_assert_int_eq(cuda_atc_find(&a, "CONV key 3")->engine, 99);
	ck_assert_ptr_null(cuda_atc_find(&a, "CONV key 40"));

	ck_assert_int_eq(cuda_atc_encode(&a, crc32c, &buf, &len), 0);
	ck_assert_mem_eq(buf, "KILNATC1", 8);
	memset(&b, 0, sizeof b);
	strcpy(b.device, a.device);
	ck_assert_int_eq(cuda_atc_decode(&b, buf, len, crc32c, why, sizeof why), 0);
	ck_assert_uint_eq(b.n, a.n);
	for (size_t i = 0; i < a.n; i++) {
		const struct cuda_atc_entry *x = &a.e[i], *y = cuda_atc_find(&b, x->key);
		ck_assert_ptr_nonnull(y);
		ck_assert_int_eq(y->engine, x->engine);
		ck_assert_int_eq(y->workspace, x->workspace);
		ck_assert_float_eq(y->ms, x->ms);
		ck_assert_uint_eq(y->n_knobs, x->n_knobs);
		for (uint32_t k = 0; k < x->n_knobs; k++) {
			ck_assert_int_eq(y->knob_type[k], x->knob_type[k]);
			ck_assert_int_eq(y->knob_value[k], x->knob_value[k]);
		}
	}
	/* the same bytes again */
	uint8_t *buf2;
	size_t len2;
	ck_assert_int_eq(cuda_atc_encode(&b, crc32c, &buf2, &len2), 0);
	ck_assert_uint_eq(len2, len);
	ck_assert_mem_eq(buf2, buf, len);
	free(buf2);

	/* another GPU, driver or cuDNN: valid, not loaded, entries kept */
	struct cuda_atc c;
	memset(&c, 0, sizeof c);
	strcpy(c.device, "NVIDIA H200 sm_90 132 SMs driver 13000 cudnn 91901");
	ck_assert_int_eq(cuda_atc_decode(&c, buf, len, crc32c, why, sizeof why), 1);
	ck_assert_uint_eq(c.n, 0);
	ck_assert_ptr_nonnull(strstr(why, "cudnn 91900"));

	/* every single-byte corruption and every truncation is refused, and
	 * leaves what was loaded before */
	for (size_t i = 0; i < len; i++) {
		buf[i] ^= 0x5a;
		ck_assert_int_eq(cuda_atc_decode(&b, buf, len, crc32c, why, sizeof why), -1);
		buf[i] ^= 0x5a;
	}
	for (size_t l = 0; l < len; l++)
		ck_assert_int_eq(cuda_atc_decode(&b, buf, l, crc32c, why, sizeof why), -1);
	ck_assert_uint_eq(b.n, 40);
	free(buf);
	cuda_atc_clear(&a);
	cuda_atc_clear(&b);
}
END_TEST

/* a well-formed file (right checksum) whose fields lie is refused too */
START_TEST(test_cache_bad_fields)
{
	struct cuda_atc a, b;
	uint8_t *buf;
	size_t len;
	char why[300];
	memset(&a, 0, sizeof a);
	strcpy(a.device, "dev");
	struct cuda_atc_entry e;
	entry(&e, "k", 1, 1);
	cuda_atc_put(&a, &e);
	ck_assert_int_eq(cuda_atc_encode(&a, crc32c, &buf, &len), 0);
	/* header: magic 8, version 4, count 4, device 2+3; entry: key 2+1,
	 * engine 8, workspace 8, ms 4, knobs 4 */
	const size_t knobs_at = 8 + 4 + 4 + 2 + 3 + 2 + 1 + 8 + 8 + 4;
	memset(&b, 0, sizeof b);
	strcpy(b.device, "dev");
	buf[knobs_at] = CUDA_ATC_KNOBS + 1; /* too many knobs */
	const uint32_t crc = crc32c(0, buf, len - 4);
	for (int i = 0; i < 4; i++)
		buf[len - 4 + i] = (uint8_t)(crc >> (8 * i));
	ck_assert_int_eq(cuda_atc_decode(&b, buf, len, crc32c, why, sizeof why), -1);
	/* a newer format version: not ours, not corrupt */
	buf[knobs_at] = 1;
	buf[8] = 2;
	const uint32_t crc2 = crc32c(0, buf, len - 4);
	for (int i = 0; i < 4; i++)
		buf[len - 4 + i] = (uint8_t)(crc2 >> (8 * i));
	ck_assert_int_eq(cuda_atc_decode(&b, buf, len, crc32c, why, sizeof why), 1);
	ck_assert_ptr_nonnull(strstr(why, "version 2"));
	free(buf);
	cuda_atc_clear(&a);
}
END_TEST

START_TEST(test_cache_file)
{
	char dir[] = "/tmp/kiln_atc_XXXXXX", path[512], why[600];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/a/b/cudnn_autotune.bin", dir);
	struct cuda_atc a, b;
	fill(&a);
	memset(&b, 0, sizeof b);
	strcpy(b.device, a.device);
	/* missing: nothing loaded, no error */
	ck_assert_int_eq(cuda_atc_load(&b, path, crc32c, why, sizeof why), 0);
	ck_assert_uint_eq(b.n, 0);
	/* saved (directories created), loaded back */
	ck_assert_int_eq(cuda_atc_save(&a, path, crc32c, why, sizeof why), 0);
	ck_assert_int_eq(cuda_atc_load(&b, path, crc32c, why, sizeof why), 0);
	ck_assert_uint_eq(b.n, 40);
	ck_assert_int_eq(cuda_atc_find(&b, "CONV key 7")->engine, 7);
	/* a damaged file: an error naming it, entries kept */
	FILE *f = fopen(path, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, 30, SEEK_SET);
	fputc('!', f);
	fclose(f);
	ck_assert_int_eq(cuda_atc_load(&b, path, crc32c, why, sizeof why), -1);
	ck_assert_ptr_nonnull(strstr(why, path));
	ck_assert_ptr_nonnull(strstr(why, "checksum"));
	ck_assert_uint_eq(b.n, 40);
	/* no temporary file is left behind */
	char cmd[700];
	snprintf(cmd, sizeof cmd, "test -z \"$(ls %s/a/b | grep tmp)\"", dir);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
	cuda_atc_clear(&a);
	cuda_atc_clear(&b);
}
END_TEST

/* The cache's device string names the GPU model, not the unit: two ranks
 * on two H200s (or the next job on another one) read each other's file,
 * a MIG slice (fewer SMs), another driver or cuDNN do not. */
START_TEST(test_device_string)
{
	char dir[] = "/tmp/kiln_atc_XXXXXX", path[512], why[600];
	struct cuda_atc a, b;
	cuda_atc_device_string(a.device, sizeof a.device, "NVIDIA H200", 9, 0, 132, 13000, 91900);
	ck_assert_str_eq(a.device, "NVIDIA H200 sm_90 132 SMs driver 13000 cudnn 91900");
	cuda_atc_device_string(b.device, sizeof b.device, "NVIDIA H200", 9, 0, 16, 13000, 91900);
	ck_assert_str_ne(a.device, b.device);
	cuda_atc_device_string(b.device, sizeof b.device, "NVIDIA H200", 9, 0, 132, 13000, 91901);
	ck_assert_str_ne(a.device, b.device);
	/* rank 0 saves, rank 1 (same model) loads its entries */
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/cudnn_autotune.bin", dir);
	fill(&a);
	cuda_atc_device_string(a.device, sizeof a.device, "NVIDIA H200", 9, 0, 132, 13000, 91900);
	ck_assert_int_eq(cuda_atc_save(&a, path, crc32c, why, sizeof why), 0);
	memset(&b, 0, sizeof b);
	cuda_atc_device_string(b.device, sizeof b.device, "NVIDIA H200", 9, 0, 132, 13000, 91900);
	ck_assert_int_eq(cuda_atc_load(&b, path, crc32c, why, sizeof why), 0);
	ck_assert_uint_eq(b.n, a.n);
	unlink(path);
	rmdir(dir);
	cuda_atc_clear(&a);
	cuda_atc_clear(&b);
}
END_TEST

START_TEST(test_default_path)
{
	/* (the folder above the cache's must exist since session 35: kiln
	 * never makes HOME, plugins/common/cache_file.h) */
	char p[512], dir[] = "/tmp/kiln_atc_home_XXXXXX", want[600], xdg[600];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(xdg, sizeof xdg, "%s/cache", dir);
	setenv("XDG_CACHE_HOME", xdg, 1);
	ck_assert_int_eq(cuda_atc_default_path(p, sizeof p), 0);
	snprintf(want, sizeof want, "%s/cache/kiln/cudnn_autotune.bin", dir);
	ck_assert_str_eq(p, want);
	unsetenv("XDG_CACHE_HOME");
	setenv("HOME", dir, 1);
	ck_assert_int_eq(cuda_atc_default_path(p, sizeof p), 0);
	snprintf(want, sizeof want, "%s/.cache/kiln/cudnn_autotune.bin", dir);
	ck_assert_str_eq(p, want);
	setenv("HOME", "/nonexistent-kiln-home", 1);
	ck_assert_int_eq(cuda_atc_default_path(p, sizeof p), -1);
	unsetenv("HOME");
	ck_assert_int_eq(cuda_atc_default_path(p, sizeof p), -1);
	rmdir(dir);
}
END_TEST

static Suite *make_cuda_dnn_suite(void)
{
	Suite *s = suite_create("cuda_dnn");
	check_add_case(s, "map", 0, NULL, NULL, (const TTest *[]){
		test_crc_reference, test_strides, test_geom, test_key, NULL });
	check_add_case(s, "cache", 60, NULL, NULL, (const TTest *[]){
		test_cache_roundtrip, test_cache_bad_fields, test_cache_file, test_default_path,
		test_device_string, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cuda_dnn_suite };
