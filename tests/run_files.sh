#!/bin/sh
# tests/run_files.sh - the run directory and the files kiln writes there
# (session 33's findings), on tests/data/tr_cnn.ini's tiny model:
#  1. out_dir removed mid-run: the run recreates it (the lock, config.ini,
#     metrics.jsonl continued), writes a checkpoint there and stops, exit 4,
#     naming it; the run resumes from that checkpoint.  The old code went
#     on into the unlinked files and exited 0.  The recreated metrics.jsonl
#     holds every line written before the removal (session 34; session
#     33's started at the loss); seen at a checkpoint between log points,
#     the run stops there (1b; it stopped a step later);
#  2. `kiln pack --format tokens --force` that fails midway keeps the
#     earlier pack's shards whole; it removed them first;
#  3. a best/ckpt-N.kiln.tmp that a killed best write left is pruned; it
#     stayed for good;
#  4. a file in the way of checkpoints/best (keep_best), a directory named
#     trace.json (--profile): refused at the start naming it; the old
#     code trained first;
#  5. config.ini is written through kiln_file_write: its temporary fsynced
#     before the rename, a killed run's temporary removed;
#  6. profile.txt and trace.json are written whole or not at all: a
#     failed write (ulimit -f) names the file, exit 1, no partial file.
name=run_files
. "$(dirname "$0")/lib.sh"
data="$srcdir/tests/data"
ini="$data/tr_cnn.ini"

need_source idx
d="data.path=$data"

# ---- 1: out_dir removed mid-run ----
run="$tmp/gone"
"$kiln" train "$ini" "$d" train.eval=0 train.epochs=1000000 train.max_steps=0 train.log_every=1 \
	"run.out_dir=$run" >"$tmp/gone.out" 2>"$tmp/gone.err" &
pid=$!
wait_line $pid "$run/metrics.jsonl" '"event":"train"' "the run whose out_dir goes" "$tmp/gone.err"
rm -rf "$run"
n=0
while kill -0 $pid 2>/dev/null; do
	n=$((n + 1))
	[ $n -le 300 ] || { kill -9 $pid; fail "a run whose out_dir was removed went on (30 s)"; }
	sleep 0.1
