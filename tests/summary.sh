#!/bin/sh
# tests/summary.sh - `kiln summary` against PyTorch and torchinfo: for the
# ResNet, CNN and MLP examples every layer's output shape and parameter
# count, and the total, equal tests/data/summary_refs.txt (written by
# tests/data/gen_summary_refs.py from the PyTorch twins of the examples:
# forward hooks and p.numel(), which is what torchinfo reports; the script
# checks against torchinfo itself where it is installed); the FLOPs of the
# MLP's and CNN's layers equal their formulas (a multiply-add is 2 FLOPs);
# --batch scales shapes and FLOPs; frozen layers are counted as such; a
# plugin layer's FLOPs are counted from the ops it prepares; the device
# prepares none of them (no convolution prepared or timed); and `kiln
# train` prints the summary at the start.
name=summary
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
refs="$srcdir/tests/data/summary_refs.txt"

# rows FILE: "LAYER SHAPE PARAMS TRAINABLE FROZEN FLOPS" for every table row
# of a summary (shape without spaces, -- for a loss layer; numbers without
# separators)
rows() {
	awk '/^[^ ]+ \([^)]*\) +(\[|--)/ {
		s = substr($0, index($0, ")") + 1); sub(/^ +/, "", s)
		if (s ~ /^--/) { sh = "--"; s = substr(s, 3) }
		else { sh = substr(s, 2, index(s, "]") - 2); s = substr(s, index(s, "]") + 1) }
		gsub(/ /, "", sh); split(s, f, " ")
		for (i = 1; i <= 4; i++) gsub(/,/, "", f[i])
		print $1, sh, f[1], f[2], f[3], f[4] }' "$1"
}
# total LABEL FILE: the number after "LABEL: " (separators removed)
total() { sed -n "s/^$1: \([0-9,]*\).*/\1/p" "$2" | tr -d ,; }
# flops LAYER: that layer's FLOPs in $tmp/rows
flops() { awk -v l="$1" '$1 == l { print $6 }' "$tmp/rows"; }

for m in resnet cnn mlp; do
	kiln 0 summary "$srcdir/examples/fashion_mnist_$m.ini"
	rows "$out" >"$tmp/rows"
	n=0
	while read -r model layer shape params; do
		[ "$model" = "$m" ] || continue
		if [ "$layer" = total ]; then
			got=$(total "Total params" "$out")
			[ "$got" = "$params" ] || fail "$m: Total params $got, PyTorch $params"
			continue
		fi
		grep -q "^$layer $shape $params $params 0 " "$tmp/rows" ||
			fail "$m: layer $layer: kiln '$(grep "^$layer " "$tmp/rows")', PyTorch shape $shape, $params parameters"
		n=$((n + 1))
	done <"$refs"
	[ "$n" -gt 5 ] || fail "$m: only $n reference layers read from $refs"
	# the table's FLOPs add up to the total
	sum=$(awk '{ s += $6 } END { printf "%.0f", s }' "$tmp/rows")
	stdout_has "\"flops\": $sum,"
	echo "ok: $m: $n layers' shapes and parameters and the total ($(total "Total params" "$out")) equal PyTorch's"
	cp "$tmp/rows" "$tmp/rows.$m"
done

# shapes and FLOPs alone: the device prepares none of the plan's ops (a
# layout-only plan, core/device.c), so the CPU device logs no prepared
# convolution (its debug "CONV x [...]" lines)
# and its tuner times none (before: 18 such lines); the rows are the ones read above
KILN_LOG_LEVEL=debug kiln 0 summary "$srcdir/examples/fashion_mnist_resnet.ini"
n=$(grep -c '^\[cpu\] debug: CONV x \[' "$err")
[ "$n" = 0 ] || fail "summary prepared $n convolutions on the CPU device"
grep -q 'implementations,' "$err" && fail "summary timed convolutions: $(grep -m1 'implementations,' "$err")"
rows "$out" >"$tmp/rows"
cmp -s "$tmp/rows" "$tmp/rows.resnet" || fail "the debug run's rows differ: $(diff "$tmp/rows.resnet" "$tmp/rows")"
echo "ok: summary prepares no device op (no convolution prepared nor timed), same rows"

# FLOPs: linear y = x W^T + b is 2*in*out + out; conv 2*numel(y)*C*KH*KW +
# numel(y) (bias); relu one per element (batch 1)
cp "$tmp/rows.mlp" "$tmp/rows"
for want in "fc1 $((2 * 784 * 512 + 512))" "relu1 512" "fc2 $((2 * 512 * 256 + 256))" \
	"relu2 256" "fc3 $((2 * 256 * 10 + 10))" "flat 0"; do
	set -- $want
	[ "$(flops "$1")" = "$2" ] || fail "mlp: $1 FLOPs $(flops "$1"), expected $2"
done
cp "$tmp/rows.cnn" "$tmp/rows"
for want in "conv1 $((2 * 32 * 28 * 28 * 1 * 25 + 32 * 28 * 28))" \
	"conv2 $((2 * 64 * 14 * 14 * 32 * 25 + 64 * 14 * 14))" \
	"fc1 $((2 * 3136 * 1024 + 1024))" "fc2 $((2 * 1024 * 10 + 10))" \
	"pool1 $((32 * 14 * 14 * 4))" "relu1 $((32 * 28 * 28))"; do
	set -- $want
	[ "$(flops "$1")" = "$2" ] || fail "cnn: $1 FLOPs $(flops "$1"), expected $2"
done
echo "ok: the MLP's and CNN's layer FLOPs equal their formulas"

