#!/bin/sh
# tests/dist_zero_lion.sh - ZeRO-1 works for a plugin optimizer unchanged:
# examples/plugins/lion.c (built here against the source tree's headers;
# tests/oot.sh builds it against an installed kiln) trains the MLP of
# tests/dist_common.sh for 64 steps on 2 Gloo ranks, plain DDP and with
# [dist] zero = 1, and both end with the same parameters and momentum
# (optim.exp_avg: the one state slot the plugin reports, which ZeRO-1
# shards and gathers for the checkpoint without knowing what it holds);
# the same under bf16 compute, where the plugin's step also writes its
# slice of the compute copy.  With 2 ranks the averaged gradients are the
# same bits either way (a + b), so the sign in Lion's update cannot flip
# between the two runs.
name=zero-lion needs=gloo
. "$(dirname "$0")/dist_common.sh"
: "${abs_top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"

mkdir "$tmp/plugins" || exit 99
${CC:-cc} -shared -fPIC -fvisibility=hidden -Wall -Werror -I"$abs_top_srcdir/include" \
	-o "$tmp/plugins/kiln-lion.so" "$abs_top_srcdir/examples/plugins/lion.c" ||
	{ echo "FAIL: building examples/plugins/lion.c"; exit 1; }

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 20 gloo
lion="run.plugin_path=$tmp/plugins train.optimizer=lion train.lr=0.001 train.weight_decay=0.01"

for p in fp32 bf16; do
	run ${p}_ddp 2 32 $lion run.precision=$p
	run ${p}_zero 2 32 $lion run.precision=$p dist.zero=1
	grep -q "ZeRO-1: rank 0 updates 25440 floats" "$tmp/${p}_zero.log" ||
		{ bad "$p: lion under zero = 1 did not shard"; grep ZeRO "$tmp/${p}_zero.log"; }
	"$tool" close "$(ck ${p}_ddp 64)" "$(ck ${p}_zero 64)" 1e-5 params optim.exp_avg ||
		bad "$p: lion with ZeRO-1 differs from DDP"
	"$tool" same "$(ck ${p}_ddp 64)" "$(ck ${p}_zero 64)" optim.step ||
		bad "$p: lion's optim.step differs under ZeRO-1"
done
[ $fail = 0 ] && echo "ok: ZeRO-1 with the lion plugin equals DDP (fp32, bf16)"
exit $fail
