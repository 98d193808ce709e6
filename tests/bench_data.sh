#!/bin/sh
# tests/bench_data.sh - `kiln bench data`'s timed window (core/bench_data.c):
# it starts with the loader idle (the warm-up taken completely), so a short
# run reports the rate of the batches read in it.  A loader of about 300 us
# a sample (synthetic 256x256 images resized and cropped), 4 workers and a
# deep prefetch: one timed batch, in each of 3 runs, is no more than 2.5x
# the steady rate of 24.  Before session 29 the clock started with the
# batches the workers had read ahead during the warm-up: one batch
# reported about 10x the steady rate in most runs (up to 100x elsewhere).
name=bench_data
. "$(dirname "$0")/lib.sh"

cat >"$tmp/bd.ini" <<'INI'
[run]
device = cpu
[data]
source = synthetic
samples = 2000
image_size = 256
image_channels = 3
classes = 10
resize = 224
crop = random
size = 200
workers = 4
prefetch = 8
[layer.flat]
type = flatten
[layer.fc]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
batch = 8
INI
kiln 0 bench data "$tmp/bd.ini" --batches 24
steady=$(field samples_per_s "$out")
for run in 1 2 3; do
	kiln 0 bench data "$tmp/bd.ini" --batches 1
	one=$(field samples_per_s "$out")
	stdout_has '"batches": 1,'
	awk -v a="$one" -v s="$steady" 'BEGIN { exit !(a > 0 && a < 2.5 * s) }' ||
		fail "--batches 1: $one samples/s, --batches 24: $steady (the prefetched batches timed as free)"
done
# the per-sample times are over the samples read in the window: some
awk -v r="$(field read_us "$out")" -v x="$(field xform_us "$out")" 'BEGIN { exit !(r > 0 && x > 0) }' ||
	fail "--batches 1: read_us $(field read_us "$out"), xform_us $(field xform_us "$out")"
echo "ok: bench data --batches 1: $one samples/s, --batches 24: $steady"
