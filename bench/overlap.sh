#!/bin/sh
# bench/overlap.sh [--runs N] [--batches "B..."] [--variant NAME:K=V,K=V]... COMM [KEY=VALUE...]
#
# DDP overlap and the cost of a second rank on this machine: an MLP
# (784-1024-1024-10, 1.86 M gradient floats in 1 MiB buckets), 1 thread per
# rank, async CPU streams, at each per-rank batch (default "64 256 1024"):
#   one    1 process (no communicator)
#   floor  2 independent processes side by side, no communication: what two
#          ranks cost on these cores before any communication
#   2 ranks of COMM (gloo: `kiln launch`; mpi: mpirun), once per variant:
#          by default `overlap` (as configured) and `no-overlap`
#          (dist.overlap=0); each --variant NAME:K=V,... adds a row (K=V
#          overrides, comma-separated; NAME: alone is the configuration as is).
# Every process of a run does the same number of steps per rank (4 epochs of
# 12288 samples per rank, so each run lasts a few seconds) and the step
# time is per-rank batch / rank 0's samples/s, timed from epoch 2.  The rows
# are run N times (default 3) interleaved (one, floor, variants, one, ...);
# the table gives medians over the runs: the step, the per-run ratio against
# `one` (issue #9's target: <= 1.15x) and against `floor` (same minute), and
# the CPU time of the whole run (user + system, every process, start-up
# included) per step, and from [dist] timing = 1 the exposed communication
# in % of the allreduce time (rank 0's) and the allreduce ms per step.  The KEY=VALUE overrides go to every run.  From the build directory:
#   sh bench/overlap.sh --runs 5 mpi
#   sh bench/overlap.sh --batches 256 --variant block:plugin.mpi.wait=block mpi
set -u
runs=3 batches="64 256 1024" variants=
while [ $# -gt 0 ]; do
	case $1 in
	--runs) runs=$2; shift 2 ;;
	--batches) batches=$2; shift 2 ;;
	--variant) variants="$variants $2"; shift 2 ;;
	*) break ;;
	esac
done
[ -n "$variants" ] || variants="overlap: no-overlap:dist.overlap=0"
comm=${1:-gloo}
[ $# -ge 1 ] && shift
extra="$*"
b=$(cd "$(dirname "$0")/.." && pwd)
kiln="$b/kiln"
root=; [ "$(id -u)" = 0 ] && root=--allow-run-as-root
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$tmp/cache}" # not the user's (bench/common.sh)
port=$(( 30000 + $$ % 20000 ))
# the rendezvous store's secret, shared by the ranks mpirun starts
export KILN_STORE_TOKEN=${KILN_STORE_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}

