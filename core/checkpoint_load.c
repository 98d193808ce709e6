/* core/checkpoint_load.c - a checkpoint into a model (checkpoint.h):
 * the model's parameters checked against the checkpoint's (names, shapes,
 * sample; read by name when laid out in another order:
 * checkpoint_layout.c), the weights checked finite on their way to the
 * device, the counters range-checked; whole, or one ZeRO slot's or one
 * pipeline stage's slice.
 */
#include "checkpoint_impl.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int kiln_ckpt_is_checkpoint(const char *path)
{
	char kind[64];
	const char *why;
	int fd = common_open_file(path, kind, sizeof kind, &why, NULL), yes = 0;
	if (fd < 0)
		return 0;
	yes = kiln_ckpt_is_checkpoint_fd(fd);
	close(fd);
	return yes;
}

int kiln_ckpt_is_checkpoint_fd(int fd)
{
	char h[8];
	return kiln_pread_all(fd, h, sizeof h, 0) == 0 && !memcmp(h, ckpt_magic, 8);
}

/* The batchnorm count the checkpoint's weights stand at: its "tracked"
 * section, plus the "step" buffer's micro-steps when that is not loaded
 * with them (what).  A checkpoint of an older kiln has no "tracked": for a
 * resume (LOAD_ALL) *out is left as it is (the same init_from loaded it),
 * else it counts from 0. */
static kiln_status tracked_count(struct kiln_ckpt *ck, int what, int64_t *out)
{
	const struct rsec *step = ckpt_section(ck, "step");
	uint8_t b[8];
	kiln_status st;
	/* each count is checked before the sum: INT64_MAX + the step was
	 * signed overflow (undefined) */
	const uint64_t most = (uint64_t)1 << 62;
	uint64_t v;
	if (ckpt_section(ck, "tracked")) {
		if ((st = kiln_ckpt_read(ck, "tracked", b, sizeof b)))
			return st;
		if ((v = get_u64(b)) > most)
			return kiln_error(KILN_EDATA, "checkpoint %s: batch count out of range", ck->path);
		*out = (int64_t)v;
	} else if (what == KILN_CKPT_LOAD_WEIGHTS) {
		*out = 0;
	}
	if (what == KILN_CKPT_LOAD_WEIGHTS && step && step->bytes == sizeof b) {
		if ((st = kiln_ckpt_read(ck, "step", b, sizeof b)))
			return st;
		if ((v = get_u64(b)) > most)
			return kiln_error(KILN_EDATA, "checkpoint %s: batch count out of range", ck->path);
		*out += (int64_t)v; /* both at most 2^62: no overflow */
	}
	if (*out < 0 || *out > (int64_t)most)
		return kiln_error(KILN_EDATA, "checkpoint %s: batch count out of range", ck->path);
	return KILN_OK;
}

/* The counters among the state sections, range-checked before any byte
 * reaches the model (CRCs prove a file whole, not sane): the step counts
 * ("step", "optim.step": int64 in [0, 2^62], the optimizers' bias
 * corrections and the schedule add to them) and the loss scaler's state
 * ("amp.scaler": scale finite and > 0, its counts finite and >= 0).
 * KILN_EDATA naming the file and section. */
static kiln_status check_counters(const struct kiln_ckpt *ck, const char *name, const void *p,
				  size_t bytes)
{
	if ((!strcmp(name, "step") || !strcmp(name, "optim.step")) && bytes == 8) {
		int64_t v;
		memcpy(&v, p, 8);
		if (v < 0 || v > (int64_t)1 << 62)
			return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' = %lld is out of range [0, 2^62]",
					  ck->path, name, (long long)v);
	}
	if (!strcmp(name, "amp.scaler") && bytes == 4 * sizeof(float)) {
		float v[4];
		memcpy(v, p, sizeof v);
		for (int i = 0; i < 4; i++)
			/* (hysteresis left, value 2, went below 0 before session
			 * 29: a count below 0 acts as 0) */
			if (!isfinite(v[i]) || (v[i] < 0 && i != 2) || (i == 0 && !(v[0] > 0)))
				return kiln_error(KILN_EDATA, "checkpoint %s: section 'amp.scaler' value %d (%s) = %g is out of range (%s)",
						  ck->path, i, i ? "a count" : "the loss scale", v[i],
						  i ? "finite, >= 0" : "finite, > 0");
	}
	return KILN_OK;
}

