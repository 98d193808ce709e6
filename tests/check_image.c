/* tests/check_image.c - the pixels kiln decodes from PNG and JPEG files:
 * PIL's (so torchvision's).
 *
 * The fixtures are the files of tests/data/png/ and tests/data/jpeg/, with
 * the expected pixels in refs.txt beside them, written by
 * tests/data/gen_png_refs.py and tests/data/gen_jpeg_refs.py.
 *
 * PNG: the stored samples, whatever gAMA or sRGB says (alpha composited
 * onto black in the stored values, round(v * a / 255); 16 bits the high
 * byte, v >> 8, as PIL keeps it: round(v * 255 / 65535) before session 41,
 * 1 more for about a quarter of the values; 16-bit gray kiln's own rule,
 * v >> 8 too, where PIL clips at 255).  Before session 36 libpng's simplified API moved the
 * samples of a file whose gamma is not ~1/2.2 through that gamma (gAMA
 * 1.0: 4..7 -> 39 43 46 50) and composited alpha in linear light (gray 200
 * at alpha 64 -> 106, not 50).
 *
 * JPEG: files PIL decodes past a libjpeg warning (extraneous bytes before a
 * marker, JFIF revision 2.01) decode to the clean file's pixels, and a file
 * whose data ends before its EOI marker is bad data naming the file, as
 * PIL refuses it.  Before session 41 every warning was an error (exit 3).
 * CMYK and YCCK JPEGs decode to RGB as PIL converts them (refused before
 * session 41).
 * CK_RUN_CASE=png_pixels (png_errors, jpeg_pixels, jpeg_truncated,
 * jpeg_scans, pixel_limit, file_kinds) runs one.
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "../plugins/loaders/image.h"

#include <check.h>
#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h> /* tjCompress2: a progressive JPEG */
#include <zlib.h> /* crc32: a PNG chunk's */

/* $srcdir/tests/data/<dir>/<name> into a malloc()ed buffer. */
static uint8_t *read_fixture(const char *dir, const char *name, size_t *n)
{
	char path[1024];
	const char *srcdir = getenv("srcdir");
	snprintf(path, sizeof path, "%s/tests/data/%s/%s", srcdir ? srcdir : ".", dir, name);
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
	long size = ftell(f);
	rewind(f);
	uint8_t *buf = malloc(size > 0 ? (size_t)size : 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	fclose(f);
	*n = (size_t)size;
	return buf;
}

static int hexval(char ch)
{
	return ch <= '9' ? ch - '0' : ch - 'a' + 10;
}

/* One refs.txt line of tests/data/<dir>: the file decodes to exactly its
 * pixels. */
static void check_ref_line(const char *dir, char *line, struct kiln_image *img)
{
	char name[128];
	int h, w, c, at = 0;
	ck_assert_int_eq(sscanf(line, "%127s %d %d %d %n", name, &h, &w, &c, &at), 4);
	const char *hex = line + at;
	ck_assert_uint_eq(strcspn(hex, "\n"), (size_t)h * w * c * 2);
	size_t n;
	uint8_t *buf = read_fixture(dir, name, &n);
	kiln_status st = img_decode(kiln_host_table(), buf, n, name, IMG_MAX_PIXELS, img);
	ck_assert_msg(st == KILN_OK, "%s: %s", name, kiln_last_error());
	ck_assert_msg(img->h == h && img->w == w && img->c == c, "%s: %dx%dx%d, want %dx%dx%d",
		      name, img->h, img->w, img->c, h, w, c);
	for (int i = 0; i < h * w * c; i++) {
		int want = hexval(hex[2 * i]) * 16 + hexval(hex[2 * i + 1]);
		ck_assert_msg(img->data[i] == want, "%s: pixel (%d, %d) channel %d is %d, refs.txt %d", name,
			      i / c / w, i / c % w, i % c, img->data[i], want);
	}
	free(buf);
}

/* Every line of tests/data/<dir>/refs.txt, `files` of them. */
static void check_refs(const char *dir, int files)
{
	char path[1024], line[16384];
	const char *srcdir = getenv("srcdir");
	snprintf(path, sizeof path, "%s/tests/data/%s/refs.txt", srcdir ? srcdir : ".", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	struct kiln_image img = { 0 };
	int seen = 0;
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '#')
			continue;
		check_ref_line(dir, line, &img);
		seen++;
	}
	fclose(f);
	free(img.data);
	ck_assert_int_eq(seen, files);
}

START_TEST(test_png_pixels)
{
	check_refs("png", 13);
}
END_TEST

/* Damaged files are bad data naming the file, never a crash: cut
 * anywhere (interlaced too), or with the image data's CRC broken. */
