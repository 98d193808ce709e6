/* kiln/ops.h - the device op catalogue: every operation a device runs,
 * with its exact contract (operands, shapes, math, PyTorch equivalent).
 *
 * A device plugin implements these through kiln_device_ops.prepare/run
 * (kiln/plugin.h, which includes this file); layer and optimizer plugins
 * compose them through host->device_prepare/run.  The core checks every op
 * against its contract before prepare (core/opcheck.c).
 *
 * Adding an op: append it before KILN_OP_TYPE_COUNT (values never change),
 * write its contract beside it, then give it a row in the core's op table
 * (core/opcheck.c: name, check and the ABI minor that adds it: the core
 * asks no device built before that minor about it, has_op included) and
 * in every device's dispatch table;
 * those tables are sized by the enum and _Static_assert'ed against
 * KILN_OP_TYPE_COUNT, so an op without a row does not compile.  A new op is
 * an ABI minor bump: devices that lack it say so through has_op.
 */
#ifndef KILN_OPS_H
#define KILN_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_OP_MAX_IN 6
#define KILN_OP_MAX_OUT 4
/* i64 elements of the dropout counter DROPOUT and ATTENTION read (ABI
 * 2.20): { step, row0, rstride }, see KILN_OP_DROPOUT */
#define KILN_DROP_CTR 3

/* Operation types.  Shapes in comments; i[] and f[] are the integer and
 * real parameters of struct kiln_op.  Unless stated otherwise all tensors
 * are f32 and contiguous.
 *
 * Low-precision compute (ABI 1.3, docs/plugins.md has the table): the
 * activations and activation gradients of every op may be bf16 or f16
 * (one low-precision dtype per op, mixed with f32 where the table says):
 * bf16/f16 storage, f32 arithmetic, the f32 result rounded once to nearest
 * even.  GEMM: in0/in1 low precision, out0 that or f32, bias f32.
 * CONV_BWD_WEIGHTS and BIAS_GRAD write f32 gradients from low-precision
 * inputs.  Batchnorm's parameters and statistics, the loss metrics and
 * scale stay f32.  The optimizers (SGD, ADAMW, LAMB) take an optional last
 * output in bf16/f16 [n]: the compute copy of the parameters after the
 * step, rounded to nearest even, written in the same pass (not ADAMW with
 * amsgrad, whose outputs are full: see there). */
enum kiln_op_type {
	/* out0[M,N] = f[0]*op(in0)[M,K] op(in1)[K,N] + beta*out0 (+ in2[N] bias)
	 * i[0]=transA i[1]=transB i[2]=M i[3]=N i[4]=K, f[0]=alpha,
	 * beta = 1 if KILN_OPF_ACCUMULATE else 0. in2 optional (n_in = 3).
	 * i[5] = batch count for batched GEMM (0 or 1: not batched); devices
	 * may return KILN_ENOTSUP for batches > 1 (the CPU device does). */
	KILN_OP_GEMM = 1,
	/* out0[R,N] += in0[N] (bias broadcast over rows; in-place on out0) */
	KILN_OP_BIAS_ADD = 2,
	/* out0[N] (=|+=) sum over rows of in0[R,N] */
	KILN_OP_BIAS_GRAD = 3,
	/* out0 = max(in0, 0), any shape; may be in-place */
	KILN_OP_RELU = 4,
	/* out0 (=|+=) in1 * (in0 > 0): in0 = forward output y, in1 = dy.
	 * ABI 2.9: n_out = 2 also writes out1 f32 [N] = sum over rows of
	 * in1 * (in0 > 0) (not of out0's earlier contents), N = out0's
	 * innermost dimension (BIAS_GRAD's rows and order), f32 operands;
	 * a device without it returns KILN_ENOTSUP from prepare. */
	KILN_OP_RELU_BWD = 5,
	/* Fused loss over rows of logits against class labels.
	 * in0 logits[N,C], in1 labels i32[N]; out0 dlogits[N,C]; out1 f32[2]
	 * or f32[3] += { sum of the rows' losses, count of argmax == label
	 * (the first maximum), [count of the label among the 5 largest
	 * logits: top-5, ties broken by index] }.  i[0] = number of valid
	 * rows (rows past it get zero gradient and are not counted: masked
	 * padding).  f[0] the gradient scale (usually 1/N_total).  i[1] the
	 * loss, t = one-hot of the label:
	 *   0 softmax cross-entropy with label smoothing e = f[1]
	 *     (nn.CrossEntropyLoss(label_smoothing = e)): q = (1-e) t + e/C,
	 *     loss = -sum q log softmax, dlogits = f[0] (softmax - q)
	 *   1 mean squared error against t (nn.MSELoss on one-hot targets):
	 *     loss = sum (x - t)^2 / C, dlogits = f[0] 2 (x - t) / C
	 *   2 binary cross-entropy with logits against t, per class
	 *     (nn.BCEWithLogitsLoss): loss = sum over classes of
	 *     max(x,0) - x t + log(1 + exp(-|x|)), over C; dlogits =
	 *     f[0] (sigmoid(x) - t) / C
	 * in2 (optional, n_in = 3; ABI 1.2): a device f32[1] loss scale s
	 * (mixed precision's, KILN_OP_SCALER_UPDATE's state[0]): dlogits are
	 * multiplied by s as well, the loss and counts are not.
	 * ignore_index (ABI 2.1): with i[2] = 1, rows whose label equals i[3]
	 * are ignored as nn.CrossEntropyLoss(ignore_index = i[3]) ignores
	 * them: zero gradient, not counted in any metric; and the gradient
	 * scale becomes f[0] * i[0] / n, n = the rows counted in this call
	 * (with f[0] = 1/i[0], PyTorch's mean over the rows not ignored; all
	 * zero when n = 0).  i[2] = 0 (every 2-d use before): no row is
	 * ignored and every label must be in [0, C).  out1 may have a fourth
	 * element: [3] += n, the rows counted (what a mean divides by).
	 * i[4] = M > 0 (ABI 2.1): the loss and count metrics are added as M
	 * times their means over the n rows counted (0 when n = 0): a loss
	 * over B samples of T tokens sets M = B, so a mean over samples
	 * (the trainer's) is the mean of the batches' token means, the
	 * number a PyTorch loop over CrossEntropyLoss(reduction = 'mean')
	 * reports in training.  i[4] = 0: plain sums (the trainer's
	 * evaluations, ABI 2.27 kiln_layer.eval_counted, with the fourth
	 * metric: the set's sums over its count, one mean over every row of
	 * the set).  ABI 2.4: out0 may be in0 (the
	 * gradient written over the logits; a device reads every logit of
	 * a row before it writes any of that row's gradient); i[5] = K in
	 * (0, C]: only the first K columns are classes (a padded vocabulary):
	 * the loss, softmax, accuracy and mean are over them, columns K..C-1
	 * get a zero gradient, a label must be < K; i[5] = 0: K = C. */
	KILN_OP_SOFTMAX_XENT = 6,
	/* SGD with momentum and weight decay over flat buffers of n = i[0]
	 * elements: in0 grads, in1 lr f32[1] (device scalar), in2 (optional:
	 * n_in = 3) the per-element weight-decay multiplier d f32[n] (parameter
	 * groups: 1 decays, 0 does not; absent = 1 everywhere); out0 params,
	 * out1 momentum (absent, n_out = 1, when f[0] = 0).  f[0] momentum mu,
	 * f[1] L2 weight decay (PyTorch SGD's weight_decay), f[2] decoupled
	 * weight decay (SGDW), i[1] nesterov.  Per element, p the params before
	 * the step:
	 *   g = grad + f[1]*d*p;  v = mu*v + g
	 *   p = p - lr*f[2]*d*p - lr * (nesterov ? g + mu*v : v)
	 * f[3] (ABI 2.29) dampening, torch.optim.SGD's: with it non-zero the
	 * op reads the optimizer step count t i64[1] (1-based, of the step
	 * being taken, as ADAMW's) as in2, and the multiplier d (optional)
	 * moves to in3; the momentum is then
	 *   v = g                        at t = 1 (PyTorch's first buffer is a
	 *                                clone of g, undamped)
	 *   v = mu*v + (1 - f[3])*g      after
	 * (nesterov reads that v too; torch.optim.SGD refuses nesterov with a
	 * dampening, and so does kiln's `optimizer = sgd`).  f[3] = 0 (every
	 * use before 2.29): no t, the update above.  Without momentum (f[0] =
	 * 0) the dampening changes nothing, as in PyTorch.  The core asks no
	 * device built before 2.29 for f[3] != 0.
	 * Optimizer state below FLT_MIN (SGD's v; ADAMW's and LAMB's m, v
	 * and vmax; session 45): a device may store a new state element whose
	 * magnitude is below FLT_MIN (an f32 subnormal) as a zero of its
	 * sign, and the update then reads that zero; every other element is
	 * the IEEE result of the formulas.  ADAMW and LAMB may do so only
	 * when their eps (f[2]) >= 1e-10; below it (eps = 0: a flushed v
	 * would give m/0 = inf, flushed m and v 0/0 = NaN) their state is
	 * IEEE.  The cpu device flushes wherever this allows, on every ISA
	 * (x86 takes a microcode assist for each subnormal operand or result:
	 * the momentum of a dead ReLU unit decays into that range and slowed
	 * whole epochs by a quarter), without touching the caller's MXCSR;
	 * the cuda device keeps subnormals (GPUs handle them at full rate).
	 * The params come out as the IEEE update's unless |p| < ~1e-22
	 * (docs/training.md, "Subnormal optimizer state"). */
	KILN_OP_SGD = 7,
	/* out0 (any dtype) = f[0] */
	KILN_OP_FILL = 8,
	/* out0[1] (=|+=) sum of in0 (any shape) */
	KILN_OP_REDUCE_SUM = 9,
	/* out0 = f[0] * in0 (+ out0 if accumulate) */
	KILN_OP_SCALE = 10,
	/* out0 = in0 + in1 (+ out0 if accumulate).
	 * ABI 2.10 addition (chained INT8, inference plans: a residual sum and
	 * the ReLU that alone reads it, written for the INT8 layers after it):
	 * out0 may be u8, with in0 and in1 f32, no accumulate, and out0's
	 * scale so = f[0] > 0:
	 *   out0 = sat_u8(round_half_even(max(in0 + in1, 0) * (float)(1 / so)))
	 * in f32 arithmetic: the bytes QCONV's own quantization of the f32
	 * ReLU output would give (its xq with r = 1 / so).  A device without
	 * it returns KILN_ENOTSUP from prepare. */
	KILN_OP_ADD = 11,
	/* out0 f32 [N, C, H, W] = (in0 u8 / 255 - f[c]) / f[3 + c]: ToTensor +
	 * Normalize on the device (`transform_on = device`), C = 1..3; in and
	 * out have the same layout (NCHW or NHWC). */
	KILN_OP_NORMALIZE_U8 = 12,

