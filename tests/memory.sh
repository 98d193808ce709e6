#!/bin/sh
# tests/memory.sh - `kiln memory` against what the operating system sees,
# and `[train] batch = auto`.  Each run is its own process, so the resident
# memory it reports (rss_growth_bytes: the peak resident memory minus the
# resident memory before the model was built) is the run's alone.
#  1. The ResNet example at batches 32 and 128: the measured peak is within
#     5% of the prediction (device total + host staging + device library).
#  1b. [run] precision = bf16 and fp16: the CNN's device peak within 1%
#     of the prediction;
#  2. batch = auto under a memory limit picks a multiple of 8 whose
#     prediction fits while the next multiple of 8 does not, logs it, and
#     `kiln train` trains with it; a limit too small fails, naming the key;
#     without a limit on the CPU, device total + host staging fit the free
#     memory it reports, which in a 400M memory cgroup is at most 400 MiB,
#     and kiln train in that cgroup with the batch it picks is not killed.
#  3. (session 37) within 5% too: the MLP at accumulate = 4 (the adding
#     GEMM's sgemm kernels made at prepare), and with [data] cache = ram
#     (IDX, and a PNG folder of varying-size images: the cache's own
#     line); workers = auto stages the batches of kiln_loader_auto_max's
#     count (1 under taskset -c 0), not of every online CPU.
# The training runs keep the opening thread team (plugin.cpu.adaptive=0):
# when a busy machine shrinks the adaptive team, the CPU device prepares
# smaller-team versions of its oneDNN plans, which `kiln memory` does not
# predict yet (docs/memory.md, "What the prediction leaves out").
name=memory
. "$(dirname "$0")/lib.sh"
need_fashion_mnist

cfg="$srcdir/examples/fashion_mnist_resnet.ini"
for b in 32 128; do
	"$kiln" memory "$cfg" "train.batch=$b" >"$tmp/m.out" 2>"$tmp/m.err" ||
		{ cat "$tmp/m.err"; fail "kiln memory batch $b"; }
	"$kiln" train "$cfg" "train.batch=$b" plugin.cpu.adaptive=0 train.max_steps=2 train.epochs=1 data.eval.limit=1000 \
		run.out_dir= >"$tmp/t.out" 2>"$tmp/t.err" || { cat "$tmp/t.err"; fail "kiln train batch $b"; }
	pred=$(($(field total "$tmp/m.out") + $(field host "$tmp/m.out") + $(field library "$tmp/m.out")))
	dev=$(field device_peak_bytes "$tmp/t.out")
	rss=$(field rss_growth_bytes "$tmp/t.out")
	[ "$rss" -gt 0 ] || fail "batch $b: no resident memory reading (rss_growth_bytes = $rss)"
	# within 5%: |rss - pred| * 20 <= pred
	d=$((rss > pred ? rss - pred : pred - rss))
	echo "batch $b: predicted $pred bytes, resident peak growth $rss ($((d * 1000 / pred)) per mille), device counter $dev"
	[ $((d * 20)) -le "$pred" ] || fail "batch $b: the resident peak $rss is not within 5% of the prediction $pred"
	[ "$dev" -le "$(field total "$tmp/m.out")" ] || fail "batch $b: the device counter $dev exceeds the device prediction"
done

# [run] precision (session 29): the prediction is the run's device peak,
# the compute copy of the weights and the bf16/f16 activations counted
# (before, fp32's figures whatever the precision: bf16 predicted 216 MiB
# for a 177 MiB peak, fp16 6 MiB short)
mcfg="$srcdir/examples/fashion_mnist_cnn.ini"
for p in bf16 fp16; do
	"$kiln" memory "$mcfg" run.precision=$p data.eval.limit=500 >"$tmp/p.out" 2>"$tmp/p.err" ||
		{ cat "$tmp/p.err"; fail "kiln memory precision $p"; }
	grep -q "compute copy" "$tmp/p.out" || fail "$p: the weights' compute copy is not reported"
	"$kiln" train "$mcfg" run.precision=$p plugin.cpu.adaptive=0 train.max_steps=1 train.epochs=1 \
		data.eval.limit=500 run.out_dir= >"$tmp/t.out" 2>"$tmp/t.err" || { cat "$tmp/t.err"; fail "kiln train $p"; }
	pred=$(field total "$tmp/p.out") dev=$(field device_peak_bytes "$tmp/t.out")
	d=$((dev > pred ? dev - pred : pred - dev))
	echo "precision $p: predicted $pred device bytes, measured $dev"
	[ $((d * 100)) -le "$pred" ] || fail "$p: the device peak $dev is not within 1% of the prediction $pred"