/* Section `tag`'s bytes [off, off + bytes) read into v: refused when it is
 * the parameters or the buffers and a tensor's values there are not
 * finite (kiln_model_finite_check). */
static kiln_status weights_finite(const struct kiln_ckpt *ck, const struct kiln_model *m,
				  const char *tag, size_t off, const void *v, size_t bytes)
{
	char what[4200];
	const int region = !strcmp(tag, "params") ? 0 : !strcmp(tag, "buffers") ? 1 : -1;
	if (region < 0)
		return KILN_OK;
	snprintf(what, sizeof what, "checkpoint %s", ck->path);
	return kiln_model_finite_check(m, what, region, off / sizeof(float), v,
				       bytes / sizeof(float));
}

/* After state buffer `name` was enqueued from host: when it is "step",
 * dropout's step from the same bytes (it has no section of its own): a
 * model stepped through kiln_model_step_advance, one micro-step a step,
 * draws on where it was; the trainer sets the optimizer step's after
 * loading (kiln_model_drop_set). */
static kiln_status step_to_drop(struct kiln_model *m, const char *name, const void *host,
				void *stream)
{
	if (strcmp(name, "step"))
		return KILN_OK;
	return kiln_device_copy_async(m->dev, m->drop_d, host, sizeof(int64_t), KILN_COPY_H2D,
				      stream);
}

/* Section `tag` whole into host (bytes, its exact length) in m's layout:
 * read as stored, its CRC checked over the stored bytes, then, when the
 * checkpoint lays m's tensors out in another order (at: ckpt_layout) and
 * the section holds tensors, each tensor's extent moved to its place. */
static kiln_status read_section(struct kiln_ckpt *ck, const struct kiln_model *m,
				const size_t *at, const char *tag, void *host, size_t bytes)
{
	const int kind = at ? ckpt_layout_kind(m, tag) : CKPT_MAP_NONE;
	if (kind == CKPT_MAP_NONE)
		return kiln_ckpt_read(ck, tag, host, bytes);
	float *stored = malloc(bytes ? bytes : 1);
	if (!stored)
		return kiln_error(KILN_ENOMEM, "out of memory");
	kiln_status st = kiln_ckpt_read(ck, tag, stored, bytes);
	if (!st)
		ckpt_gather(m, at, kind, 0, bytes / sizeof(float), stored, -1, 0, host);
	free(stored);
	return st;
}

