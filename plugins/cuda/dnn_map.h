/* plugins/cuda/dnn_map.h - the host-only logic of the CUDA device's
 * convolution (cudnn.c): cuDNN tensor strides of kiln's layouts, the
 * geometry of the three convolution ops, the autotune key of a shape, and
 * the persistent autotune cache (its file format and lookups).
 *
 * Nothing here includes a CUDA or cuDNN header, so these are pure
 * functions tested on any machine (tests/check_cuda_dnn.c, in `make
 * check`) with no GPU; cudnn.c only turns their results into backend
 * descriptors.
 */
#ifndef KILN_CUDA_DNN_MAP_H
#define KILN_CUDA_DNN_MAP_H

#include <kiln/plugin.h> /* struct kiln_op, the op types */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Strides, in elements, of a 4-d activation described as dims N, C, H, W
 * (kiln's convention whatever the layout) and stored NCHW (nhwc = 0) or
 * NHWC (nhwc = 1): cuDNN's tensors take logical dims plus strides, so the
 * layout lives in the strides alone.
 *   NCHW: { C*H*W, H*W, W, 1 }     NHWC: { H*W*C, 1, W*C, C } */
void cuda_dnn_strides(const int64_t dims[4], int nhwc, int64_t strides[4]);

/* The geometry of a CONV, CONV_BWD_DATA or CONV_BWD_WEIGHTS op, named as
 * the forward convolution names it whichever op reads or writes which. */
struct cuda_conv_geom {
	int type;            /* KILN_OP_CONV* */
	int64_t x[4], w[4], y[4]; /* dims: x [N,C,H,W], w [O,C/g,KH,KW], y [N,O,OH,OW] */
	int64_t xs[4], ws[4], ys[4]; /* their strides (w is always OIHW) */
	int64_t stride[2], pad[2], dil[2], groups;
	int nhwc;
	int dt_x, dt_w, dt_y; /* kiln dtypes of x, w (dw for BWD_WEIGHTS), y */
	int bias;            /* CONV with in2 b[O], or BWD_WEIGHTS with out1 db[O] */
	/* where each tensor is in the op's arguments: (k << 8 | i), k = 0 in,
	 * 1 out; -1 absent */
	int arg_x, arg_w, arg_y, arg_b;
};

/* Fill g from op.  Returns 0, or -1 with a reason in why[0..n) for what
 * this mapping cannot express (not 4-d, an unknown layout); the shapes
 * themselves are the core's to check (opcheck) and cuDNN's. */
int cuda_conv_geom(const struct kiln_op *op, struct cuda_conv_geom *g, char *why, size_t n);

/* The autotune key of a convolution: every property the choice of an
 * engine depends on, as text ("CONV f32/f32/f32 NHWC x 8,3,224,224 w
 * 64,3,7,7 s 2,2 p 3,3 d 1,1 g 1 b1 det0 ws 1024"), so a cache file can be
 * read by eye.  Returns the length (truncated to n - 1 like snprintf). */
int cuda_conv_key(const struct cuda_conv_geom *g, int deterministic, int64_t ws_mb, char *buf,
		  size_t n);

/* ---- the autotune cache ------------------------------------------------
 * One entry per key: the engine cuDNN's heuristics named (its global
 * index), the knob choices of its configuration, the workspace it needs
 * and the time measured.  The file is valid for one (GPU, driver, cuDNN)
 * triple, its `device` string: a file written for another is ignored (and
 * replaced at the next save).
 *
 * File format (little-endian, fixed-width):
 *   "KILNATC1"                     8 bytes magic
 *   u32 version (1), u32 entry count
 *   u16 length + bytes             the device string
 *   per entry: u16 key length + key bytes, i64 engine, i64 workspace,
 *              f32 ms, u32 knob count (<= CUDA_ATC_KNOBS),
 *              knob count x (i32 type, i64 value)
 *   u32 CRC32C of every byte before it
 */
#define CUDA_ATC_MAGIC "KILNATC1"
#define CUDA_ATC_VERSION 1u
#define CUDA_ATC_KNOBS 48
#define CUDA_ATC_KEY 256

struct cuda_atc_entry {
	char key[CUDA_ATC_KEY];
	int64_t engine;
	int64_t workspace;
	float ms;
	uint32_t n_knobs;
	int32_t knob_type[CUDA_ATC_KNOBS];
	int64_t knob_value[CUDA_ATC_KNOBS];
};

struct cuda_atc {
	char device[256];          /* cuda_atc_device_string's */
	struct cuda_atc_entry *e;  /* malloc'd, n of cap */
	size_t n, cap;
};

typedef uint32_t (*cuda_crc_fn)(uint32_t crc, const void *buf, size_t n);

/* The entry of key, or NULL. */
const struct cuda_atc_entry *cuda_atc_find(const struct cuda_atc *a, const char *key);
/* Add or replace the entry of e->key.  0, or -1 out of memory. */
int cuda_atc_put(struct cuda_atc *a, const struct cuda_atc_entry *e);
void cuda_atc_clear(struct cuda_atc *a); /* frees the entries, keeps device */

/* Serialise a into *buf (malloc'd, the caller frees) of *len bytes.
 * 0, or -1 out of memory / a field too long for its width. */
int cuda_atc_encode(const struct cuda_atc *a, cuda_crc_fn crc, uint8_t **buf, size_t *len);
/* Parse buf into a's entries, replacing them; a->device must be set to
 * this machine's string first.  Returns 0 (loaded), 1 (a valid file of
 * another device or version: nothing loaded), or -1 (corrupt: bad magic,
 * truncated, bad checksum, a field out of range: nothing loaded), with a
 * reason in why. */
int cuda_atc_decode(struct cuda_atc *a, const uint8_t *buf, size_t len, cuda_crc_fn crc,
		    char *why, size_t n);

/* The file: load (a missing file is 0 with nothing loaded) and save
 * (written beside as a temporary of the call's own, common_open_tmp,
 * then renamed, so a reader never sees half a file; the directories are
 * created).  Same returns as decode;
 * save: 0 or -1 with why. */
int cuda_atc_load(struct cuda_atc *a, const char *path, cuda_crc_fn crc, char *why, size_t n);
int cuda_atc_save(const struct cuda_atc *a, const char *path, cuda_crc_fn crc, char *why,
		  size_t n);

/* The device string of the cache, what an engine choice depends on: the
 * GPU model (name, compute capability and SM count, so a MIG slice differs
 * from the whole GPU), the driver and cuDNN versions, e.g. "NVIDIA H200
 * sm_90 132 SMs driver 13000 cudnn 91900".  Not the GPU's UUID: the ranks
 * of a node share one file, and the next job may land on another unit of
 * the same model; keyed by unit, each would find another's file and
 * replace it, and the cache would never be read. */
void cuda_atc_device_string(char *buf, size_t n, const char *name, int cc_major, int cc_minor,
			    int sms, int driver, size_t cudnn);

/* The default path of the cache: $XDG_CACHE_HOME/kiln/cudnn_autotune.bin,
 * else $HOME/.cache/kiln/cudnn_autotune.bin.  0, or -1 when neither
 * variable is set (no cache file then). */
int cuda_atc_default_path(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_DNN_MAP_H */