	/* ---- convolutional networks --------------------------------------
	 * 4-d activations are described as dims N, C, H, W whatever their
	 * layout; desc.layout (KILN_NCHW or KILN_NHWC) says how they are stored,
	 * and every activation of one op has the same layout.  Weights are
	 * always OIHW (PyTorch's layout).  Convolution geometry, shared by
	 * the three conv ops: i[0], i[1] stride h, w; i[2], i[3] padding h, w
	 * (both sides); i[4], i[5] dilation h, w (PyTorch's: 1 = none);
	 * i[6] groups. */
	/* out0 y[N,O,OH,OW] = conv(in0 x[N,C,H,W], in1 w[O,C/g,KH,KW]) (+ in2 b[O]) */
	KILN_OP_CONV = 13,
	/* out0 dx[N,C,H,W] = conv_backward_data(in0 dy[N,O,OH,OW], in1 w).
	 * KILN_OPF_ACCUMULATE may be refused (KILN_ENOTSUP): the caller then
	 * writes to scratch and adds. */
	KILN_OP_CONV_BWD_DATA = 14,
	/* out0 dw[O,C/g,KH,KW] (and out1 db[O] when n_out = 2) from in0 x and
	 * in1 dy, overwritten; ABI 2.9: with KILN_OPF_ACCUMULATE added into
	 * (dw += ..., db += ...: gradient accumulation).  A device may refuse
	 * the flag (KILN_ENOTSUP): the caller then writes to scratch and adds;
	 * the core never asks a device built before 2.9. */
	KILN_OP_CONV_BWD_WEIGHTS = 15,
	/* Batch normalisation over N, H, W per channel (2-d [N, C] inputs too).
	 * f[0] eps, f[1] momentum (PyTorch's: new = (1-m)*old + m*batch).
	 * Training: in0 x, in1 gamma[C], in2 beta[C]; out0 y; out1 saved
	 * f32[2,C] (batch mean, then 1/sqrt(var + eps)) for the backward;
	 * out2 running_mean[C] and out3 running_var[C] (unbiased) updated in
	 * place. */
	KILN_OP_BN_TRAIN = 16,
	/* Inference: in0 x, in1 gamma, in2 beta, in3 running_mean[C],
	 * in4 running_var[C]; out0 y.  (All three batchnorm ops may ask for
	 * workspace in prepare, like any op.) */
	KILN_OP_BN_INFER = 17,
	/* in0 x, in1 dy, in2 gamma, in3 saved f32[2,C]; out0 dx, out1 dgamma,
	 * out2 dbeta (all overwritten). */
	KILN_OP_BN_BWD = 18,
	/* Pooling.  i[0] kind (KILN_POOL_MAX, KILN_POOL_AVG), i[1], i[2] kernel
	 * h, w; i[3], i[4] stride; i[5], i[6] padding; i[7] for average:
	 * count padding in the divisor (PyTorch's count_include_pad, default 1).
	 * Global average pooling is a kernel of the whole input.
	 * Forward: in0 x; out0 y; out1 aux (u8[aux_bytes], see the device's
	 * aux_bytes member) for max pooling's backward, when aux_bytes > 0.
	 * ABI 2.8: x and y may both be u8 for max pooling in inference
	 * (n_out = 1): a chained INT8 model's activations (QCONV), pooled as
	 * they are (max commutes with the positive scale: exact).
	 * ABI 2.16: a max POOL with out1 (training) may take KILN_OPF_ACT with
	 * i[KILN_OPI_ACT] = KILN_ACT_RELU: x is a ReLU's output, and that
	 * ReLU's backward is folded into the pooling's: POOL_BWD with this
	 * aux writes pool_bwd(dy * (y > 0)), exactly, instead of pool_bwd(dy)
	 * (every input a window's gradient reaches holds its maximum y).  out0
	 * is the plain pooling's.  A device without it returns KILN_ENOTSUP
	 * from prepare and the caller masks dy with RELU_BWD on y; devices
	 * built before ABI 2.16 are never asked.
	 * ABI 2.17: an f32 max POOL (and its POOL_BWD) may have x (dx, in2)
	 * NHWC and y (dy) NCHW: the pooling of NHWC's, its output stored in
	 * NCHW planes (aux is the device's, as ever).  KILN_OPF_ACT as above.
	 * A device without it returns KILN_ENOTSUP from prepare, and the core
	 * plans the model in one layout; devices built before ABI 2.17 are
	 * never asked. */
	KILN_OP_POOL = 19,
	/* in0 dy, in1 aux (max; may be NULL for average), in2 x (forward input,
	 * for devices without aux); out0 dx (overwritten).  A device whose
	 * library needs the forward output too keeps it in aux. */
	KILN_OP_POOL_BWD = 20,
	/* Elementwise activation, any shape.  i[0] kind (enum kiln_act),
	 * f[0] its alpha (leaky_relu slope).  Forward: out0 = act(in0);
	 * backward (_BWD): out0 (=|+=) dy * act'(.) with in0 = forward input x,
	 * in1 = dy, in2 = forward output y (either of x, y may be what the
	 * derivative is computed from; pass both). */
	KILN_OP_ACT = 21,
	KILN_OP_ACT_BWD = 22,
	/* Dropout with a counter-based mask: keep element e with probability
	 * 1 - f[0], scaling kept values by 1/(1 - f[0]).  The mask is a pure
	 * function of (i[0] seed, i[1] layer id, step, g) where in1 is the
	 * device's i64[KILN_DROP_CTR] counter { step, row0, rstride } and g
	 * the element's index in the optimizer step's GLOBAL batch, so
	 * forward and backward agree, no mask is stored, and a sample draws
	 * the same mask whichever rank, accumulation micro-step or pipeline
	 * micro-batch holds it (DESIGN.md "Randomness").  The trainer keeps
	 * step = optimizer steps taken (the same on every rank and micro-
	 * step) and sets row0, rstride so that row n of the op's tensor is
	 * row row0 + n * rstride of the global batch (kiln's sampler hands
	 * rank r of W the global rows r, r + W, ...: row0 = r, rstride = W;
	 * docs/distributed.md "Dropout and the global batch").  Every device
	 * computes exactly this (so runs agree across devices):
	 *   e    = the element's index in logical N, C, H, W order
	 *   R    = elements per row (numel / dims[0]),  n = e / R
	 *   g    = (row0 + n * rstride) * R + e % R
	 *   ctr  = { g & 0xffffffff, g >> 32,
	 *            layer ^ ((step >> 32) << 16) (32 bits), step & 0xffffffff }
	 *   key  = { seed & 0xffffffff, (seed >> 32) ^ 0x44524f50 }
	 *   v    = Philox4x32-10(ctr, key)          (Random123's philox4x32)
	 *   keep = (v[0] >> 8) >= ceil(p * 2^24)
	 *   y    = x * (keep ? (float)(1.0 / (1.0 - p)) : 0)
	 * Forward: in0 x, in1 counter; out0 y.  Backward: in0 dy, in1
	 * counter; out0 dx (=|+=).  ABI 2.20: in1 was i64[1] = { step } (then
	 * the micro-steps done, g = e); devices built before 2.20 are refused
	 * the op (core/device.c).  Word 2 took the step's high word in session
	 * 38 (before, step s and s + 2^32 drew one mask): the same bits below
	 * step 2^32, so no ABI change; distinct masks up to step 2^48 for
	 * layer ids below 2^16. */
	KILN_OP_DROPOUT = 23,
	KILN_OP_DROPOUT_BWD = 24,
	/* Concatenate in0..in{n-1} along dimension i[0] into out0 (same layout;
	 * for 4-d activations dimension 1 is channels).  Backward (SPLIT):
	 * in0 dy -> out0..out{n-1} (each written, or added into when bit k of
	 * i[1] is set). */
	KILN_OP_CONCAT = 25,
	KILN_OP_SPLIT = 26,
	/* Copy in0 into out0 with the same dims and dtype but out0's layout
	 * (NCHW <-> NHWC).  Accumulate adds. */
	KILN_OP_REORDER = 27,
	/* out0 i64[1] += i[0] (the trainer's counters: dropout's step and
	 * row0, in device memory so captured graphs replay correct values;
	 * i[0] may be negative).  With
	 * KILN_OPF_GATED, in0 is an f32[1] gate and nothing is added when it
	 * is 0: the optimizer's step count, which a step skipped for
	 * non-finite gradients does not advance (Adam's bias correction). */
	KILN_OP_COUNTER_ADD = 28,
	/* out0 (=|+=) in0 * in1, elementwise, any shape (f32): with ADD, SCALE
	 * and ACT, the vector ops third-party layers and optimizers compose */
	KILN_OP_MUL = 29,
	/* The learning rate of the coming step, on the device: out0 lr f32[1]
	 * from in0 step i64[1] (optimizer steps done so far: the trainer
	 * passes its optimizer-step counter, which neither a micro-step of
	 * [train] accumulate nor a step skipped for non-finite gradients
	 * advances; "micro-steps" before session 40 was wrong).  i[0] schedule
	 * (KILN_SCHED_*), i[1] total steps T, i[2] warmup steps W; f[0] base
	 * lr, f[1] final lr (cosine's minimum).  With t = step:
	 *   t < W:    lr = base * (t + 1) / W                 (linear warmup)
	 *   constant: lr = base
	 *   cosine:   lr = final + (base - final) * (1 + cos(pi * u / U)) / 2,
	 *             u = min(t - W, U), U = max(T - W, 1)
	 *             (PyTorch's CosineAnnealingLR with T_max = U, eta_min = final)
	 *   step:     lr = base * f[2]^floor(u / i[3])   (StepLR: gamma, step_size)
	 *   multistep: lr = base * f[2]^(number of milestones m <= u), milestones
	 *             i[4 .. 4 + i[3]) ascending, at most 12 (MultiStepLR)
	 *   onecycle: OneCycleLR(max_lr = base, total_steps = U, pct_start =
	 *             f[4], div_factor = f[2], final_div_factor = f[3],
	 *             anneal_strategy = cos, three_phase = False); f[4] x U
	 *             = 1 (a rise of 0 steps, whose first rate OneCycleLR
	 *             divides 0 by 0 for, at t = W) is refused at prepare
	 *             (KILN_EINVAL) unless i[4], the first step the op will be
	 *             run at (in0's value then: the optimizer-step counter's
	 *             at a resume, since session 41; the trainer's step, ahead
	 *             of it by the skipped steps, in session 40), is past it
	 *             (i[4] > W: a run resumed after its rise, whose length
	 *             changed with its global batch; core checks it, since
	 *             session 40; 0 before).  ABI 2.30: i[5] three_phase
	 *             (1: OneCycleLR's three_phase = True, back down to
	 *             base / f[2] by step 2 x f[4] x U - 2, then to the final
	 *             rate), i[6] anneal_strategy (0 cos, 1 linear); 0 and 0
	 *             (every onecycle op before 2.30) is the rule above
	 *   exponential (2.30): lr = base * f[2]^u        (ExponentialLR: gamma)
	 *   linear (2.30): lr = base * (f[2] + (f[3] - f[2]) * min(u, i[3]) /
	 *             i[3])  (LinearLR: start_factor f[2] in (0, 1],
	 *             end_factor f[3] in [0, 1], total_iters i[3] >= 1)
	 *   polynomial (2.30): lr = base * (1 - min(u, i[3]) / i[3])^f[2]
	 *             (PolynomialLR: total_iters i[3] >= 1, power f[2] >= 0)
	 * where u = t - W counts the steps after the warmup.  Every rule reads
	 * only the device counter, so a replayed graph stays correct.  The
	 * core asks no device built before 2.30 for a schedule or an onecycle
	 * option of 2.30 (core/device.c). */
	KILN_OP_LR_SCHEDULE = 30,
	/* ---- fused adaptive optimizers --------------------------------------
	 * Both run over flat buffers of n = i[0] f32 elements and read every
	 * per-step scalar from device memory, so one prepared plan serves every
	 * step (and a captured graph replays correct values).  f[0] beta1,
	 * f[1] beta2, f[2] eps, f[3] weight decay wd (decoupled: never added to
	 * the gradient).  in2 is the optimizer step count t, i64[1], of the step
	 * being taken, 1-based (the caller advances it before the run); it
	 * drives the bias corrections c1 = 1 - beta1^t, c2 = 1 - beta2^t.  The
	 * per-element weight-decay multiplier d f32[n] (parameter groups: 1
	 * decays, 0 does not) is always the last input and optional: absent
	 * (one input fewer) means d = 1 everywhere.  out1 m and out2 v are the
	 * first and second moments (PyTorch's exp_avg, exp_avg_sq), zero
	 * before the first step.  Per element, p the params before the step:
	 *   m = beta1*m + (1-beta1)*g;   v = beta2*v + (1-beta2)*g*g
	 *   vh = sqrt(v) / sqrt(c2) + eps                (eps outside the root)
	 * m, v (and ADAMW's vmax) below FLT_MIN may be stored as zeros: see
	 * "Optimizer state below FLT_MIN" at KILN_OP_SGD. */
	/* AdamW exactly as torch.optim.AdamW (amsgrad: i[1]): in0 grads [n],
	 * in1 lr f32[1], in2 t i64[1], in3 (optional) d [n]; out0 params [n],
	 * out1 m [n], out2 v [n].
	 *   p = p*(1 - lr*wd*d) - (lr/c1) * m / vh
	 * f[4] (ABI 2.28) l2, torch.optim.Adam's (coupled) weight_decay: the
	 * moments above read g + l2*d*p in place of g (kiln's `optimizer =
	 * adam` sets f[3] = 0, f[4] = wd).  0 (every use before 2.28): g as
	 * it is.  The core asks no device built before 2.28 for l2 != 0.
	 * i[1] (ABI 2.29) amsgrad, torch.optim.Adam/AdamW(amsgrad=True): one
	 * more output, out3 vmax [n] (PyTorch's max_exp_avg_sq, zero before
	 * the first step), the largest second moment so far, taken of the raw
	 * v after its update and bias-corrected with this step's c2:
	 *   vmax = max(vmax, v);   vh = sqrt(vmax) / sqrt(c2) + eps
	 * The four f32 outputs fill KILN_OP_MAX_OUT, so with i[1] = 1 the op
	 * has no compute-copy output: the caller casts the params after it
	 * (KILN_OP_CAST; the built-in optimizers do).  i[1] = 0 (every use
	 * before 2.29): three outputs, vh from v.  The core asks no device
	 * built before 2.29 for i[1] != 0. */
	KILN_OP_ADAMW = 31,
	/* LAMB (You et al. 2019, Algorithm 2, with the trust ratio on every
	 * tensor, as NVIDIA apex FusedLAMB with use_nvlamb; no gradient
	 * clipping): in0 grads [n], in1 lr f32[1], in2 t i64[1], in3 tensor
	 * offsets i64[T+1] in device memory (tensor k is elements
	 * [off[k], off[k+1]); off[0] = 0, off[T] = n, nondecreasing; T = in3's
	 * element count - 1), in4 (optional) d [n]; out0 params, out1 m,
	 * out2 v.  Needs workspace (prepare reports how much).
	 *   u = (m/c1) / vh + wd*d*p
	 *   per tensor k: r = ||p_k|| / ||u_k|| (2-norms over the tensor, p
	 *                 before the step), r = 1 when either norm is 0
	 *   p = p - lr * r * u
	 * One launch: a reduction pass over the tensors, then the update.
	 * No amsgrad: i[1] must be 0 (the core refuses any other value since
	 * ABI 2.29, where ADAMW's i[1] became amsgrad). */
	KILN_OP_LAMB = 32,
	/* Gradient clipping and the non-finite check before an optimizer
	 * step, over the flat gradients: in0 grads f32[n] (n = i[0]), out0
	 * grads (may alias in0), out1 state f32[4] (device): [0] this step's
	 * global L2 norm (before clipping; at most FLT_MAX while the elements
	 * are finite), [1] finite flag (1, or 0 when an element is NaN or
	 * infinite: the step is to be skipped and the gradients are left as
	 * they are; as GradScaler's found_inf, elements whose squares
	 * overflow f32 are finite), [2] skipped steps so far (+1 on a skip),
	 * [3] clipped steps so far.  When finite, with f[0] > 0 (PyTorch's
	 * clip_grad_norm_, [3] += 1 when it scales): the gradients are
	 * scaled by min(1, f[0] / (norm + 1e-6)) (so also a norm up to 1e-6
	 * below f[0]; before session 42 only norm > f[0]), and by 0 when the
	 * sum of squares exceeds FLT_MAX (norm above ~1.8e19, whatever f[0]:
	 * clip_grad_norm_'s f32 norm is inf there, and it multiplies by
	 * f[0] / (inf + 1e-6) = 0; torch 1.13 and 2.x).  Then with f[1] > 0
	 * each is clamped to [-f[1], f[1]] (clip_grad_value_).
	 * ABI 2.32: GRAD_CLIP may take in1, f32[nb] (nb = ceil(n / 1024)),
	 * the block sums KILN_OP_GRAD_SUMSQ wrote over every block of these
	 * gradients as they are now (while the backward made them, hot in the
	 * cache): the op then reads the gradients only to clip or scale them,
	 * or to sum again a block whose sum is not finite, and its results are
	 * those it gives without in1, bit for bit.  The core asks no device
	 * built before 2.32 for in1. */
	KILN_OP_GRAD_CLIP = 33,
	/* out0 = in0 converted elementwise between f32 and bf16 or f16 (either
	 * way; same element count; to bf16/f16 rounds to nearest even, NaN
	 * stays NaN, f16 overflows to inf): bf16 samples ([data] dtype = bf16)
	 * widened on the device, the compute copy of the parameters. */
	KILN_OP_CAST = 34,
	/* ---- dynamic loss scaling (ABI 1.2) --------------------------------
	 * The scaler's state is a device f32[4]: [0] the loss scale s, [1] the
	 * growth tracker (finite steps since the scale last changed), [2] the
	 * hysteresis left (overflowing steps still tolerated before a backoff),
	 * [3] overflowing steps so far.  The gate state is GRAD_CLIP's f32[4]
	 * (norm, finite flag, skipped steps, clipped steps), whose flag
	 * KILN_OPF_GATED optimizers read. */
	/* Unscale, non-finite check and clipping, one op: GRAD_CLIP on the
	 * gradients divided by the loss scale.  in0 grads f32[n] (n = i[0]),
	 * in1 scaler state f32[4] (reads s = [0]); out0 grads (may alias in0),
	 * out1 gate state f32[4].  The norm is that of g / s (each element
	 * multiplied by 1/s before squaring, so it never overflows where the
	 * unscaled gradients do not).  When an element of g / s is NaN or
	 * infinite: [1] = 0, [2] += 1, gradients left as they are.  Otherwise
	 * [1] = 1 and every element becomes g * (1/s) * c, c GRAD_CLIP's
	 * clip factor of the norm of g / s (with f[0] > 0: f[0] / (norm +
	 * 1e-6) when norm > f[0], 0 when its square exceeds FLT_MAX; [3] += 1
	 * when it scales), else 1; then with f[1] > 0 clamped to
	 * [-f[1], f[1]].  [0] = the norm of g / s. */
	KILN_OP_UNSCALE = 35,
	/* The scale update after a step (torch.cuda.amp.GradScaler's
	 * _amp_update_scale, with Megatron-LM's hysteresis): in0 gate state
	 * f32[4] (reads the finite flag [1]); out0 scaler state f32[4], updated
	 * in place.  f[0] growth factor, f[1] backoff factor, f[2] minimum
	 * scale, f[3] maximum scale (0: none); i[0] growth interval, i[1]
	 * hysteresis, both in [1, 2^24] (the state's f32 counters are exact
	 * up to 2^24: a larger interval would never be reached).
	 *   finite:     [1] += 1; when [1] >= i[0]: s' = s * f[0], taken when
	 *               finite (and <= f[3] if set); [1] = 0; [2] = i[1]
	 *   not finite: [3] += 1; [1] = 0; [2] -= 1; when [2] <= 0:
	 *               s = max(s * f[1], f[2], FLT_MIN)
	 * (FLT_MIN, the smallest normal float: a scale of 0, or one whose
	 * 1/s overflows, would skip every later step.) */
	KILN_OP_SCALER_UPDATE = 36,
	/* ---- batch normalisation over several ranks' batches (ABI 1.4) -----
	 * SyncBatchNorm as four ops around two collectives: BN_STATS gives
	 * each rank's statistics, the ranks allgather them, BN_APPLY merges
	 * them and normalises; in backward BN_BWD_REDUCE gives each rank's
	 * two per-channel sums, the ranks allreduce (sum) them, BN_BWD_APPLY
	 * computes dx from the global sums.  With one group and the local
	 * sums they compute exactly BN_TRAIN and BN_BWD.  Every rank's batch
	 * has the same N*H*W elements per channel (call it n; M = G*n). */
	/* in0 x [N,C] or [N,C,H,W]; out0 f32[2,C]: the batch mean per channel,
	 * then the biased variance. */
	KILN_OP_BN_STATS = 37,
	/* in0 x, in1 gamma[C], in2 beta[C], in3 f32[G,2,C] (G = i[0] >= 1
	 * BN_STATS outputs of batches of n elements per channel, this one's
	 * among them); out0 y, out1 saved f32[2,C] (mean, 1/sqrt(var + eps)),
	 * out2 running_mean[C], out3 running_var[C] updated in place as
	 * BN_TRAIN does, from the merged statistics:
	 *   mean = sum_g mean_g / G,  var = sum_g (var_g + (mean_g - mean)^2) / G
	 *   running_var uses var * M / (M - 1).  f[0] eps, f[1] momentum. */
	KILN_OP_BN_APPLY = 38,
	/* in0 x, in1 dy, in2 saved f32[2,C]; out0 dgamma[C] = sum(dy * xhat),
	 * out1 dbeta[C] = sum(dy) over this batch (overwritten), out2 f32[2,C]
	 * the same two again, contiguous (dgamma, then dbeta: what the ranks
	 * sum). */
	KILN_OP_BN_BWD_REDUCE = 39,
	/* in0 x, in1 dy, in2 gamma, in3 saved, in4 f32[2,C] the sums of every
	 * group's BN_BWD_REDUCE out2; out0 dx (overwritten); i[0] = G:
	 *   dx = gamma*invstd * (dy - S_dbeta/M - xhat * S_dgamma/M) */
	KILN_OP_BN_BWD_APPLY = 40,
	/* ---- transformers (ABI 2.1) ----------------------------------------
	 * Token activations are [B, T, C] row-major (any shape whose last
	 * dimension is C: R = B*T rows of C). */
	/* Embedding lookup (nn.Embedding): in0 idx i32[N] (any shape of N
	 * elements), in1 table [V, C]; out0 y (N*C elements: [N, C] or
	 * [B, T, C]), row n = table row idx[n].  An index outside [0, V) is
	 * never read: its row of y is zeroed and the run fails with
	 * KILN_EDATA naming the first such position and index. */
	KILN_OP_EMBEDDING = 41,
	/* Its backward: in0 idx i32[N], in1 dy (N*C elements); out0 dtable
	 * f32[V, C] (=|+= with KILN_OPF_ACCUMULATE): row v gets the sum of
	 * dy's rows n with idx[n] = v, added in increasing n whatever the
	 * thread count (deterministic: no atomics).  Rows of no index are
	 * zeroed (or left as they are when accumulating).  Bad indices as
	 * the forward: skipped, KILN_EDATA. */
	KILN_OP_EMBEDDING_BWD = 42,
	/* Layer normalisation over the last dimension (nn.LayerNorm(C, eps)):
	 * in0 x (R rows of C), in1 gamma f32[C], in2 beta f32[C] (both absent,
	 * n_in = 1: no affine); out0 y (x's shape), out1 saved f32[R, 2]
	 * (per row the mean, then rstd = 1/sqrt(var + eps), var biased);
	 * f[0] eps.  y = (x - mean) * rstd * gamma + beta. */
	KILN_OP_LAYERNORM = 43,
	/* Its backward: in0 x, in1 dy, in2 saved f32[R, 2] (LAYERNORM's out1),
	 * in3 gamma f32[C] (absent, n_in = 3: no affine); out0 dx (=|+= with
	 * KILN_OPF_ACCUMULATE), out1 dgamma f32[C], out2 dbeta f32[C] (both
	 * absent, n_out = 1: no affine, or parameters not trained; both
	 * added into when i[0] = 1, else overwritten).  With xh = (x - mean)
	 * * rstd and g = dy * gamma:
	 *   dx = rstd * (g - mean_C(g) - xh * mean_C(g * xh))
	 *   dgamma = sum over rows of dy * xh,  dbeta = sum over rows of dy
	 * (the sums over rows in a fixed order, whatever the thread count). */
	KILN_OP_LAYERNORM_BWD = 44,
	/* ---- fused scaled-dot-product attention ----------------------------
	 * Multi-head self-attention over token activations, one op each way,
	 * as PyTorch computes it explicitly (minGPT / GPT-2's CausalSelfAttention
	 * without the projections):
	 *   q, k, v = qkv.split(C, dim=2)          each [B,T,C] -> [B,H,T,D]
	 *   att = (q @ k.transpose(-2,-1)) * scale  (masked_fill(j > i, -inf)
	 *                                            when causal)
	 *   P = softmax(att, dim=-1);  P' = dropout(P)
	 *   y = (P' @ v).transpose(1, 2).reshape(B, T, C)
	 * with H = i[0] heads, D = C/H, head h of q at columns [h*D, (h+1)*D)
	 * of qkv's first C, of k of the second C, of v of the third.  Every
	 * tensor is f32 (or the compute dtype: bf16/f16 activations, f32
	 * arithmetic; lse is always f32), row-major, contiguous.
	 * i[0] = H (C % H == 0), i[1] = causal (1: row i sees keys j <= i;
	 * 0: every key), i[2] = dropout seed, i[3] = dropout layer id;
	 * f[0] = scale (the layer sets 1/sqrt(D)), f[1] = dropout probability
	 * p on the attention probabilities (0: none; then there is no step
	 * input).  The dropout mask is KILN_OP_DROPOUT's, bit for bit, with
	 * seed = i[2], layer = i[3], the counter from the device i64
	 * [KILN_DROP_CTR] step input, and e the logical index of the
	 * probability in [B, H, T, T]:
	 *   e = ((b*H + h)*T + i)*T + j     (query row i, key column j)
	 * (so R = H*T*T and the global g has b's global row), so P' = P *
	 * (keep ? (float)(1/(1-p)) : 0), exactly what DROPOUT on the
	 * materialised [B, H, T, T] P would give.
	 * Forward: in0 qkv [B,T,3C], in1 step i64[KILN_DROP_CTR] (only when
	 * p > 0);
	 * out0 y [B,T,C], out1 lse f32[B,H,T]: the logsumexp of each
	 * softmax row (of the scaled, masked scores), saved for the backward.
	 * A device never materialises more than a [T, T] block per (b, h). */
	KILN_OP_ATTENTION = 45,
	/* Backward: in0 dy [B,T,C], in1 qkv, in2 y (the forward's out0), in3
	 * lse (its out1), in4 step i64[KILN_DROP_CTR] (only when p > 0); out0 dqkv
	 * [B,T,3C] (=|+= with KILN_OPF_ACCUMULATE).  Same i[] and f[].  P is
	 * recomputed from the saved lse, P = exp(att - lse), M the mask
	 * scaled by 1/(1-p) (1 without dropout), and with
	 * Di = sum_d dy[i,d] * y[i,d] (= rowsum(dP' * P')):
	 *   dv = (P*M)^T dy,  dP = (dy v^T) * M,  dS = P * (dP - Di)
	 *   dq = scale * dS k,  dk = scale * dS^T q */
	KILN_OP_ATTENTION_BWD = 46,
	/* One decoding step of causal attention with a key/value cache
	 * (text generation, docs/generate.md): every row of the batch holds
	 * one new token at position t = *in1 (the same t for every row).
	 * in0 qkv [B,1,3C] (q, k, v as ATTENTION's), in1 pos i32[1] (device);
	 * out0 y [B,1,C] (qkv's dtype); out1 kcache, out2 vcache f32
	 * [B,H,Tmax,D], read and written: row t of head h gets the new k and
	 * v (converted to f32), rows < t must hold what the steps at those
	 * positions wrote, rows > t are neither read nor written.  Then
	 *   y[b,0,h*D:(h+1)*D] = sum_{j<=t} softmax_j(scale * q.K[j]) V[j]
	 * which is ATTENTION's causal row t of the sequence fed so far.
	 * i[0] = H, f[0] = scale.  A t outside [0, Tmax) writes nothing and
	 * fails the run with KILN_EDATA naming it. */
	KILN_OP_ATTENTION_DECODE = 47,
	/* ---- recurrent layers (ABI 2.5) ------------------------------------
	 * One direction of one layer of nn.LSTM / nn.GRU (batch_first, zero
	 * initial state), PyTorch's parameters and gate order: G = 4 gates
	 * i, f, g, o (LSTM) or G = 3 gates r, z, n (GRU, PyTorch's form:
	 * n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1-z) n + z h).
	 * i[0] cell (0 LSTM, 1 GRU), i[1] reverse (1: the direction that reads
	 * the sequence backwards, PyTorch's `_reverse` parameters), i[2] pad
	 * id (with in5).  Forward: in0 x [B,T,I], in1 w_ih [G*H, I], in2 w_hh
	 * [G*H, H], in3 b_ih [G*H], in4 b_hh [G*H], in5 (optional, n_in = 6)
	 * token ids i32 [B,T]: the length of row b is the first t with
	 * ids[b,t] == i[2] (T when none), and the row runs as PyTorch runs a
	 * pack_padded_sequence of that length: steps t >= len are not run,
	 * y is 0 there, the reverse direction starts at t = len - 1.  Without
	 * in5 every row has length T.  out0 y [B,T,H] (every step's h);
	 * out1 (training, n_out = 2) u8[aux_bytes]: what the backward reads
	 * (the device's aux_bytes for the plan; inference n_out = 1).
	 * ABI 2.25: i[4] = 1 ("last"): out0 is y [B,H] instead, each row's
	 * final hidden state, PyTorch's h_n of this direction: h at t = len-1
	 * (forward) or at t = 0 (reverse), the last step the row ran; 0 for
	 * a row of length 0.  (A bidirectional nn.LSTM's
	 * torch.cat([h_n[-2], h_n[-1]], 1) is the two directions' [B,H]
	 * joined.)  The core asks no device built before 2.25 for it. */
	KILN_OP_RNN = 48,
	/* Its backward: in0 x, in1 dy [B,T,H], in2 w_ih, in3 w_hh, in4 the
	 * forward's out1 (same i[], same shapes); out0 dx [B,T,I] (=|+= with
	 * KILN_OPF_ACCUMULATE), out1 dw_ih, out2 dw_hh, out3 f32[2, G*H]: the
	 * gradients of b_ih, then b_hh (written); out1 and out2 written, or
	 * added into when i[3] = 1.  Padded steps give dx = 0 and add nothing.
	 * With i[4] = 1 (ABI 2.25) in1 is dy [B,H], the gradient of the final
	 * hidden state alone: the backward of the sequence whose dy is that
	 * row at the row's last step run (t = len-1, or t = 0 reverse) and 0
	 * at every other step. */
	KILN_OP_RNN_BWD = 49,
	/* ABI 2.6, INT8 inference (docs/inference.md "INT8"; kiln quantize).
	 * CONV's operands, geometry (i[0..6]) and fused activation, with the
	 * input and the weights quantized to 8 bits, exact int32 products:
	 *   xq = sat(round_half_even(x * r)) in u8 [0, 255] (i[8] = 1) or
	 *        s8 [-128, 127] (i[8] = 0), r = (float)(1 / sx), sx = f[0] > 0;
	 *   sw[o] = max|w[o,...]| / 63 (1 for an all-zero filter),
	 *   wq[o,...] = round_half_even(w[o,...] / sw[o]) in [-63, 63] (7-bit
	 *   weights: CPUs without VNNI sum u8 x s8 pairs in int16, and
	 *   255 * 63 * 2 fits);
	 *   acc[n,o,p,q] = sum over c,kh,kw of xq * wq (int32, exact);
	 *   y = act(sx * sw[o] * acc + b[o])
	 *   (up to f32 rounding in the order of the scale and the bias: the
	 *   CPU device adds b[o] / (sx * sw[o]) to the sums, then scales, as
	 *   oneDNN orders them; the sums themselves are exact).
	 * in0 x f32 [N,C,H,W] (nchw or nhwc), in1 w f32 [O,C/g,KH,KW], in2 b
	 * f32 [O] (optional), out0 y f32 [N,O,OH,OW] in x's layout.  The
	 * weights are quantized by the op (the scales follow from them), so
	 * a model's f32 weights run as they are; `kiln quantize` stores the
	 * weights as wq * sw, which the op quantizes back to exactly wq.
	 * ABI 2.8, chained INT8 (u8 activations between INT8 layers):
	 *  - in0 may be u8 (then i[8] = 1): x is xq itself, already quantized
	 *    by f[0] (a chained INT8 layer's out0), and the op reads it as is;
	 *  - out0 may be u8, with its scale so = f[1] > 0: the op writes
	 *      yq = sat_u8(round_half_even(act(sx * sw[o] * acc + b[o]) / so))
	 *    (0 for a negative value: with or without a fused ReLU, the result
	 *    is that of the ReLU), up to f32 rounding in the order of the
	 *    scales and the bias (the CPU device computes
	 *    (acc + b[o] / (sx * sw[o])) * (sx * sw[o] / so)).
	 * Both only in inference plans; w and b stay f32.  A device without
	 * them returns KILN_ENOTSUP from prepare (the core refuses them on a
	 * device built before 2.8). */
	KILN_OP_QCONV = 50,
	/* ABI 2.6: GEMM's y[M,N] = x[M,K] w[N,K]^T (+ b[N]) (i[0] = 0, i[1] = 1,
	 * i[2] = M, i[3] = N, i[4] = K; fused activation as GEMM's) with x
	 * and w quantized as QCONV's (sw[n] per row n of w, xq by f[0] and
	 * i[8]): y[m,n] = act(sx * sw[n] * sum_k xq[m,k] wq[n,k] + b[n]).
	 * f32 in memory, except ABI 2.8's u8 x and u8 y (as QCONV's). */
	KILN_OP_QLINEAR = 51,
	/* ABI 2.31: ATTENTION_DECODE of T >= 1 positions a run (a prompt's
	 * prefill, docs/generate.md): every row holds T new tokens at
	 * positions t = *in1 .. *in1 + T - 1 (the same for every row).
	 * in0 qkv [B,T,3C], in1 pos i32[1] (device, the first position); out0
	 * y [B,T,C] (qkv's dtype); out1 kcache, out2 vcache f32 [B,H,Tmax,D]
	 * as ATTENTION_DECODE's: row t + i of head h gets the k and v of query
	 * i (converted to f32), rows < t must hold what the runs at those
	 * positions wrote, rows >= t + T are neither read nor written.  For
	 * query i at position u = t + i,
	 *   y[b,i,h*D:(h+1)*D] = sum_{j<=u} softmax_j(scale * q_i.K[j]) V[j]
	 * what T steps of ATTENTION_DECODE give, up to float rounding (the
	 * CPU device's run, blocked over the queries since session 44, sums
	 * a score's D terms in another order than its step).  A run may rewrite positions
	 * an earlier run wrote (the core's last run of a long prompt overlaps
	 * the one before) and may hold padding past the prompt (id 0; its
	 * rows are written, and overwritten by the steps that follow).
	 * i[0] = H, f[0] = scale.  Positions outside [0, Tmax) write nothing
	 * and fail the run with KILN_EDATA naming them.  A new op, not
	 * ATTENTION_DECODE of T > 1, so that a device written for ATTENTION_
	 * DECODE (T = 1) and rebuilt unchanged refuses it (KILN_ENOTSUP from
	 * prepare; the core asks no device built before 2.31): generation
	 * then feeds a prompt a position a step. */
	KILN_OP_ATTENTION_DECODE_RUN = 52,
	/* ---- the gradients' non-finite check where they are made (ABI 2.32)
	 * GRAD_CLIP's first pass over a range of blocks, run as soon as
	 * their gradients are final (after the weight- and bias-gradient ops
	 * of the layer that completes them): in0 grads f32[n] (n = i[0], the
	 * whole flat gradient GRAD_CLIP takes), out0 f32[nb] block sums (nb =
	 * ceil(n / 1024)).  Block k is elements [1024 k, min(1024 (k + 1), n));
	 * for k in [i[1], i[2]) (0 <= i[1] <= i[2] <= nb) out0[k] = the f32
	 * sum of squares of block k exactly as the device's GRAD_CLIP sums it
	 * (NaN or inf where an element is, or where finite squares overflow:
	 * GRAD_CLIP sums such a block again); the other elements of out0 are
	 * not touched.  What GRAD_CLIP's in1 reads. */
	KILN_OP_GRAD_SUMSQ = 53,
	KILN_OP_TYPE_COUNT
};