kiln_status kiln_ckpt_load_model(struct kiln_ckpt *ck, struct kiln_model *m, void *stream, int what)
{
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	kiln_status st;
	size_t total = 0, off = 0, *at = NULL;
	void *host = NULL;
	if ((st = ckpt_same_model(ck, m, &at)))
		return st;
	if (at)
		ckpt_layout_note(ck, m, at);
	int64_t tracked = m->tracked_base;
	/* (the slots are read: the same tensors trainable, before their
	 * lengths are compared) */
	if ((what == KILN_CKPT_LOAD_ALL && m->state_d && (st = ckpt_same_trainable(ck, m, at))) ||
	    (st = tracked_count(ck, what, &tracked)))
		goto out;
	/* every wanted section present with exactly the buffer's length */
	for (int i = 0; i < nb; i++) {
		uint64_t bytes;
		if (what == KILN_CKPT_LOAD_WEIGHTS && strcmp(sb[i].name, "params") &&
		    strcmp(sb[i].name, "buffers"))
			continue;
		if ((st = kiln_ckpt_find(ck, sb[i].name, &bytes))) {
			st = KILN_EDATA;
			goto out;
		}
		if (bytes != sb[i].bytes) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section '%s' has %llu bytes but this model's %s has %zu",
					ck->path, sb[i].name, (unsigned long long)bytes, sb[i].name,
					sb[i].bytes);
			goto out;
		}
		total += sb[i].bytes;
	}
	/* read and check everything before the first byte reaches the model */
	if (total && (st = kiln_device_host_alloc(m->dev, total, &host)))
		goto out;
	for (int i = 0; i < nb; i++) {
		if (what == KILN_CKPT_LOAD_WEIGHTS && strcmp(sb[i].name, "params") &&
		    strcmp(sb[i].name, "buffers"))
			continue;
		if ((st = read_section(ck, m, at, sb[i].name, (char *)host + off, sb[i].bytes)) ||
		    (st = check_counters(ck, sb[i].name, (char *)host + off, sb[i].bytes)) ||
		    (st = weights_finite(ck, m, sb[i].name, 0, (char *)host + off, sb[i].bytes)))
			goto out;
		off += sb[i].bytes;
	}
	off = 0;
	for (int i = 0; i < nb; i++) {
		if (what == KILN_CKPT_LOAD_WEIGHTS && strcmp(sb[i].name, "params") &&
		    strcmp(sb[i].name, "buffers"))
			continue;
		if (sb[i].bytes && ((st = kiln_device_copy_async(m->dev, sb[i].ptr, (char *)host + off,
								  sb[i].bytes, KILN_COPY_H2D, stream)) ||
				    (st = step_to_drop(m, sb[i].name, (char *)host + off, stream))))
			break;
		off += sb[i].bytes;
	}
	{
		/* the host buffer must outlive the copies, even after a failure */
		kiln_status st2 = kiln_device_stream_sync(m->dev, stream);
		if (!st)
			st = st2;
	}
	if (!st)
		m->tracked_base = tracked;
out:
	kiln_device_host_free(m->dev, host);
	free(at);
	return st;
}

/* ---- a stage's slice (core/dist_pipe_ckpt.c) ------------------------------- */

/* Bytes [off, off + n) of section r in m's layout, piece by piece
 * through host, to the device at dst (the file's checksums were verified
 * when it was opened; the parameters' and buffers' values are checked
 * finite).  lay: where the checkpoint holds m's tensors when its order is
 * another (ckpt_layout), each piece gathered from their places. */
static kiln_status range_to_device(struct kiln_ckpt *ck, const struct rsec *r, uint64_t off,
				   size_t n, void *dst, void *host, struct kiln_model *m,
				   const size_t *lay, void *stream)
{
	const int kind = lay ? ckpt_layout_kind(m, r->tag) : CKPT_MAP_NONE;
	const size_t f = sizeof(float);
	kiln_status st = KILN_OK;
	for (size_t at = 0; at < n && !st; at += PIECE) {
		const size_t k = n - at < PIECE ? n - at : PIECE;
		if (kind == CKPT_MAP_NONE ? kiln_pread_all(ck->fd, host, k, r->off + off + at)
					  : ckpt_gather(m, lay, kind, (off + at) / f, (off + at + k) / f,
							NULL, ck->fd, r->off, host))
			return ckpt_read_error(ck->path, r->tag);
		if ((st = weights_finite(ck, m, r->tag, off + at, host, k)))
			return st;
		if (!(st = kiln_device_copy_async(m->dev, (char *)dst + at, host, k, KILN_COPY_H2D,
						  stream)))
			st = kiln_device_stream_sync(m->dev, stream);
	}
	return st;
}

/* Section `tag` present with exactly `bytes`. */
static kiln_status section_of(struct kiln_ckpt *ck, const char *tag, size_t bytes,
			      const struct rsec **out)
{
	const struct rsec *r = ckpt_section(ck, tag);
	if (!r)
		return kiln_error(KILN_EDATA, "checkpoint %s: no section '%s'", ck->path, tag);
	if (r->bytes != bytes)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' has %llu bytes but this model's %s has %zu",
				  ck->path, tag, (unsigned long long)r->bytes, tag, bytes);
	*out = r;
	return KILN_OK;
}

/* The counters ("step", "optim.step", "amp.scaler": small, every rank's
 * alike) whole, range-checked before they reach the device. */
