/* plugins/loaders/image.c - JPEG (libjpeg-turbo: libjpeg's API to decode,
 * TurboJPEG's to encode) and PNG (libpng) in memory; see image.h. */
#include "image.h"

#include <png.h>
#include <setjmp.h>
#include <stdatomic.h> /* atomic_exchange: the warning given once */
#include <stdio.h>     /* jpeglib.h needs FILE */
#include <jpeglib.h> /* the JPEG decoder */
#include <jerror.h>  /* JWRN_JPEG_EOF */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <turbojpeg.h> /* the JPEG encoder */

int img_sniff(const void *buf, size_t n)
{
	const uint8_t *p = buf;
	if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
		return IMG_JPEG;
	if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
		return IMG_PNG;
	return IMG_UNKNOWN;
}

/* What buf[0..n) is, by the signatures of the formats PIL reads and kiln
 * does not (a GIF or WebP named .jpg), for the message refusing it; NULL
 * when none matches. */
static const char *img_sniff_other(const uint8_t *p, size_t n)
{
	static const struct {
		size_t at, len;
		const char *sig, *name;
	} sigs[] = {
		{ 0, 6, "GIF87a", "a GIF" },
		{ 0, 6, "GIF89a", "a GIF" },
		{ 8, 4, "WEBP", "a WebP" }, /* after "RIFF" and a length */
		{ 0, 4, "II*\0", "a TIFF" },
		{ 0, 4, "MM\0*", "a TIFF" },
		{ 4, 8, "ftypavif", "an AVIF" },
		{ 4, 8, "ftypheic", "a HEIC" },
		{ 0, 12, "\0\0\0\x0cjP  \r\n\x87\n", "a JPEG 2000" },
	};
	for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
		if (n >= sigs[k].at + sigs[k].len &&
		    !memcmp(p + sigs[k].at, sigs[k].sig, sigs[k].len) &&
		    (sigs[k].at != 8 || !memcmp(p, "RIFF", 4)))
			return sigs[k].name;
	return NULL;
}

