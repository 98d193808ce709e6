#!/bin/sh
# tests/oom_named.sh - an allocation that fails names what it was for and its
# size (session 37; the model's, the plans' and the optimizer's since
# session 31).  Before, these said "out of memory" or "cpu: alloc of N bytes
# failed" alone:
#  1. the sample orders, an int64 a sample (docs/memory.md): a training set
#     of 3e9 samples under `ulimit -v` 8 GB, with workers 0, 1 and auto;
#  2. the trainer's host and device input slots, the loader's staging
#     slots, the model's optimizer state and the host buffer of its initial
#     weights, the checkpoint's staging buffer, and kiln predict's folding of
#     the weights: an LD_PRELOAD shim built here fails the Nth allocation
#     of one size asked for by one library (kiln's CPU plugin or libkiln),
#     the only way to hit a buffer of a few KB at the same point on every
#     machine (a `ulimit -v` that does lands elsewhere on the next build);
#  3. the device scalars of 64 bytes (step counters, learning rate, metric
#     sums, loss scaler, clipping and check states; session 42): the shim
#     fails each 64-byte allocation of the CPU plugin in turn, and every
#     one that fails names its buffer; kiln eval and predict under fp16
#     allocate no loss scaler.
name=oom_named
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
need_source idx
data="$srcdir/tests/data"
ini="$srcdir/tests/data/tr_cnn.ini"

# ---- 1: 3e9 samples (45 GB of sample order) under an 8 GB address space ----
{
	ini run threads=1 device=cpu
	ini data source=synthetic image_size="1 1" classes=2 samples=3000000000
	linear_layers 2
	ini train batch=4 max_steps=1
} >"$tmp/huge.ini"
(ulimit -v 8000000 && kiln 1 train "$tmp/huge.ini" run.out_dir= data.workers=0) || exit 1
stderr_has "kiln: error: the epoch's sample order for 3000000000 training samples (44.70 GiB, 16 bytes a sample): out of memory; set [data] limit to train on fewer (docs/memory.md)"
(ulimit -v 8000000 && kiln 1 train "$tmp/huge.ini" run.out_dir= data.workers=1) || exit 1
stderr_has "kiln: error: the evaluation's sample order for 3000000000 samples (22.35 GiB, 8 bytes a sample): out of memory; set [data.eval] limit to evaluate fewer (docs/memory.md)"
# workers = auto's probe reads the end of epoch 0's order without the
# whole permutation since session 38 (core/loader.c probe_order: it
# needed 22.35 GiB here, and said so): the probe runs, and the run fails
# at the next order it needs
(ulimit -v 8000000 && kiln 1 train "$tmp/huge.ini" run.out_dir= data.workers=auto) || exit 1
stderr_has "[data] workers = auto: 1: "
stderr_has "kiln: error: the evaluation's sample order for 3000000000 samples (22.35 GiB, 8 bytes a sample): out of memory; set [data.eval] limit to evaluate fewer (docs/memory.md)"

# ---- 2: small buffers, failed by a shim ------------------------------------
shim_build ||
	{ cat "$tmp/shim.err"; echo "SKIP (part 2): cannot build the allocation shim (glibc's __libc_malloc)"; exit 0; }
# shimmed FROM BYTES NTH WANT ARGS...: kiln ARGS with that allocation failed
shimmed() {
	(export LD_PRELOAD="$shim" SHIM_ALLOC_FROM="$1" SHIM_ALLOC_BYTES="$2" SHIM_ALLOC_NTH="$3"
	 shift 3
	 kiln "$@") || exit 1
}
# batches of 13 and 11 samples of 8x8 f32 (256 bytes): 3328 and 2816
# bytes; the trainer's two slots take the larger batch, a host then a
# device buffer each (x 3328, y 52), then the loader's ring
slots() {
	shimmed /kiln-cpu.so 3328 "$1" 1 train "$ini" data.path="$data" run.out_dir= run.device=cpu \
		train.batch=13 train.eval_batch=11 data.workers=1
}
slots 1
stderr_has "kiln: error: the trainer's host input slot 1 of 2 (a batch of 13 samples and labels, 3380 bytes; [train] batch): cpu: alloc of 3328 bytes failed"
slots 2
stderr_has "kiln: error: the trainer's device input slot 1 of 2 (a batch of 13 samples and labels, 3380 bytes; [train] batch): cpu: alloc of 3328 bytes failed"
slots 5
stderr_has "kiln: error: the loader's staging slot 1 of 3 (a batch of 13 samples and labels, 3380 bytes; the ring of [data] workers + prefetch slots 10140 bytes): cpu: alloc of 3328 bytes failed"
# the model's buffers of its 416 floats (1664 bytes each, the parameters'
# region being the larger): the parameters, their gradients, the momentum,
# then the host buffer its initial weights are drawn in (before session 41
# "cpu: alloc of 1664 bytes failed" alone)
shimmed /kiln-cpu.so 1664 3 1 train "$ini" data.path="$data" run.out_dir= run.device=cpu
stderr_has "kiln: error: the model's optimizer state (1664 bytes, 416 floats; the largest tensor 'fc1.weight' f32[5, 64]): cpu: alloc of 1664 bytes failed"
shimmed /kiln-cpu.so 1664 4 1 train "$ini" data.path="$data" run.out_dir= run.device=cpu
stderr_has "kiln: error: the model's host buffer for drawing its initial weights (1664 bytes, 416 floats; the largest tensor 'fc1.weight' f32[5, 64]): cpu: alloc of 1664 bytes failed"
# the checkpoint after the last step: its 256 KiB staging buffer
shimmed /kiln-cpu.so 262144 1 1 train "$ini" data.path="$data" run.out_dir="$tmp/ck" run.device=cpu
stderr_has "kiln: error: $tmp/ck/checkpoints/ckpt-5.kiln.tmp: the checkpoint's staging buffer (256 KiB): cpu: alloc of 262144 bytes failed"
# kiln predict folds batchnorm into the convolution: the trained weights'
# host copy (since session 38 the one copy at a time: the trained model's,
# then the folded one's) has 416 + 1 floats of parameters (each tensor in
# 16s: 48 + 16 + 16 + 320 + 16), the allocation failed here
kiln 0 train "$ini" data.path="$data" run.out_dir="$tmp/run" run.device=cpu
shimmed /libkiln.so 1668 1 1 predict "$ini" data.path="$data" run.out_dir="$tmp/run" run.device=cpu --eval-set --logits "$tmp/x.npy"
stderr_has "kiln: error: folding the model for inference: a host copy of its weights (1800 bytes): out of memory"
[ ! -e "$tmp/x.npy" ] || fail "a failed predict wrote its logits"

