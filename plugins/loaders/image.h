/* plugins/loaders/image.h - decoding and encoding images in memory, shared
 * by every source of kiln-loaders.so that stores encoded images (folder,
 * tar, lmdb, records with JPEG storage) and by `kiln pack`.
 *
 * JPEG goes through libjpeg-turbo (libjpeg's API) with the settings PIL
 * uses (accurate integer IDCT, fancy upsampling), and past libjpeg's
 * warnings as PIL, refusing only a file whose data ends before its EOI, so
 * pixels equal what torchvision's PIL path decodes (and a file whose false
 * marker sends jpeg_finish_decompress past the end after every row is
 * decoded, which PIL returns: rare, the safe direction; and one of more
 * than 500 scans, TurboJPEG's limit); the first file of a process decoded
 * past a warning is named in a logged warning.  PNG through libpng's low-level reader,
 * to the stored samples as PIL returns them (no gAMA, sRGB or ICC
 * conversion).  Decoded pixels are 8-bit HWC: gray stays 1 channel (a
 * gray+alpha PNG too), everything else (RGB, palette, RGBA, CMYK and
 * YCCK JPEGs) becomes 3-channel RGB (CMYK as PIL's convert("RGB")); alpha
 * (a channel or tRNS) is composited onto black in the stored values,
 * round(v * a / 255); 16-bit PNG samples become their high byte, v >> 8
 * (PIL's, but for 16-bit gray, which PIL clips at 255).
 * Thread-safe: the shared state is two atomic flags (the warnings of an
 * image above max_pixels and of a JPEG decoded past libjpeg's warning are
 * each given once a process).
 */
#ifndef KILN_LOADERS_IMAGE_H
#define KILN_LOADERS_IMAGE_H

#include <kiln/plugin.h>

#include <stddef.h>
#include <stdint.h>

enum img_format { IMG_UNKNOWN = 0, IMG_JPEG = 1, IMG_PNG = 2 };

/* The format of buf[0..n) by its signature bytes (IMG_UNKNOWN if neither). */
int img_sniff(const void *buf, size_t n);

/* The format a file name's extension promises (.jpg/.jpeg/.png, any case),
 * IMG_UNKNOWN otherwise. */
int img_format_of_name(const char *name);

/* Decode buf[0..n) (JPEG or PNG, told apart by signature) into *img,
 * growing img->data with realloc() as struct kiln_image says.  As PIL's
 * decompression bomb guard ([data] max_image_pixels its MAX_IMAGE_PIXELS):
 * an image whose header declares more than max_pixels (width x height) is
 * decoded with a warning (the first in the process only), one of more
 * than twice max_pixels, or more than IMG_MAX_PIXELS, refused before
 * anything is decoded or allocated.  `what`
 * names the file (and member) in messages: "photos/cat/1.jpg: not a JPEG
 * or PNG image".  KILN_EDATA for undecodable input, KILN_ENOMEM. */
#define IMG_MAX_PIXELS ((int64_t)1 << 28)
/* No image file is larger: a bigger one (a sparse file, a mistake) is
 * refused before it is read (the folder source, kiln predict). */
#define IMG_MAX_FILE ((uint64_t)1 << 30) /* 1 GiB */
kiln_status img_decode(const struct kiln_host *host, const void *buf, size_t n,
		       const char *what, int64_t max_pixels, struct kiln_image *img);

/* What img_decode does to the channels of the image in buf[0..n), for
 * messages that count the decoded ones: a static sentence ("the file is
 * RGBA (4 channels), decoded to RGB (3) with its alpha composited onto
 * black"; also gray with alpha, palette PNGs, CMYK JPEGs), NULL when the
 * decoded channels are the file's (gray, RGB) or buf is no readable PNG or
 * JPEG. */
const char *img_channels_note(const void *buf, size_t n);

/* Encode h x w x c (c = 1 or 3) 8-bit pixels as a baseline JPEG of the
 * given quality (1..100, 4:2:0 for colour).  *out is malloc()ed; the
 * caller frees it. */
kiln_status img_encode_jpeg(const struct kiln_host *host, const uint8_t *px, int h, int w,
			    int c, int quality, uint8_t **out, size_t *n);

/* Encode as PNG (lossless).  *out is malloc()ed; the caller frees it. */
kiln_status img_encode_png(const struct kiln_host *host, const uint8_t *px, int h, int w,
			   int c, uint8_t **out, size_t *n);

/* Make sure img->data holds `bytes` (realloc as needed). */
kiln_status img_reserve(const struct kiln_host *host, struct kiln_image *img, size_t bytes);

#endif /* KILN_LOADERS_IMAGE_H */