int img_format_of_name(const char *name)
{
	const char *dot = strrchr(name, '.');
	if (!dot)
		return IMG_UNKNOWN;
	if (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"))
		return IMG_JPEG;
	if (!strcasecmp(dot, ".png"))
		return IMG_PNG;
	return IMG_UNKNOWN;
}

kiln_status img_reserve(const struct kiln_host *host, struct kiln_image *img, size_t bytes)
{
	if (img->cap >= bytes && img->data)
		return KILN_OK;
	uint8_t *p = realloc(img->data, bytes ? bytes : 1);
	if (!p)
		return host->error(KILN_ENOMEM, "out of memory for a %zu-byte image", bytes);
	img->data = p;
	img->cap = bytes;
	return KILN_OK;
}

/* Whether an image above max_pixels has been warned of: once a process,
 * as Python's default filter shows PIL's DecompressionBombWarning. */
static atomic_int img_big_warned;

/* PIL's decompression bomb check (Image._decompression_bomb_check): an
 * image of more than max_pixels (Image.MAX_IMAGE_PIXELS) is decoded with a
 * warning, one of more than twice that refused; and never more than
 * IMG_MAX_PIXELS. */
static kiln_status check_dims(const struct kiln_host *host, const char *what, int64_t w,
			      int64_t h, int64_t max_pixels)
{
	if (w <= 0 || h <= 0)
		return host->error(KILN_EDATA, "%s: image of %lldx%lld pixels", what, (long long)w,
				   (long long)h);
	if (max_pixels > IMG_MAX_PIXELS)
		max_pixels = IMG_MAX_PIXELS;
	const int64_t refuse = 2 * max_pixels < IMG_MAX_PIXELS ? 2 * max_pixels : IMG_MAX_PIXELS;
	if (w * h > refuse)
		return host->error(KILN_EDATA, "%s: image of %lldx%lld pixels (%lld) is larger than the limit of %lld pixels (%s; a decompression bomb?)",
				   what, (long long)w, (long long)h, (long long)(w * h), (long long)refuse,
				   refuse == 2 * max_pixels ? "twice [data] max_image_pixels, as PIL refuses"
							    : "2^28, the most kiln decodes");
	if (w * h > max_pixels && !atomic_exchange(&img_big_warned, 1))
		host->log(KILN_LOG_WARN, "image", "%s: image of %lldx%lld pixels (%lld) is larger than [data] max_image_pixels = %lld: decoded, as PIL decodes up to twice that with a DecompressionBombWarning (said once: other such images are decoded silently)",
			  what, (long long)w, (long long)h, (long long)(w * h), (long long)max_pixels);
	return KILN_OK;
}

/* ---- JPEG: libjpeg's API ----------------------------------------------
 *
 * Not TurboJPEG's decoder, which reports a libjpeg warning only as a
 * string (the first one's) and either stops at it or goes on past every
 * kind.  PIL ignores libjpeg's warnings (corrupt data: extraneous bytes
 * before a marker, an unknown JFIF revision, a bad Huffman code) and
 * decodes what is there, but refuses a file whose data ends before its
 * EOI marker ("image file is truncated").  Here a warning is told apart by
 * its code: JWRN_JPEG_EOF (libjpeg's "Premature end of JPEG file", the
 * memory source running out) stops the decode as bad data, every other
 * warning is let pass, so the pixels are PIL's.  libjpeg's defaults are
 * PIL's and TurboJPEG's: accurate integer IDCT, fancy upsampling. */

/* libjpeg's error manager: errors (and running out of data) longjmp back
 * to the caller's setjmp (decode_jpeg, jpeg_is_cmyk) with the message;
 * other warnings are counted, the first one's message kept (decode_jpeg
 * logs it once a process). */
struct jpeg_src_err {
	struct jpeg_error_mgr mgr; /* first: libjpeg's cinfo->err points here */
	jmp_buf jmp;
	char msg[JMSG_LENGTH_MAX];
	int warnings;
	char warning[JMSG_LENGTH_MAX]; /* the first one's */
};

/* Whether a JPEG decoded past a warning has been named: once a process,
 * as check_dims warns. */
static atomic_int jpeg_warning_said;

/* The most scans a JPEG may have: TurboJPEG's TJFLAG_LIMITSCANS, its guard
 * against a progressive file of many tiny scans, each of which costs a pass
 * over the whole image ("Two Issues with the JPEG Standard"). */
#define JPEG_MAX_SCANS 500

static void jpeg_src_error(j_common_ptr cinfo)
{
	struct jpeg_src_err *e = (struct jpeg_src_err *)cinfo->err;
	cinfo->err->format_message(cinfo, e->msg);
	longjmp(e->jmp, 1);
}

/* msg_level < 0: a warning; >= 0: trace output (never asked for) */
static void jpeg_src_warning(j_common_ptr cinfo, int msg_level)
{
	struct jpeg_src_err *e = (struct jpeg_src_err *)cinfo->err;
	if (msg_level >= 0)
		return;
	if (cinfo->err->msg_code == JWRN_JPEG_EOF)
		jpeg_src_error(cinfo);
	if (e->warnings++ == 0)
		cinfo->err->format_message(cinfo, e->warning);
}

/* libjpeg's progress hook (called between the scans it absorbs): more than
 * JPEG_MAX_SCANS scans is an error, as TurboJPEG's limit. */
static void jpeg_src_progress(j_common_ptr cinfo)
{
	struct jpeg_src_err *e = (struct jpeg_src_err *)cinfo->err;
	if (cinfo->is_decompressor &&
	    ((j_decompress_ptr)cinfo)->input_scan_number > JPEG_MAX_SCANS) {
		snprintf(e->msg, sizeof e->msg, "more than %d scans (a progressive JPEG built to be slow to decode?)",
			 JPEG_MAX_SCANS);
		cinfo->err->msg_code = 0;
		longjmp(e->jmp, 1);
	}
}

/* The CMYK rows of a started decode into h x w RGB pixels at rgb, as PIL
 * converts them.  PIL reads every CMYK JPEG as Adobe's (inverted: libjpeg's
 * samples are 255 - ink; its "CMYK;I") and convert("RGB") gives
 * R = nk - nk * c' / 255 rounded, c' = 255 - C the ink, nk = K (Convert.c
 * cmyk2rgb), which is round(C * K / 255) of libjpeg's samples (never a half:
 * 255 is odd); G and B from M and Y alike.  A YCCK file is CMYK by then
 * (libjpeg converts it). */
static void jpeg_read_cmyk(struct jpeg_decompress_struct *ci, uint8_t *rgb)
{
	/* one row of w x 4, libjpeg's: freed with the decoder, even on a longjmp */
	JSAMPARRAY row = ci->mem->alloc_sarray((j_common_ptr)ci, JPOOL_IMAGE,
					       ci->output_width * 4, 1);
	while (ci->output_scanline < ci->output_height) {
		uint8_t *out = rgb + (size_t)ci->output_scanline * ci->output_width * 3;
		jpeg_read_scanlines(ci, row, 1);
		for (JDIMENSION x = 0; x < ci->output_width; x++) {
			const JSAMPLE *cmyk = row[0] + 4 * (size_t)x;
			for (int j = 0; j < 3; j++)
				out[3 * (size_t)x + j] = (uint8_t)((cmyk[j] * cmyk[3] + 127) / 255);
		}
	}
}

/* After jpeg_read_header: the pixels into *img (8-bit; gray 1 channel,
 * colour and CMYK 3), then the rest of the file read up to its EOI
 * marker. */
static kiln_status jpeg_read_pixels(const struct kiln_host *host, struct jpeg_decompress_struct *ci,
				    const char *what, int64_t max_pixels, struct kiln_image *img)
{
	kiln_status st = check_dims(host, what, ci->image_width, ci->image_height, max_pixels);
	if (st)
		return st;
	const int cmyk = ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK;
	const int c = ci->jpeg_color_space == JCS_GRAYSCALE ? 1 : 3, decoded = cmyk ? 4 : c;
	ci->out_color_space = c == 1 ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
	const size_t row = (size_t)ci->image_width * c;
	if ((st = img_reserve(host, img, row * ci->image_height)))
		return st;
	jpeg_start_decompress(ci);
	if (ci->output_components != decoded || ci->output_width != ci->image_width ||
	    ci->output_height != ci->image_height)
		return host->error(KILN_EINTERNAL, "%s: libjpeg gave %ux%u pixels of %d channels for %ux%u of %d",
				   what, ci->output_width, ci->output_height, ci->output_components,
				   ci->image_width, ci->image_height, decoded);
	if (cmyk)
		jpeg_read_cmyk(ci, img->data);
	while (ci->output_scanline < ci->output_height) {
		JSAMPROW rows[16];
		JDIMENSION k = 0, y = ci->output_scanline;
		for (; k < 16 && y + k < ci->output_height; k++)
			rows[k] = img->data + (size_t)(y + k) * row;
		jpeg_read_scanlines(ci, rows, k);
	}
	jpeg_finish_decompress(ci); /* reads up to EOI: a file cut after its scan ran out */
	img->h = (int32_t)ci->image_height;
	img->w = (int32_t)ci->image_width;
	img->c = c;
	return KILN_OK;
}

/* ci's error manager err, before jpeg_create_decompress (after a setjmp). */
static void jpeg_src_init(struct jpeg_decompress_struct *ci, struct jpeg_src_err *err)
{
	ci->err = jpeg_std_error(&err->mgr);
	err->mgr.error_exit = jpeg_src_error;
	err->mgr.emit_message = jpeg_src_warning;
	err->warnings = 0;
}

static kiln_status decode_jpeg(const struct kiln_host *host, const uint8_t *buf, size_t n,
			       const char *what, int64_t max_pixels, struct kiln_image *img)
{
	struct jpeg_decompress_struct ci;
	struct jpeg_src_err err;
	struct jpeg_progress_mgr progress = { .progress_monitor = jpeg_src_progress };
	jpeg_src_init(&ci, &err);
	/* libjpeg's errors longjmp here; this function changes nothing between
	 * setjmp and a longjmp */
	kiln_status st;
	if (setjmp(err.jmp)) {
		st = host->error(KILN_EDATA, "%s: undecodable JPEG: %s%s", what, err.msg,
				 err.mgr.msg_code == JWRN_JPEG_EOF ? " (the file is truncated)" : "");
	} else {
		jpeg_create_decompress(&ci);
		ci.progress = &progress;
		jpeg_mem_src(&ci, buf, (unsigned long)n);
		jpeg_read_header(&ci, TRUE);
		st = jpeg_read_pixels(host, &ci, what, max_pixels, img);
	}
	jpeg_destroy_decompress(&ci);
	if (st == KILN_OK && err.warnings && !atomic_exchange(&jpeg_warning_said, 1))
		host->log(KILN_LOG_WARN, "data", "%s: decoded despite libjpeg's warning '%s' (as PIL does; later such files are not named)",
			  what, err.warning);
	return st;
}

/* Whether buf[0..n) is a JPEG whose header says CMYK or YCCK (0 when the
 * header cannot be read). */
static int jpeg_is_cmyk(const uint8_t *buf, size_t n)
{
	struct jpeg_decompress_struct ci;
	struct jpeg_src_err err;
	volatile int cmyk = 0;
	jpeg_src_init(&ci, &err);
	if (!setjmp(err.jmp)) {
		jpeg_create_decompress(&ci);
		jpeg_mem_src(&ci, buf, (unsigned long)n);
		jpeg_read_header(&ci, TRUE);
		cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
	}
	jpeg_destroy_decompress(&ci);
	return cmyk;
}

/* ---- PNG: libpng's low-level reader ------------------------------------
 *
 * Not the simplified API (png_image_*), which converts to sRGB: a file whose
 * gAMA is not ~1/2.2 (gAMA 1.0: a 0..255 ramp's 4..7 became 39 43 46 50)
 * had its samples moved through that gamma, and alpha was composited in
 * linear light (gray 200 at alpha 64 became 106).  PIL, so torchvision,
 * returns the stored samples whatever the gAMA, sRGB, cHRM or iCCP chunks
 * say.  Here no gamma transform is ever set: the stored samples are what
 * comes out, expanded to 8 bits (palette -> RGB, 1/2/4-bit gray -> 8 bits
 * as PIL scales them, tRNS -> alpha, 16 bits -> the high byte, v >> 8, as
 * PIL keeps it), then alpha composited onto black in those stored values.
 * A 16-bit gray PNG is the one kind PIL reads otherwise: mode I;16, whose
 * convert("L") or ("RGB") clips v at 255 (32000 -> 255); kiln keeps the
 * high byte there too (32000 -> 125), as for every other 16-bit PNG. */

/* The compressed file and how far libpng has read it. */
struct png_src {
	const uint8_t *buf;
	size_t n, at;
	char msg[200]; /* libpng's error, for the message */
};

static void png_src_read(png_structp png, png_bytep out, size_t len)
{
	struct png_src *s = png_get_io_ptr(png);
	if (len > s->n - s->at)
		png_error(png, "the file ends inside a chunk (truncated)");
	memcpy(out, s->buf + s->at, len);
	s->at += len;
}

/* libpng's errors end in a longjmp back to decode_png; warnings (a bad
 * ancillary chunk's CRC: the chunk is dropped) are not bad data. */
static void png_src_error(png_structp png, png_const_charp msg)
{
	struct png_src *s = png_get_error_ptr(png);
	snprintf(s->msg, sizeof s->msg, "%s", msg);
	png_longjmp(png, 1);
}

static void png_src_warning(png_structp png, png_const_charp msg)
{
	(void)png, (void)msg;
}

/* The transforms to 8-bit gray, gray+alpha, RGB or RGBA in the stored
 * values, and every interlace pass combined: the number of passes. */
static int png_set_transforms(png_structp png, png_infop info)
{
	const int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
	if (type == PNG_COLOR_TYPE_PALETTE)
		png_set_palette_to_rgb(png);
	if (type == PNG_COLOR_TYPE_GRAY && depth < 8)
		png_set_expand_gray_1_2_4_to_8(png); /* v * 255 / (2^depth - 1), as PIL */
	if (png_get_valid(png, info, PNG_INFO_tRNS))
		png_set_tRNS_to_alpha(png);
	if (depth == 16)
		png_set_strip_16(png); /* v >> 8, as PIL's RGB;16B, RGBA;16B, LA;16B */
	int passes = png_set_interlace_handling(png);
	png_read_update_info(png, info);
	return passes;
}

/* Alpha composited onto black, pixel by pixel in place: h*w pixels of
 * c + 1 channels at px become h*w of c (each written at or before where
 * its own samples were read).  v * a / 255 rounded to nearest: v * a / 255
 * is never a half, as 255 is odd. */
static void png_composite_black(uint8_t *px, size_t pixels, int c)
{
	for (size_t i = 0; i < pixels; i++) {
		const uint8_t *in = px + i * (size_t)(c + 1);
		unsigned a = in[c], v[3];
		for (int k = 0; k < c; k++)
			v[k] = (in[k] * a + 127) / 255;
		for (int k = 0; k < c; k++)
			px[i * (size_t)c + k] = (uint8_t)v[k];
	}
}

/* After png_read_info: the pixels into *img (8-bit, 1 or 3 channels). */
static kiln_status png_read_pixels(const struct kiln_host *host, png_structp png, png_infop info,
				   const char *what, int64_t max_pixels, struct kiln_image *img)
{
	const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
	kiln_status st = check_dims(host, what, w, h, max_pixels);
	if (st)
		return st;
	const int passes = png_set_transforms(png, info);
	const int ch = png_get_channels(png, info); /* 1 gray, 2 +alpha, 3 RGB, 4 RGBA */
	const int c = ch <= 2 ? 1 : 3;
	const size_t row = png_get_rowbytes(png, info);
	if (png_get_bit_depth(png, info) != 8 || row != (size_t)w * ch)
		return host->error(KILN_EINTERNAL, "%s: libpng gave %d-bit samples, %zu bytes a row of %u pixels",
				   what, png_get_bit_depth(png, info), row, (unsigned)w);
	if ((st = img_reserve(host, img, (size_t)h * row)))
		return st;
	/* row by row, every pass: libpng adds each pass's pixels to the row it
	 * handed back in the pass before (no h-long array of row pointers) */
	for (int p = 0; p < passes; p++)
		for (png_uint_32 y = 0; y < h; y++)
			png_read_row(png, img->data + (size_t)y * row, NULL);
	if (ch != c)
		png_composite_black(img->data, (size_t)h * w, c);
	img->h = (int32_t)h;
	img->w = (int32_t)w;
	img->c = c;
	return KILN_OK;
}

static kiln_status decode_png(const struct kiln_host *host, const uint8_t *buf, size_t n,
			      const char *what, int64_t max_pixels, struct kiln_image *img)
{
	struct png_src src = { .buf = buf, .n = n };
	png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_src_error,
						 png_src_warning);
	png_infop info = png ? png_create_info_struct(png) : NULL;
	if (!info) {
		png_destroy_read_struct(&png, NULL, NULL);
		return host->error(KILN_ENOMEM, "%s: cannot start the PNG decoder", what);
	}
	/* libpng's errors longjmp here; this function changes nothing between
	 * setjmp and a longjmp (src is changed only through libpng's pointer) */
	kiln_status st;
	if (setjmp(png_jmpbuf(png))) {
		st = host->error(KILN_EDATA, "%s: undecodable PNG: %s", what, src.msg);
	} else {
		png_set_read_fn(png, &src, png_src_read);
		png_read_info(png, info);
		st = png_read_pixels(host, png, info, what, max_pixels, img);
	}
	png_destroy_read_struct(&png, &info, NULL);
	return st;
}

