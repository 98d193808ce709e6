/* tests/check_safetensors.c - safetensors files (core/safetensors.c), model
 * weights in them (core/weights.c), [model] init_from and `kiln export`.
 *
 *   format    the writer's output read back (order, alignment, metadata,
 *             every dtype kiln has, scalars, empty tensors); corrupt files
 *             refused with messages naming file and tensor; tensors
 *             read with pread, a file cut short after open an error;
 *             a file too big to map: find KILN_EIO, then mapped once it fits
 *   weights   PyTorch -> kiln: tests/data/st_cnn_torch.safetensors (the
 *             state_dict of gen_safetensors_refs.py's Net) loaded with
 *             init_from into tests/data/st_cnn.ini's model gives PyTorch's
 *             eval-mode logits (st_cnn_io.safetensors) within rel 1e-4, in
 *             both layouts; save/load round trip; init_strict errors; F16,
 *             BF16 conversion; the trainer and `kiln export` read init_from
 *
 * The other direction (PyTorch loads kiln's export) is
 * tests/safetensors_torch.sh, which needs torch.
 *   CK_RUN_CASE=format tests/check_safetensors
 */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include "proc_io.h" /* proc_bytes_read */
#include <kiln/kiln.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>    /* open, AT_FDCWD */
#include <errno.h>
#include <sys/resource.h> /* setrlimit */
#include <sys/stat.h> /* utimensat */
#include <sys/wait.h>
#include <unistd.h>

#define REL 1e-4

static struct kiln_registry *reg;
static char tmpdir[900]; /* $TMPDIR/kiln-st-XXXXXX (st_setup) */
static const char *srcdir = ".";

static const char *tpath(const char *name)
{
	static char p[8][1024];
	static int k;
	char *s = p[k++ % 8];
	snprintf(s, sizeof p[0], "%s/%s", tmpdir, name);
	return s;
}

static const char *dpath(const char *name)
{
	static char p[4][1024];
	static int k;
	char *s = p[k++ % 4];
	snprintf(s, sizeof p[0], "%s/tests/data/%s", srcdir, name);
	return s;
}

static void write_bytes(const char *path, const void *buf, size_t n)
{
	FILE *f = fopen(path, "wb");
	ck_assert_msg(f != NULL, "cannot write %s", path);
	ck_assert(fwrite(buf, 1, n, f) == n);
	ck_assert(fclose(f) == 0);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot read %s", path);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *b = malloc(*n + 1);
	ck_assert(fread(b, 1, *n, f) == *n);
	fclose(f);
	return b;
}

static int has_synthetic(void)
{
	const struct kiln_plugin *p;
	if (kiln_registry_find(reg, KILN_PLUGIN_SOURCE, "synthetic", &p) == KILN_OK)
		return 1;
	fprintf(stderr, "check_safetensors: no synthetic source (built without loaders): skipped\n");
	return 0;
}

/* ---- the format ----------------------------------------------------------- */

START_TEST(test_roundtrip)
{
	const float w[6] = { 1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f };
	const int64_t scalar = -1234567890123ll;
	const uint8_t bytes[5] = { 1, 2, 3, 254, 255 };
	const uint16_t bf[3] = { 0x3f80, 0xc040, 0x0001 };
	const int64_t wd[2] = { 2, 3 }, bd[1] = { 5 }, fd[1] = { 3 }, ed[2] = { 4, 0 };
	struct kiln_safetensors_writer *wr;
	ck_assert_int_eq(kiln_safetensors_writer_new(&wr), KILN_OK);
	/* added in no particular order: written I64, F32, I32, BF16, U8 */
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "c.bytes", KILN_U8, 1, bd, bytes), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "b.weight", KILN_F32, 2, wd, w), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "e.empty", KILN_I32, 2, ed, NULL), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "a.scalar", KILN_I64, 0, NULL, &scalar), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "d.bf", KILN_BF16, 1, fd, bf), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "b.weight", KILN_F32, 2, wd, w), KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "__metadata__", KILN_F32, 2, wd, w),
			 KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "", KILN_F32, 2, wd, w), KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_writer_meta(wr, "note", "a \"quoted\" value"), 0);
	ck_assert_int_eq(kiln_safetensors_writer_meta(wr, "k", "v1"), 0);
	ck_assert_int_eq(kiln_safetensors_writer_meta(wr, "k", "v"), 0);
	ck_assert_int_eq(kiln_safetensors_writer_write(wr, tpath("rt.safetensors")), KILN_OK);
	/* a directory that does not exist: KILN_EIO naming the file */
	ck_assert_int_eq(kiln_safetensors_writer_write(wr, tpath("nodir/x.safetensors")), KILN_EIO);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "nodir/x.safetensors"));
	kiln_safetensors_writer_free(wr);

	size_t n;
	unsigned char *raw = read_bytes(tpath("rt.safetensors"), &n);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | raw[i];
	ck_assert_int_eq(hl % 8, 0);
	ck_assert_int_eq(n, 8 + hl + 8 + 24 + 0 + 6 + 5);
	ck_assert_int_eq(raw[8], '{');
	free(raw);

	struct kiln_safetensors *f;
	ck_assert_msg(kiln_safetensors_open(tpath("rt.safetensors"), &f) == KILN_OK, "%s",
		      kiln_last_error());
	static const char *order[] = { "a.scalar", "b.weight", "e.empty", "d.bf", "c.bytes" };
	ck_assert_int_eq(kiln_safetensors_count(f), 5);
	for (int i = 0; i < 5; i++) {
		struct kiln_safetensors_tensor t;
		kiln_safetensors_get(f, i, &t);
		ck_assert_str_eq(t.name, order[i]);
		/* each tensor aligned to its element size in the file */
		size_t es = kiln_dtype_size(t.dtype);
		ck_assert_int_eq((uintptr_t)t.data % es, 0);
	}
	struct kiln_safetensors_tensor t;
	ck_assert_int_eq(kiln_safetensors_find(f, "b.weight", &t), KILN_OK);
	ck_assert_str_eq(t.dtype_name, "F32");
	ck_assert_int_eq(t.dtype, KILN_F32);
	ck_assert_int_eq(t.ndim, 2);
	ck_assert_int_eq(t.dims[0], 2);
	ck_assert_int_eq(t.dims[1], 3);
	ck_assert_int_eq(t.numel, 6);
	ck_assert_int_eq(t.bytes, sizeof w);
	ck_assert_int_eq(memcmp(t.data, w, sizeof w), 0);
	ck_assert_int_eq(kiln_safetensors_find(f, "a.scalar", &t), KILN_OK);
	ck_assert_str_eq(t.dtype_name, "I64");
	ck_assert_int_eq(t.ndim, 0);
	ck_assert_int_eq(t.numel, 1);
	ck_assert_int_eq(memcmp(t.data, &scalar, 8), 0);
	ck_assert_int_eq(kiln_safetensors_find(f, "c.bytes", &t), KILN_OK);
	ck_assert_int_eq(t.dtype, KILN_U8);
	ck_assert_int_eq(memcmp(t.data, bytes, 5), 0);
	ck_assert_int_eq(kiln_safetensors_find(f, "d.bf", &t), KILN_OK);
	ck_assert_str_eq(t.dtype_name, "BF16");
	ck_assert_int_eq(memcmp(t.data, bf, 6), 0);
	ck_assert_int_eq(kiln_safetensors_find(f, "e.empty", &t), KILN_OK);
	ck_assert_int_eq(t.numel, 0);
	ck_assert_int_eq(t.bytes, 0);
	ck_assert_int_eq(kiln_safetensors_find(f, "nope", &t), KILN_ENOTFOUND);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "rt.safetensors"));
	ck_assert_str_eq(kiln_safetensors_meta(f, "k"), "v");
	ck_assert_str_eq(kiln_safetensors_meta(f, "note"), "a \"quoted\" value");
	ck_assert_ptr_null(kiln_safetensors_meta(f, "format"));
	kiln_safetensors_close(f);

	/* a file without tensors or metadata: "{}" padded */
	ck_assert_int_eq(kiln_safetensors_writer_new(&wr), 0);
	ck_assert_int_eq(kiln_safetensors_writer_write(wr, tpath("empty.safetensors")), 0);
	kiln_safetensors_writer_free(wr);
	ck_assert_int_eq(kiln_safetensors_open(tpath("empty.safetensors"), &f), KILN_OK);
	ck_assert_int_eq(kiln_safetensors_count(f), 0);
	kiln_safetensors_close(f);
}
END_TEST