done
wait $pid
rc=$?
cp "$tmp/gone.err" "$err"
cp "$tmp/gone.out" "$out"
[ $rc -eq 4 ] || fail "out_dir removed mid-run: exit $rc, expected 4"
stdout_has '"out_dir_lost": true'
stderr_has "[train] error: the run directory $run was removed, renamed or replaced while this run wrote into it (its lock $run/.kiln.lock is gone): recreating it"
[ -f "$run/config.ini" ] && [ -f "$run/.kiln.lock" ] || fail "config.ini or the lock not recreated: $(ls -a "$run")"
ck=$(ls "$run/checkpoints")
step=${ck#ckpt-}
step=${step%.kiln}
[ "$ck" = "ckpt-$step.kiln" ] || fail "not one checkpoint in the recreated out_dir: $ck"
stderr_has "kiln: error: stopped at step $step, not at the user's request: the run directory $run was removed or replaced mid-run (recreated); checkpoint written to $run/checkpoints/$ck; resume with --resume"
grep -q "\"event\":\"out_dir_lost\",\"step\":$step,\"out_dir\":\"$run\"}\$" "$run/metrics.jsonl" ||
	fail "no out_dir_lost event: $(cat "$run/metrics.jsonl")"
# every step's train line, those written before the removal (1 to step - 1)
# too, once and in order
[ "$step" -ge 2 ] || fail "the removal seen at step $step: no line before it to check"
steps=$(sed -n 's/.*"event":"train",.*"step":\([0-9]*\),.*/\1/p' "$run/metrics.jsonl" | tr '\n' ' ')
[ "$steps" = "$(seq -s ' ' 1 "$step") " ] ||
	fail "the recreated metrics.jsonl's train lines are of steps $steps, expected 1 to $step"
# the recreated run resumes from its checkpoint
kiln 0 train "$ini" "$d" train.eval=0 train.epochs=1000000 train.max_steps=$((step + 2)) train.log_every=1 \
	"run.out_dir=$run" --resume
grep -q "\"event\":\"resume\",.*\"step\":$step," "$run/metrics.jsonl" || fail "the run did not resume at step $step"
[ -f "$run/checkpoints/ckpt-$((step + 2)).kiln" ] || fail "the resumed run wrote no checkpoint of step $((step + 2))"

# ---- 1b: out_dir lost between log points: the run stops at the checkpoint ----
# (session 34; before, it stopped a step later, a second checkpoint
# written).  A synthetic set of 1024 steps an epoch (its end the first log
# point), renamed away (atomic) after step 200's checkpoint
syn="$tmp/syn.ini"
printf '%s\n' '[data]' 'source = synthetic' 'samples = 8192' 'image_size = 32' 'classes = 4' \
	'[layer.flat]' 'type = flatten' '[layer.fc]' 'type = linear' 'out = 1024' \
	'[layer.loss]' 'type = softmax_xent' '[train]' 'batch = 8' 'eval = 0' >"$syn"
run="$tmp/ckgone"
"$kiln" train "$syn" train.epochs=1000 train.log_every=100000 train.checkpoint_every=200 \
	"run.out_dir=$run" >"$tmp/ckgone.out" 2>"$tmp/ckgone.err" &
pid=$!
wait_line $pid "$run/metrics.jsonl" '"event":"checkpoint","step":200,' "the run whose out_dir goes at a checkpoint" "$tmp/ckgone.err"
mv "$run" "$run.gone"
wait $pid
rc=$?
cp "$tmp/ckgone.err" "$err"
[ $rc -eq 4 ] || fail "out_dir renamed between log points: exit $rc, expected 4"
step=$(sed -n 's/.*"event":"out_dir_lost","step":\([0-9]*\),.*/\1/p' "$run/metrics.jsonl")
echo "out_dir renamed after step 200's checkpoint: seen at step $step"
[ -n "$step" ] && [ $((step % 200)) -eq 0 ] && [ "$step" -lt 1024 ] ||
	fail "the loss seen at step '$step', not at a checkpoint before the epoch's end"
[ "$(ls "$run/checkpoints")" = "ckpt-$step.kiln" ] ||
	fail "the recreated checkpoints/ holds '$(ls "$run/checkpoints")', not ckpt-$step.kiln alone"
stderr_has "kiln: error: stopped at step $step, not at the user's request: the run directory $run was removed or replaced mid-run (recreated); checkpoint written to $run/checkpoints/ckpt-$step.kiln; resume with --resume"
# the lines before the loss, copied: those of the renamed directory
grep '"event":"checkpoint","step":200,' "$run/metrics.jsonl" >/dev/null ||
	fail "the recreated metrics.jsonl lacks step 200's checkpoint line"

# ---- 2: a tokens pack that fails midway keeps the earlier shards ----
awk 'BEGIN { for (i = 0; i < 200; i++) printf "line %d\n", i }' >"$tmp/a.txt"
kiln 0 pack --format tokens "$tmp/a.txt" --out "$tmp/tok" --shard-tokens 500 --val-fraction 0.1
cp -r "$tmp/tok" "$tmp/tok.before"
# (a file that fails when it is read, after a.txt is encoded: a symbolic
# link to itself; a directory, before session 50, is refused before any
# work now, exit 2)
ln -s notafile.txt "$tmp/notafile.txt"
kiln 3 pack --format tokens "$tmp/a.txt" "$tmp/notafile.txt" --out "$tmp/tok" --shard-tokens 100 --force
stderr_has "$tmp/notafile.txt: cannot read"
diff -r "$tmp/tok.before" "$tmp/tok" >/dev/null ||
	fail "a failed pack --force changed the earlier shards: $(diff -r "$tmp/tok.before" "$tmp/tok")"
# a pack that succeeds replaces them, fewer shards included
kiln 0 pack --format tokens "$tmp/a.txt" --out "$tmp/tok" --shard-tokens 1000 --force
stdout_has "in 2 train shard(s)"
[ "$(ls "$tmp/tok")" = "$(printf 'train-000000.bin\ntrain-000001.bin')" ] ||
	fail "after a pack --force of fewer shards: $(ls "$tmp/tok")"

# ---- 3: best/'s stale temporary pruned ----
run="$tmp/best"
kiln 0 train "$ini" "$d" train.max_steps=2 train.eval_every=1 train.keep_best=1 "run.out_dir=$run"
echo partial >"$run/checkpoints/best/ckpt-1.kiln.tmp"
kiln 0 train "$ini" "$d" train.max_steps=4 train.eval_every=1 train.keep_best=1 "run.out_dir=$run" --resume
[ ! -e "$run/checkpoints/best/ckpt-1.kiln.tmp" ] || fail "best/'s stale temporary stayed: $(ls "$run/checkpoints/best")"

# ---- 4: what the end of the run writes, blocked: refused at the start ----
run="$tmp/blocked"
mkdir -p "$run/checkpoints"
echo not a directory >"$run/checkpoints/best"
kiln 1 train "$ini" "$d" train.max_steps=2 train.eval_every=1 train.keep_best=1 "run.out_dir=$run"
stderr_has "kiln: error: $run/checkpoints/best: [train] keep_best cannot create its checkpoint directory there: a file of that name is in the way; move it, or choose another out_dir"
[ ! -e "$run/metrics.jsonl" ] || fail "the refused run trained: $(cat "$run/metrics.jsonl")"
rm -rf "$run" && mkdir -p "$run/trace.json"
kiln 1 train "$ini" "$d" train.max_steps=2 "run.out_dir=$run" --profile
stderr_has "kiln: error: $run/trace.json: the profiler cannot write it at the end of the run: a directory of that name is in the way"
[ ! -e "$run/metrics.jsonl" ] || fail "the refused profiled run trained"
rmdir "$run/trace.json" && mkdir "$run/profile.txt"
kiln 1 train "$ini" "$d" train.max_steps=2 "run.out_dir=$run" --profile
stderr_has "kiln: error: $run/profile.txt: the profiler cannot write it at the end of the run: a directory of that name is in the way"

# ---- 5: config.ini through kiln_file_write ----
run="$tmp/cfg"
mkdir "$run"
gone=$(sh -c 'echo $$')
echo partial >"$run/config.ini.kiln-tmp$gone.0"
kiln 0 train "$ini" "$d" train.max_steps=1 "run.out_dir=$run"
stderr_has "[core] removed $run/config.ini.kiln-tmp$gone.0, the temporary of a write of $run/config.ini that was killed"
[ -z "$(ls "$run" | grep tmp)" ] || fail "temporaries left in out_dir: $(ls "$run")"
# its temporary fsynced before the rename (where strace can trace kiln)
if strace -f -o /dev/null true 2>/dev/null; then
	strace -f -y -e trace=fsync,rename -o "$tmp/strace" "$kiln" train "$ini" "$d" train.max_steps=1 \
		"run.out_dir=$run" --overwrite >"$out" 2>"$err" || fail "train under strace: exit $?"
	grep -q "fsync([0-9]*<$run/config.ini.kiln-tmp[0-9.]*>)" "$tmp/strace" ||
		fail "config.ini's temporary not fsynced: $(grep config.ini "$tmp/strace")"
else
	echo "no strace here: config.ini's fsync not traced"
fi

# ---- 5b: the config itself as out_dir's config.ini ----
# (before session 50 `kiln train config.ini run.out_dir=.` deleted the
# user's config.ini as "the earlier run's" file and wrote the resolved
# config over it: its comments and layout gone, the overrides baked in)
run="$tmp/own"
mkdir "$run"
cp "$ini" "$run/config.ini"
cp "$ini" "$tmp/own.ini"
for extra in "" --overwrite --resume; do
	kiln 2 train "$run/config.ini" "$d" train.max_steps=1 "run.out_dir=$run" $extra
	stderr_has "kiln: error: $run/config.ini: the config is [run] out_dir's $run/config.ini, a file the run writes"
	stderr_has "nothing was changed"
	cmp "$run/config.ini" "$tmp/own.ini" || fail "train $extra: the config was changed"
	[ "$(ls "$run")" = config.ini ] || fail "train $extra: a refused run wrote: $(ls "$run")"
done
# a run's own config.ini (resolved form) run again: allowed, as before
run="$tmp/self"
kiln 0 train "$ini" "$d" train.max_steps=1 "run.out_dir=$run"
kiln 0 train "$run/config.ini" train.max_steps=2 --resume
stderr_has "resuming from $run/checkpoints/ckpt-1.kiln"
grep -qx "max_steps = 2" "$run/config.ini" || fail "the resumed run's config.ini lacks max_steps = 2"
# an older run's config.ini, without a key added since (its default
# applies): resumed too (session 50's first check wanted the text whole)
grep -qx "label_smoothing = 0" "$run/config.ini" || fail "no label_smoothing line to drop: $(cat "$run/config.ini")"
grep -vx "label_smoothing = 0" "$run/config.ini" >"$tmp/older.ini"
cp "$tmp/older.ini" "$run/config.ini"
kiln 0 train "$run/config.ini" train.max_steps=3 --resume
stderr_has "resuming from $run/checkpoints/ckpt-2.kiln"
grep -qx "label_smoothing = 0" "$run/config.ini" || fail "the resumed run's config.ini lacks label_smoothing"

# ---- 6: profile.txt and trace.json whole or not at all ----
run="$tmp/prof"
kiln 0 train "$ini" "$d" train.max_steps=3 train.eval=0 train.checkpoint_last=0 "run.out_dir=$run" --profile
size=$(wc -c <"$run/trace.json" | tr -d ' ')
small=$(wc -c <"$run/metrics.jsonl" | tr -d ' ')
echo "trace.json: $size bytes, metrics.jsonl $small"
[ "$size" -gt 8192 ] || fail "trace.json of $size bytes: too small to cut below"
# (ulimit -f counts 512-byte blocks: 8 KB lets everything but the trace through)
(ulimit -f 16 && KILN_LOG_LEVEL=error exec "$kiln" train "$ini" "$d" train.max_steps=3 train.eval=0 \
	train.checkpoint_last=0 "run.out_dir=$run" --profile --overwrite >"$out" 2>"$err")
rc=$?
[ "$rc" -eq 1 ] || fail "a trace.json past ulimit -f: exit $rc, expected 1 ($(cat "$err"))"
stderr_has "kiln: error: $run/trace.json: cannot write the trace: File too large"
[ ! -e "$run/trace.json" ] || fail "a partial trace.json was left ($(wc -c <"$run/trace.json") bytes)"
[ -z "$(ls "$run" | grep tmp)" ] || fail "temporaries left in out_dir: $(ls "$run")"

echo "$checks checks passed"
