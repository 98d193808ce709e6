#!/bin/sh
# tests/resume_last_kill.sh - a SIGKILL around the run's last checkpoint
# loses nothing (session 33; docs/checkpoints.md, resume item 3).
#
# strace kills kiln train deterministically at its Nth rename or unlink
# (`-e inject=SYSCALL:signal=SIGKILL:when=N`; N read from an uninterrupted
# run's trace), then `--resume` finishes the run:
#
# 1. An early stop at an eval_every evaluation (step 24), no [data.val]:
#    killed at each of the run's last two renames, the resumed result has
#    the uninterrupted run's test numbers, and its ckpt-24.kiln the same
#    "evaluated" section.  Before, the checkpoint was written at the stop
#    and again with the evaluation's numbers; a kill between the two left
#    "test_loss": null in this and every later resume.
# 2. The same with [data.val], killed at the rename of the rewrite after
#    the final test: the resume evaluates the stopping evaluation again
#    (not recorded) and has its val numbers (before: none).
# 3. keep_last = 1, killed at the prune of ckpt-56 after ckpt-60's rename:
#    the resume prunes it and logs step 60's "checkpoint" event (before:
#    ckpt-56 stayed for good and the event was never logged).
# 4. A resume of the finished run says "the run is complete: no step is
#    left" and prints no epoch line ("0.0 s, 0 samples/s" before).
#
# A small CNN on Fashion-MNIST, 640 samples: 20 steps an epoch, about a
# second a run, 12 runs.
name=resumelast
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/config_lib.sh"
tool="$top_builddir/tests/ckpt_tool"
need_fashion_mnist
command -v strace > /dev/null 2>&1 ||
	{ echo "SKIP: strace missing (scripts/install-deps installs it)"; exit 77; }
strace -qq -o /dev/null true 2> /dev/null ||
	{ echo "SKIP: strace cannot trace here (ptrace not permitted)"; exit 77; }
# rename and unlink are system calls of their own only on x86_64 (aarch64
# has renameat2 and unlinkat); strace counts when=N per system call, so the
# kill points are counted for one call each, which must be the only one
[ "$(uname -m)" = x86_64 ] ||
	{ echo "SKIP: the kill points count rename/unlink system calls, x86_64's only ($(uname -m))"; exit 77; }

{
	ini run seed=11 threads=1
	ini_fmnist path=$FM limit=640 shuffle=1 crop=random pad=2 flip=1 workers=2
	ini data.eval limit=200
	ini_layers c1:conv:out=4:kernel=3:padding=1 bn:batchnorm r:relu p:maxpool:kernel=2 d:dropout:p=0.3 \
		f:flatten fc1:linear:out=64 r2:relu fc:linear:out=10 loss:softmax_xent
	ini train epochs=3 batch=16 accumulate=2 optimizer=adamw lr=0.003 weight_decay=0.01 \
		schedule=cosine warmup=4 log_every=1 eval_batch=100 checkpoint_every=4 keep_last=1
} > "$tmp/run.ini"

# traced DIR OVERRIDES...: kiln train into $tmp/DIR, its renames and
# unlinks traced into $tmp/DIR.trace
traced() {
	_d=$1
	shift
	strace -f -qq -e trace=rename,unlink -o "$tmp/$_d.trace" "$kiln" train "$tmp/run.ini" \
		"run.out_dir=$tmp/$_d" "$@" > "$tmp/$_d.out" 2> "$tmp/$_d.err" ||
		fail "the uninterrupted run $_d failed: $(tail -3 "$tmp/$_d.err")"
}

# nth DIR SYSCALL [PATTERN]: which SYSCALL of $tmp/DIR.trace is the last one
# matching PATTERN (else the last), counted from the rename of the run's
# config.ini on (its temporary is config.ini.kiln-tmp<pid>.<n>, core/out_file.c):
# the first run in a cache directory also renames its cache files (plugin
# probe, inflated IDX) before it, which the killed run, after it, does not
nth() {
	sed -n '/rename(".*\/config\.ini\.[^"]*", ".*\/config\.ini")/,$p' "$tmp/$1.trace" | grep " $2(" |
		grep -n -- "${3:-}" | tail -1 | cut -d: -f1
}

# killed DIR SYSCALL N OVERRIDES...: kiln train into $tmp/DIR, SIGKILLed at
# its Nth SYSCALL
killed() {
	_d=$1 _s=$2 _n=$3
	shift 3
	strace -f -qq -o /dev/null -e trace="$_s" -e inject="$_s":signal=SIGKILL:when="$_n" \
		"$kiln" train "$tmp/run.ini" "run.out_dir=$tmp/$_d" "$@" > /dev/null 2>&1
	rc=$?
	[ $rc -eq 137 ] || fail "kiln train under strace, killed at $_s $_n: exit $rc, not 137"
}