START_TEST(test_png_errors)
{
	static const char *names[] = { "rgb_interlaced.png", "palette_trns.png", "rgba16.png" };
	struct kiln_image img = { 0 };
	for (int k = 0; k < 3; k++) {
		size_t n;
		uint8_t *buf = read_fixture("png", names[k], &n);
		for (size_t cut = 8; cut < n - 12; cut += 7) { /* IEND (12 bytes) is not read */
			kiln_status st = img_decode(kiln_host_table(), buf, cut, names[k], IMG_MAX_PIXELS,
						    &img);
			ck_assert_msg(st == KILN_EDATA, "%s cut at %zu: status %d", names[k], cut, st);
			ck_assert_msg(strstr(kiln_last_error(), names[k]) &&
					      strstr(kiln_last_error(), "undecodable PNG"),
				      "%s", kiln_last_error());
		}
		buf[n - 13] ^= 1; /* the last IDAT's CRC */
		ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, names[k], IMG_MAX_PIXELS, &img),
				 KILN_EDATA);
		ck_assert_msg(strstr(kiln_last_error(), "CRC"), "%s", kiln_last_error());
		buf[n - 13] ^= 1;
		/* the pixel limit (twice max_pixels: all are 143 pixels or more),
		 * before anything is decoded */
		ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, names[k], 71, &img), KILN_EDATA);
		ck_assert_msg(strstr(kiln_last_error(), "max_image_pixels"), "%s", kiln_last_error());
		free(buf);
	}
	free(img.data);
}
END_TEST

/* The warnings logged whose text holds `want`, counted; the first one's
 * "[who] text" kept. */
struct log_count {
	const char *want;
	int n;
	char first[512];
};

static void count_warnings(void *user, int level, const char *who, const char *msg)
{
	struct log_count *c = user;
	if (level == KILN_LOG_WARN && strstr(msg, c->want) && c->n++ == 0)
		snprintf(c->first, sizeof c->first, "[%s] %s", who, msg);
}

/* PIL's pixels past libjpeg's warnings: extraneous bytes before the EOI
 * or the SOS marker, JFIF 2.01 (each the clean file's pixels, which
 * gen_jpeg_refs.py checked for PIL); and of a CMYK and a YCCK file, as
 * PIL's convert("RGB") (refused before session 41).  The first file
 * decoded past a warning is named in a warning with libjpeg's message,
 * the others (and a second decode of it) are not (silent before). */
START_TEST(test_jpeg_pixels)
{
	struct log_count warned = { .want = "decoded despite libjpeg's warning" };
	kiln_log_set_sink(count_warnings, &warned);
	check_refs("jpeg", 6);
	size_t n;
	uint8_t *buf = read_fixture("jpeg", "extra3.jpg", &n);
	struct kiln_image img = { 0 };
	ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, "extra3.jpg", IMG_MAX_PIXELS, &img),
			 KILN_OK);
	kiln_log_set_sink(NULL, NULL);
	free(img.data);
	free(buf);
	ck_assert_int_eq(warned.n, 1);
	ck_assert_str_eq(warned.first, "[data] extra3.jpg: decoded despite libjpeg's warning 'Corrupt JPEG data: 1 extraneous bytes before marker 0xd9' (as PIL does; later such files are not named)");
}
END_TEST

/* A JPEG cut anywhere (every cut of the two files, the one with a warning
 * before its scan too: the first warning must not hide the truncation)
 * is bad data naming the file; from the scan on, "truncated", as PIL
 * refuses it ("image file is truncated"). */
START_TEST(test_jpeg_truncated)
{
	static const char *names[] = { "clean.jpg", "extra_sos.jpg" };
	struct kiln_image img = { 0 };
	for (int k = 0; k < 2; k++) {
		size_t n;
		uint8_t *buf = read_fixture("jpeg", names[k], &n);
		size_t sos = 0;
		while (sos + 1 < n && !(buf[sos] == 0xff && buf[sos + 1] == 0xda))
			sos++;
		ck_assert_uint_lt(sos + 1, n);
		for (size_t cut = 3; cut < n; cut++) {
			kiln_status st = img_decode(kiln_host_table(), buf, cut, names[k], IMG_MAX_PIXELS,
						    &img);
			ck_assert_msg(st == KILN_EDATA, "%s cut at %zu of %zu: status %d", names[k], cut, n,
				      st);
			ck_assert_msg(strstr(kiln_last_error(), names[k]) &&
					      strstr(kiln_last_error(), "undecodable JPEG"),
				      "%s", kiln_last_error());
			if (cut > sos)
				ck_assert_msg(strstr(kiln_last_error(), "Premature end of JPEG file (the file is truncated)"),
					      "%s cut at %zu: %s", names[k], cut, kiln_last_error());
		}
		ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, names[k], IMG_MAX_PIXELS, &img),
				 KILN_OK);
		free(buf);
	}
	free(img.data);
}
END_TEST

