/* plugins/common/device.h - what the device plugins (cpu, cuda) do alike,
 * kept once: the op's name from the host, run()'s argument check, the
 * extents of the elementwise ops' plans, and the doubly linked lists of
 * live objects.  Header-only (static inline); the
 * host table is the plugin's (kiln_plugin_init), borrowed for its life.
 */
#ifndef KILN_COMMON_DEVICE_H
#define KILN_COMMON_DEVICE_H

#include "describe.h"     /* common_numel, common_inner */
#include <kiln/plugin.h> /* struct kiln_host, struct kiln_op_args */

#include <stddef.h>
#include <stdint.h>

/* The core's name of op type `type` (host table version 3), "op" before. */
static inline const char *common_op_name(const struct kiln_host *host, int type)
{
	return host && host->version >= 3 ? host->op_name(type) : "op";
}

/* run()'s checks in a device's run function: a plan, args and a stream,
 * then the plan's arguments (common_run_args_check); returns the error
 * from the function when one fails.  p: the device's plan (members op,
 * n_in, n_out, workspace). */
#define COMMON_RUN_CHECK(host, dev, p, args, stream)                                       \
	do {                                                                               \
		if (!(p) || !(args) || !(stream))                                          \
			return (host)->error(KILN_EINVAL, "%s: run: NULL %s", dev,          \
					     !(p) ? "plan" : !(args) ? "args" : "stream");  \
		const kiln_status st_ = common_run_args_check(host, dev, (p)->op.type,     \
							      (p)->n_in, (p)->n_out,       \
							      (p)->workspace, args);       \
		if (st_)                                                                   \
			return st_;                                                        \
	} while (0)

/* run()'s check of a plan's arguments, on the caller's thread so that a
 * missing buffer is reported by run() itself rather than by a later sync:
 * n_in inputs and n_out outputs set, and a workspace of at least
 * `workspace` bytes when the plan asked for one.  dev: "cpu", "cuda". */
static inline kiln_status common_run_args_check(const struct kiln_host *host, const char *dev,
						int type, int n_in, int n_out, size_t workspace,
						const struct kiln_op_args *args)
{
	for (int i = 0; i < n_in; i++)
		if (!args->in[i])
			return host->error(KILN_EINVAL, "%s: %s: input %d is NULL", dev,
					   common_op_name(host, type), i);
	for (int i = 0; i < n_out; i++)
		if (!args->out[i])
			return host->error(KILN_EINVAL, "%s: %s: output %d is NULL", dev,
					   common_op_name(host, type), i);
	if (workspace && (!args->workspace || args->workspace_bytes < workspace))
		return host->error(KILN_EINVAL, "%s: %s: workspace of %zu bytes given, prepare asked for %zu",
				   dev, common_op_name(host, type),
				   args->workspace ? args->workspace_bytes : 0, workspace);
	return KILN_OK;
}

/* The extents the elementwise and row-wise ops' kernels run over, the same
 * on every device: rows x cols for BIAS_ADD / BIAS_GRAD (cols: the bias's
 * elements; the bias is in0 for ADD, out0 for GRAD) and SOFTMAX_XENT (cols:
 * the classes, the stored innermost extent); n elements for RELU, SCALE,
 * REDUCE_SUM (in0), RELU_BWD, ADD, MUL, FILL, CAST, NORMALIZE_U8 (out0),
 * GRAD_CLIP and UNSCALE (i[0]).  Other ops: nothing is set. */
static inline void common_op_extent(const struct kiln_op *op, int64_t *rows, int64_t *cols,
				    int64_t *n)
{
	const struct kiln_tensor_desc *x = &op->in[0];
	switch (op->type) {
	case KILN_OP_BIAS_ADD:
	case KILN_OP_BIAS_GRAD:
		*cols = common_numel(op->type == KILN_OP_BIAS_ADD ? &op->in[0] : &op->out[0]);
		x = op->type == KILN_OP_BIAS_ADD ? &op->out[0] : &op->in[0];
		*rows = *cols ? common_numel(x) / *cols : 0;
		break;
	case KILN_OP_SOFTMAX_XENT:
		*cols = common_inner(x);
		*rows = *cols ? common_numel(x) / *cols : 0;
		break;
	case KILN_OP_RELU:
	case KILN_OP_SCALE:
	case KILN_OP_REDUCE_SUM: *n = common_numel(x); break;
	case KILN_OP_RELU_BWD:
	case KILN_OP_ADD:
	case KILN_OP_MUL:
	case KILN_OP_FILL:
	case KILN_OP_CAST:
	case KILN_OP_NORMALIZE_U8: *n = common_numel(&op->out[0]); break;
	case KILN_OP_GRAD_CLIP:
	case KILN_OP_UNSCALE:
	case KILN_OP_GRAD_SUMSQ: *n = op->i[0]; break;
	default: break;
	}
}

/* capture_begin's checks: the device's [plugin.<dev>] graph key is on, and
 * there is a stream to capture. */