done

# batch = auto under a limit
"$kiln" memory "$mcfg" train.batch=auto run.memory_limit=250M data.eval.limit=1000 >"$tmp/a.out" 2>"$tmp/a.err" ||
	{ cat "$tmp/a.err"; fail "kiln memory batch=auto"; }
b=$(field batch "$tmp/a.out")
grep -q "batch = auto: $b, predicted" "$tmp/a.err" || { cat "$tmp/a.err"; fail "the choice is not logged"; }
[ $((b % 8)) = 0 ] && [ "$b" -ge 8 ] || fail "batch = auto chose $b, not a positive multiple of 8"
lim=$((250 * 1048576))
[ "$(field total "$tmp/a.out")" -le $lim ] || fail "batch $b: the prediction exceeds the limit"
"$kiln" memory "$mcfg" "train.batch=$((b + 8))" data.eval.limit=1000 >"$tmp/n.out" 2>/dev/null || fail "kiln memory batch $((b + 8))"
[ "$(field total "$tmp/n.out")" -gt $lim ] || fail "batch $((b + 8)) fits too: auto chose $b, not the largest"
echo "ok: batch = auto under 250M: $b (and $((b + 8)) does not fit)"

"$kiln" train "$mcfg" train.batch=auto run.memory_limit=250M train.max_steps=1 train.epochs=1 \
	data.eval.limit=1000 run.out_dir= >"$tmp/t.out" 2>"$tmp/t.err" || { cat "$tmp/t.err"; fail "kiln train batch=auto"; }
grep -q "batch = auto: $b, predicted" "$tmp/t.err" || { cat "$tmp/t.err"; fail "kiln train: the choice is not logged"; }
echo "ok: kiln train with batch = auto"

"$kiln" memory "$mcfg" train.batch=auto run.memory_limit=10M >"$tmp/s.out" 2>"$tmp/s.err"
rc=$?
[ $rc -ne 0 ] || fail "a limit too small for batch 8 succeeded"
grep -q "batch = auto: batch 8 needs .* memory_limit" "$tmp/s.err" || { cat "$tmp/s.err"; fail "unclear error for a limit too small"; }
"$kiln" memory "$mcfg" train.batch=auto run.memory_limit=lots >"$tmp/s.out" 2>"$tmp/s.err" &&
	fail "memory_limit = lots accepted"
grep -q "memory_limit = 'lots'" "$tmp/s.err" || { cat "$tmp/s.err"; fail "unclear error for a bad memory_limit"; }
# a hex number, an exponent, a space inside: config errors (exit 2), with
# or without batch = auto (before session 29 the first two were taken and
# a bad value was read only by batch = auto); a number without its unit
# (1.5: one byte) is too small, in a readable unit, not "batch 8 needs
# more than 0.0 MiB"
for v in 0x10M 1e9 "2 G"; do
	for bb in auto 64; do
		"$kiln" memory "$mcfg" "train.batch=$bb" "run.memory_limit=$v" >"$tmp/s.out" 2>"$tmp/s.err"
		rc=$?
		[ $rc -eq 2 ] || { cat "$tmp/s.err"; fail "memory_limit = '$v' (batch $bb): exit $rc, expected 2"; }
		grep -qF "command line 'run.memory_limit=$v': [run] memory_limit = '$v': expected a decimal number of bytes, optionally with K, M, G or T" "$tmp/s.err" ||
			{ cat "$tmp/s.err"; fail "unclear error for memory_limit = '$v'"; }
	done
