/* plugins/loaders/image.c - JPEG (TurboJPEG) and PNG (libpng) in memory;
 * see image.h. */
#include "image.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <turbojpeg.h>

int img_sniff(const void *buf, size_t n)
{
	const uint8_t *p = buf;
	if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
		return IMG_JPEG;
	if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8))
		return IMG_PNG;
	return IMG_UNKNOWN;
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

static kiln_status check_dims(const struct kiln_host *host, const char *what, int64_t w,
			      int64_t h, int64_t max_pixels)
{
	if (w <= 0 || h <= 0)
		return host->error(KILN_EDATA, "%s: image of %lldx%lld pixels", what, (long long)w,
				   (long long)h);
	if (max_pixels > IMG_MAX_PIXELS)
		max_pixels = IMG_MAX_PIXELS;
	if (w * h > max_pixels)
		return host->error(KILN_EDATA, "%s: image of %lldx%lld pixels (%lld) is larger than the limit of %lld pixels ([data] max_image_pixels; a decompression bomb?)",
				   what, (long long)w, (long long)h, (long long)(w * h),
				   (long long)max_pixels);
	return KILN_OK;
}

static kiln_status decode_jpeg(const struct kiln_host *host, const uint8_t *buf, size_t n,
			       const char *what, int64_t max_pixels, struct kiln_image *img)
{
	kiln_status st = KILN_OK;
	tjhandle tj = tjInitDecompress();
	if (!tj)
		return host->error(KILN_ENOMEM, "%s: cannot start the JPEG decoder: %s", what,
				   tjGetErrorStr2(NULL));
	/* TurboJPEG returns success without setting these for a stream that
	 * ends before its frame header (a "tables-only" JPEG): start at 0 */
	int w = 0, h = 0, sub = 0, cs = 0;
	if (tjDecompressHeader3(tj, buf, (unsigned long)n, &w, &h, &sub, &cs)) {
		st = host->error(KILN_EDATA, "%s: undecodable JPEG: %s", what, tjGetErrorStr2(tj));
		goto out;
	}
	if (w == 0 || h == 0) {
		st = host->error(KILN_EDATA, "%s: undecodable JPEG: no frame header (SOF) before the end of the data",
				 what);
		goto out;
	}
	if ((st = check_dims(host, what, w, h, max_pixels)))
		goto out;
	if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
		st = host->error(KILN_EDATA, "%s: CMYK JPEGs are not supported (convert to RGB)", what);
		goto out;
	}
	int c = cs == TJCS_GRAY ? 1 : 3;
	if ((st = img_reserve(host, img, (size_t)w * h * c)))
		goto out;
	/* accurate DCT and fancy upsampling are TurboJPEG's defaults, and
	 * PIL's: the same pixels as torchvision.  A warning (truncated data,
	 * corrupt segment) stops the decode: a damaged image is an error. */
	if (tjDecompress2(tj, buf, (unsigned long)n, img->data, w, w * c, h,
			  c == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING)) {
		st = host->error(KILN_EDATA, "%s: undecodable JPEG: %s", what, tjGetErrorStr2(tj));
		goto out;
	}
	img->h = h;
	img->w = w;
	img->c = c;
out:
	tjDestroy(tj);
	return st;
}

static kiln_status decode_png(const struct kiln_host *host, const uint8_t *buf, size_t n,
			      const char *what, int64_t max_pixels, struct kiln_image *img)
{
	kiln_status st;
	png_image pi;
	memset(&pi, 0, sizeof pi);
	pi.version = PNG_IMAGE_VERSION;
	if (!png_image_begin_read_from_memory(&pi, buf, n))
		return host->error(KILN_EDATA, "%s: undecodable PNG: %s", what, pi.message);
	if ((st = check_dims(host, what, pi.width, pi.height, max_pixels))) {
		png_image_free(&pi);
		return st;
	}
	int gray = !(pi.format & PNG_FORMAT_FLAG_COLOR) && !(pi.format & PNG_FORMAT_FLAG_COLORMAP);
	pi.format = gray ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
	/* 16-bit samples are sRGB-encoded, as every 8-bit one is: reduced to 8
	 * bits by scaling (v * 255 / 65535, rounded), not through the linear
	 * light the simplified API assumes 16-bit data is in (which mapped
	 * 3 * 257 to 33 and 89 * 257 to 158) */
	pi.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
	int c = gray ? 1 : 3;
	if ((st = img_reserve(host, img, (size_t)pi.width * pi.height * c))) {
		png_image_free(&pi);
		return st;
	}
	/* alpha, if any, is composited onto black */
	png_color bg = { 0, 0, 0 };
	if (!png_image_finish_read(&pi, &bg, img->data, (png_int_32)(pi.width * c), NULL)) {
		st = host->error(KILN_EDATA, "%s: undecodable PNG: %s", what, pi.message);
		png_image_free(&pi);
		return st;
	}
	img->h = (int32_t)pi.height;
	img->w = (int32_t)pi.width;
	img->c = c;
	return KILN_OK;
}

const char *img_channels_note(const void *buf, size_t n)
{
	png_image pi;
	if (img_sniff(buf, n) != IMG_PNG)
		return NULL; /* (a JPEG is decoded with its own channels; CMYK is refused) */
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
	if ((f & PNG_FORMAT_FLAG_ALPHA) && (f & PNG_FORMAT_FLAG_COLOR))
		return "the file is RGBA (4 channels), decoded to RGB (3) with its alpha composited onto black";
	if (f & PNG_FORMAT_FLAG_ALPHA)
		return "the file is gray with alpha (2 channels), decoded to gray (1) with its alpha composited onto black";
	return NULL;
}

kiln_status img_decode(const struct kiln_host *host, const void *buf, size_t n,
		       const char *what, int64_t max_pixels, struct kiln_image *img)
{
	switch (img_sniff(buf, n)) {
	case IMG_JPEG:
		return decode_jpeg(host, buf, n, what, max_pixels, img);
	case IMG_PNG:
		return decode_png(host, buf, n, what, max_pixels, img);
	default:
		return host->error(KILN_EDATA, "%s: not a JPEG or PNG image (%zu bytes)", what, n);
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