# ---- 3: the device scalars (64 bytes each), failed one after the other ----
# (before session 42 the step counters, the learning rate, the metric sums,
# the loss scaler, the clipping and check states said "kiln: error: cpu:
# alloc of 64 bytes failed" alone)
# scalars ARGS...: kiln ARGS with the 1st, 2nd, ... allocation of 64 bytes
# the CPU plugin makes on the main thread failing, until one is not
# reached: each run exits 0 or 1, and a failed device allocation names its
# buffer; the names in $tmp/names, one a line
scalars() {
	: >"$tmp/names"
	_n=1
	while [ $_n -le 200 ]; do
		rm -f "$tmp/hit"
		last="$* (allocation $_n of 64 bytes failing)"
		_rc=0
		(export LD_PRELOAD="$shim" SHIM_ALLOC_FROM=/kiln-cpu.so SHIM_ALLOC_BYTES=64 \
			SHIM_ALLOC_MAIN=1 SHIM_ALLOC_NTH=$_n SHIM_ALLOC_HIT="$tmp/hit"
		 exec timeout -k 5 60 "$kiln" "$@" >"$out" 2>"$err") || _rc=$?
		[ -e "$tmp/hit" ] || break
		case $_rc in
		0|1) ;;
		*) fail "exit $_rc (a failed allocation must be exit 1)" ;;
		esac
		! grep -q "^kiln: error: cpu: alloc of 64 bytes failed" "$err" ||
			fail "a failed allocation of 64 bytes not named"
		sed -n 's/^kiln: error: \(.*\): cpu: alloc of 64 bytes failed$/\1/p' "$err" >>"$tmp/names"
		_n=$((_n + 1))
	done
	[ $_n -gt 1 ] || fail "kiln $*: no allocation of 64 bytes: the sweep tested nothing"
	echo "ok: kiln $1 with each of $((_n - 1)) allocations of 64 bytes failing: $(wc -l <"$tmp/names") named"
}
# named WHAT: the sweep's names hold WHAT
named() { grep -qxF "$1" "$tmp/names" || fail "no failed allocation named '$1': $(cat "$tmp/names")"; }
scalars train "$ini" data.path="$data" run.out_dir= run.device=cpu run.precision=fp16 \
	train.max_steps=2 train.accumulate=2 train.clip_norm=1
named "the model's step and dropout counters"
named "the optimizer's step count"
named "the trainer's learning rate"
named "the trainer's metric sums"
named "the trainer's metric sums, their host copy"
named "the loss scaler's state"
named "the loss gradient's seed (the mean over micro-batches)"
named "the gradients' clipping state (norm, finite, skipped, clipped)"
named "the parameters' non-finite check's state"
# kiln eval and kiln predict under fp16 compute in f16 and make no loss
# scaler, which nothing would read (before session 42 both allocated its
# state, 64 bytes, and logged its scale): none of their 64-byte
# allocations is it (tests/config_amp.sh: their results are fp16's)
scalars eval "$ini" data.path="$data" run.out_dir="$tmp/run" run.device=cpu run.precision=fp16
named "the trainer's metric sums"
! grep -q "loss scaler" "$tmp/names" || fail "kiln eval under fp16 allocated $(grep "loss scaler" "$tmp/names")"
scalars predict "$ini" data.path="$data" run.out_dir="$tmp/run" run.device=cpu run.precision=fp16 \
	--eval-set --logits "$tmp/p16.npy"
named "the model's step and dropout counters"
! grep -q "loss scaler" "$tmp/names" || fail "kiln predict under fp16 allocated $(grep "loss scaler" "$tmp/names")"
echo "PASS: every failed allocation named with its size"
