#!/bin/sh
# tests/affine.sh - thread-affine optimizer updates (session 50, issue 22):
# on a team of 2 the written weight gradient is kiln's own row split
# (plugins/cpu/gemm.c, gemm_blas_rows: each thread runs sgemm on its rows)
# and SGD and AdamW give each thread the rows it wrote (CPU_AFFINE_FOR,
# plugins/cpu/split.c).  Neither may move a bit: the benchmark's MLP
# (784-512-256-10) for 8 steps of 64 on random pixels, with
# $KILN_CPU_AFFINE=0 (oneDNN's threaded sgemm whole and the update in
# halves of the flat buffer, as before) and without, gives the same loss
# and grad_norm every step and the same weights after (`kiln export`),
# for SGD with momentum and for AdamW, on 2 threads; and the split rows
# are those the one-thread run computes (run.threads = 1, whole sgemm).
name=affine
. "$(dirname "$0")/lib.sh"
need_source idx

python3 - "$tmp" <<'EOF' || fail "python3 could not write the data"
import random, struct, sys
d, n = sys.argv[1], 512
r = random.Random(50)
with open(d + "/img.idx", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(r.randrange(256) for _ in range(n * 784)))
with open(d + "/lab.idx", "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(r.randrange(10) for _ in range(n)))
EOF
ini="$tmp/m.ini"
cat > "$ini" <<EOF
[run]
device = cpu
threads = 2
seed = 1
[data]
source = idx
images = $tmp/img.idx
labels = $tmp/lab.idx
workers = 0
[layer.fc1]
type = linear
out = 512
[layer.relu1]
type = relu
[layer.fc2]
type = linear
out = 256
[layer.relu2]
type = relu
[layer.fc3]
type = linear
out = 10
[layer.loss]
type = softmax_xent
[train]
epochs = 1
batch = 64
lr = 0.1
momentum = 0.9
log_every = 1
eval = 0
EOF

# the train lines' step, loss and grad_norm
steps() { grep '"event": *"train"' "$1/metrics.jsonl" |
	sed 's/.*"step": *\([0-9]*\).*"loss": *\([^,]*\),.*"grad_norm": *\([^,}]*\).*/\1 \2 \3/'; }

# run DIR ENV OVERRIDES...: 8 steps into $tmp/DIR, its weights in $tmp/DIR.st
run() {
	d=$1 e=$2
	shift 2
	env KILN_CPU_AFFINE="$e" "$kiln" train "$ini" run.out_dir="$tmp/$d" \
		train.overwrite=1 "$@" > "$tmp/$d.out" 2>&1 || { cat "$tmp/$d.out"; fail "$d: kiln train: exit $?"; }
	steps "$tmp/$d" > "$tmp/$d.steps"
	[ "$(wc -l < "$tmp/$d.steps")" -eq 8 ] || fail "$d: $(wc -l < "$tmp/$d.steps") train lines, expected 8"
	kiln 0 export "$ini" --checkpoint "$tmp/$d/checkpoints/ckpt-8.kiln" --safetensors "$tmp/$d.st" \
		run.out_dir="$tmp/none" "$@"
}

# same WHAT A B: runs A and B took the same steps to the same weights
same() {
	cmp -s "$tmp/$2.steps" "$tmp/$3.steps" ||
		{ diff "$tmp/$2.steps" "$tmp/$3.steps"; fail "$1: the steps' loss or grad_norm differ"; }
	cmp -s "$tmp/$2.st" "$tmp/$3.st" || fail "$1: the weights after 8 steps differ"
	echo "ok: $1: 8 steps, the same bits ($(sed -n '8p' "$tmp/$2.steps"))"
}

for opt in sgd adamw; do
	o="train.optimizer=$opt"
	[ "$opt" = adamw ] && o="$o train.lr=0.001"
	run "$opt-off" 0 $o
	run "$opt-on" "" $o
	run "$opt-one" "" $o run.threads=1
	same "$opt: thread-affine against the old split" "$opt-off" "$opt-on"
	same "$opt: thread-affine against one thread" "$opt-one" "$opt-on"
done
echo "PASS: $name ($checks kiln runs)"