# recurrent layers (docs/report.md's RNN row): 2*B*T*G*H*(I + H), G = 4 for
# an LSTM, 3 for a GRU; T = 24 tokens, I = 8 into the LSTM's H = 16, 16 into
# the GRU's H = 5
mkdir "$tmp/tok"
echo "the quick brown fox jumps over the lazy dog again and again and again" >"$tmp/tok/t.txt"
kiln 0 pack --format tokens "$tmp/tok/t.txt" --out "$tmp/tok"
{
	printf '[data]\nsource = tokens\npath = %s/tok\ncontext = 24\nvocab = 256\n[train]\neval = 0\n' "$tmp"
	printf '[layer.emb]\ntype = embedding\nvocab = 256\ndim = 8\n'
	printf '[layer.rnn]\ntype = lstm\nhidden = 16\n[layer.g]\ntype = gru\nhidden = 5\n'
	printf '[layer.head]\ntype = linear\nout = 256\n[layer.loss]\ntype = softmax_xent\n'
} >"$tmp/rnn.ini"
kiln 0 summary "$tmp/rnn.ini"
rows "$out" >"$tmp/rows"
[ "$(flops rnn)" = $((2 * 24 * 4 * 16 * (8 + 16))) ] || fail "lstm FLOPs $(flops rnn), expected $((2 * 24 * 4 * 16 * 24))"
[ "$(flops g)" = $((2 * 24 * 3 * 5 * (16 + 5))) ] || fail "gru FLOPs $(flops g), expected $((2 * 24 * 3 * 5 * 21))"
echo "ok: the LSTM's and GRU's FLOPs equal docs/report.md's formula"

# --batch 4: four times the rows and the FLOPs
kiln 0 summary "$srcdir/examples/fashion_mnist_mlp.ini" --batch 4
rows "$out" >"$tmp/rows"
grep -q "^fc1 4,512 401920 401920 0 $((4 * (2 * 784 * 512 + 512)))$" "$tmp/rows" ||
	fail "--batch 4: fc1 row '$(grep "^fc1 " "$tmp/rows")'"
stdout_has "Forward FLOPs (batch 4, evaluation"

# a frozen layer: its parameters are counted as non-trainable
kiln 0 summary "$srcdir/examples/fashion_mnist_mlp.ini" layer.fc1.trainable=0
rows "$out" >"$tmp/rows"
grep -q "^fc1 1,512 401920 0 401920 " "$tmp/rows" || fail "frozen fc1 row '$(grep "^fc1 " "$tmp/rows")'"
[ "$(total "Trainable params" "$out")" = $((535818 - 401920)) ] || fail "trainable total with fc1 frozen"
[ "$(total "Non-trainable params" "$out")" = 401920 ] || fail "non-trainable total with fc1 frozen"
stdout_has '"params": 535818, "trainable": 133898, "frozen": 401920'

# batchnorm running statistics are buffers, not parameters (ResNet: 2 x
# the channels of its 12 batchnorms)
kiln 0 summary "$srcdir/examples/fashion_mnist_resnet.ini"
bn=$(awk '$1 == "resnet" && $2 ~ /bn/ { s += $4 } END { print s }' "$refs")
[ "$(total "Buffers (not parameters: batchnorm running statistics)" "$out")" = "$bn" ] ||
	fail "resnet buffers: $(total "Buffers (not parameters: batchnorm running statistics)" "$out"), expected $bn"
echo "ok: --batch, frozen layers, buffers"

# a plugin layer is counted from the ops it prepares: examples/plugins/swish.c
# (y = x * sigmoid(x): an ACT and a MUL, 2 FLOPs per element)
mkdir "$tmp/plugins" || exit 99
${CC:-cc} -shared -fPIC -I"$srcdir/include" -o "$tmp/plugins/kiln-swish.so" \
	"$srcdir/examples/plugins/swish.c" || fail "building examples/plugins/swish.c failed"
cat >"$tmp/swish.ini" <<INI
[run]
plugin_path = $tmp/plugins
[data]
source = idx
path = $FM
[layer.flat]
type = flatten
[layer.fc1]
type = linear
out = 32
[layer.act]
type = swish
[layer.fc2]
type = linear
out = 10
[layer.loss]
type = softmax_xent
INI
# (a config file's plugin_path counts only with the opt-in, docs/plugins.md)
export KILN_ALLOW_CONFIG_PLUGIN_PATH=1
kiln 0 summary "$tmp/swish.ini" --batch 2
unset KILN_ALLOW_CONFIG_PLUGIN_PATH
rows "$out" >"$tmp/rows"
grep -q "^act 2,32 0 0 0 128$" "$tmp/rows" || fail "swish layer row '$(grep "^act " "$tmp/rows")'"
echo "ok: the swish plugin layer's FLOPs are counted from its ops"

# bad input: clear errors, usage exit codes
kiln 2 summary
kiln 2 summary "$srcdir/examples/fashion_mnist_mlp.ini" --batch 0
stderr_has "--batch '0'"
kiln 2 summary "$tmp/missing.ini"
kiln 2 summary "$srcdir/examples/fashion_mnist_mlp.ini" --bogus
stderr_has "unknown option '--bogus'"

# kiln train prints the summary at the start (log level info, rank 0)
kiln 0 train "$srcdir/examples/fashion_mnist_mlp.ini" data.limit=256 train.max_steps=2 train.eval=0 \
	run.out_dir=
stderr_has "[summary] Total params: 535,818"
stderr_has "[summary] fc1 (linear)"
stderr_has "Forward FLOPs (batch 128, training"
echo "ok: summary.sh: $checks kiln runs"