/* The end of the entropy-coded data that begins at buf[i]: the next
 * marker but a stuffed 0xff00 or a restart marker. */
static size_t scan_end(const uint8_t *buf, size_t n, size_t i)
{
	while (i + 1 < n && !(buf[i] == 0xff && buf[i + 1] && (buf[i + 1] & 0xf8) != 0xd0))
		i++;
	return i;
}

/* A progressive JPEG of more than 500 scans is bad data naming the file,
 * as TurboJPEG limits them (TJFLAG_LIMITSCANS; decoded whatever their number before,
 * each scan a pass over the image): a 16x16 gray progressive file with its
 * first (DC) scan repeated to 500 scans in all decodes (past libjpeg's
 * bogus-progression warnings), to 501 is refused. */
START_TEST(test_jpeg_scans)
{
	uint8_t px[16 * 16];
	for (int i = 0; i < 16 * 16; i++)
		px[i] = (uint8_t)(i * 7);
	tjhandle tj = tjInitCompress();
	ck_assert_ptr_nonnull(tj);
	unsigned char *jpg = NULL;
	unsigned long n = 0;
	ck_assert_int_eq(tjCompress2(tj, px, 16, 16, 16, TJPF_GRAY, &jpg, &n, TJSAMP_GRAY, 90,
				     TJFLAG_PROGRESSIVE),
			 0);
	int scans = 0;
	size_t sos = 0, end = 0;
	for (size_t i = 0; i + 1 < n; i++)
		if (jpg[i] == 0xff && jpg[i + 1] == 0xda && scans++ == 0)
			sos = i;
	ck_assert_int_gt(scans, 1);
	ck_assert_int_lt(scans, 500);
	end = scan_end(jpg, n, sos + 2 + ((size_t)jpg[sos + 2] << 8 | jpg[sos + 3]));
	const size_t seg = end - sos;
	struct kiln_image img = { 0 };
	for (int total = 500; total <= 501; total++) {
		const size_t copies = (size_t)(total - scans), m = n + copies * seg;
		uint8_t *buf = malloc(m);
		ck_assert_ptr_nonnull(buf);
		memcpy(buf, jpg, end);
		for (size_t k = 0; k < copies; k++)
			memcpy(buf + end + k * seg, jpg + sos, seg);
		memcpy(buf + end + copies * seg, jpg + end, n - end);
		kiln_status st = img_decode(kiln_host_table(), buf, m, "scans.jpg", IMG_MAX_PIXELS, &img);
		if (total == 500) {
			ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
			ck_assert_int_eq(img.h * img.w * img.c, 16 * 16);
		} else {
			ck_assert_int_eq(st, KILN_EDATA);
			ck_assert_str_eq(kiln_last_error(), "scans.jpg: undecodable JPEG: more than 500 scans (a progressive JPEG built to be slow to decode?)");
		}
		free(buf);
	}
	free(img.data);
	tjFree(jpg);
	tjDestroy(tj);
}
END_TEST

/* What the messages say of a file: a CMYK JPEG's channels (decoded to 3),
 * and a GIF or WebP named .jpg refused naming what it is (before session
 * 41 "not a JPEG or PNG image (N bytes)" alone). */
START_TEST(test_file_kinds)
{
	size_t n;
	uint8_t *buf = read_fixture("jpeg", "cmyk.jpg", &n);
	const char *note = img_channels_note(buf, n);
	ck_assert_msg(note && strstr(note, "CMYK JPEG (4 channels), decoded to RGB (3)"), "%s",
		      note ? note : "(none)");
	free(buf);
	buf = read_fixture("jpeg", "clean.jpg", &n);
	ck_assert_ptr_null(img_channels_note(buf, n));
	free(buf);
	static const struct {
		const char *bytes, *is;
		size_t n;
	} other[] = {
		{ "GIF89a\x01\0\x01\0\0\0\0", "a GIF", 13 },
		{ "RIFF\x1a\0\0\0WEBPVP8 ", "a WebP", 16 },
		{ "RIFF\x1a\0\0\0AVI LIST", NULL, 16 },
		{ "<!DOCTYPE html>", NULL, 15 },
	};
	struct kiln_image img = { 0 };
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(img_decode(kiln_host_table(), other[k].bytes, other[k].n, "x.jpg",
					    IMG_MAX_PIXELS, &img),
				 KILN_EDATA);
		char want[200];
		snprintf(want, sizeof want, "x.jpg: not a JPEG or PNG image (%zu bytes%s%s%s)", other[k].n,
			 other[k].is ? "; it begins with the signature of " : "",
			 other[k].is ? other[k].is : "", other[k].is ? ": convert it to JPEG or PNG" : "");
		ck_assert_str_eq(kiln_last_error(), want);
	}
	free(img.data);
}
END_TEST

