#!/bin/sh
# tests/bench_data.sh - `kiln bench data`'s timed window (core/bench_data.c):
# it starts with the loader idle (the warm-up taken completely), so a short
# run reports the rate of the batches read in it.  A loader of about 300 us
# a sample (synthetic 256x256 images resized and cropped), 4 workers and a
# deep prefetch: one timed batch, in each of 3 runs, counts its reads,
# transforms and the consumer's wait.  Before session 29 the clock started
# with the batches the workers had read ahead during the warm-up: one
# batch reported about 10x the steady rate in most runs (up to 100x
# elsewhere) with no read or transform time.
name=bench_data
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"

ini_bench_data samples=2000 image_size=256 image_channels=3 classes=10 resize=224 crop=random \
	size=200 workers=4 prefetch=8 >"$tmp/bd.ini"
# (not a rate comparison: timings are bench/'s, never a test's) each of 3
# runs of one timed batch counts that batch's reads and transforms: the
# loader is idle when the clock starts (before, most runs timed a batch
# read ahead during the warm-up: read_us 0.00, xform_us 0.00 and 10x-100x
# the steady samples/s).  The consumer's wait is not asserted above 0: on
# a busy machine the consumer can be descheduled between starting the
# epoch and asking for its batch for longer than the batch takes to read
# (CI, session 29: wait_frac 0.0000 with the batch read in the window).
for run in 1 2 3; do
	kiln 0 bench data "$tmp/bd.ini" --batches 1
	stdout_has '"batches": 1,'
	awk -v r="$(field read_us "$out")" -v x="$(field xform_us "$out")" -v w="$(field wait_frac "$out")" \
		'BEGIN { exit !(r > 0 && x > 0 && w >= 0 && w <= 1) }' ||
		fail "run $run, --batches 1: read_us $(field read_us "$out"), xform_us $(field xform_us "$out"), wait_frac $(field wait_frac "$out"): a batch read before the clock started"
done
echo "ok: bench data --batches 1 times the batch it reads"
