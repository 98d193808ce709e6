#!/bin/sh
# bench/onnx.sh - kiln's fp32 inference vs ONNX Runtime on the model `kiln
# export --onnx` wrote of it: the MLP, CNN and ResNet Fashion-MNIST
# examples (seeded initial weights, exported and read back as [model]
# init_from: speed does not depend on them), the same
# batch of BATCH test images (default 1000), the same intra-op threads, 1
# and then 2 (ONNX Runtime: inter-op 1, sequential, all graph optimisations,
# CPU provider).
#   kiln: kiln_infer (include/kiln/infer.h) on the host batch, the path
#     `kiln predict` and an embedding program take: the folded inference
#     graph (batchnorm into conv/linear, dropout removed, bias + ReLU in the
#     oneDNN epilogue, a residual add and its ReLU in the conv's; each
#     convolution on the fastest of oneDNN's kernels, timed at prepare:
#     [plugin.cpu] conv_impl = auto), the inference plan of BATCH rows
#     run in blocks of rows that stay in the cache ([run] infer_block =
#     auto: the ResNet in blocks of 8 rows a thread; run.infer_block=0 is
#     the path before session 13); timed by tests/onnx_tool logits --time (host input to host logits).
#   ONNX Runtime: session.run on the same host batch, tests/onnx_ort.py
#     --time.
# Each run times ITERS calls after two warm-ups and prints its median; kiln
# and ONNX Runtime alternate, RUNS rounds (default 5), and the table gives
# the medians of the run medians, ms per batch and images/s, and kiln's
# speed-up (ONNX Runtime's ms / kiln's); then the same for the process CPU
# time per call (every thread's: on a loaded machine the 1-thread CPU-time
# ratio is the steadier figure).  Each round prints (stderr) kiln's row
# block and conv_impl choices (round_choices).  The first round also prints how
# far ONNX Runtime's logits are from kiln's (tests/onnx_ort.py; the test
# that asserts it is tests/onnx_ort.sh).
#
# Usage: bench/onnx.sh [--short] [--runs N] [--threads "1 2"] [--batch B]
#                      [--iters R] [--models "mlp cnn resnet"] [--no-residual]
#                      [section.key=value ...]
#   --short: 3 rounds of 5 calls.  Run from the top of a built tree; the
#   overrides go to kiln's side (e.g. model.layout=nchw).  --no-residual
#   keeps the residual adds as layers (tests/onnx_tool --no-residual); with
#   plugin.cpu.conv_impl=first it is the path before session 9.
# Environment: KILN_VENV (default /work/scratch/venv, else .venv): the venv
#   with onnxruntime and onnx (scripts/install-deps --bench).
RUNS=5
THREADS="1 2"
MODELS="mlp cnn resnet"
TOOL_FLAGS=
BATCH=1000
ITERS=10
OVERRIDES=
while [ $# -gt 0 ]; do
	case $1 in
	--short) RUNS=3 ITERS=5; shift ;;
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--batch) BATCH=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--models) MODELS=$2; shift 2 ;;
	--no-residual) TOOL_FLAGS="$TOOL_FLAGS --no-residual"; shift ;;
	*=*) OVERRIDES="$OVERRIDES $1"; shift ;;
	*) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
	esac
done
VENV=${KILN_VENV:-/work/scratch/venv}
[ -x "$VENV/bin/python" ] || VENV=.venv
PYTHON=$VENV/bin/python
. "$(dirname "$0")/common.sh"
bench_tmpdir onnx-bench
# failed WHAT LOG: a step failed; say which and show its log's end
failed() {
	echo "bench/onnx.sh: $1 failed; the end of its log:" >&2
	tail -n 5 "$2" >&2
	exit 1
}
# make decides: a tool left from an older build would fail to link at run
# time against today's libkiln (a missing symbol) and end the bench
make -s tests/onnx_tool || { echo "bench/onnx.sh: cannot build tests/onnx_tool" >&2; exit 1; }
"$PYTHON" -c 'import onnxruntime' || { echo "bench/onnx.sh: no onnxruntime in $PYTHON" >&2; exit 1; }
echo "# bench/onnx.sh --runs $RUNS --threads \"$THREADS\" --batch $BATCH --iters $ITERS --models \"$MODELS\"$TOOL_FLAGS$OVERRIDES"
echo "# loadavg before: $(cut -d' ' -f1-3 /proc/loadavg); onnxruntime $("$PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)'), $(nproc) CPUs"
# round_choices MODEL THREADS ROUND: what kiln's round ran with, from its
# info log (stderr): the row block of the inference plan and each timed
# choice ([plugin.cpu] conv_impl = auto: timed, or read from the tune cache)
# as OP IN -> OUT = K, sorted, so that a slow round can be told apart
round_choices() {
	block=$(sed -n 's/.*batch of [0-9]* rows in blocks of \([0-9]*\).*/\1/p' "$TMP/$1.klog" | head -n 1)
	ch=$(sed -n -e 's/.*\] f32 \(CONV .*\): [0-9]* implementations,.*: implementation \([0-9]*\).*/\1=\2/p' \
		-e 's/.*\] \([A-Z_]* .*\): choice \([0-9]*\) from the tune cache.*/\1=\2/p' "$TMP/$1.klog" |
		sed 's/f32//g; s/ nhwc//g; s/ //g' | sort -u | tr '\n' ' ')
	echo "# $1 $2 threads round $(($3 + 1)): kiln $(sed -n 's/^kiln_ms //p' "$TMP/$1.kout") ms, block ${block:-none}," \
		"$(grep -c 'implementations,' "$TMP/$1.klog") timed: $ch" >&2
}
printf '%-8s %7s %10s %10s %11s %11s %8s %11s %11s %8s\n' model threads kiln_ms ort_ms kiln_img_s \
	ort_img_s speedup kiln_cpu_ms ort_cpu_ms cpu_x
