#!/bin/sh
# Data-loader benchmark: kiln's loader vs PyTorch's DataLoader on the same
# images, and what the loader costs a training step.
#
# 1. An ImageFolder of N RGB JPEGs (Fashion-MNIST upscaled to 128x128 and
#    tinted, quality 90; bench/make_image_folder.py) in $DIR/jpeg/train.
# 2. PyTorch: torchvision ImageFolder + RandomResizedCrop(112) +
#    RandomHorizontalFlip + ToTensor + Normalize through a DataLoader with
#    W workers, batch 128 (bench/pytorch_data.py).
# 3. kiln, the same transforms (bench/data_bench.ini, `kiln bench data`):
#      folder        the JPEG folder, decoded by libjpeg-turbo in W workers
#      records-raw   the folder packed by `kiln pack --store raw` (decoded
#                    pixels, no decode at train time), same transforms
#      records-112   packed with --resize 112 (the crop's size) and read
#                    with crop = none + flip, u8 shipped (transform_on =
#                    device): the offline-prepared path
# 4. The loader's cost in training: the CNN of examples/fashion_mnist_cnn.ini
#    (bench/cnn_bench.ini), S steps with the real loader (idx, cache off)
#    and with data.resident=1 (one batch on the device, no loading);
#    overhead = step(real) / step(resident) - 1.
# Every figure is the median of R runs.
#
# Usage: bench/data.sh [--runs R] [--workers W] [--n N] [--batches B] [--steps S]
#                      [--dir DIR] [--part all|loader|train|prepare]
# --anchors: instead bench/anchors.sh --bench data (kiln's folder loader
# beside PyTorch 2.x's and 1.13's DataLoader, interleaved).
# --part prepare: only make the JPEG folder and its packed records in DIR
# (bench/anchors.sh uses it), no measurement.
# Defaults: R=3, W=2, N=10000, B=40, S=300, DIR=/tmp/kiln-bench-data.
# Environment: KILN (default ./kiln), PYTHON (default /usr/bin/python3).
# Run from the top of the source tree after `make`.
set -eu

RUNS=3
W=2
N=10000
BATCHES=40
STEPS=300
DIR=/tmp/kiln-bench-data
PART=all
ANCHORS=0
KILN=${KILN:-./kiln}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(dirname "$0")

while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --workers) W=$2; shift 2 ;;
    --n) N=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --part) PART=$2; shift 2 ;;
    --anchors) ANCHORS=1; shift ;;
    -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "data.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done

[ "$ANCHORS" = 0 ] || exec "$HERE/anchors.sh" --bench data --runs "$RUNS"
. "$HERE/common.sh"
real_kiln # time the binary itself, not libtool's wrapper

if [ "$PART" != train ] && [ ! -d "$DIR/jpeg/train" ] || [ "$(find "$DIR/jpeg/train" -name '*.jpg' | wc -l)" -ne "$N" ]; then
    rm -rf "$DIR"
    echo "making $N JPEGs in $DIR/jpeg/train ..." >&2
    (cd "$HERE" && "$PYTHON" make_image_folder.py "$DIR/jpeg/train" --n "$N")
fi
if [ "$PART" != train ] && [ ! -d "$DIR/raw" ]; then
    "$KILN" pack "$HERE/data_bench.ini" --out "$DIR/raw" "data.path=$DIR/jpeg" 2>/dev/null
    "$KILN" pack "$HERE/data_bench.ini" --out "$DIR/raw112" --resize 112 "data.path=$DIR/jpeg" 2>/dev/null
fi

run_pt() {
    i=0
    while [ $i -lt "$RUNS" ]; do
        "$PYTHON" "$HERE/pytorch_data.py" "$DIR/jpeg/train" --workers "$W" --batch 128 \
            --batches "$BATCHES" --size 112 --crop resized --flip \
            --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25 | field samples_per_s
        i=$((i + 1))
    done | median
}
run_kiln() {
    i=0
    while [ $i -lt "$RUNS" ]; do
        "$KILN" bench data "$HERE/data_bench.ini" "data.workers=$W" --batches "$BATCHES" "$@" \
            2>/dev/null | field samples_per_s
        i=$((i + 1))
    done | median
}
run_train() {
    i=0
    while [ $i -lt "$RUNS" ]; do
        "$KILN" train "$HERE/cnn_bench.ini" "data.limit=$((STEPS * 128))" "train.max_steps=$STEPS" \
            train.eval=0 "$@" 2>/dev/null | field train_samples_per_s
        i=$((i + 1))
    done | median
}

[ "$PART" != prepare ] || exit 0
pt=0 folder=0 raw=0 raw112=0 real=0 resident=0
if [ "$PART" != train ]; then
    pt=$(run_pt)
    folder=$(run_kiln "data.path=$DIR/jpeg")
    raw=$(run_kiln data.source=records "data.path=$DIR/raw")
    raw112=$(run_kiln data.source=records "data.path=$DIR/raw112" data.crop=none data.transform_on=device)
fi
if [ "$PART" != loader ]; then
    real=$(run_train data.workers=1)
    resident=$(run_train data.resident=1)
fi

awk -v pt="$pt" -v folder="$folder" -v raw="$raw" -v raw112="$raw112" -v real="$real" \
    -v resident="$resident" -v n="$N" -v w="$W" -v runs="$RUNS" -v steps="$STEPS" \
    -v part="$PART" 'BEGIN {
    if (part != "train") {
    printf "data loader, %d RGB JPEGs 128x128 -> RandomResizedCrop(112) + flip + normalize,\n", n
    printf "batch 128, %d workers, median of %d runs (samples/s):\n", w, runs
    printf "  %-36s %10.0f\n", "pytorch DataLoader (ImageFolder)", pt
    printf "  %-36s %10.0f  %5.2fx pytorch\n", "kiln folder (JPEG)", folder, folder / pt
    printf "  %-36s %10.0f  %5.2fx kiln folder\n", "kiln records, raw", raw, raw / folder
    printf "  %-36s %10.0f  %5.2fx kiln folder\n", "kiln records, raw 112, u8 shipped", raw112, raw112 / folder
    }
    if (part == "loader") exit
    printf "CNN example, %d steps of batch 128, median of %d runs:\n", steps, runs
    printf "  %-36s %10.0f samples/s\n", "real loader (idx, 1 worker)", real
    printf "  %-36s %10.0f samples/s\n", "resident batch (no loading)", resident
    printf "  %-36s %9.1f%%\n", "overhead step(real)/step(resident)-1", (resident / real - 1) * 100
}'