/* The file of test_read and test_rewritten at p: "a", F32 [3000], then
 * "b", F32 [5]. */
static void write_ab(const char *p, const float a[3000], const float b[5])
{
	const int64_t ad[1] = { 3000 }, bd[1] = { 5 };
	struct kiln_safetensors_writer *wr;
	ck_assert_int_eq(kiln_safetensors_writer_new(&wr), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "a", KILN_F32, 1, ad, a), 0);
	ck_assert_int_eq(kiln_safetensors_writer_add(wr, "b", KILN_F32, 1, bd, b), 0);
	ck_assert_int_eq(kiln_safetensors_writer_write(wr, p), 0);
	kiln_safetensors_writer_free(wr);
}

/* kiln_safetensors_read: each tensor's bytes as `data` has them, through
 * pread from the file open since kiln_safetensors_open: the file renamed
 * over or removed since changes nothing; cut short since, the tensors
 * past the cut are KILN_EDATA naming the file, the tensor and the sizes,
 * and those before it too, the file's size no longer the one opened
 * (test_rewritten; before session 40 they read).  (Through `data`, a
 * tensor past the cut would be SIGBUS: kiln's loaders read before session
 * 39 that way.) */
START_TEST(test_read)
{
	float a[3000], b[5];
	for (int i = 0; i < 3000; i++)
		a[i] = (float)i * 0.5f - 7;
	for (int i = 0; i < 5; i++)
		b[i] = -(float)i;
	const char *p = tpath("rd.safetensors");
	write_ab(p, a, b);
	size_t n;
	unsigned char *raw = read_bytes(p, &n);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | raw[i];
	free(raw);

	struct kiln_safetensors *f;
	struct kiln_safetensors_tensor t;
	float got[3000];
	ck_assert_msg(kiln_safetensors_open(p, &f) == KILN_OK, "%s", kiln_last_error());
	const int ia = kiln_safetensors_index(f, "a"), ib = kiln_safetensors_index(f, "b");
	ck_assert_int_eq(ia, 0);
	ck_assert_int_eq(ib, 1);
	ck_assert_int_eq(kiln_safetensors_index(f, "c"), -1);
	ck_assert_int_eq(kiln_safetensors_index(NULL, "a"), -1);
	ck_assert_int_eq(kiln_safetensors_index(f, NULL), -1);
	kiln_safetensors_get(f, ia, &t);
	ck_assert_int_eq(kiln_safetensors_read(f, ia, got, sizeof got), KILN_OK);
	ck_assert(!memcmp(got, a, sizeof a) && !memcmp(t.data, a, sizeof a));
	ck_assert_int_eq(kiln_safetensors_read(f, ib, got, sizeof b), KILN_OK);
	ck_assert(!memcmp(got, b, sizeof b));
	/* a buffer too small, no such tensor, NULL: KILN_EINVAL */
	ck_assert_int_eq(kiln_safetensors_read(f, ib, got, sizeof b - 1), KILN_EINVAL);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "tensor 'b' is 20 bytes, the buffer holds 19"));
	ck_assert_int_eq(kiln_safetensors_read(f, 2, got, sizeof got), KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_read(f, -1, got, sizeof got), KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_read(NULL, 0, got, sizeof got), KILN_EINVAL);
	ck_assert_int_eq(kiln_safetensors_read(f, 0, NULL, sizeof got), KILN_EINVAL);

	/* another file renamed over the path, then the path removed: the
	 * file opened is read */
	write_bytes(tpath("other"), "not safetensors", 15);
	ck_assert_int_eq(rename(tpath("other"), p), 0);
	ck_assert_int_eq(kiln_safetensors_read(f, ia, got, sizeof got), KILN_OK);
	ck_assert(!memcmp(got, a, sizeof a));
	ck_assert_int_eq(unlink(p), 0);
	ck_assert_int_eq(kiln_safetensors_read(f, ib, got, sizeof got), KILN_OK);
	ck_assert(!memcmp(got, b, sizeof b));
	kiln_safetensors_close(f);

	/* cut after open, 4 bytes into "b" (a page past "a"'s start) */
	write_ab(p, a, b);
	ck_assert_int_eq(kiln_safetensors_open(p, &f), KILN_OK);
	const long long cut = (long long)(8 + hl + sizeof a + 4);
	ck_assert_int_eq(truncate(p, (off_t)cut), 0);
	/* "a" is all there, but the file is no longer the one opened
	 * (session 40: its bytes were taken before) */
	ck_assert_int_eq(kiln_safetensors_read(f, ia, got, sizeof got), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "changed while kiln read it (tensor 'a')"), "%s",
		      kiln_last_error());
	ck_assert_int_eq(kiln_safetensors_read(f, ib, got, sizeof got), KILN_EDATA);
	char want[600];
	snprintf(want, sizeof want, "%s: tensor 'b' (bytes %llu..%llu): only 4 of 20 bytes are there: the file had %zu bytes when kiln opened it, it has %lld now (was it truncated or rewritten while kiln read it?)",
		 p, (unsigned long long)(8 + hl + sizeof a), (unsigned long long)(8 + hl + sizeof a + 19),
		 n, cut);
	ck_assert_str_eq(kiln_last_error(), want);
	ck_assert_int_eq(truncate(p, 0), 0);
	ck_assert_int_eq(kiln_safetensors_read(f, ia, got, sizeof got), KILN_EDATA);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "tensor 'a' (bytes"));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "only 0 of 12000 bytes are there"));
	kiln_safetensors_close(f);
}
END_TEST

/* Is `path` mapped into this process (a line of /proc/self/maps)? */
static int mapped(const char *path)
{
	char line[4096];
	int yes = 0;
	FILE *m = fopen("/proc/self/maps", "r");
	ck_assert(m != NULL);
	while (!yes && fgets(line, sizeof line, m))
		yes = strstr(line, path) != NULL;
	fclose(m);
	return yes;
}

/* p's modification time set to 2000-01-01 00:00:00 UTC: a rewrite now
 * changes it, however coarse the file system's clock. */
static void set_old_mtime(const char *p)
{
	const struct timespec t[2] = { { 946684800, 0 }, { 946684800, 0 } };
	ck_assert_int_eq(utimensat(AT_FDCWD, p, t, 0), 0);
}

/* A file rewritten in place while a reader has it open (a truncate-then-
 * write to at least its old size, as `cp` or safetensors.torch.save_file
 * over the same path do): kiln_safetensors_read reads whole, but the
 * file's size or modification time is no longer what open saw, and the
 * read is KILN_EDATA naming the file and both (session 40: before, the
 * new bytes were read at the old header's offsets and returned KILN_OK).
 * And the reader maps the file only once `data` is asked for
 * (kiln_safetensors_get): open and read map nothing (before session 40
 * every open mapped the file whole, and failed where the address space
 * could not hold it: tests/st_vmem.sh). */
START_TEST(test_rewritten)
{
	float a[3000], b[5], nb[5], got[3000];
	for (int i = 0; i < 3000; i++)
		a[i] = (float)i;
	for (int i = 0; i < 5; i++) {
		b[i] = (float)i + 0.5f;
		nb[i] = -b[i];
	}
	const char *p = tpath("rw.safetensors");
	write_ab(p, a, b);
	size_t n;
	free(read_bytes(p, &n));
	char want[1200];

	/* 1. the same size, "b" rewritten: its new bytes would be read */
	set_old_mtime(p);
	struct kiln_safetensors *f;
	struct kiln_safetensors_tensor t;
	ck_assert_msg(kiln_safetensors_open(p, &f) == KILN_OK, "%s", kiln_last_error());
	const int ia = kiln_safetensors_index(f, "a"), ib = kiln_safetensors_index(f, "b");
	ck_assert_int_eq(kiln_safetensors_read(f, ia, got, sizeof got), KILN_OK);
	ck_assert(!memcmp(got, a, sizeof a));
	ck_assert_msg(!mapped(p), "open and read mapped %s", p);
	kiln_safetensors_get(f, ib, &t);
	ck_assert_msg(mapped(p), "kiln_safetensors_get did not map %s", p);
	ck_assert(t.data != NULL && !memcmp(t.data, b, sizeof b));
	int fd = open(p, O_WRONLY);
	ck_assert(fd >= 0);
	ck_assert_int_eq(pwrite(fd, nb, sizeof nb, (off_t)(n - sizeof nb)), (ssize_t)sizeof nb);
	ck_assert_int_eq(close(fd), 0);
	ck_assert_int_eq(kiln_safetensors_read(f, ib, got, sizeof got), KILN_EDATA);
	snprintf(want, sizeof want, "%s: changed while kiln read it (tensor 'b'): it had %zu bytes, modified at 946684800.000000000, when kiln opened it, and has %zu bytes, modified at ",
		 p, n, n);
	ck_assert_msg(!strncmp(kiln_last_error(), want, strlen(want)), "%s", kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), ", now (rewritten in place?); run again once it is written whole"),
		      "%s", kiln_last_error());
	kiln_safetensors_close(f);

	/* 2. grown (its old modification time put back: the size alone
	 * tells) */
	set_old_mtime(p);
	ck_assert_msg(kiln_safetensors_open(p, &f) == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(truncate(p, (off_t)(n + 8)), 0);
	set_old_mtime(p);
	ck_assert_int_eq(kiln_safetensors_read(f, ia, got, sizeof got), KILN_EDATA);
	snprintf(want, sizeof want, "%s: changed while kiln read it (tensor 'a'): it had %zu bytes, modified at 946684800.000000000, when kiln opened it, and has %zu bytes, modified at 946684800.000000000, now",
		 p, n, n + 8);
	ck_assert_msg(!strncmp(kiln_last_error(), want, strlen(want)), "%s", kiln_last_error());
	kiln_safetensors_close(f);
}
END_TEST