mlp_ini() { # FILE BATCH LIMIT: the model, LIMIT samples per epoch
	cat > "$1" <<INI
[run]
seed = 1
threads = 1
comm = $comm
[data]
source = idx
limit = $3
mean = 0.286
std = 0.353
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 1024
[layer.r1]
type = relu
[layer.fc2]
type = linear
out = 1024
[layer.r2]
type = relu
[layer.fc3]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 4
batch = $2
lr = 0.01
momentum = 0.9
log_every = 16
eval = 0
[plugin.cpu]
async = 1
[dist]
bucket_mb = 1
timing = 1
INI
}
step_ms() { # OUT_DIR BATCH: per-rank batch / samples per second of its rank 0
	sps=$(grep -o '"train_samples_per_s": *[0-9.e+]*' "$1/metrics.jsonl" | tail -1 | sed 's/.*: *//')
	awk -v s="$sps" -v b="$2" 'BEGIN { if (s > 0) printf "%.3f", 1000 * b / s; else print "nan" }'
}
exposed_pct() { # LOG: rank 0's "(Z% exposed)" and its allreduce ms/step
	grep "rank 0: over .* exposed communication" "$1" | head -1 |
		sed 's/.*allreduce \([0-9.]*\) ms\/step.*(\([0-9.]*\)% exposed).*/\2 \1/'
}
T="/usr/bin/time -f %U+%S -o"
cpu() { # TIME_FILE STEPS [TIME_FILE2]: CPU ms (user + system, every process) per step
	cat "$1" ${3:+"$3"} | grep -E '^[0-9.]+\+[0-9.]+$' | tr '+' '\n' |
		awk -v n="$2" '{ s += $1 } END { printf "%.2f", 1000 * s / n }'
}
fail() { echo "$1 failed:"; tail -5 "$2"; exit 1; }
med() { # FILE COLUMN: the median of that column
	awk -v c="$2" '{ print $c }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

for batch in $batches; do
	# 12288 samples per rank and epoch (a run: ~3-4 s on this VM), whole batches
	per=$(( 12288 / batch * batch )); [ $per -lt $(( batch * 4 )) ] && per=$(( batch * 4 ))
	ini="$tmp/b$batch.ini" ini1="$tmp/b$batch.one.ini"
	mlp_ini "$ini" "$batch" $(( per * 2 ))
	mlp_ini "$ini1" "$batch" "$per"
	steps=$(( 4 * per / batch ))
	for r in $(seq "$runs"); do
		d="$tmp/b$batch.r$r"
		$T "$d.one.t" "$kiln" train "$ini1" run.out_dir="$d.one" run.comm=none $extra > "$d.one.log" 2>&1 ||
			fail "1 process" "$d.one.log"
		$T "$d.fa.t" "$kiln" train "$ini1" run.out_dir="$d.fa" run.comm=none $extra > "$d.fa.log" 2>&1 &
		pa=$!
		$T "$d.fb.t" "$kiln" train "$ini1" run.out_dir="$d.fb" run.comm=none $extra > "$d.fb.log" 2>&1 ||
			fail "floor process b" "$d.fb.log"
		wait $pa || fail "floor process a" "$d.fa.log"
		one=$(step_ms "$d.one" "$batch")
		fl=$(awk -v a="$(step_ms "$d.fa" "$batch")" -v b="$(step_ms "$d.fb" "$batch")" \
			'BEGIN { printf "%.3f", (a + b) / 2 }')
		echo "$one $fl $(cpu "$d.one.t" "$steps") $(cpu "$d.fa.t" "$steps" "$d.fb.t")" >> "$tmp/b$batch.ref"
		for v in $variants; do
			name=${v%%:*} ov=$(echo "${v#*:}" | tr , ' ')
			log="$d.$name.log"
			if [ "$comm" = mpi ]; then
				$T "$d.$name.t" mpirun $root --oversubscribe -np 2 -x KILN_MASTER_PORT=$port -x OMP_NUM_THREADS=1 \
					"$kiln" train "$ini" run.out_dir="$d.$name" $ov $extra > "$log" 2>&1
			else
				KILN_MASTER_PORT=$port $T "$d.$name.t" "$kiln" launch -n 2 -- "$kiln" train "$ini" \
					run.out_dir="$d.$name" $ov $extra > "$log" 2>&1
			fi || fail "2 ranks, $name" "$log"
			two=$(step_ms "$d.$name" "$batch")
			echo "$two $(awk -v t="$two" -v o="$one" -v f="$fl" \
				'BEGIN { printf "%.3f %.3f", t / o, t / f }') $(cpu "$d.$name.t" "$steps")" \
				"$(exposed_pct "$log")" \
				>> "$tmp/b$batch.$name"
		done
	done
done

echo "DDP step, $comm, 2 ranks vs 1 process, 1 thread per rank, $(nproc) cores, medians of $runs interleaved run(s);" \
	"load $(cut -d' ' -f1-3 /proc/loadavg) at the end${extra:+; overrides: $extra}"
printf '%6s  %-28s %9s %9s %9s %9s %10s %10s\n' batch row "step ms" "x 1 proc" "x floor" "cpu ms" "exposed %" "allred ms"
for batch in $batches; do
	printf '%6s  %-28s %9s %9s %9s %9s\n' "$batch" "1 process" "$(med "$tmp/b$batch.ref" 1)" "" "" \
		"$(med "$tmp/b$batch.ref" 3)"
	printf '%6s  %-28s %9s %9s %9s %9s\n' "$batch" "floor: 2 processes, no comm" "$(med "$tmp/b$batch.ref" 2)" \
		"$(awk '{ print $2 / $1 }' "$tmp/b$batch.ref" > "$tmp/fr"; med "$tmp/fr" 1 | xargs printf '%.3f')" "" \
		"$(med "$tmp/b$batch.ref" 4)"
	for v in $variants; do
		name=${v%%:*} f="$tmp/b$batch.${v%%:*}"
		printf '%6s  %-28s %9s %9s %9s %9s %10s %10s\n' "$batch" "2 ranks, $name" "$(med "$f" 1)" \
			"$(med "$f" 2)" "$(med "$f" 3)" "$(med "$f" 4)" "$(med "$f" 5)" "$(med "$f" 6)"
	done
done