for model in $MODELS; do
	ini=examples/fashion_mnist_$model.ini
	for th in $THREADS; do
		# shellcheck disable=SC2086 # the overrides are words
		set -- run.out_dir="$TMP/run_$model" run.threads="$th" $OVERRIDES
		# the seeded initial weights, as a weights file kiln_infer loads
		[ -e "$TMP/$model.safetensors" ] ||
			./kiln export "$ini" --safetensors "$TMP/$model.safetensors" "$@" 2>"$TMP/$model.elog" ||
				failed "kiln export --safetensors" "$TMP/$model.elog"
		set -- "$@" model.init_from="$TMP/$model.safetensors"
		./kiln export "$ini" --onnx "$TMP/$model.onnx" "$@" 2>"$TMP/$model.elog" ||
			failed "kiln export --onnx" "$TMP/$model.elog"
		: >"$TMP/$model.kiln"
		: >"$TMP/$model.ort"
		: >"$TMP/$model.kcpu"
		: >"$TMP/$model.ocpu"
		r=0
		while [ "$r" -lt "$RUNS" ]; do
			# onnx_tool logs at libkiln's default level, info, which
			# round_choices reads (it does not read KILN_LOG_LEVEL)
			# shellcheck disable=SC2086 # the flags are words
			tests/onnx_tool logits "$ini" "$BATCH" "$TMP/$model" --time "$ITERS" \
				$TOOL_FLAGS "$@" >"$TMP/$model.kout" 2>"$TMP/$model.klog" ||
				failed "tests/onnx_tool logits ($model, $th threads)" "$TMP/$model.klog"
			sed -n 's/^kiln_ms //p' "$TMP/$model.kout" >>"$TMP/$model.kiln"
			round_choices "$model" "$th" "$r"
			sed -n 's/^kiln_cpu_ms //p' "$TMP/$model.kout" >>"$TMP/$model.kcpu"
			"$PYTHON" tests/onnx_ort.py "$TMP/$model.onnx" "$TMP/$model" --threads "$th" \
				--time "$ITERS" >"$TMP/$model.out" || { cat "$TMP/$model.out" >&2; exit 1; }
			sed -n 's/^ort_ms //p' "$TMP/$model.out" >>"$TMP/$model.ort"
			sed -n 's/^ort_cpu_ms //p' "$TMP/$model.out" >>"$TMP/$model.ocpu"
			[ "$r" -gt 0 ] || sed -n 's/^max_abs/# '"$model $th"' threads: max_abs/p' "$TMP/$model.out" >&2
			r=$((r + 1))
		done
		[ -s "$TMP/$model.kiln" ] || { echo "bench/onnx.sh: kiln's $model run failed" >&2; exit 1; }
		k=$(median <"$TMP/$model.kiln")
		o=$(median <"$TMP/$model.ort")
		kc=$(median <"$TMP/$model.kcpu")
		oc=$(median <"$TMP/$model.ocpu")
		awk -v m="$model" -v t="$th" -v k="$k" -v o="$o" -v b="$BATCH" -v kc="$kc" -v oc="$oc" \
			'BEGIN { printf "%-8s %7d %10.2f %10.2f %11.0f %11.0f %7.2fx %11.2f %11.2f %7.2fx\n", m, t, k, o, b * 1000 / k, b * 1000 / o, o / k, kc, oc, oc / kc }'
	done
done
echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