static inline kiln_status common_capture_check(const struct kiln_host *host, const char *dev,
					       int graph_on, const void *stream)
{
	if (!graph_on)
		return host->error(KILN_ENOTSUP, "%s: [plugin.%s] graph = 0: steps are not captured",
				   dev, dev);
	if (!stream)
		return host->error(KILN_EINVAL, "%s: capture_begin: NULL stream", dev);
	return KILN_OK;
}

/* In a prepare function with `kiln_status st` and an `out:` label: when
 * `failed`, st = the host's error (ENOTSUP when `unsupported`, else
 * EDEVICE) reading "<head>: file:line: call: status", head printf-style
 * (fmt and its arguments), and goto out.  `status` is evaluated only on
 * failure.  Each device wraps it for its library (CPU_DNN_TRY, CUDA_LT). */
#define COMMON_TRY(host, failed, unsupported, call, status, fmt, ...)                    \
	do {                                                                             \
		if (failed) {                                                            \
			st = (host)->error((unsupported) ? KILN_ENOTSUP : KILN_EDEVICE,    \
					   fmt ": %s:%d: %s: %s", __VA_ARGS__, __FILE__,  \
					   __LINE__, call, status);                        \
			goto out;                                                        \
		}                                                                        \
	} while (0)

/* A plan's argument counts (the op's) and extents (common_op_extent), for
 * either device's plan (members n_in, n_out, rows, cols, n). */
#define COMMON_PLAN_SIZES(p, op)                                   \
	((p)->n_in = (op)->n_in, (p)->n_out = (op)->n_out,         \
	 common_op_extent((op), &(p)->rows, &(p)->cols, &(p)->n))

/* A doubly linked list through members prev and next, first node `head`
 * (an lvalue); the caller holds the list's lock. */
#define COMMON_LIST_PUSH(head, o)                 \
	do {                                      \
		(o)->prev = NULL;                 \
		(o)->next = (head);               \
		if (head)                         \
			(head)->prev = (o);       \
		(head) = (o);                     \
	} while (0)
#define COMMON_LIST_UNLINK(head, o)               \
	do {                                      \
		if ((o)->prev)                    \
			(o)->prev->next = (o)->next; \
		else                              \
			(head) = (o)->next;       \
		if ((o)->next)                    \
			(o)->next->prev = (o)->prev; \
	} while (0)

/* The struct kiln_device_ops members both devices implement as functions
 * named <prefix>_<member> (open .. graph_free, in the header's order); a
 * device's table is { COMMON_DEVICE_OPS(prefix), ... } followed by the
 * members it fills otherwise. */
#define COMMON_DEVICE_OPS(P)                                                          \
	.version = KILN_DEVICE_OPS_VERSION, .open = P##_open, .close = P##_close,      \
	.alloc = P##_alloc, .free = P##_free, .host_alloc = P##_host_alloc,            \
	.host_free = P##_host_free, .stream_create = P##_stream_create,                \
	.stream_destroy = P##_stream_destroy, .event_create = P##_event_create,        \
	.event_destroy = P##_event_destroy, .copy_async = P##_copy_async,              \
	.event_record = P##_event_record, .stream_wait = P##_stream_wait,              \
	.event_sync = P##_event_sync, .stream_sync = P##_stream_sync,                  \
	.prepare = P##_prepare, .run = P##_run, .plan_free = P##_plan_free,            \
	.get_proc_address = P##_get_proc_address, .mem_info = P##_mem_info,            \
	.capture_begin = P##_capture_begin, .capture_end = P##_capture_end,            \
	.graph_launch = P##_graph_launch, .graph_free = P##_graph_free

/* A device .so's one plugin: its descriptor `var` (struct kiln_plugin:
 * this ABI, kind device, name, ops table, key rows, probe or NULL,
 * summary) and kiln_plugin_init, which keeps the host table in host_var
 * (borrowed for the plugin's life) and returns { &var, NULL }. */
#define COMMON_DEVICE_PLUGIN(host_var, var, NAME, OPS, KEYS, PROBE, SUMMARY)              \
	static const struct kiln_plugin var = {                                           \
		.abi_major = KILN_ABI_MAJOR,                                              \
		.abi_minor = KILN_ABI_MINOR,                                              \
		.kind = KILN_PLUGIN_DEVICE,                                               \
		.name = NAME,                                                             \
		.summary = SUMMARY,                                                       \
		.ops = OPS,                                                               \
		.keys = KEYS,                                                             \
		.probe = PROBE,                                                           \
	};                                                                                \
	KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(             \
		const struct kiln_host *host);                                            \
	const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)   \
	{                                                                                 \
		static const struct kiln_plugin *const list[] = { &var, NULL };           \
		if (host_var != host) /* a second load: the same table, not rewritten */ \
			host_var = host;                                                  \
		return list;                                                              \
	}

#endif /* KILN_COMMON_DEVICE_H */
