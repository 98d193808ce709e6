/* tests/attn_op.h - an ATTENTION / ATTENTION_BWD op for the CUDA device's
 * host-side attention tests (check_cuda_attn.c, check_cuda_sdpa.c). */
#ifndef KILN_TESTS_ATTN_OP_H
#define KILN_TESTS_ATTN_OP_H

#include <kiln/plugin.h>
#include <string.h>

/* ATTENTION (bwd 0) or ATTENTION_BWD: qkv [B,T,3C] of dt, y / dy [B,T,C]
 * of dt, lse f32 [B,H,T]; H heads, causal, scale 0.125, no dropout. */
static inline struct kiln_op test_attn_op(int bwd, int dt, int64_t B, int64_t T, int64_t C,
					  int64_t H, int causal)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	const int64_t dq[3] = { B, T, 3 * C }, dy[3] = { B, T, C }, dl[3] = { B, H, T };
	struct kiln_tensor_desc qkv, y, lse;
	kiln_tensor_desc_init(&qkv, dt, 3, dq);
	kiln_tensor_desc_init(&y, dt, 3, dy);
	kiln_tensor_desc_init(&lse, KILN_F32, 3, dl);
	if (bwd) {
		op.type = KILN_OP_ATTENTION_BWD, op.n_in = 4, op.n_out = 1;
		op.in[0] = op.in[2] = y, op.in[1] = qkv, op.in[3] = lse, op.out[0] = qkv;
	} else {
		op.type = KILN_OP_ATTENTION, op.n_in = 1, op.n_out = 2;
		op.in[0] = qkv, op.out[0] = y, op.out[1] = lse;
	}
	op.i[0] = H, op.i[1] = causal;
	op.f[0] = 0.125;
	return op;
}

#endif
