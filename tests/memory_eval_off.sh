#!/bin/sh
# tests/memory_eval_off.sh - `kiln memory` sizes the trainer's input slots
# by the batches that will run: with [train] eval = 0 the training batch,
# whatever eval_batch says (core/train_buffers.c alloc_buffers allocates
# that).  Before session 41 core/memory.c io_bytes took max(eval_batch,
# batch) with evaluation off too: tests/data/tr_cnn.ini at batch 13 and
# eval_batch 40 (8x8 f32 samples, 256 bytes, and int32 labels) predicted
# 20800 bytes of input slots for the 6760 the run allocates, and `kiln
# train`'s device peak was 14104 bytes under the prediction, not 64.
#
# The hand count: the two device slots hold R rows of samples and labels,
# 2 R (S + 4) bytes, and with transform_on = device (u8 samples widened on
# the device) one f32 input of R rows more, R x 256; the host staging (no
# loader: workers = 0) is the two host slots, 2 R (S + 4), and the epoch's
# sample order and permutation, 2 x 48 x 8 bytes.  R is the batch, 13, with
# eval = 0, and the larger of batch and eval_batch, 40, with eval = 1.
# Each prediction's device total is also checked against what `kiln train`
# asked the device for (device_peak_bytes): within the 64 bytes the report
# assumes for one device scalar that is smaller (docs/memory.md).
name=memory_eval_off
. "$(dirname "$0")/lib.sh"
need_source idx

ini="$srcdir/tests/data/tr_cnn.ini"
data=$srcdir/tests/data

# check EVAL ON_DEVICE INPUTS HOST: kiln memory's inputs and host bytes
# with [train] eval = EVAL (transform_on = device when ON_DEVICE is 1: u8
# samples), and kiln train's device peak against its total
check() {
	tod=host
	[ "$2" = 1 ] && tod=device
	kiln 0 memory "$ini" "data.path=$data" train.batch=13 train.eval_batch=40 train.eval="$1" data.transform_on=$tod
	cp "$out" "$tmp/m.out"
	got_in=$(field inputs "$tmp/m.out") got_host=$(field host "$tmp/m.out")
	total=$(field total "$tmp/m.out")
	[ "$got_in" = "$3" ] ||
		fail "eval = $1, transform_on = $tod: input buffers $got_in bytes, want $3 (hand count)"
	[ "$got_host" = "$4" ] ||
		fail "eval = $1, transform_on = $tod: host staging $got_host bytes, want $4 (hand count)"
	if [ "$1" = 0 ]; then
		grep -q "evaluation plan .* none: \[train\] eval = 0" "$tmp/m.out" ||
			fail "eval = 0: the report does not say there is no evaluation plan"
	fi
	kiln 0 train "$ini" "data.path=$data" train.batch=13 train.eval_batch=40 train.eval="$1" data.transform_on=$tod run.out_dir=
	peak=$(field device_peak_bytes "$out")
	d=$((total - peak))
	[ "$d" -ge 0 ] && [ "$d" -le 64 ] ||
		fail "eval = $1, transform_on = $tod: kiln memory's device total $total, the run's device peak $peak (want the total 0 to 64 bytes above)"
	echo "ok: eval = $1, transform_on = $tod: inputs $got_in, host $got_host, device total $total (the run's peak $peak)"
}

# f32 samples (256 bytes): R (256 + 4) twice; host: that + 768
check 0 0 $((2 * 13 * 260)) $((2 * 13 * 260 + 768))
check 1 0 $((2 * 40 * 260)) $((2 * 40 * 260 + 768))
# u8 samples (64 bytes) widened on the device into R x 256 bytes
check 0 1 $((2 * 13 * 68 + 13 * 256)) $((2 * 13 * 68 + 768))
check 1 1 $((2 * 40 * 68 + 40 * 256)) $((2 * 40 * 68 + 768))
echo "PASS: $name"