static kiln_status load_counters(struct kiln_ckpt *ck, struct kiln_model *m, void *stream)
{
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	const int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	uint8_t b[64];
	kiln_status st = KILN_OK;
	for (int i = 0; i < nb && !st; i++) {
		const struct rsec *r;
		if (strcmp(sb[i].name, "step") && strcmp(sb[i].name, "optim.step") &&
		    strcmp(sb[i].name, "amp.scaler"))
			continue;
		if (sb[i].bytes > sizeof b)
			return kiln_error(KILN_EINTERNAL, "state buffer '%s' of %zu bytes", sb[i].name,
					  sb[i].bytes);
		if ((st = section_of(ck, sb[i].name, sb[i].bytes, &r)) ||
		    (st = kiln_ckpt_read(ck, sb[i].name, b, sb[i].bytes)) ||
		    (st = check_counters(ck, sb[i].name, b, sb[i].bytes)) ||
		    (st = kiln_device_copy_async(m->dev, sb[i].ptr, b, sb[i].bytes, KILN_COPY_H2D,
						 stream)))
			break;
		if ((st = step_to_drop(m, sb[i].name, b, stream)))
			break;
		st = kiln_device_stream_sync(m->dev, stream);
	}
	return st;
}

kiln_status kiln_ckpt_load_slot(struct kiln_ckpt *ck, struct kiln_model *m, const size_t *lay,
				int k, size_t lo, size_t hi, float *dst, void *stream)
{
	const size_t bytes = m->n_trainable * sizeof(float);
	const struct rsec *r;
	void *host = NULL;
	kiln_status st = section_of(ck, m->optim_info.slot_names[k], bytes, &r);
	if (!st && hi > lo && !(st = kiln_device_host_alloc(m->dev, PIECE, &host)))
		st = range_to_device(ck, r, lo * sizeof(float), (hi - lo) * sizeof(float), dst, host,
				     m, lay, stream);
	kiln_device_host_free(m->dev, host);
	return st;
}

kiln_status kiln_ckpt_load_stage(struct kiln_ckpt *ck, struct kiln_model *m, void *stream,
				 size_t lo, size_t hi, float *state, int what)
{
	const size_t n = hi > lo ? hi - lo : 0;
	const struct rsec *r;
	size_t *at = NULL;
	void *host = NULL;
	kiln_status st;
	if ((st = ckpt_same_model(ck, m, &at)))
		return st;
	if (at)
		ckpt_layout_note(ck, m, at);
	int64_t tracked = m->tracked_base;
	if ((what == KILN_CKPT_LOAD_ALL && state && (st = ckpt_same_trainable(ck, m, at))) ||
	    (st = tracked_count(ck, what, &tracked)) ||
	    (st = kiln_device_host_alloc(m->dev, PIECE, &host)))
		goto out;
	/* the stage's parameters, the buffers (whole on every rank), the
	 * stage's slice of each optimizer slot, then the counters */
	if ((st = section_of(ck, "params", m->n_elems * sizeof(float), &r)) ||
	    (st = range_to_device(ck, r, lo * sizeof(float), n * sizeof(float), m->params_d + lo,
				  host, m, at, stream)))
		goto out;
	if (m->n_buf_elems &&
	    ((st = section_of(ck, "buffers", m->n_buf_elems * sizeof(float), &r)) ||
	     (st = range_to_device(ck, r, 0, m->n_buf_elems * sizeof(float), m->buffers_d, host, m,
				   at, stream))))
		goto out;
	for (int k = 0; what == KILN_CKPT_LOAD_ALL && state && k < m->state_slots; k++)
		if ((st = section_of(ck, m->optim_info.slot_names[k], m->n_trainable * sizeof(float),
				     &r)) ||
		    (st = range_to_device(ck, r, lo * sizeof(float), n * sizeof(float),
					  state + (size_t)k * n, host, m, at, stream)))
			goto out;
	if (what == KILN_CKPT_LOAD_ALL && (st = load_counters(ck, m, stream)))
		goto out;
	m->tracked_base = tracked;
	kiln_model_weights_written(m);
out:
	kiln_device_host_free(m->dev, host);
	free(at);
	return st;
}