done
"$kiln" memory "$mcfg" train.batch=auto run.memory_limit=1.5 >"$tmp/s.out" 2>"$tmp/s.err"
rc=$?
[ $rc -eq 2 ] || { cat "$tmp/s.err"; fail "memory_limit = 1.5: exit $rc, expected 2"; }
grep -qF "[run] memory_limit = '1.5' is 1 byte: too small to plan a model in (at least 1 MiB; a unit such as 512M or 2G)" "$tmp/s.err" ||
	{ cat "$tmp/s.err"; fail "unclear error for memory_limit = 1.5"; }
"$kiln" memory "$mcfg" train.batch=auto run.memory_limit=250MiB data.eval.limit=1000 >"$tmp/s.out" 2>"$tmp/s.err" ||
	{ cat "$tmp/s.err"; fail "memory_limit = 250MiB refused"; }
[ "$(field batch "$tmp/s.out")" = "$b" ] || fail "memory_limit = 250MiB chose another batch than 250M"
echo "ok: errors for a limit too small and a bad size"

# batch = auto without a limit on the CPU, whose device memory is the
# host's: the device total and the host staging together fit in the free
# memory it reports (before session 31 the device total alone filled it,
# and kiln train was OOM-killed)
"$kiln" memory "$mcfg" train.batch=auto data.eval.limit=1000 >"$tmp/f.out" 2>"$tmp/f.err" ||
	{ cat "$tmp/f.err"; fail "kiln memory batch=auto without a limit"; }
free=$(sed -n 's/.* of the \([0-9.]*\) MiB the device reports free.*/\1/p' "$tmp/f.err")
[ -n "$free" ] || { cat "$tmp/f.err"; fail "batch = auto on the CPU: no free memory in the log"; }
need=$(( $(field total "$tmp/f.out") + $(field host "$tmp/f.out") ))
awk -v n="$need" -v f="$free" 'BEGIN { exit !(n <= (f + 0.05) * 1048576) }' ||
	fail "batch = auto on the CPU: device $(field total "$tmp/f.out") + host $(field host "$tmp/f.out") bytes > the $free MiB free"
grep -q "predicted to need [0-9.]* MiB (device, host staging and library: the same memory) of the" "$tmp/f.err" ||
	{ cat "$tmp/f.err"; fail "batch = auto on the CPU: the log does not say it counts the host staging"; }
echo "ok: batch = auto on the CPU: device + host $need bytes fit the $free MiB free"
# in a memory cgroup of 400M (root and a writable v1 or v2 memory
# controller; else skipped): the free memory is the cgroup's room, not
# MemAvailable
cg=$(sed -n 's/^[0-9]*:[a-z,]*memory[a-z,]*:\(.*\)/\1/p' /proc/self/cgroup)
if [ -n "$cg" ]; then
	cgd=/sys/fs/cgroup/memory$cg/kiln_test$$ cgmax=memory.limit_in_bytes
else
	cgd=/sys/fs/cgroup$(sed -n 's/^0::\(.*\)/\1/p' /proc/self/cgroup)/kiln_test$$ cgmax=memory.max
fi
if [ "$(id -u)" = 0 ] && mkdir "$cgd" 2>/dev/null; then
	if echo 400M > "$cgd/$cgmax" 2>/dev/null; then
		sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cgd" "$kiln" memory "$mcfg" train.batch=auto \
			data.eval.limit=1000 >"$tmp/c.out" 2>"$tmp/c.err"
		free=$(sed -n 's/.* of the \([0-9]*\)\.[0-9] MiB the device reports free.*/\1/p' "$tmp/c.err")
		[ -n "$free" ] && [ "$free" -le 400 ] ||
			{ cat "$tmp/c.err"; fail "in a 400M memory cgroup: the device reports ${free:-no} MiB free"; }
		echo "ok: in a 400M memory cgroup the CPU reports $free MiB free"
		# and kiln train with the batch it picks there is not OOM-killed
		# (before session 31: MemAvailable's batch, killed; then, without
		# the library memory and the predictions' own, batch 440, killed)
		sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cgd" "$kiln" train "$mcfg" train.batch=auto \
			train.max_steps=2 train.epochs=1 data.eval.limit=1000 run.out_dir= >"$tmp/c.out" 2>"$tmp/c.err" ||
			{ tail -3 "$tmp/c.err"; fail "kiln train batch=auto in a 400M memory cgroup failed (OOM-killed?)"; }
		echo "ok: kiln train in a 400M memory cgroup: $(grep -o 'batch = auto: [0-9]*' "$tmp/c.err")"
	else
		echo "SKIP (part): cannot limit a memory cgroup"
	fi
	rmdir "$cgd"
