#!/bin/sh
# tests/oom_named_dist.sh - the device buffers ZeRO-1 and [dist] pipeline
# allocate on a rank name what they are for when the allocation fails
# (session 43; before, "kiln: error: cpu: alloc of N bytes failed" alone,
# where the model's other buffers say their name, size and largest tensor
# since session 37: tests/oom_named.sh).  tests/shim_fault.c on rank 1
# fails its Nth allocation of one size from the CPU plugin on its main
# thread, N = 1, 2, ... until one is not reached (the size the plugin
# asks for: the bytes rounded up to 64); every run exits 0 or 1 (a
# failure: kiln launch passes rank 1's 1), and one of the failures says
# the buffer's name.  The model: flatten 8x8, fc1 (64 -> 10: 640 + 16
# floats, each tensor in 16s), relu, fc2 (10 -> 10: 112 + 16 floats),
# softmax cross-entropy: 784 trainable floats.
#  1. [dist] zero = 1, AdamW (2 state slots), 2 ranks: rank 1's shard is
#     half of the 768 that split in pieces of 16 a rank (384) and the 16
#     left over: its optimizer state 2 x 400 floats, 3200 bytes.
#  2. [dist] pipeline = 2, fc2 on stage 1 (rank 1): the stage's
#     parameters alone (128 floats, 512 bytes), its gradients with the 2
#     stages' norm slots (130 floats, 520 bytes: 576 asked) and the
#     pipeline's gradient norms (2 x 64 + 4 floats, 528 bytes: 576).
name=oom-named-dist needs=gloo fmnist=0
. "$(dirname "$0")/dist_common.sh"
shim_build || { bad "cannot build tests/shim_fault.c: $(cat "$tmp/shim.err")"; exit 1; }
{
	ini run threads=1 seed=3
	ini data source=synthetic image_size=8 classes=10 samples=64 workers=0
	ini_layers flat:flatten fc1:linear:out=10 r1:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=1 batch=8 max_steps=2 eval=0 optimizer=adamw
	ini dist timeout=20
} >"$tmp/s.ini"

# sweep LABEL BYTES OVERRIDES...: rank 1's allocations of BYTES failing in
# turn; the names said before ": cpu: alloc of N bytes failed" into
# $tmp/LABEL.names
sweep() {
	_l=$1 _b=$2
	shift 2
	: >"$tmp/$_l.names"
	_n=1
	while [ $_n -le 60 ]; do
		rank1_oom $_n $_b /kiln-cpu.so "$tmp/s.ini" "$@"
		_rc=$?
		[ -e "$tmp/hit" ] || break
		case $_rc in
		0|1) ;;
		*) bad "$_l: allocation $_n of $_b bytes failing on rank 1: exit $_rc: $(grep error "$tmp/l.log" | head -3)" ;;
		esac
		sed -n "s/^kiln: error: \(.*\): cpu: alloc of [0-9]* bytes failed\$/\1/p" "$tmp/l.log" >>"$tmp/$_l.names"
		_n=$((_n + 1))
	done
	[ $_n -gt 1 ] || bad "$_l: no allocation of $_b bytes on rank 1: the sweep tested nothing"
	echo "$_l: rank 1 with each of $((_n - 1)) allocations of $_b bytes failing; named:"
	sed 's/^/  /' "$tmp/$_l.names"
}
# named LABEL TEXT: a failure of LABEL's sweep named TEXT
named() { grep -qF "$2" "$tmp/$1.names" || bad "$1: no failed allocation named '$2'"; }

sweep zero 3200 dist.zero=1
named zero "the model's optimizer state for this rank's ZeRO-1 shard (3200 bytes, 800 floats; the largest tensor 'fc1.weight' f32[10, 64])"

p="dist.pipeline=2 layer.fc2.stage=1 pipeline.micro_batches=2"
sweep params 512 $p
named params "the model's parameters for this pipeline stage alone (512 bytes, 128 floats;"
sweep stage 576 $p
named stage "the model's gradients for this pipeline stage alone (520 bytes, 130 floats;"
named stage "the pipeline's gradient norms (one a stage)"
[ $fail != 0 ] || echo "PASS: $name"
exit $fail
