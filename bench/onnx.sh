#!/bin/sh
# kiln's fp32 evaluation vs ONNX Runtime on the model `kiln export --onnx`
# wrote of it: the MLP, CNN and ResNet Fashion-MNIST examples (seeded
# initial weights: speed does not depend on them), the same batch of BATCH
# test images (default 1000, [train] eval_batch of the MLP and CNN), the
# same THREADS intra-op threads (default 2; ONNX Runtime: inter-op 1,
# sequential, all graph optimisations, CPU provider).  kiln: an evaluation
# plan's forward (the loss layer included, as `kiln eval` runs it; input
# already on the device), tests/onnx_tool logits --time; ONNX Runtime:
# session.run, tests/onnx_ort.py --time.  Each run times ITERS passes after
# two warm-ups and prints its median; kiln and ONNX Runtime alternate, RUNS
# rounds (default 5), and the table gives the medians of the run medians,
# ms per batch and images/s, and kiln's speed-up.  The first run also
# checks the logits agree (1e-4 relative).
#
# Usage: bench/onnx.sh [RUNS] [THREADS] [BATCH] [ITERS] [section.key=value ...]
#   (from the top of a built tree; the overrides go to kiln's evaluation, e.g.
#   run.fuse=1)
# Environment: KILN_VENV (default .venv): the venv with onnxruntime and onnx
#   (scripts/install-deps --bench).
RUNS=${1:-5}
THREADS=${2:-2}
BATCH=${3:-1000}
ITERS=${4:-10}
[ $# -le 4 ] || { shift 4; OVERRIDES="$*"; }
PYTHON=${KILN_VENV:-.venv}/bin/python
. "$(dirname "$0")/common.sh"
bench_tmpdir onnx-bench
[ -x tests/onnx_tool ] || make -s tests/onnx_tool || exit 1
"$PYTHON" -c 'import onnxruntime' || { echo "bench/onnx.sh: no onnxruntime in $PYTHON" >&2; exit 1; }
echo "# bench/onnx.sh $RUNS $THREADS $BATCH $ITERS ${OVERRIDES:-}; loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# onnxruntime $("$PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)'), $(nproc) CPUs"
printf '%-8s %12s %12s %14s %14s %8s\n' model kiln_ms ort_ms kiln_img_s ort_img_s speedup
for model in mlp cnn resnet; do
	ini=examples/fashion_mnist_$model.ini
	# shellcheck disable=SC2086 # the overrides are words
	set -- run.out_dir="$TMP/run_$model" run.threads="$THREADS" ${OVERRIDES:-}
	./kiln export "$ini" --onnx "$TMP/$model.onnx" "$@" 2>/dev/null || exit 1
	: >"$TMP/$model.kiln"
	: >"$TMP/$model.ort"
	r=0
	while [ "$r" -lt "$RUNS" ]; do
		tests/onnx_tool logits "$ini" "$BATCH" "$TMP/$model" --time "$ITERS" "$@" 2>/dev/null |
			sed -n 's/^kiln_ms //p' >>"$TMP/$model.kiln" || exit 1
		"$PYTHON" tests/onnx_ort.py "$TMP/$model.onnx" "$TMP/$model" --threads "$THREADS" \
			--time "$ITERS" >"$TMP/$model.out" || { cat "$TMP/$model.out" >&2; exit 1; }
		sed -n 's/^ort_ms //p' "$TMP/$model.out" >>"$TMP/$model.ort"
		[ "$r" -gt 0 ] || sed -n 's/^max_abs/# '"$model"': max_abs/p' "$TMP/$model.out" >&2
		r=$((r + 1))
	done
	k=$(median <"$TMP/$model.kiln")
	o=$(median <"$TMP/$model.ort")
	awk -v m="$model" -v k="$k" -v o="$o" -v b="$BATCH" \
		'BEGIN { printf "%-8s %12.2f %12.2f %14.0f %14.0f %7.2fx\n", m, k, o, b * 1000 / k, b * 1000 / o, o / k }'
done
echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