/* A file of an 8-byte length (`len`, or the header's when len < 0), the
 * header text padded with spaces to a multiple of 8, and `data` zero bytes. */
static const char *raw_file(const char *name, const char *hdr, long long len, size_t data)
{
	size_t h = strlen(hdr), hp = (h + 7) & ~(size_t)7;
	unsigned char *b = calloc(8 + hp + data + 1, 1);
	uint64_t l = len < 0 ? hp : (uint64_t)len;
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(l >> (8 * i));
	memcpy(b + 8, hdr, h);
	memset(b + 8 + h, ' ', hp - h);
	const char *p = tpath(name);
	write_bytes(p, b, 8 + hp + data);
	free(b);
	return p;
}

/* What test_map_fails's child saw. */
struct map_seen {
	int open_st, limited, find_st, find_data_null;
	size_t find_bytes;
	int get_data_null;
	int again_st, again_same;
	char find_msg[600], get_msg[600];
};

/* The address space this process uses, in bytes (/proc/self/statm). */
static size_t vm_bytes(void)
{
	unsigned long pages = 0;
	FILE *s = fopen("/proc/self/statm", "r");
	if (s) {
		if (fscanf(s, "%lu", &pages) != 1)
			pages = 0;
		fclose(s);
	}
	return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* test_map_fails's child: the reader opened, RLIMIT_AS 256 MiB above what
 * it uses, "a" found (the whole file mapped: it cannot be), the limit put
 * back and "a" found again. */
static void map_child(const char *p, const float a[4], struct map_seen *r)
{
	struct kiln_safetensors *f;
	struct kiln_safetensors_tensor t;
	struct rlimit old, low;
	memset(r, 0, sizeof *r);
	r->open_st = kiln_safetensors_open(p, &f);
	if (r->open_st || getrlimit(RLIMIT_AS, &old))
		return;
	low = old;
	low.rlim_cur = (rlim_t)(vm_bytes() + ((size_t)256 << 20));
	if (setrlimit(RLIMIT_AS, &low))
		return;
	r->limited = 1;
	r->find_st = kiln_safetensors_find(f, "a", &t);
	r->find_data_null = t.data == NULL;
	r->find_bytes = t.bytes;
	snprintf(r->find_msg, sizeof r->find_msg, "%s", kiln_last_error());
	(void)kiln_safetensors_find(f, "nope", &t); /* another message first */
	kiln_safetensors_get(f, 0, &t);
	r->get_data_null = t.data == NULL;
	snprintf(r->get_msg, sizeof r->get_msg, "%s", kiln_last_error());
	setrlimit(RLIMIT_AS, &old);
	r->again_st = kiln_safetensors_find(f, "a", &t);
	r->again_same = t.data && !memcmp(t.data, a, 4 * sizeof(float));
	kiln_safetensors_close(f);
}

/* A file the address space cannot map (a 1 GiB tensor, stored as a hole,
 * under an RLIMIT_AS 256 MiB above what the process uses): open maps
 * nothing and succeeds; kiln_safetensors_find is KILN_EIO, "PATH: cannot
 * map: Cannot allocate memory", and kiln_safetensors_get sets the same
 * message, `data` NULL; once the limit is raised, find maps the file and
 * `data` holds the tensor.  Session 40's review: before, find returned
 * KILN_OK with `data` NULL and no message, and the failure was kept, so no
 * later call mapped.  In a child process, so that the limit cannot outlive
 * the test whatever Check's fork mode (CK_FORK=no). */
START_TEST(test_map_fails)
{
	const float a[4] = { 1.5f, -2.0f, 3.25f, 4.0f };
	const size_t big = (size_t)1 << 30;
	char hdr[300];
	snprintf(hdr, sizeof hdr,
		 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		 "\"big\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[16,%zu]}}",
		 big, big + 16);
	const char *p = raw_file("map.safetensors", hdr, -1, sizeof a);
	size_t n;
	free(read_bytes(p, &n));
	int fd = open(p, O_WRONLY);
	ck_assert(fd >= 0);
	ck_assert_int_eq(pwrite(fd, a, sizeof a, (off_t)(n - sizeof a)), (ssize_t)sizeof a);
	ck_assert_int_eq(ftruncate(fd, (off_t)(n + big)), 0);
	ck_assert_int_eq(close(fd), 0);

	int pipefd[2];
	ck_assert_int_eq(pipe(pipefd), 0);
	const pid_t pid = fork();
	ck_assert(pid >= 0);
	if (pid == 0) {
		struct map_seen r;
		close(pipefd[0]);
		map_child(p, a, &r);
		_exit(write(pipefd[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
	}
	close(pipefd[1]);
	struct map_seen r;
	const ssize_t got = read(pipefd[0], &r, sizeof r);
	close(pipefd[0]);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	ck_assert_int_eq(got, (ssize_t)sizeof r);
	unlink(p);

	char want[1200];
	snprintf(want, sizeof want, "%s: cannot map: %s", p, strerror(ENOMEM));
	ck_assert_int_eq(r.open_st, KILN_OK);
	ck_assert_msg(r.limited, "the child could not set RLIMIT_AS");
	ck_assert_msg(r.find_st == KILN_EIO, "find under the limit: status %d, data %s, message '%s'",
		      r.find_st, r.find_data_null ? "NULL" : "set", r.find_msg);
	ck_assert(r.find_data_null);
	ck_assert_uint_eq(r.find_bytes, sizeof a); /* described all the same */
	ck_assert_str_eq(r.find_msg, want);
	ck_assert(r.get_data_null);
	ck_assert_str_eq(r.get_msg, want);
	ck_assert_msg(r.again_st == KILN_OK && r.again_same,
		      "find after the limit was raised: status %d, data %s", r.again_st,
		      r.again_same ? "right" : "NULL or wrong");
}
END_TEST

/* open(path) fails with `st`, its message names the file and has every
 * fragment of the NULL-terminated list. */
static void refused(const char *path, kiln_status st, ...)
{
	struct kiln_safetensors *f = NULL;
	kiln_status got = kiln_safetensors_open(path, &f);
	ck_assert_msg(got == st, "%s: status %d, expected %d (%s)", path, got, st, kiln_last_error());
	ck_assert_ptr_null(f);
	const char *msg = kiln_last_error();
	ck_assert_msg(strstr(msg, path) != NULL, "message does not name the file: %s", msg);
	va_list ap;
	va_start(ap, st);
	for (const char *frag; (frag = va_arg(ap, const char *));)
		ck_assert_msg(strstr(msg, frag) != NULL, "message lacks '%s': %s", frag, msg);
	va_end(ap);
	fprintf(stderr, "refused as expected: %s\n", msg);
}

#define T(name, dt, shape, b, e) \
	"\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

START_TEST(test_corrupt)
{
	const char *p;
	/* a good one first, so the helpers themselves are right */
	p = raw_file("good", "{" T("t", "F32", "[2]", 0, 8) "}", -1, 8);
	struct kiln_safetensors *f;
	ck_assert_msg(kiln_safetensors_open(p, &f) == KILN_OK, "%s", kiln_last_error());
	kiln_safetensors_close(f);

	refused(tpath("missing.safetensors"), KILN_EIO, "cannot open", NULL);
	write_bytes(tpath("short"), "abcde", 5);
	refused(tpath("short"), KILN_EDATA, "too short", NULL);
	write_bytes(tpath("zero"), "", 0);
	refused(tpath("zero"), KILN_EDATA, "too short", NULL);
	/* header length past the end of the file */
	refused(raw_file("bad_len", "{" T("t", "F32", "[2]", 0, 8) "}", 1000000, 8),
		KILN_EDATA, "header length 1000000 exceeds", NULL);
	refused(raw_file("huge_len", "{}", 0x7fffffffffffffffll, 0), KILN_EDATA, "exceeds", NULL);
	/* a PyTorch file (torch.save: a zip archive, or a pickle before 1.6;
	 * a Lightning .ckpt) is told as one, with the conversion (before
	 * session 50 "header length 578712552184433488 exceeds ...") */
	static const char zip[] = "PK\3\4\0\0\10\10\0\0archive/data.pklxxxxxxxxxxxxxxxxxxxxxxxxxx";
	write_bytes(tpath("w.pt"), zip, sizeof zip - 1);
	refused(tpath("w.pt"), KILN_EDATA, "w.pt: a PyTorch file (torch.save's zip archive",
		"safetensors.torch.save_file(model.state_dict()", NULL);
	static const char pkl[] = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.xxxxxxxxxxxxxxxx";
	write_bytes(tpath("w.pth"), pkl, sizeof pkl - 1);
	refused(tpath("w.pth"), KILN_EDATA, "w.pth: a PyTorch file (torch.save's pickle", NULL);
	/* pickle_protocol=4 or 5: a FRAME of the magic number's 13 bytes */
	static const char pkl4[] = "\x80\x04\x95\x0d\0\0\0\0\0\0\0\x8a\x0a\x6c\xfc\x9c\x46xxxxxxxxxxxx";
	write_bytes(tpath("w4.pth"), pkl4, sizeof pkl4 - 1);
	refused(tpath("w4.pth"), KILN_EDATA, "w4.pth: a PyTorch file (torch.save's pickle", NULL);
	/* a truncated safetensors file whose header length's low byte is
	 * 0x80, then 2 (640): a length, as before, not a PyTorch pickle */
	refused(raw_file("len640", "{" T("t", "F32", "[2]", 0, 8) "}", 640, 8), KILN_EDATA,
		"header length 640 exceeds the", NULL);
	/* a header length that cuts the JSON */
	refused(raw_file("cut_len", "{" T("t", "F32", "[2]", 0, 8) "}", 16, 8), KILN_EDATA,
		"not valid JSON", NULL);
	/* truncated data */
	refused(raw_file("truncated", "{" T("a", "F32", "[2]", 0, 8) "," T("t", "F32", "[2]", 8, 16) "}",
			 -1, 12),
		KILN_EDATA, "'t'", "outside the data", NULL);
	refused(raw_file("bad_json", "{\"t\":{\"dtype\":\"F32\",", -1, 0), KILN_EDATA,
		"not valid JSON", NULL);
	refused(raw_file("not_object", "[1, 2]", -1, 0), KILN_EDATA, "does not start with '{'", NULL);
	refused(raw_file("dup", "{" T("t", "F32", "[1]", 0, 4) "," T("t", "F32", "[1]", 0, 4) "}", -1, 4),
		KILN_EDATA, "not valid JSON", NULL);
	refused(raw_file("range", "{" T("t", "F32", "[4]", 0, 16) "}", -1, 8), KILN_EDATA, "'t'",
		"outside the data (8 bytes)", NULL);
	refused(raw_file("overlap", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}",
			 -1, 12),
		KILN_EDATA, "'a' and 'b' overlap", NULL);
	refused(raw_file("hole", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 12, 20) "}",
			 -1, 20),
		KILN_EDATA, "8..12", "belong to no tensor", NULL);
	refused(raw_file("lead", "{" T("a", "F32", "[2]", 4, 12) "}", -1, 12), KILN_EDATA,
		"0..4", "belong to no tensor", NULL);
	refused(raw_file("trailing", "{" T("a", "F32", "[2]", 0, 8) "}", -1, 12), KILN_EDATA,
		"trailing", NULL);
	refused(raw_file("shape", "{" T("t", "F32", "[3]", 0, 8) "}", -1, 8), KILN_EDATA, "'t'",
		"F32 [3] is 12 bytes", "hold 8", NULL);
	refused(raw_file("dtype_size", "{" T("t", "I64", "[2]", 0, 8) "}", -1, 8), KILN_EDATA, "'t'",
		"I64 [2] is 16 bytes", NULL);
	refused(raw_file("dtype", "{" T("t", "F33", "[2]", 0, 8) "}", -1, 8), KILN_EDATA, "'t'",
		"unknown dtype \"F33\"", NULL);
	refused(raw_file("neg", "{" T("t", "F32", "[2]", -8, 0) "}", -1, 8), KILN_EDATA, "'t'",
		"data_offsets must be", NULL);
	refused(raw_file("backwards", "{" T("t", "F32", "[0]", 8, 0) "}", -1, 8), KILN_EDATA,
		"data_offsets must be", NULL);
	refused(raw_file("neg_dim", "{" T("t", "F32", "[-2]", 0, 8) "}", -1, 8), KILN_EDATA, "'t'",
		"shape[0]", NULL);
	refused(raw_file("big_dims", "{" T("t", "F32", "[4294967296,4294967296,4294967296]", 0, 8) "}",
			 -1, 8),
		KILN_EDATA, "'t'", "too large", NULL);
	refused(raw_file("no_shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", -1, 8),
		KILN_EDATA, "'t'", "needs", NULL);
	refused(raw_file("entry", "{\"t\":5}", -1, 0), KILN_EDATA, "'t'", "not an object", NULL);
	refused(raw_file("meta", "{\"__metadata__\":{\"a\":1}," T("t", "F32", "[2]", 0, 8) "}", -1, 8),
		KILN_EDATA, "__metadata__", "'a'", NULL);
	refused(raw_file("meta2", "{\"__metadata__\":[]}", -1, 0), KILN_EDATA, "__metadata__", NULL);

	/* every truncation of a real file is refused, none crashes */
	size_t n;
	unsigned char *b = read_bytes(dpath("st_cnn_torch.safetensors"), &n);
	int tries = 0, bad = 0;
	for (size_t cut = 0; cut < n; cut += cut < 64 ? 1 : 97, tries++) {
		write_bytes(tpath("cut"), b, cut);
		struct kiln_safetensors *g = NULL;
		bad += kiln_safetensors_open(tpath("cut"), &g) == KILN_EDATA;
		ck_assert_ptr_null(g);
	}
	ck_assert_int_eq(bad, tries);
	ck_assert_int_gt(tries, 100);
	free(b);
}
END_TEST

/* An escaped NUL (\u0000) in a "__metadata__" value, as Python's
 * safetensors writes and reads (`save_file(sd, f, metadata={"note":
 * "a\0b"})`: this header is its bytes, the tensor renamed): the file
 * opens, its tensor reads, that value is absent (a C string cannot carry
 * it) and the others are there.  Before session 39 the file was refused
 * ("\u0000 is not allowed without JSON_ALLOW_NUL").  A NUL in a tensor's
 * name or its dtype is still refused. */
START_TEST(test_nul)
{
	const char *p = raw_file("nul_meta", "{\"__metadata__\":{\"note\":\"a\\u0000b\",\"who\":\"torch\"},"
					     T("x", "F32", "[2]", 0, 8) "}", -1, 0);
	const float x[2] = { 1.5f, -2.25f };
	FILE *fp = fopen(p, "ab");
	ck_assert(fp && fwrite(x, sizeof x, 1, fp) == 1 && !fclose(fp));
	struct kiln_safetensors *f = NULL;
	ck_assert_msg(kiln_safetensors_open(p, &f) == KILN_OK, "%s", kiln_last_error());
	struct kiln_safetensors_tensor t;
	ck_assert_int_eq(kiln_safetensors_count(f), 1);
	ck_assert_int_eq(kiln_safetensors_find(f, "x", &t), KILN_OK);
	ck_assert_int_eq(t.numel, 2);
	ck_assert_int_eq(t.bytes, 8);
	ck_assert_mem_eq(t.data, x, sizeof x);
	ck_assert_ptr_null(kiln_safetensors_meta(f, "note"));
	ck_assert_str_eq(kiln_safetensors_meta(f, "who"), "torch");
	kiln_safetensors_close(f);

	refused(raw_file("nul_name", "{" T("x\\u0000y", "F32", "[2]", 0, 8) "}", -1, 8), KILN_EDATA,
		"not valid JSON", "NUL byte in object key", NULL);
	refused(raw_file("nul_dtype", "{" T("x", "F32\\u0000", "[2]", 0, 8) "}", -1, 8), KILN_EDATA,
		"'x'", "unknown dtype \"F32\\u0000...\"", NULL);
}
END_TEST

/* ---- model weights -------------------------------------------------------- */

struct net {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
};

/* tests/data/st_cnn.ini's model for 3x8x8 samples, overrides applied, on
 * the CPU, its weights not yet initialised. */
static void net_build(struct net *n, const char *const *over)
{
	memset(n, 0, sizeof *n);
	ck_assert_msg(kiln_config_load(dpath("st_cnn.ini"), &n->cfg) == KILN_OK, "%s",
		      kiln_last_error());
	for (int i = 0; over && over[i]; i++)
		ck_assert_msg(kiln_config_override(n->cfg, over[i]) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_config_validate(n->cfg, reg) == KILN_OK, "%s", kiln_last_error());
	const int64_t dims[3] = { 3, 8, 8 };
	struct kiln_tensor_desc s;
	kiln_tensor_desc_init(&s, KILN_F32, 3, dims);
	ck_assert(kiln_device_open(reg, n->cfg, "cpu", 0, &n->dev) == KILN_OK);
	ck_assert_msg(kiln_model_create(n->cfg, reg, n->dev, &s, &n->m) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(n->dev, &n->stream) == KILN_OK);
}

/* net_build's model, its parameters initialised from `seed`; init_from
 * applied when set.  Returns the status of kiln_model_init_from. */
static kiln_status net_open(struct net *n, uint64_t seed, const char *const *over)
{
	net_build(n, over);
	ck_assert(kiln_model_init_params(n->m, seed, n->stream) == KILN_OK);
	return kiln_model_init_from(n->m, n->stream);
}

static void net_close(struct net *n)
{
	kiln_device_stream_sync(n->dev, n->stream);
	kiln_model_free(n->m);
	kiln_device_stream_destroy(n->dev, n->stream);
	kiln_device_close(n->dev);
	kiln_config_free(n->cfg);
}

/* The values of parameter `name` (malloc'ed), and its element count. */
static float *net_param(struct net *n, const char *name, int64_t *numel)
{
	struct kiln_param_info p;
	ck_assert_msg(kiln_model_param_find(n->m, name, &p) == KILN_OK, "%s", kiln_last_error());
	*numel = kiln_tensor_numel(&p.desc);
	float *v = malloc(sizeof(float) * (size_t)*numel);
	ck_assert(kiln_device_copy_async(n->dev, v, p.param, sizeof(float) * (size_t)*numel,
					 KILN_COPY_D2H, n->stream) == KILN_OK);
	ck_assert(kiln_device_stream_sync(n->dev, n->stream) == KILN_OK);
	return v;
}

/* Every parameter and buffer of a's model has the bytes of b's. */
static void nets_same(struct net *a, struct net *b)
{
	ck_assert_int_eq(kiln_model_param_count(a->m), kiln_model_param_count(b->m));
	for (int i = 0; i < kiln_model_param_count(a->m); i++) {
		struct kiln_param_info p;
		int64_t na, nb;
		kiln_model_param_get(a->m, i, &p);
		float *va = net_param(a, p.name, &na), *vb = net_param(b, p.name, &nb);
		ck_assert_int_eq(na, nb);
		ck_assert_msg(!memcmp(va, vb, sizeof(float) * (size_t)na), "%s", p.name);
		free(va);
		free(vb);
	}
}

static double max_rel(const float *a, const float *ref, int64_t n)
{
	double scale = 0, err = 0;
	for (int64_t i = 0; i < n; i++) {
		scale = fmax(scale, fabs(ref[i]));
		err = fmax(err, fabs((double)a[i] - ref[i]));
	}
	return scale > 0 ? err / scale : err;
}

/* PyTorch -> kiln: the reference state_dict, loaded strictly, gives
 * PyTorch's eval-mode logits in either layout. */
static void torch_logits(const char *layout)
{
	char o1[1100], o2[64];
	snprintf(o1, sizeof o1, "model.init_from=%s", dpath("st_cnn_torch.safetensors"));
	snprintf(o2, sizeof o2, "model.layout=%s", layout);
	const char *over[] = { o1, o2, NULL };
	struct net n;
	ck_assert_msg(net_open(&n, 3, over) == KILN_OK, "%s", kiln_last_error());

	struct kiln_safetensors *io, *sd;
	struct kiln_safetensors_tensor x, ref, t;
	ck_assert_msg(kiln_safetensors_open(dpath("st_cnn_io.safetensors"), &io) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_safetensors_find(io, "x", &x) == KILN_OK);
	ck_assert(kiln_safetensors_find(io, "logits", &ref) == KILN_OK);
	const int64_t N = x.dims[0], C = ref.dims[1];
	/* every parameter and buffer holds the file's bytes */
	ck_assert(kiln_safetensors_open(dpath("st_cnn_torch.safetensors"), &sd) == 0);
	for (int i = 0; i < kiln_model_param_count(n.m); i++) {
		struct kiln_param_info p;
		int64_t numel;
		kiln_model_param_get(n.m, i, &p);
		ck_assert(kiln_safetensors_find(sd, p.name, &t) == KILN_OK);
		float *v = net_param(&n, p.name, &numel);
		ck_assert_msg(t.bytes == sizeof(float) * (size_t)numel && !memcmp(v, t.data, t.bytes),
			      "%s differs from the file", p.name);
		free(v);
	}
	kiln_safetensors_close(sd);

	struct kiln_plan *plan;
	struct kiln_plan_opts po = { .training = 0, .keep_all = 1 };
	ck_assert_msg(kiln_model_plan_ex(n.m, N, &po, &plan) == KILN_OK, "%s", kiln_last_error());
	float *xd, *md, *logits = malloc(sizeof(float) * (size_t)(N * C)), *xh = malloc(x.bytes);
	int32_t *yd;
	memcpy(xh, x.data, x.bytes); /* the mapping's bytes need not be aligned */
	ck_assert(kiln_device_alloc(n.dev, x.bytes, (void **)&xd) == 0);
	ck_assert(kiln_device_alloc(n.dev, 64 + 4 * (size_t)N, (void **)&yd) == 0);
	ck_assert(kiln_device_alloc(n.dev, 64, (void **)&md) == 0);
	int32_t zeros[64] = { 0 };
	float z2[2] = { 0, 0 };
	void *yp;
	struct kiln_tensor_desc yd_desc;
	ck_assert(kiln_device_copy_async(n.dev, xd, xh, x.bytes, KILN_COPY_H2D, n.stream) == 0);
	ck_assert(kiln_device_copy_async(n.dev, yd, zeros, 4 * (size_t)N, KILN_COPY_H2D, n.stream) == 0);
	ck_assert(kiln_device_copy_async(n.dev, md, z2, sizeof z2, KILN_COPY_H2D, n.stream) == 0);
	ck_assert_msg(kiln_plan_forward(plan, xd, yd, md, n.stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_sync(n.dev, n.stream) == 0);
	ck_assert(kiln_plan_tensor(plan, "fc2", "y", &yp, &yd_desc) == KILN_OK);
	ck_assert_int_eq(kiln_tensor_numel(&yd_desc), N * C);
	ck_assert(kiln_device_copy_async(n.dev, logits, yp, sizeof(float) * (size_t)(N * C),
					 KILN_COPY_D2H, n.stream) == 0);
	ck_assert(kiln_device_stream_sync(n.dev, n.stream) == 0);
	float *rh = malloc(ref.bytes);
	memcpy(rh, ref.data, ref.bytes);
	double e = max_rel(logits, rh, N * C);
	fprintf(stderr, "check_safetensors: PyTorch -> kiln (%s): eval logits max rel diff %.3g\n",
		layout, e);
	ck_assert_msg(e <= REL, "%s: kiln's logits differ from PyTorch's by %g (relative)", layout, e);
	free(rh);
	free(xh);
	free(logits);
	kiln_device_free(n.dev, xd);
	kiln_device_free(n.dev, yd);
	kiln_device_free(n.dev, md);
	kiln_plan_free(plan);
	kiln_safetensors_close(io);

	/* exported again, the file's num_batches_tracked survives */
	struct kiln_safetensors *g;
	ck_assert(kiln_model_save_safetensors(n.m, tpath(layout), n.stream) == KILN_OK);
	ck_assert(kiln_safetensors_open(tpath(layout), &g) == KILN_OK);
	ck_assert(kiln_safetensors_find(g, "bn2.num_batches_tracked", &t) == KILN_OK);
	ck_assert_int_eq(*(const int64_t *)t.data, 7);
	kiln_safetensors_close(g);
	net_close(&n);
}

START_TEST(test_torch_nchw) { torch_logits("nchw"); }
END_TEST

START_TEST(test_torch_nhwc) { torch_logits("nhwc"); }
END_TEST

/* kiln -> kiln: what one model saves another loads bit for bit, and the
 * batch counter is the micro-steps. */
START_TEST(test_save_load)
{
	struct net a, b;
	ck_assert(net_open(&a, 5, NULL) == KILN_OK);
	for (int i = 0; i < 4; i++)
		ck_assert(kiln_model_step_advance(a.m, a.stream) == KILN_OK);
	ck_assert_msg(kiln_model_save_safetensors(a.m, tpath("a.safetensors"), a.stream) == KILN_OK,
		      "%s", kiln_last_error());
	struct kiln_safetensors *f;
	struct kiln_safetensors_tensor t;
	ck_assert(kiln_safetensors_open(tpath("a.safetensors"), &f) == KILN_OK);
	ck_assert_int_eq(kiln_safetensors_count(f), kiln_model_param_count(a.m) + 2);
	ck_assert(kiln_safetensors_find(f, "bn1.num_batches_tracked", &t) == KILN_OK);
	ck_assert_str_eq(t.dtype_name, "I64");
	ck_assert_int_eq(t.ndim, 0);
	ck_assert_int_eq(*(const int64_t *)t.data, 4);
	ck_assert(kiln_safetensors_find(f, "conv1.weight", &t) == KILN_OK);
	ck_assert_int_eq(t.ndim, 4); /* OIHW */
	ck_assert_int_eq(t.dims[0], 4);
	ck_assert_int_eq(t.dims[1], 3);
	ck_assert(kiln_safetensors_find(f, "fc1.weight", &t) == KILN_OK);
	ck_assert_int_eq(t.dims[0], 16); /* [out, in] */
	ck_assert_int_eq(t.dims[1], 96);
	ck_assert_str_eq(kiln_safetensors_meta(f, "format"), "pt");
	ck_assert_str_eq(kiln_safetensors_meta(f, "kiln_version"), kiln_version());
	ck_assert_int_eq(strlen(kiln_safetensors_meta(f, "config_hash")), 16);
	/* the model's sections, the keys left unset not among them (since
	 * session 42: "; key = (unset)" lines, most of the text) */
	const char *layers = kiln_safetensors_meta(f, "kiln.layers");
	ck_assert(layers && strstr(layers, "[layer.conv1]\ntype = conv\n"));
	ck_assert_msg(!strstr(layers, "(unset)"), "kiln.layers holds unset keys:\n%s", layers);
	kiln_safetensors_close(f);

	char o[1100];
	snprintf(o, sizeof o, "model.init_from=%s", tpath("a.safetensors"));
	const char *over[] = { o, NULL };
	ck_assert_msg(net_open(&b, 6, over) == KILN_OK, "%s", kiln_last_error());
	nets_same(&a, &b);
	/* b saves the same file: loaded count 4 + 0 steps */
	ck_assert(kiln_model_save_safetensors(b.m, tpath("b.safetensors"), b.stream) == KILN_OK);
	size_t n1, n2;
	unsigned char *f1 = read_bytes(tpath("a.safetensors"), &n1);
	unsigned char *f2 = read_bytes(tpath("b.safetensors"), &n2);
	ck_assert(n1 == n2 && !memcmp(f1, f2, n1));
	free(f1);
	free(f2);
	net_close(&a);
	net_close(&b);
}
END_TEST

/* The bytes this process has read (tests/proc_io.h), where the kernel
 * says. */
static long long bytes_read(void)
{
	const long long v = proc_bytes_read();
	ck_assert_msg(v >= 0, "no rchar in /proc/self/io");
	return v;
}

/* A load reads each byte of a file kiln wrote once, its CRC32Cs checked
 * as the tensors are read (since session 42): before, the check read the
 * data whole, then the load read it again (the data twice: 21080 bytes
 * read for the 12432-byte file written then, 8544 of them data).  The
 * values are a's all the same. */
START_TEST(test_load_once)
{
	struct net a, b;
	ck_assert(net_open(&a, 5, NULL) == KILN_OK);
	ck_assert(kiln_model_save_safetensors(a.m, tpath("once.safetensors"), a.stream) == KILN_OK);
	size_t size;
	unsigned char *raw = read_bytes(tpath("once.safetensors"), &size);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | raw[i];
	free(raw);
	const long long data = (long long)(size - 8 - hlen);
	net_build(&b, NULL);
	const long long r0 = bytes_read();
	ck_assert_msg(kiln_model_load_safetensors(b.m, tpath("once.safetensors"), 1, b.stream) ==
			      KILN_OK,
		      "%s", kiln_last_error());
	/* (and the one read of /proc/self/io between, a few hundred bytes) */
	const long long got = bytes_read() - r0;
	fprintf(stderr, "test_load_once: a %zu-byte file (%lld of data) loaded with %lld bytes read\n",
		size, data, got);
	ck_assert_msg(data > 2048 && got >= (long long)size && got < (long long)size + data / 2,
		      "%lld bytes read to load a %zu-byte file (%lld of data)", got, size, data);
	nets_same(&a, &b);
	net_close(&a);
	net_close(&b);
}
END_TEST

/* An export's config_hash is of the [layer.*] sections' values by
 * meaning (kiln_config_write_layers, core/config_same.c): configs that
 * differ in how a value is written alone (`kernel = 3,3` for 3, `padding
 * = 1, 1`, `eps = 0.00001` for 1e-5, `inplace = yes` for 1) build the
 * same model and share it (before session 36 the text's bytes were
 * hashed: four hashes); another width is another hash. */
static void export_hash(const char *const *over, const char *name, char hash[17])
{
	struct net n;
	struct kiln_safetensors *f;
	ck_assert_msg(net_open(&n, 5, over) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_model_save_safetensors(n.m, tpath(name), n.stream) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert(kiln_safetensors_open(tpath(name), &f) == KILN_OK);
	snprintf(hash, 17, "%s", kiln_safetensors_meta(f, "config_hash"));
	ck_assert_int_eq(strlen(hash), 16);
	kiln_safetensors_close(f);
	net_close(&n);
}

START_TEST(test_config_hash)
{
	static const char *const written[] = { "layer.conv1.kernel=3,3", "layer.conv1.padding= 1, 1",
					       "layer.bn1.eps=0.00001", "layer.relu1.inplace=yes",
					       NULL };
	static const char *const wider[] = { "layer.fc1.out=17", NULL };
	char plain[17], other[17], wide[17];
	export_hash(NULL, "h0.safetensors", plain);
	export_hash(written, "h1.safetensors", other);
	export_hash(wider, "h2.safetensors", wide);
	ck_assert_str_eq(plain, other);
	ck_assert_str_ne(plain, wide);
}
END_TEST

/* init_strict: missing, unexpected and mismatched tensors. */
static void load_fails(const char *const *over, kiln_status want, ...)
{
	struct net n;
	kiln_status st = net_open(&n, 1, over);
	const char *msg = kiln_last_error();
	ck_assert_msg(st == want, "status %d, expected %d: %s", st, want, msg);
	ck_assert_msg(strstr(msg, "init_from") != NULL, "%s", msg);
	va_list ap;
	va_start(ap, want);
	for (const char *frag; (frag = va_arg(ap, const char *));)
		ck_assert_msg(strstr(msg, frag) != NULL, "message lacks '%s': %s", frag, msg);
	va_end(ap);
	fprintf(stderr, "refused as expected: %s\n", msg);
	net_close(&n);
}

START_TEST(test_strict)
{
	char from[1100];
	snprintf(from, sizeof from, "model.init_from=%s", dpath("st_cnn_torch.safetensors"));
	/* conv1 gains a bias the file lacks */
	const char *missing[] = { from, "layer.conv1.bias=1", NULL };
	load_fails(missing, KILN_ECONFIG, "st_cnn_torch.safetensors", "init_strict = 1",
		   "missing from the file: conv1.bias", NULL);
	/* fc1 loses its bias: the file has one the model lacks */
	const char *unexpected[] = { from, "layer.fc1.bias=0", NULL };
	load_fails(unexpected, KILN_ECONFIG, "not in the model: fc1.bias", NULL);
	/* another width: a shape error, strict or not */
	const char *shape[] = { from, "layer.fc1.out=8", NULL };
	load_fails(shape, KILN_ECONFIG, "fc1.weight is [16, 96] in the file but [8, 96] in the model",
		   NULL);
	const char *shape_lax[] = { from, "layer.fc1.out=8", "model.init_strict=0", NULL };
	load_fails(shape_lax, KILN_ECONFIG, "do not fit the model", "bn2.weight is [16]", NULL);
	/* not a model file at all: lists the first names */
	char io[1100];
	snprintf(io, sizeof io, "model.init_from=%s", dpath("st_cnn_io.safetensors"));
	const char *other[] = { io, NULL };
	load_fails(other, KILN_ECONFIG, "missing from the file: conv1.weight, bn1.weight",
		   "(and 11 more)", "not in the model: ", "logits", NULL);
	const char *nofile[] = { "model.init_from=/nonexistent/w.safetensors", NULL };
	/* a config error at its key since session 36 (was KILN_EIO) */
	load_fails(nofile, KILN_ECONFIG, "/nonexistent/w.safetensors", "no such file", NULL);
	write_bytes(tpath("junk"), "not a safetensors file at all", 29);
	char junk[1100];
	snprintf(junk, sizeof junk, "model.init_from=%s", tpath("junk"));
	const char *bad[] = { junk, NULL };
	load_fails(bad, KILN_EDATA, "junk", "exceeds", NULL);

	/* init_strict = 0: what matches loads, the rest keeps its init */
	const char *lax[] = { from, "layer.conv1.bias=1", "model.init_strict=0", NULL };
	struct net n, fresh;
	ck_assert_msg(net_open(&n, 1, lax) == KILN_OK, "%s", kiln_last_error());
	const char *plain[] = { "layer.conv1.bias=1", NULL };
	ck_assert(net_open(&fresh, 1, plain) == KILN_OK);
	struct kiln_safetensors *f;
	struct kiln_safetensors_tensor t;
	ck_assert(kiln_safetensors_open(dpath("st_cnn_torch.safetensors"), &f) == KILN_OK);
	int64_t k1, k2;
	float *v = net_param(&n, "conv1.bias", &k1), *w = net_param(&fresh, "conv1.bias", &k2);
	ck_assert(!memcmp(v, w, sizeof(float) * (size_t)k1)); /* kept */
	free(v);
	free(w);
	v = net_param(&n, "conv1.weight", &k1);
	ck_assert(kiln_safetensors_find(f, "conv1.weight", &t) == KILN_OK);
	ck_assert(!memcmp(v, t.data, t.bytes)); /* loaded */
	free(v);
	kiln_safetensors_close(f);
	net_close(&n);
	net_close(&fresh);
}
END_TEST

/* init_from before kiln_model_init_params (the trainer's order): the
 * file's tensors are not drawn over (so not drawn at all), and every
 * parameter and buffer ends with the bytes of the other order, those the
 * file lacks (conv1.bias here) drawn as in a model without init_from: the
 * draws are keyed by (seed, parameter, element), so skipping some shifts
 * no other. */
START_TEST(test_init_from_first)
{
	char from[1100];
	snprintf(from, sizeof from, "model.init_from=%s", dpath("st_cnn_torch.safetensors"));
	const char *lax[] = { from, "layer.conv1.bias=1", "model.init_strict=0", NULL };
	struct net a, b;
	ck_assert_msg(net_open(&a, 1, lax) == KILN_OK, "%s", kiln_last_error());
	net_build(&b, lax);
	ck_assert_msg(kiln_model_init_from(b.m, b.stream) == KILN_OK, "%s", kiln_last_error());
	ck_assert(kiln_model_init_params(b.m, 1, b.stream) == KILN_OK);
	ck_assert_int_ge(kiln_model_param_count(a.m), 4);
	nets_same(&a, &b);
	/* a second init_params (nothing loaded since) draws everything anew */
	ck_assert(kiln_model_init_params(b.m, 1, b.stream) == KILN_OK);
	const char *plain[] = { "layer.conv1.bias=1", NULL };
	struct net fresh;
	ck_assert(net_open(&fresh, 1, plain) == KILN_OK);
	int64_t k1, k2;
	float *v = net_param(&b, "conv1.weight", &k1), *w = net_param(&fresh, "conv1.weight", &k2);
	ck_assert(!memcmp(v, w, sizeof(float) * (size_t)k1));
	free(v);
	free(w);
	net_close(&a);
	net_close(&b);
	net_close(&fresh);
}
END_TEST

/* F16, BF16 and F64 tensors load converted to f32; integers do not. */
START_TEST(test_dtypes)
{
	/* fc: linear 4 -> 3, weight [3, 4] F16, bias [3] BF16.  (f16's
	 * infinities were here until session 30, when weights holding NaN or
	 * inf came to be refused on load: the largest negative and 1.5
	 * instead; tests/nonfinite_weights.sh has the refusal.) */
	const uint16_t h[12] = { 0x3c00, 0xc000, 0x0001, 0x7bff, 0x0400, 0x03ff, 0x3555, 0x8000,
				 0xfbff, 0x3e00, 0x4248, 0x0000 };
	const float want_h[12] = { 1.0f, -2.0f, 5.9604645e-8f, 65504.0f, 6.1035156e-5f,
				   6.0975552e-5f, 0.33325195f, -0.0f, -65504.0f, 1.5f, 3.140625f,
				   0.0f };
	const uint16_t bf[3] = { 0x3f80, 0xc040, 0x3eab };
	const float want_bf[3] = { 1.0f, -3.0f, 0.333984375f };
	const int64_t wd[2] = { 3, 4 }, bd[1] = { 3 };
	struct kiln_safetensors_writer *w;
	ck_assert(kiln_safetensors_writer_new(&w) == 0);
	ck_assert(kiln_safetensors_writer_add(w, "fc.weight", KILN_F16, 2, wd, h) == 0);
	ck_assert(kiln_safetensors_writer_add(w, "fc.bias", KILN_BF16, 1, bd, bf) == 0);
	ck_assert(kiln_safetensors_writer_write(w, tpath("half.safetensors")) == 0);
	kiln_safetensors_writer_free(w);
	const int32_t ints[3] = { 1, 2, 3 };
	ck_assert(kiln_safetensors_writer_new(&w) == 0);
	ck_assert(kiln_safetensors_writer_add(w, "fc.weight", KILN_F16, 2, wd, h) == 0);
	ck_assert(kiln_safetensors_writer_add(w, "fc.bias", KILN_I32, 1, bd, ints) == 0);
	ck_assert(kiln_safetensors_writer_write(w, tpath("int.safetensors")) == 0);
	kiln_safetensors_writer_free(w);
	/* F64, by hand (kiln has no f64 dtype to write it with) */
	unsigned char f64[8 + 96 + 24];
	const char *hdr = "{\"fc.bias\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[0,24]}}";
	memset(f64, ' ', sizeof f64);
	memset(f64, 0, 8);
	f64[0] = 96;
	memcpy(f64 + 8, hdr, strlen(hdr));
	const double dv[3] = { 0.1, -1e10, 2.5 };
	memcpy(f64 + 8 + 96, dv, sizeof dv);
	write_bytes(tpath("f64.safetensors"), f64, sizeof f64);

	struct kiln_config *cfg;
	ck_assert(kiln_config_load_string("[layer.fc]\ntype = linear\nout = 3\n"
					  "[layer.loss]\ntype = softmax_xent\n",
					  "dtypes.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_validate(cfg, reg) == KILN_OK);
	struct kiln_device *dev;
	struct kiln_model *m;
	void *s;
	const int64_t in = 4;
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
	ck_assert(kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0);
	ck_assert(kiln_model_create(cfg, reg, dev, &sample, &m) == 0);
	ck_assert(kiln_device_stream_create(dev, &s) == 0);
	ck_assert(kiln_model_init_params(m, 0, s) == 0);
	ck_assert_msg(kiln_model_load_safetensors(m, tpath("half.safetensors"), 1, s) == KILN_OK, "%s",
		      kiln_last_error());
	struct kiln_param_info pw, pb;
	float gw[12], gb[3];
	ck_assert(kiln_model_param_find(m, "fc.weight", &pw) == 0);
	ck_assert(kiln_model_param_find(m, "fc.bias", &pb) == 0);
	ck_assert(kiln_device_copy_async(dev, gw, pw.param, sizeof gw, KILN_COPY_D2H, s) == 0);
	ck_assert(kiln_device_copy_async(dev, gb, pb.param, sizeof gb, KILN_COPY_D2H, s) == 0);
	ck_assert(kiln_device_stream_sync(dev, s) == 0);
	for (int i = 0; i < 12; i++)
		ck_assert_msg(gw[i] == want_h[i] && signbit(gw[i]) == signbit(want_h[i]),
			      "f16 %04x -> %g, expected %g", h[i], gw[i], want_h[i]);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(gb[i] == want_bf[i], "bf16 %04x -> %g", bf[i], gb[i]);
	/* non-strict: only the bias is in the F64 file */
	ck_assert_msg(kiln_model_load_safetensors(m, tpath("f64.safetensors"), 0, s) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_copy_async(dev, gb, pb.param, sizeof gb, KILN_COPY_D2H, s) == 0);
	ck_assert(kiln_device_stream_sync(dev, s) == 0);
	for (int i = 0; i < 3; i++)
		ck_assert(gb[i] == (float)dv[i]);
	ck_assert_int_eq(kiln_model_load_safetensors(m, tpath("f64.safetensors"), 1, s), KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "missing from the file: fc.weight"));
	ck_assert_int_eq(kiln_model_load_safetensors(m, tpath("int.safetensors"), 1, s), KILN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "fc.bias is I32"));
	kiln_device_stream_sync(dev, s);
	kiln_model_free(m);
	kiln_device_stream_destroy(dev, s);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}
END_TEST

/* The trainer reads init_from right after initialising (an unfit file
 * stops it before the first step; a fitting one trains). */
START_TEST(test_trainer_init_from)
{
	if (!has_synthetic())
		return;
	char text[8192];
	size_t n;
	unsigned char *ini = read_bytes(dpath("st_cnn.ini"), &n);
	ini[n] = 0;
	for (int pass = 0; pass < 2; pass++) {
		snprintf(text, sizeof text,
			 "%s[data]\nsource = synthetic\nimage_size = 8 8\nimage_channels = 3\nsamples = 64\n"
			 "workers = 0\n[train]\nbatch = 8\nepochs = 1\nmax_steps = 2\neval = 0\n"
			 "[run]\nout_dir =\n[model]\ninit_from = %s\n",
			 (char *)ini,
			 dpath(pass ? "st_cnn_torch.safetensors" : "st_cnn_io.safetensors"));
		struct kiln_config *cfg;
		ck_assert(kiln_config_load_string(text, "trainer.ini", &cfg) == KILN_OK);
		ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
		struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
		kiln_status st = kiln_train(cfg, reg, NULL, NULL, &r);
		if (!pass) {
			ck_assert_int_eq(st, KILN_ECONFIG);
			ck_assert_msg(strstr(kiln_last_error(), "trainer.ini:") &&
					      strstr(kiln_last_error(), "[model] init_from") &&
					      strstr(kiln_last_error(), "does not match the model"),
				      "%s", kiln_last_error());
		} else {
			ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
			ck_assert_int_eq(r.steps, 2);
		}
		kiln_config_free(cfg);
	}
	free(ini);
}
END_TEST

/* `kiln export`: init_from's tensors written back unchanged (num_batches_tracked
 * too); usage errors. */
static int run(const char *args, const char *log)
{
	char cmd[10000];
	snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>&1", KILN_BIN, args, tpath(log));
	int rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *log_text(const char *log)
{
	size_t n;
	unsigned char *b = read_bytes(tpath(log), &n);
	b[n] = 0;
	return (char *)b;
}

START_TEST(test_export_cli)
{
	if (!has_synthetic())
		return;
	char args[8192];
	/* run.out_dir= : no run directory, so the initial weights (init_from) */
	const char *data = "data.source=synthetic 'data.image_size=8 8' data.image_channels=3 run.out_dir=";
	snprintf(args, sizeof args, "export '%s' --safetensors '%s' %s 'model.init_from=%s'",
		 dpath("st_cnn.ini"), tpath("cli.safetensors"), data,
		 dpath("st_cnn_torch.safetensors"));
	int rc = run(args, "cli.log");
	char *log = log_text("cli.log");
	ck_assert_msg(rc == 0, "kiln %s: exit %d: %s", args, rc, log);
	free(log);
	struct kiln_safetensors *a, *b;
	ck_assert(kiln_safetensors_open(dpath("st_cnn_torch.safetensors"), &a) == KILN_OK);
	ck_assert(kiln_safetensors_open(tpath("cli.safetensors"), &b) == KILN_OK);
	ck_assert_int_eq(kiln_safetensors_count(a), kiln_safetensors_count(b));
	for (int i = 0; i < kiln_safetensors_count(a); i++) {
		struct kiln_safetensors_tensor ta, tb;
		kiln_safetensors_get(a, i, &ta);
		ck_assert_msg(kiln_safetensors_find(b, ta.name, &tb) == KILN_OK, "%s", kiln_last_error());
		ck_assert_str_eq(ta.dtype_name, tb.dtype_name);
		ck_assert_int_eq(ta.ndim, tb.ndim);
		ck_assert_msg(ta.bytes == tb.bytes && !memcmp(ta.data, tb.data, ta.bytes), "%s", ta.name);
	}
	kiln_safetensors_close(a);
	kiln_safetensors_close(b);

	/* usage: neither --safetensors nor --onnx (2), a missing --checkpoint file (2 since
	 * session 36, refused before any work; was 1), a bad init_from (2, naming it) */
	snprintf(args, sizeof args, "export '%s' %s", dpath("st_cnn.ini"), data);
	ck_assert_int_eq(run(args, "u1.log"), 2);
	log = log_text("u1.log");
	ck_assert_msg(strstr(log, "give one of --safetensors FILE and --onnx FILE"), "%s", log);
	free(log);
	snprintf(args, sizeof args, "export '%s' --safetensors '%s' --checkpoint x.ckpt %s",
		 dpath("st_cnn.ini"), tpath("u2.safetensors"), data);
	ck_assert_int_eq(run(args, "u2.log"), 2); /* no such checkpoint file */
	log = log_text("u2.log");
	ck_assert_msg(strstr(log, "x.ckpt"), "%s", log);
	free(log);
	snprintf(args, sizeof args, "export '%s' --safetensors '%s' %s 'model.init_from=%s'",
		 dpath("st_cnn.ini"), tpath("u3.safetensors"), data, dpath("st_cnn_io.safetensors"));
	ck_assert_int_eq(run(args, "u3.log"), 2);
	log = log_text("u3.log");
	ck_assert_msg(strstr(log, "[model] init_from") && strstr(log, "not in the model: "), "%s",
		      log);
	free(log);
	ck_assert_int_ne(access(tpath("u3.safetensors"), F_OK), 0);
}
END_TEST

static Suite *make_safetensors_suite(void)
{
	Suite *s = suite_create("safetensors");
	check_add_case(s, "format", 0, NULL, NULL, (const TTest *[]){
		test_roundtrip, test_corrupt, test_nul, test_read, test_rewritten, test_map_fails,
		NULL });
	check_add_case(s, "weights", 120, NULL, NULL, (const TTest *[]){
		test_torch_nchw, test_torch_nhwc, test_save_load, test_strict, test_dtypes,
		test_trainer_init_from, test_export_cli, test_init_from_first, test_config_hash,
		test_load_once, NULL });
	return s;
}

/* before the run: the data directory and a scratch directory */
static int st_setup(void)
{
	if (getenv("srcdir"))
		srcdir = getenv("srcdir");
	if (!test_tmpdir_make(tmpdir, sizeof tmpdir, "st")) {
		perror("mkdtemp");
		return 1;
	}
	return 0;
}

static void st_teardown(void)
{
	test_tmpdir_remove(tmpdir);
}

static const struct check_main check_suite = { .suite = make_safetensors_suite, .reg = &reg,
					       .need_cpu = 1, .setup = st_setup,
					       .teardown = st_teardown, .omp_passive = 1 };
