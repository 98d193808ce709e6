#!/bin/sh
# bench/stage_bytes.sh [RUNS]: the constant of [model] stages = auto's cost
# model, [model] stages_flops_per_byte (core/schema.c; docs/pipeline.md,
# "Balanced stages"; session 20, issue 21): FLOPs a second of a GEMM over
# bytes a second of the memory-bound ops, from `kiln train --profile` of
# bench/pipeline_pair.sh's blocks model at ROWS rows (default 128, a
# micro-batch of BATCH=2048 at M = 16), 1 thread.  Each op's time is its
# profile's min (the VM's hidden neighbour slows ops up to 2x: the least
# is the op's own), the figures the medians over RUNS runs (default 3):
#   F    GFLOP/s of the 1024 x 1024 linears' forward GEMMs (2 ROWS 1024^2)
#   B_r  GB/s of the ReLUs' backward (reads y and dy, writes dx: 3 tensors)
#   B_f  GB/s of the layernorm's forward (reads x, writes y: 2 tensors)
#   B_b  GB/s of the layernorm's backward (x, dy read, dx written, dW)
#   R    F / B, B the bytes kiln_pipe_layer_cost counts for the model's
#        memory-bound layers over their measured time: the layernorm's
#        forward (x, y) and its parameters' gradient (x, dy; its input's
#        is not asked for: the data's), 4 t, and the 4 ReLUs' input
#        gradients (3 t each; their forwards are the GEMMs' epilogues),
#        over t_lf + t_lb + 4 t_r (t: a ROWS x 1024 f32 tensor's bytes):
#        the FLOPs a byte that make the estimate of those layers' time
#        what it is here.
# Usage (from the top of the build tree): sh bench/stage_bytes.sh 5
set -eu
RUNS=${1:-3}
ROWS=${ROWS:-128}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$tmp/cache}"
. "$(dirname "$0")/../tests/config_lib.sh"
{
	ini run seed=1 threads=1 out_dir="$tmp/run"
	ini_synthetic 8192 32 16 image_channels=1 workers=1
	ini_layers flat:flatten ln:layernorm b1:linear:out=1024 r1:relu b2:linear:out=1024 r2:relu \
		b3:linear:out=1024 r3:relu b4:linear:out=1024 r4:relu head:linear:out=16 loss:softmax_xent
	ini train epochs=1 max_steps=24 batch="$ROWS" lr=0.01 log_every=100 eval=0 \
		checkpoint_last=0 overwrite=1
} > "$tmp/b.ini"
echo "load average: $(cat /proc/loadavg)"
for _ in $(seq "$RUNS"); do
	rm -rf "$tmp/run"
	./kiln train "$tmp/b.ini" --profile run.profile_steps=0 > "$tmp/log" 2>&1 ||
		{ tail -5 "$tmp/log" >&2; exit 1; }
	# the min column (the last) of each op's row, the least over the layers
	awk -v n="$ROWS" '
		function least(key, v) { if (!(key in m) || v < m[key]) m[key] = v }
		$2 == "gemm" && $3 == "forward" && $1 ~ /^b[1-4]$/ { least("g", $NF) }
		$2 == "relu_bwd" { least("r", $NF) }
		$2 == "layernorm" && $3 == "forward" { least("lf", $NF) }
		$2 == "layernorm_bwd" { least("lb", $NF) }
		END {
			t = n * 1024 * 4
			F = 2 * n * 1024 * 1024 / m["g"] / 1e3
			Br = 3 * t / m["r"] / 1e3; Bf = 2 * t / m["lf"] / 1e3
			Bb = (3 * t + 4 * 2048 * 2) / m["lb"] / 1e3
			B = 16 * t / (m["lf"] + m["lb"] + 4 * m["r"]) / 1e3
			printf "%.1f %.2f %.2f %.2f %.2f\n", F, Br, Bf, Bb, F / B
		}' "$tmp/run/profile.txt" >> "$tmp/fig"
	tail -1 "$tmp/fig"
done
med() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
printf 'medians of %s runs, %s rows: F %s GFLOP/s, B_r %s GB/s, B_f %s GB/s, B_b %s GB/s, R %s FLOP/byte\n' "$RUNS" "$ROWS" \
	"$(cut -d' ' -f1 "$tmp/fig" | med)" "$(cut -d' ' -f2 "$tmp/fig" | med)" \
	"$(cut -d' ' -f3 "$tmp/fig" | med)" "$(cut -d' ' -f4 "$tmp/fig" | med)" "$(cut -d' ' -f5 "$tmp/fig" | med)"