const char *img_channels_note(const void *buf, size_t n)
{
	png_image pi;
	if (img_sniff(buf, n) == IMG_JPEG && jpeg_is_cmyk(buf, n))
		return "the file is a CMYK JPEG (4 channels), decoded to RGB (3) as PIL converts it";
	if (img_sniff(buf, n) != IMG_PNG)
		return NULL; /* (a JPEG's other channels, gray or colour, are its own) */
	memset(&pi, 0, sizeof pi);
	pi.version = PNG_IMAGE_VERSION;
	if (!png_image_begin_read_from_memory(&pi, buf, n))
		return NULL;
	const png_uint_32 f = pi.format;
	png_image_free(&pi);
	if (f & PNG_FORMAT_FLAG_COLORMAP)
		return f & PNG_FORMAT_FLAG_ALPHA
			       ? "the file is a palette PNG with transparency, decoded to RGB (3 channels) with its alpha composited onto black"
			       : "the file is a palette PNG, decoded to RGB (3 channels)";
	if (!(f & PNG_FORMAT_FLAG_ALPHA))
		return NULL;
	/* alpha from a tRNS chunk on an RGB or gray file (IHDR's colour type,
	 * byte 25 of a PNG, 2 or 0) is transparency, not a 4th channel */
	const int trns = n > 25 && (((const unsigned char *)buf)[25] & 4) == 0;
	if (f & PNG_FORMAT_FLAG_COLOR)
		return trns ? "the file is RGB with a tRNS transparency chunk, decoded to RGB (3 channels) with its transparent pixels composited onto black"
			    : "the file is RGBA (4 channels), decoded to RGB (3) with its alpha composited onto black";
	return trns ? "the file is gray with a tRNS transparency chunk, decoded to gray (1 channel) with its transparent pixels composited onto black"
		    : "the file is gray with alpha (2 channels), decoded to gray (1) with its alpha composited onto black";
}