else
	echo "SKIP (part): a memory cgroup needs root and a writable cgroup tree"
fi

# The evaluation plan prepares the forward alone: no kept copies, no
# backward ops (kiln_layer_training), so its size is the same whether the
# convolutions train or are frozen ([layer.X] trainable = 0).  Before, a
# trainable conv's evaluation plan kept x and sized its workspace for the
# backward (this CNN at eval batch 500: 152 MiB against 117 MiB).
for t in 1 0; do
	"$kiln" memory "$mcfg" layer.conv1.trainable=$t layer.conv2.trainable=$t >"$tmp/e$t.out" 2>"$tmp/e$t.err" ||
		{ cat "$tmp/e$t.err"; fail "kiln memory, convs trainable = $t"; }
done
e1=$(field eval "$tmp/e1.out") e0=$(field eval "$tmp/e0.out")
[ -n "$e1" ] && [ "$e1" -gt 0 ] || fail "no evaluation plan size"
[ "$e1" = "$e0" ] || fail "the evaluation plan takes $e1 bytes with trainable convs, $e0 with frozen ones (want the same: no backward, nothing kept)"
echo "ok: the evaluation plan is the same for trainable and frozen convs ($e1 bytes)"

# pred_rss NAME CONFIG OVERRIDES...: `kiln memory` (device total + host
# staging + library + [data] cache) against a one-epoch run's resident
# peak growth, within 5%
pred_rss() {
	_n=$1 _c=$2
	shift 2
	"$kiln" memory "$_c" "$@" >"$tmp/m.out" 2>"$tmp/m.err" || { cat "$tmp/m.err"; fail "kiln memory ($_n)"; }
	"$kiln" train "$_c" "$@" plugin.cpu.adaptive=0 train.epochs=1 run.out_dir= >"$tmp/t.out" 2>"$tmp/t.err" ||
		{ cat "$tmp/t.err"; fail "kiln train ($_n)"; }
	pred=$(($(field total "$tmp/m.out") + $(field host "$tmp/m.out") + $(field library "$tmp/m.out") +
		$(field cache "$tmp/m.out")))
	rss=$(field rss_growth_bytes "$tmp/t.out")
	d=$((rss > pred ? rss - pred : pred - rss))
	echo "$_n: predicted $pred bytes (cache $(field cache "$tmp/m.out")), resident peak growth $rss ($((d * 1000 / pred)) per mille)"
	[ $((d * 20)) -le "$pred" ] || fail "$_n: the resident peak $rss is not within 5% of the prediction $pred"
}

# accumulate > 1: the adding weight-gradient GEMM (dnnl_sgemm, beta = 1)
# generates its kernels at prepare, where `kiln memory` measures the
# library; before session 37 in the first step: +25% past the prediction
pred_rss "MLP accumulate 4" "$srcdir/examples/fashion_mnist_mlp.ini" train.accumulate=4 data.workers=0 \
	data.eval.limit=1000 train.max_steps=3

# [data] cache = ram: the decoded images, full after the first epoch, on
# their own line (before session 37 left out: 17.8 MB of this 51.5 MB
# peak); the IDX source's fixed image size, and a folder's images of
# varying size (counted as sample 0's)
pred_rss "MLP cache = ram" "$srcdir/examples/fashion_mnist_mlp.ini" data.cache=ram data.limit=20000 \
	data.eval.limit=1000 data.workers=0
grep -q "^  data cache .*\[data\] cache = ram: 21000 decoded images of the training and evaluation sets" "$tmp/m.out" ||
	{ cat "$tmp/m.out"; fail "cache = ram: no data cache line"; }