# same_field KEY A B: the JSON lines A and B have the same value of KEY
same_field() {
	_a=$(sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p" "$2")
	_b=$(sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p" "$3")
	[ -n "$_a" ] && [ "$_a" != null ] || fail "$2: no $1"
	[ "$_a" = "$_b" ] || fail "$1 $_b after the kill and resume, the uninterrupted run's $_a"
}

# 1. early stop at eval_every's step 24, no [data.val]
es="train.eval_every=4 train.early_stop_patience=1 train.early_stop_min_delta=0.02 train.keep_best=2 train.epochs=4"
# shellcheck disable=SC2086
traced ref $es
grep -q '"early_stopped": true, ' "$tmp/ref.out" && grep -q '"steps": 24,' "$tmp/ref.out" ||
	fail "the uninterrupted run did not stop early at step 24: $(cat "$tmp/ref.out")"
n=$(nth ref rename)
for k in $((n - 1)) $n; do
	# shellcheck disable=SC2086
	killed es$k rename $k $es
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/run.ini" "run.out_dir=$tmp/es$k" $es --resume
	cp "$out" "$tmp/es$k.out"
	same_field test_loss "$tmp/ref.out" "$tmp/es$k.out"
	same_field test_acc "$tmp/ref.out" "$tmp/es$k.out"
	"$tool" same "$(ck ref 24)" "$(ck es$k 24)" evaluated stopper best params ||
		fail "killed at rename $k of $n: ckpt-24.kiln differs from the uninterrupted run's"
	# and a later resume still has them
	# shellcheck disable=SC2086
	kiln 0 train "$tmp/run.ini" "run.out_dir=$tmp/es$k" $es --resume
	same_field test_loss "$tmp/ref.out" "$out"
done
echo "1. early stop, killed at rename $((n - 1)) and $n of $n: the stopping evaluation's numbers kept"

# 2. the same with [data.val]: killed at the rewrite after the final test
val="data.val.images=t10k-images-idx3-ubyte.gz data.val.labels=t10k-labels-idx1-ubyte.gz data.val.limit=100"
# shellcheck disable=SC2086
traced vref $es $val
n=$(nth vref rename)
# shellcheck disable=SC2086
killed v rename $n $es $val
# shellcheck disable=SC2086
kiln 0 train "$tmp/run.ini" "run.out_dir=$tmp/v" $es $val --resume
for f in val_loss val_acc test_loss test_acc; do
	same_field $f "$tmp/vref.out" "$out"
done
stderr_has "resume: the checkpoint lacks the numbers of the evaluation after step 24 that stopped the run: evaluating again (not recorded again)"
"$tool" same "$(ck vref 24)" "$(ck v 24)" evaluated stopper best params ||
	fail "[data.val]: ckpt-24.kiln differs from the uninterrupted run's"
echo "2. early stop with [data.val], killed at its last rename: the val numbers kept"

# 3. keep_last = 1: killed after ckpt-60's rename, at the prune of ckpt-56
traced kl
n=$(nth kl unlink 'ckpt-56\.kiln"')
[ -n "$n" ] || fail "the uninterrupted run's trace has no unlink of ckpt-56.kiln"
killed k unlink "$n"
[ -f "$(ck k 56)" ] && [ -f "$(ck k 60)" ] || fail "the kill at unlink $n left $(ls "$tmp/k/checkpoints")"
grep -q '"event":"checkpoint","step":60' "$tmp/k/metrics.jsonl" &&
	fail "the run killed before its prune logged step 60's checkpoint event (the kill came late)"
kiln 0 train "$tmp/run.ini" "run.out_dir=$tmp/k" --resume
[ "$(ls "$tmp/k/checkpoints")" = "ckpt-60.kiln" ] ||
	fail "keep_last = 1: checkpoints/ holds $(ls "$tmp/k/checkpoints" | tr '\n' ' ')after the resume"
[ "$(grep -c '"event":"checkpoint","step":60' "$tmp/k/metrics.jsonl")" = 1 ] ||
	fail "$(grep -c '"event":"checkpoint","step":60' "$tmp/k/metrics.jsonl") checkpoint events of step 60, want 1"
echo "3. keep_last = 1, killed before its prune: pruned and logged by the resume"

# 4. the finished run resumed: nothing left, said, no empty epoch line
kiln 0 train "$tmp/run.ini" "run.out_dir=$tmp/k" --resume
stderr_has "resume: the run is complete: no step is left (step 60, epoch 3 of [train] epochs 3)"
! grep -q "^epoch " "$err" || fail "a resume with no step left printed: $(grep "^epoch " "$err")"
[ "$(grep -c '"event":"checkpoint","step":60' "$tmp/k/metrics.jsonl")" = 1 ] ||
	fail "a resume of the finished run logged another checkpoint event"
echo "4. the finished run resumed: 'no step is left', no epoch line"
echo "PASS: resume_last_kill"