kiln_status img_decode(const struct kiln_host *host, const void *buf, size_t n,
		       const char *what, int64_t max_pixels, struct kiln_image *img)
{
	switch (img_sniff(buf, n)) {
	case IMG_JPEG:
		return decode_jpeg(host, buf, n, what, max_pixels, img);
	case IMG_PNG:
		return decode_png(host, buf, n, what, max_pixels, img);
	default: {
		const char *like = img_sniff_other(buf, n);
		return host->error(KILN_EDATA, "%s: not a JPEG or PNG image (%zu bytes%s%s%s)", what, n,
				   like ? "; it begins with the signature of " : "", like ? like : "",
				   like ? ": convert it to JPEG or PNG" : "");
	}
	}
}

kiln_status img_encode_jpeg(const struct kiln_host *host, const uint8_t *px, int h, int w,
			    int c, int quality, uint8_t **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (c != 1 && c != 3)
		return host->error(KILN_EINVAL, "JPEG encode: %d channels (1 or 3)", c);
	tjhandle tj = tjInitCompress();
	if (!tj)
		return host->error(KILN_ENOMEM, "cannot start the JPEG encoder: %s",
				   tjGetErrorStr2(NULL));
	unsigned char *buf = NULL;
	unsigned long size = 0;
	int r = tjCompress2(tj, px, w, w * c, h, c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
			    c == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, TJFLAG_ACCURATEDCT);
	kiln_status st = KILN_OK;
	if (r) {
		st = host->error(KILN_EINTERNAL, "JPEG encode: %s", tjGetErrorStr2(tj));
	} else if (!(*out = malloc(size))) {
		st = host->error(KILN_ENOMEM, "out of memory");
	} else {
		memcpy(*out, buf, size);
		*n = size;
	}
	tjFree(buf);
	tjDestroy(tj);
	return st;
}

kiln_status img_encode_png(const struct kiln_host *host, const uint8_t *px, int h, int w,
			   int c, uint8_t **out, size_t *n)
{
	png_image pi;
	png_alloc_size_t size = 0;
	*out = NULL;
	*n = 0;
	memset(&pi, 0, sizeof pi);
	pi.version = PNG_IMAGE_VERSION;
	pi.width = (png_uint_32)w;
	pi.height = (png_uint_32)h;
	pi.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
	if (!png_image_write_to_memory(&pi, NULL, &size, 0, px, w * c, NULL))
		return host->error(KILN_EINTERNAL, "PNG encode: %s", pi.message);
	if (!(*out = malloc(size)))
		return host->error(KILN_ENOMEM, "out of memory");
	if (!png_image_write_to_memory(&pi, *out, &size, 0, px, w * c, NULL)) {
		free(*out);
		*out = NULL;
		return host->error(KILN_EINTERNAL, "PNG encode: %s", pi.message);
	}
	*n = size;
	return KILN_OK;
}
