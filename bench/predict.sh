#!/bin/sh
# bench/predict.sh - `kiln predict` on a folder of 1,000 PNGs against PyTorch
# 2.x at its best (bench/pytorch_predict.py: model.eval() under
# torch.inference_mode(), PIL decoding, the same model and weights, loaded
# from kiln's safetensors export), the same threads.
#
# The model is bench/cnn_bench.ini's CNN (Fashion-MNIST, 28x28 gray) with its
# initial weights (kiln export writes them; speed does not depend on
# training); the PNGs are the first 1,000 test images (kiln pack --format
# folder).  Rows, each run RUNS times, interleaved:
#   kiln-b256  kiln predict --batch 256: throughput
#   kiln-b1    kiln predict --batch 1:   per-image latency
#   torch-b256, torch-b1: the same with PyTorch
# Both sides time the whole folder after the model is loaded: read, decode,
# transform, forward, softmax/top-5, output (kiln's `[predict] N images in T
# s` log line; pytorch_predict.py's JSON line, after one untimed warm-up
# batch that kiln does not get).  Medians are printed with the load average.
#
# Usage: bench/predict.sh [--short] [--runs N] [--threads N]
#   (one command from anywhere in a built tree; --short: one run of each row)
#   environment: KILN (default ./kiln), KILN_VENV (default /work/scratch/venv),
#   FM (default /usr/share/datasets/fashion-mnist)
set -eu
cd "$(dirname "$0")/.."
PYTHON=/usr/bin/python3
. bench/common.sh
RUNS=3
THREADS=2
while [ $# -gt 0 ]; do
	case $1 in
	--short) RUNS=1; shift ;;
	--runs) RUNS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	*) usage ;;
	esac
done
KILN=${KILN:-./kiln}
real_kiln # time the binary itself, not libtool's wrapper
VENV=${KILN_VENV:-/work/scratch/venv}
FM=${FM:-/usr/share/datasets/fashion-mnist}
bench_tmpdir predict
ini=bench/cnn_bench.ini
common="data.path=$FM run.threads=$THREADS"

$KILN pack $ini --format folder --store png --out "$TMP/png" --section data.eval \
	data.eval.limit=1000 $common >/dev/null 2>&1
$KILN export $ini --safetensors "$TMP/w.safetensors" $common >/dev/null 2>&1
n=$(find "$TMP/png/test" -name '*.png' | wc -l)
echo "load before: $(cat /proc/loadavg)"
for r in $(seq "$RUNS"); do
	for b in 256 1; do
		$KILN predict $ini --checkpoint "$TMP/w.safetensors" "$TMP/png/test" --batch $b \
			$common >/dev/null 2>"$TMP/err"
		sed -n 's/.*\[predict\] \([0-9]*\) images in \([0-9.]*\) s: \([0-9.]*\) images\/s, \([0-9.]*\) ms.*/{"row": "kiln-b'$b'", "images_per_s": \3, "ms_per_image": \4}/p' \
			"$TMP/err" >>"$TMP/rows.jsonl"
		(cd bench && env $BLAS_ENV "$VENV/bin/python" pytorch_predict.py \
			"$TMP/png/test" --weights "$TMP/w.safetensors" --batch $b --threads "$THREADS") |
			sed 's/^{/{"row": "torch-b'$b'", /' >>"$TMP/rows.jsonl"
	done
done
echo "load after: $(cat /proc/loadavg)"
"$PYTHON" - "$TMP/rows.jsonl" "$n" "$THREADS" "$RUNS" <<'PY'
import json, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    d = json.loads(l)
    rows.setdefault(d["row"], []).append(d)
print("%s PNGs, %s threads, median of %s runs" % tuple(sys.argv[2:5]))
print("%-11s %12s %13s" % ("row", "images/s", "ms/image"))
for k in ("kiln-b256", "torch-b256", "kiln-b1", "torch-b1"):
    v = rows.get(k, [])
    if v:
        print("%-11s %12.1f %13.4f" % (k, statistics.median(d["images_per_s"] for d in v),
                                       statistics.median(d["ms_per_image"] for d in v)))
PY