enum kiln_pool_kind { KILN_POOL_MAX = 0, KILN_POOL_AVG = 1 };

enum kiln_act {
	KILN_ACT_RELU = 0,
	KILN_ACT_LEAKY_RELU = 1, /* x > 0 ? x : alpha * x */
	KILN_ACT_GELU = 2,       /* exact (erf) GELU, PyTorch's default */
	KILN_ACT_SIGMOID = 3,
	KILN_ACT_TANH = 4,
	/* GELU's tanh approximation (GPT-2's; nn.GELU(approximate='tanh')), ABI 2.1:
	 * y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) */
	KILN_ACT_GELU_TANH = 5
};

enum kiln_loss { KILN_LOSS_XENT = 0, KILN_LOSS_MSE = 1, KILN_LOSS_BCE = 2 };
enum kiln_sched { KILN_SCHED_CONSTANT = 0, KILN_SCHED_COSINE = 1, KILN_SCHED_STEP = 2,
		  KILN_SCHED_MULTISTEP = 3, KILN_SCHED_ONECYCLE = 4,
		  /* ABI 2.30 */
		  KILN_SCHED_EXPONENTIAL = 5, KILN_SCHED_LINEAR = 6, KILN_SCHED_POLYNOMIAL = 7 };

enum kiln_op_flags {
	KILN_OPF_ACCUMULATE = 1, /* add into out0 (beta = 1) instead of overwriting */
	/* optimizer ops (SGD, ADAMW, LAMB) and COUNTER_ADD: one more input,
	 * last, a device f32[1] gate; the op changes nothing when it is 0 (a
	 * step skipped for non-finite gradients: KILN_OP_GRAD_CLIP's finite
	 * flag) */
	KILN_OPF_GATED = 2,
	/* ABI 2.3, fused epilogue activation: out0 is written as act(result)
	 * instead of the result, act = enum kiln_act i[KILN_OPI_ACT] with alpha
	 * f[KILN_OPF_ACT_ALPHA] (KILN_OP_ACT's math), after the bias and before
	 * any accumulation (not with KILN_OPF_ACCUMULATE).  On GEMM, CONV,
	 * BN_TRAIN and BN_INFER (nn.Linear/Conv2d/BatchNorm2d followed by the
	 * activation, one op).  On a training max POOL (ReLU only, ABI 2.16):
	 * the ReLU before it, its backward folded into POOL_BWD (see
	 * KILN_OP_POOL).  On BN_BWD (ReLU only): one more input, in4 =
	 * the forward output y (after the ReLU), and dy is taken as
	 * dy * (y > 0), the ReLU's backward folded in.  A device that cannot
	 * fuse returns KILN_ENOTSUP from prepare and the caller runs the op and
	 * then KILN_OP_ACT in place; devices built before ABI 2.3 are never
	 * asked (the core refuses the flag for them). */
	KILN_OPF_ACT = 4,
	/* ABI 2.9, kept copies between the convolution ops of one layer (f32):
	 * the device's copy of an activation in its kernel's layout, written by
	 * one op and read by the next instead of converting the same tensor
	 * again.  CONV (training): one more output, last, u8[aux_bytes]: x as
	 * the kernel read it, kept from forward to backward for
	 * CONV_BWD_WEIGHTS.  CONV_BWD_WEIGHTS: in2 = that copy (u8[the CONV's
	 * aux_bytes]; in0 x is then not read) and one more output, last,
	 * u8[aux_bytes]: dy as its kernel read it, for CONV_BWD_DATA.
	 * CONV_BWD_DATA: in2 = that copy (u8[the weight gradient's aux_bytes];
	 * in0 dy is then not read).  The ops must have the same geometry and
	 * tensors; aux_bytes 0 means nothing is kept (the caller then sets no
	 * KILN_OPF_KEEP on the reader).  The copy's format is the device's
	 * business.  A device without it returns KILN_ENOTSUP from prepare and
	 * the caller prepares the ops without the flag; devices built before
	 * ABI 2.9 are never asked. */
	KILN_OPF_KEEP = 8,
	/* ABI 2.11:
	 * a residual add in the convolution's epilogue (inference): CONV takes
	 * one more input, last, r with out0's descriptor, and writes out0 =
	 * act(conv(x, w) + b + r): the sum before the fused activation
	 * (KILN_OPF_ACT), as in a ResNet block's conv, add and ReLU.  The bias
	 * is there when n_in = 4.  Not with KILN_OPF_ACCUMULATE or
	 * KILN_OPF_KEEP.  A device without it returns KILN_ENOTSUP from
	 * prepare and the caller runs the CONV, KILN_OP_ADD and KILN_OP_ACT. */
	KILN_OPF_RESIDUAL = 16,
	/* ABI 2.15, frozen weights (inference): on CONV (not with
	 * KILN_OPF_KEEP), QCONV and QLINEAR (there in1 and the bias in2),
	 * and since session 46 an f32 GEMM (not with KILN_OPF_ACCUMULATE: a
	 * linear layer's forward, in1 its [out, in] weights; no ABI minor,
	 * since a device that ignores the flag on a GEMM computes the same),
	 * in1, the weights, holds the same values on every
	 * run of the plan until the core calls the device's
	 * KILN_PROC_WEIGHTS_CHANGED (kiln/plugin.h); in1's pointer may change
	 * between runs, its values may not.  The device may keep a copy of the
	 * weights converted to its kernel's layout, made on a run, and use it
	 * on later runs instead of reading in1, with nothing compared per run.
	 * The core sets it only in inference plans (kiln_plan_opts.frozen,
	 * core/infer.c), never in training or evaluation plans (the optimizer
	 * writes the weights between their runs), and only on a device that
	 * exports KILN_PROC_WEIGHTS_CHANGED.  A device may ignore it. */
	KILN_OPF_FROZEN = 32
};

/* Where KILN_OPF_ACT's kind and alpha live: the last integer and real
 * parameters, which no fusable op uses otherwise. */
#define KILN_OPI_ACT 15
#define KILN_OPF_ACT_ALPHA 7

/* An operation, described once and prepared once per shape. */
struct kiln_op {
	int32_t type;   /* enum kiln_op_type */
	int32_t flags;  /* enum kiln_op_flags */
	int32_t n_in, n_out;
	struct kiln_tensor_desc in[KILN_OP_MAX_IN];
	struct kiln_tensor_desc out[KILN_OP_MAX_OUT];
	int64_t i[16];
	double f[8];
};

/* Pointers for one run of a prepared op.  All device memory except where an
 * op says host.  workspace: at least the bytes prepare() asked for. */
struct kiln_op_args {
	const void *in[KILN_OP_MAX_IN];
	void *out[KILN_OP_MAX_OUT];
	void *workspace;
	size_t workspace_bytes;
};

#ifdef __cplusplus
}
#endif
#endif /* KILN_OPS_H */
