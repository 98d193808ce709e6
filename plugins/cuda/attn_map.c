/* plugins/cuda/attn_map.c - the host-only logic of the CUDA device's fused
 * attention through cuDNN (attn_map.h says what and why). */
#include "attn_map.h"
#include "../common/c_locale.h" /* common_snprintf_c */

#include <stdio.h>
#include <string.h>

/* kiln's buffers are 16-byte aligned at least (the planner's views keep
 * 16), so an offset of off elements of es bytes keeps the largest power of
 * two dividing off*es, up to 16 */
static int64_t view_align(int64_t off, int es)
{
	int64_t a = 16;
	while (a > 1 && (off * es) % a)
		a /= 2;
	return a;
}

static void view(struct cuda_sdpa_view *v, const int64_t dims[4], const int64_t strides[4],
		 int64_t off, int es)
{
	memcpy(v->dims, dims, sizeof v->dims);
	memcpy(v->strides, strides, sizeof v->strides);
	v->off = off;
	v->align = view_align(off, es);
}

/* v with its last two dims (and strides) swapped: the transpose cuDNN's
 * matmul takes as a view of the same memory */
static void view_t(struct cuda_sdpa_view *t, const struct cuda_sdpa_view *v)
{
	*t = *v;
	t->dims[2] = v->dims[3], t->dims[3] = v->dims[2];
	t->strides[2] = v->strides[3], t->strides[3] = v->strides[2];
}

static int esize(int dtype)
{
	return dtype == KILN_F32 ? 4 : dtype == KILN_BF16 || dtype == KILN_F16 ? 2 : 0;
}

int cuda_sdpa_geom(const struct kiln_op *op, struct cuda_sdpa_geom *g, char *why, size_t n)
{
	memset(g, 0, sizeof *g);
	if (op->type != KILN_OP_ATTENTION && op->type != KILN_OP_ATTENTION_BWD) {
		snprintf(why, n, "not an attention op (type %d)", op->type);
		return -1;
	}
	g->bwd = op->type == KILN_OP_ATTENTION_BWD;
	const struct kiln_tensor_desc *qkv = &op->in[g->bwd ? 1 : 0];
	if (qkv->ndim != 3 || op->i[0] <= 0 || qkv->dims[2] % (3 * op->i[0])) {
		snprintf(why, n, "qkv is not [B,T,3C] with C a multiple of the %lld heads",
			 (long long)op->i[0]);
		return -1;
	}
	g->B = qkv->dims[0], g->T = qkv->dims[1], g->C = qkv->dims[2] / 3;
	g->H = op->i[0], g->D = g->C / g->H;
	g->dtype = qkv->dtype;
	g->esize = esize(qkv->dtype);
	if (!g->esize) {
		snprintf(why, n, "qkv of dtype %d, not a floating dtype", qkv->dtype);
		return -1;
	}
	g->causal = op->i[1] != 0;
	g->scale = op->f[0], g->p = op->f[1];
	g->acc = g->bwd && (op->flags & KILN_OPF_ACCUMULATE);
	const int64_t B = g->B, T = g->T, C = g->C, H = g->H, D = g->D;
	const int es = g->esize;
	const int64_t bhtd[4] = { B, H, T, D }, qs[4] = { T * 3 * C, D, 3 * C, 1 };
	view(&g->q, bhtd, qs, 0, es);
	view(&g->k, bhtd, qs, C, es);
	view(&g->v, bhtd, qs, 2 * C, es);
	view_t(&g->kt, &g->k);
	view_t(&g->vt, &g->v);
	const int64_t os[4] = { T * C, D, C, 1 };
	view(&g->o, bhtd, os, 0, es);
	const int64_t sd[4] = { B, H, T, 1 }, ss[4] = { H * T, T, 1, 1 };
	view(&g->stats, sd, ss, 0, 4);
	const int64_t pd[4] = { B, H, T, T }, ps[4] = { H * T * T, T * T, T, 1 };
	view(&g->s, pd, ps, 0, 4);
	view_t(&g->st, &g->s);
	const int64_t as[4] = { H * T * D, T * D, D, 1 };
	view(&g->dq_acc, bhtd, as, 0, 4);
	return 0;
}

int64_t cuda_sdpa_at(const struct cuda_sdpa_view *v, int64_t i0, int64_t i1, int64_t i2,
		     int64_t i3)
{
	return v->off + i0 * v->strides[0] + i1 * v->strides[1] + i2 * v->strides[2] +
	       i3 * v->strides[3];
}

int cuda_attn_mode(const char *value, char *why, size_t n)
{
	if (!value || !*value || !strcmp(value, "auto"))
		return CUDA_ATTN_AUTO;
	if (!strcmp(value, "cudnn"))
		return CUDA_ATTN_CUDNN;
	if (!strcmp(value, "kiln"))
		return CUDA_ATTN_KILN;
	snprintf(why, n, "KILN_CUDA_ATTN = '%.40s': want auto, cudnn or kiln", value);
	return -1;
}

int cuda_sdpa_supported(const struct cuda_sdpa_geom *g, int cc, size_t ver, char *why, size_t n)
{
	if (g->dtype != KILN_BF16 && g->dtype != KILN_F16)
		snprintf(why, n, "%s tensors (cuDNN's fused attention takes bf16 or f16)",
			 g->dtype == KILN_F32 ? "f32" : "non-float");
	else if (g->p > 0)
		common_snprintf_c(why, n, "dropout p = %g (kiln's mask is DROPOUT's Philox stream; cuDNN's RNG draws another)",
			 g->p);
	else if (g->acc)
		snprintf(why, n, "accumulating into dqkv (cuDNN writes dq, dk, dv)");
	else if (cc < 0) /* the device not asked yet: kiln's side only */
		return 1;
	else if (cc < 80)
		snprintf(why, n, "compute capability %d.%d (cuDNN's fused attention needs 8.0 or later)",
			 cc / 10, cc % 10);
	else if (ver < 90000)
		snprintf(why, n, "cuDNN %zu (kiln builds the graph for cuDNN 9)", ver);
	else if (ver >= 91000 && ver < 91002)
		snprintf(why, n, "cuDNN %zu (9.10.0 and 9.10.1 have known SDPA bugs)", ver);
	else if (g->D % 8 || g->D > 128)
		snprintf(why, n, "head dim %lld (cuDNN wants a multiple of 8, at most 128)",
			 (long long)g->D);
	else
		return 1;
	return 0;
}

int cuda_sdpa_key(const struct cuda_sdpa_geom *g, char *buf, size_t n)
{
	return common_snprintf_c(buf, n, "SDPA %s %s B %lld T %lld H %lld D %lld causal %d scale %.9g",
			g->bwd ? "bwd" : "fwd",
			g->dtype == KILN_BF16 ? "bf16" : g->dtype == KILN_F16 ? "f16" : "f32",
			(long long)g->B, (long long)g->T, (long long)g->H, (long long)g->D,
			g->causal, g->scale);
}

#define SDPA_UP(x) (((x) + 255) / 256 * 256)

size_t cuda_sdpa_workspace(const struct cuda_sdpa_geom *g, size_t cudnn_ws, size_t *off_sum,
			   size_t *off_dq)
{
	*off_sum = *off_dq = 0;
	if (!g->bwd)
		return cudnn_ws;
	const size_t rows = (size_t)(g->B * g->H * g->T);
	*off_sum = SDPA_UP(cudnn_ws);
	*off_dq = SDPA_UP(*off_sum + rows * 4);
	return *off_dq + rows * (size_t)g->D * 4;
}