/* PIL's decompression bomb rule (Image._decompression_bomb_check) for
 * max_pixels m: w x h <= m decodes silently, up to 2m decodes with a
 * warning naming the file (the first one of the process only), above 2m
 * is refused naming the limit; 2^28 pixels at most, whatever m.  Before
 * session 41 an image was refused above m itself. */
START_TEST(test_pixel_limit)
{
	static const struct {
		const char *dir, *name;
		int pixels; /* w x h */
	} f[] = { { "png", "palette_trns.png", 256 }, { "jpeg", "clean.jpg", 480 } };
	struct kiln_image img = { 0 };
	struct log_count warned = { .want = "is larger than [data] max_image_pixels" };
	kiln_log_set_sink(count_warnings, &warned);
	for (int k = 0; k < 2; k++) {
		size_t n;
		uint8_t *buf = read_fixture(f[k].dir, f[k].name, &n);
		const int half = f[k].pixels / 2;
		ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, f[k].name, f[k].pixels, &img),
				 KILN_OK);
		ck_assert_int_eq(warned.n, k > 0); /* none at max_pixels itself */
		ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, f[k].name, half, &img), KILN_OK);
		ck_assert_int_eq(img.h * img.w, f[k].pixels);
		ck_assert_int_eq(warned.n, 1); /* the second file's is not said */
		ck_assert_int_eq(img_decode(kiln_host_table(), buf, n, f[k].name, half - 1, &img),
				 KILN_EDATA);
		char want[200];
		snprintf(want, sizeof want, "%s: image of %dx%d pixels (%d) is larger than the limit of %d pixels (twice [data] max_image_pixels, as PIL refuses",
			 f[k].name, img.w, img.h, f[k].pixels, 2 * (half - 1));
		ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
		free(buf);
	}
	kiln_log_set_sink(NULL, NULL);
	/* a header of 2^14 x 2^14 + 1 rows (then an IDAT's length and type,
	 * where libpng's png_read_info stops): above 2^28, refused even with
	 * max_pixels 2^27 + 1 */
	static const uint8_t ihdr[] = { 0x49, 0x48, 0x44, 0x52, 0, 0, 0x40, 0, 0, 0, 0x40, 1, 8, 0, 0, 0, 0 };
	uint8_t png[8 + 4 + sizeof ihdr + 4 + 12] = "\x89PNG\r\n\x1a\n\0\0\0\x0d";
	memcpy(png + 12, ihdr, sizeof ihdr);
	const uint32_t crc = (uint32_t)crc32(0, ihdr, sizeof ihdr);
	for (int b = 0; b < 4; b++)
		png[12 + sizeof ihdr + b] = (uint8_t)(crc >> (24 - 8 * b));
	memcpy(png + 12 + sizeof ihdr + 4 + 4, "IDAT", 4);
	ck_assert_int_eq(img_decode(kiln_host_table(), png, sizeof png, "big.png", ((int64_t)1 << 27) + 1,
				    &img),
			 KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "big.png: image of 16384x16385 pixels (268451840) is larger than the limit of 268435456 pixels (2^28, the most kiln decodes"),
		      "%s", kiln_last_error());
	free(img.data);
}
END_TEST

static Suite *make_image_suite(void)
{
	Suite *s = suite_create("image");
	check_add_case(s, "png_pixels", 0, NULL, NULL, (const TTest *[]){ test_png_pixels, NULL });
	check_add_case(s, "png_errors", 0, NULL, NULL, (const TTest *[]){ test_png_errors, NULL });
	check_add_case(s, "jpeg_pixels", 0, NULL, NULL, (const TTest *[]){ test_jpeg_pixels, NULL });
	check_add_case(s, "jpeg_truncated", 0, NULL, NULL,
		       (const TTest *[]){ test_jpeg_truncated, NULL });
	check_add_case(s, "jpeg_scans", 0, NULL, NULL, (const TTest *[]){ test_jpeg_scans, NULL });
	check_add_case(s, "pixel_limit", 0, NULL, NULL, (const TTest *[]){ test_pixel_limit, NULL });
	check_add_case(s, "file_kinds", 0, NULL, NULL, (const TTest *[]){ test_file_kinds, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_image_suite };