for sec in data data.eval; do
	"$kiln" pack "$srcdir/examples/fashion_mnist_mlp.ini" --out "$tmp/folder" --section $sec \
		--format folder --store png data.limit=6000 data.eval.limit=1000 >/dev/null 2>"$tmp/err" ||
		{ cat "$tmp/err"; fail "pack folder ($sec)"; }
done
pred_rss "folder cache = ram" "$srcdir/examples/fashion_mnist_folder.ini" "data.path=$tmp/folder" data.workers=2
# [data.val]'s cache too (session 37's review: 8.6 MB of a 44.6 MB peak
# left out)
{ cat "$srcdir/examples/fashion_mnist_mlp.ini"; printf '\n[data.val]\nsplit = test\nlimit = 5000\n'; } >"$tmp/val.ini"
pred_rss "MLP [data.val] cache = ram" "$tmp/val.ini" data.cache=ram data.limit=2000 data.eval.limit=1000 \
	data.workers=0
grep -q "^  data cache .*\[data\] cache = ram: 8000 decoded images of the training and evaluation sets" "$tmp/m.out" ||
	{ cat "$tmp/m.out"; fail "cache = ram with [data.val]: not 8000 decoded images"; }
# and its loader's staging slots and the evaluation order's length (the
# larger of [data.eval] and [data.val]), with loader workers
pred_rss "MLP [data.val] workers = 2" "$tmp/val.ini" data.limit=2000 data.eval.limit=1000 data.workers=2
"$kiln" memory "$srcdir/examples/fashion_mnist_folder.ini" "data.path=$tmp/folder" data.cache=none >"$tmp/n.out" 2>/dev/null ||
	fail "kiln memory (folder, cache = none)"
[ "$(field cache "$tmp/n.out")" = 0 ] || fail "cache = none: a data cache of $(field cache "$tmp/n.out") bytes"
echo "ok: [data] cache = ram is predicted"

# workers = auto: the staging of the most workers the loader's probe may
# choose (kiln_loader_auto_max: the affinity mask's CPUs, at most 32, a
# power of two), not every online CPU's (before session 37)
auto_is() { # N [taskset CPUS]: workers = auto stages what workers = N does
	_w=$1
	shift
	"$@" "$kiln" memory "$srcdir/examples/fashion_mnist_mlp.ini" data.workers=auto >"$tmp/a.out" 2>/dev/null ||
		fail "kiln memory workers = auto"
	"$@" "$kiln" memory "$srcdir/examples/fashion_mnist_mlp.ini" data.workers=$_w >"$tmp/w.out" 2>/dev/null ||
		fail "kiln memory workers = $_w"
	[ "$(field host "$tmp/a.out")" = "$(field host "$tmp/w.out")" ] ||
		fail "workers = auto${*:+ under $*}: host staging $(field host "$tmp/a.out") bytes, workers = $_w's $(field host "$tmp/w.out")"
}
n=$(nproc)
w=1
while [ $((2 * w)) -le "$n" ] && [ $((2 * w)) -le 32 ]; do w=$((2 * w)); done
auto_is $w
if command -v taskset >/dev/null 2>&1; then
	auto_is 1 taskset -c 0
fi
echo "ok: workers = auto stages $w workers' batches ($n CPUs; 1 under taskset -c 0)"

# a plan whose activations do not fit: the error names them, the batch and
# the size (it was "cpu: alloc of 5885057024 bytes failed" alone), exit 1
(ulimit -v 4000000 && exec "$kiln" train "$srcdir/examples/fashion_mnist_cnn.ini" train.batch=20000 \
	train.max_steps=1 train.epochs=1 run.out_dir=) >"$out" 2>"$err"
rc=$?
[ "$rc" = 1 ] || { cat "$err"; fail "batch 20000 under ulimit -v 4000000: exit $rc, expected 1"; }
stderr_has "kiln: error: the training plan's activations at batch 20000 (5.48 GiB; \`kiln memory\` gives the run's whole need): cpu: alloc of"
echo "ok: activations that do not fit are named"
