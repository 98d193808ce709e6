#!/bin/sh
# tests/cpu_tune_cache.sh - [plugin.cpu] tune_cache (plugins/cpu/tune_cache.c):
# the kernel choices `auto` times for a bf16 CNN are written by the first
# run and read by the second, which times nothing and trains to the same
# loss; a stale header (another kiln version) is an info line and a
# retime; a damaged file (a flipped byte, a truncated one) a warning that
# names the file, a retime and a rewrite, never a failed run; `none`
# writes nothing, the default goes to $XDG_CACHE_HOME/kiln/cpu_tune-HASH.bin
# (the tests': the build tree's tests/cache, nothing under HOME);
# another team size does not take the choices timed for this one; two runs
# writing at once leave a whole file; no op shape is timed twice, and
# no layer prepares the data gradient no backward asks for; choices timed
# under contention are stored provisional (format 2), kept by a busy run,
# re-timed by a quiet one, at most 8 a run (plugins/cpu/tune.c).
name=cpu_tune_cache
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
# the timing is quiet unless a section says otherwise (the hook stands for
# the timing thread's run-queue wait): on a loaded test machine a real one
# would mark the choices provisional and a later run re-time them
export KILN_CPU_TUNEWAIT=0 KILN_CPU_PROBEWAIT=0
# conv2's bf16 passes timed as on every CPU before session 23: on AVX-512
# bf16_conv = auto now sends them to the FFT on widened copies untimed
# (fft16.c; plugins/cpu/tune.c), which would leave 8 choices, not the 11
# that the "at most 8 a run" re-timing below needs; and conv1's two, which
# kiln's first-layer kernel (convthin.c) takes untimed on AVX-512 since
# session 24
export KILN_CPU_FFT_FFTW=1 KILN_CPU_CONVTHIN=0

cnn="$srcdir/examples/fashion_mnist_cnn.ini"
c="$tmp/tune.bin"
short="data.limit=64 train.max_steps=2 train.batch=16 train.epochs=1 train.eval=0 run.precision=bf16 run.threads=2 run.out_dir="
timed_lines() { cat "$out" "$err" | grep -cE 'bf16 kernel [0-9.]+ ms, f32 kernel' || true; }
log_has() { cat "$out" "$err" | grep -qF -- "$1" || fail "log lacks: $1"; }
log_lacks() { ! cat "$out" "$err" | grep -qF -- "$1" || fail "log has: $1"; }

# shellcheck disable=SC2086
run() { kiln 0 train "$cnn" $short "$@"; }

# 1: the first run times and writes
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: none yet; a choice timed in this run is written at its end"
t1=$(timed_lines)
[ "$t1" -gt 0 ] || fail "the first run timed no kernel"
# one timing per key (tune.c, tune_key): the writing and the accumulating
# backward GEMMs and weight gradients of one shape share it
dups=$(cat "$out" "$err" | grep -E 'bf16 kernel [0-9.]+ ms, f32 kernel' | sed 's/: bf16 kernel.*//' | sort | uniq -d)
[ -z "$dups" ] || fail "timed twice: $dups"
# no backward asks for the data's gradient, so conv1 prepares (and times)
# no CONV_BWD_DATA (core/plan.c, kiln_layer_dx_unused): 5 convolution ops
# (conv1 forward and weights, conv2 all three) and 6 GEMMs
! cat "$out" "$err" | grep -qF 'CONV_BWD_DATA bf16[16, 32, 28, 28]' || fail "conv1's data gradient was prepared"
[ "$t1" -eq 11 ] || fail "the first run timed $t1 choices, want 11"
n1=$(cat "$out" "$err" | sed -n "s/.*tune cache .*: \([0-9]*\) choices timed, \([0-9]*\) written.*/\2/p")
[ "$n1" = "$t1" ] || fail "written $n1 choices, timed $t1"
[ -s "$c" ] || fail "$c not written"
loss1=$(field train_loss "$out")
cp "$c" "$tmp/good.bin"
# each choice as "OP IN -> OUT K" (K: tune.c's TUNE_BF16 0, TUNE_F32 1, TUNE_BF16_2 2)
cat "$out" "$err" | sed -n 's/.*bf16 \([A-Z_]*\) \(bf16\[[^]]*\]\), [a-z0-9]*\[[^]]*\] -> \([^:]*\):.*: the \(.*\) kernel.*/\1 \2 -> \3 \4/p' |
	sed 's/ second bf16$/ 2/; s/ bf16$/ 0/; s/ f32$/ 1/' | sort >"$tmp/timed.txt"
[ "$(wc -l <"$tmp/timed.txt")" -eq "$t1" ] || fail "read $(wc -l <"$tmp/timed.txt") choices of $t1 timed lines"
echo "ok: first run timed and wrote $n1 choices (train_loss $loss1)"

# 1b: nor does the MLP's first linear layer prepare its data gradient's
# GEMMs (-> [16, 784]): 8 timings (3 forward, 3 weight, 2 data gradients)
# shellcheck disable=SC2086
kiln 0 train "$srcdir/examples/fashion_mnist_mlp.ini" $short plugin.cpu.tune_cache=none
[ "$(timed_lines)" -eq 8 ] || fail "the MLP timed $(timed_lines) choices, want 8"
log_lacks "-> bf16[16, 784]"
echo "ok: the MLP's first layer prepares no data gradient"

# 2: the second reads them all and times nothing
export KILN_LOG_LEVEL=debug
run "plugin.cpu.tune_cache=$c"
unset KILN_LOG_LEVEL
log_has "tune cache $c: $n1 choices read for 2 threads"
[ "$(timed_lines)" -eq 0 ] || fail "the second run timed $(timed_lines) kernels"
log_lacks "choices timed,"
# which choice each op took from the cache is logged (debug): the ones timed
cat "$out" "$err" | sed 's/\] debug: /] /' | sed -n 's/.*\] \([A-Z_]*\) \(.*\): choice \([0-9]\) from the tune cache.*/\1 \2 \3/p' | sort -u >"$tmp/read.txt"
cmp -s "$tmp/timed.txt" "$tmp/read.txt" || fail "choices from the cache: $(cat "$tmp/read.txt"); timed: $(cat "$tmp/timed.txt")"
# and counted, one info line a plan (tune.c, cpu_tune_summary): as many as
# the prepares' own lines (some ops of one key are prepared twice)
nop=$(cat "$out" "$err" | grep -c ': choice [0-9] from the tune cache')
nsum=$(cat "$out" "$err" | sed -n "s/.*\] \([0-9]*\) choices from the tune cache $(echo "$c" | sed 's/[.[\*^$/]/\\&/g') (each at.*/\1/p" | awk '{ n += $1 } END { print n + 0 }')
[ "$nop" -ge "$n1" ] && [ "$nsum" = "$nop" ] || fail "summed $nsum choices from the cache in summary lines, $nop op lines, $n1 read"
loss2=$(field train_loss "$out")
[ -n "$loss1" ] && [ "$loss1" = "$loss2" ] || fail "train_loss $loss2 from the cache, $loss1 timed"
cmp -s "$c" "$tmp/good.bin" || fail "a run that timed nothing rewrote $c"
echo "ok: second run read $n1 choices, timed none, same train_loss"
# 2b: at info, the summary alone: no op's line of its own
run "plugin.cpu.tune_cache=$c"
log_lacks ": choice 0 from the tune cache"
log_lacks ": choice 1 from the tune cache"
[ "$(cat "$out" "$err" | grep -c "choices from the tune cache $c (each at")" -eq 1 ] || fail "want one summary line of the cache's choices"
echo "ok: at info, one line for the $nsum choices from the cache"

# 3: another kiln version in the header: stale, retimed, rewritten
printf 'kiln-0.0.0-other' | dd of="$c" bs=1 seek=16 conv=notrunc 2>/dev/null
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: stale (written for another kiln version); timing again"
[ "$(timed_lines)" -eq "$t1" ] || fail "a stale cache retimed $(timed_lines) of $t1 kernels"
# the header (up to its count and checksum: a retime on a loaded machine may
# choose otherwise) is this build's again
cmp -s -n 400 "$c" "$tmp/good.bin" || fail "the stale cache was not rewritten"
echo "ok: stale header retimed and rewrote"

# 4: damaged: a flipped byte in the records, then a truncated file
printf '\377\377\377\377' | dd of="$c" bs=1 seek=600 conv=notrunc 2>/dev/null
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: damaged (bad checksum); ignored, timing again"
cat "$out" "$err" | grep -F "tune cache $c: damaged" | grep -qi warn || fail "a damaged cache is not a warning"
[ "$(timed_lines)" -eq "$t1" ] || fail "a damaged cache retimed $(timed_lines) of $t1 kernels"
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: $n1 choices read for 2 threads"
head -c 1000 "$tmp/good.bin" > "$c"
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: damaged (its length is not that of its $n1 records)"
[ "$(timed_lines)" -eq "$t1" ] || fail "a truncated cache retimed $(timed_lines) of $t1 kernels"
head -c 100 "$tmp/good.bin" > "$c"
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: damaged (too short or not a kiln tune cache)"
echo "ok: damaged caches warned, retimed, trained"

# 5: another team does not take this team's choices, and adds its own
run "plugin.cpu.tune_cache=$c" run.threads=1
log_has "tune cache $c: 0 choices read for 1 threads"
[ "$(timed_lines)" -gt 0 ] || fail "a team of 1 took the choices of a team of 2"
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: $n1 choices read for 2 threads"
echo "ok: the team size is part of the key; merged records kept"

# 6: none writes nothing; unset writes $XDG_CACHE_HOME/kiln/cpu_tune-HASH.bin,
# HASH of the header (one file per build)
mkdir -p "$tmp/xdg"
XDG_CACHE_HOME="$tmp/xdg" run plugin.cpu.tune_cache=none
log_lacks "tune cache"
[ "$(timed_lines)" -gt 0 ] || fail "none: nothing timed"
[ -z "$(find "$tmp/xdg" -name 'cpu_tune*')" ] || fail "none wrote $(find "$tmp/xdg" -name 'cpu_tune*')"
mkdir -p "$tmp/xdg/kiln" "$tmp/xdg/keep"
echo "an old build's cache" > "$tmp/xdg/kiln/cpu_tune.bin" # before per-build files
echo "the user's own file" > "$tmp/xdg/keep/cpu_tune.bin"
XDG_CACHE_HOME="$tmp/xdg" run plugin.cpu.tune_cache="$tmp/xdg/keep/cpu_tune.bin"
[ -e "$tmp/xdg/kiln/cpu_tune.bin" ] || fail "tune_cache = PATH removed the legacy cpu_tune.bin"
XDG_CACHE_HOME="$tmp/xdg" run
log_has "tune cache $tmp/xdg/kiln/cpu_tune.bin: removed, the file of builds before per-build caches"
[ ! -e "$tmp/xdg/kiln/cpu_tune.bin" ] || fail "the default's first write left the legacy cpu_tune.bin"
def=$(find "$tmp/xdg/kiln" -name 'cpu_tune-*.bin')
[ "$(echo "$def" | wc -w)" -eq 1 ] && [ -s "$def" ] || fail "unset: not one $tmp/xdg/kiln/cpu_tune-HASH.bin: $def"
echo "$def" | grep -Eq '/cpu_tune-[0-9a-f]{16}\.bin$' || fail "unset: default name $def"
log_has "tune cache $def: "
[ ! -e "$tmp/xdg/kiln/cpu_tune.bin" ] || fail "unset: the build-less cpu_tune.bin written"
echo "ok: none writes nothing; the default is under XDG_CACHE_HOME and removed the legacy cpu_tune.bin"
# 6b: a test's runs leave the user's default cache alone: lib.sh (and
# tests/local.mk, tests/check_main.h) put XDG_CACHE_HOME in the build
# tree, and a run with the default tune_cache and a HOME of its own writes
# there and nothing under that HOME's .cache
[ "$XDG_CACHE_HOME" = "$abs_top_builddir/tests/cache" ] ||
	fail "XDG_CACHE_HOME = '$XDG_CACHE_HOME', not the build tree's tests/cache"
mkdir -p "$tmp/home"
HOME="$tmp/home" run
log_has "tune cache $abs_top_builddir/tests/cache/kiln/cpu_tune-"
[ -z "$(find "$tmp/home" -mindepth 1)" ] || fail "a test's run wrote under HOME: $(find "$tmp/home" -mindepth 1)"
echo "ok: the tests' cache is the build tree's tests/cache; the default cache dir is untouched"
# 7: two runs (ranks) sharing the file, closing at about the same time: each
# writes a whole file (a temporary and a rename), never half of one
rm -f "$c"
# shellcheck disable=SC2086
"$kiln" train "$cnn" $short "plugin.cpu.tune_cache=$c" >"$tmp/a.out" 2>"$tmp/a.err" &
pa=$!
# shellcheck disable=SC2086
"$kiln" train "$cnn" $short "plugin.cpu.tune_cache=$c" >"$tmp/b.out" 2>"$tmp/b.err" &
pb=$!
wait $pa || fail "concurrent run a failed: $(cat "$tmp/a.err")"
wait $pb || fail "concurrent run b failed: $(cat "$tmp/b.err")"
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: $n1 choices read for 2 threads"
[ "$(timed_lines)" -eq 0 ] || fail "after two concurrent writers the cache lacks choices"
[ -z "$(find "$tmp" -maxdepth 1 -name 'tune.bin.tmp.*')" ] || fail "a temporary file was left behind"
echo "ok: two concurrent writers left a whole file"

# 8: timed under contention (the timing thread waited 0.5 s a second for a
# CPU): every choice provisional in the file; a busy run keeps them and
# times none; quiet runs re-time 8, then the other 3, then none
rm -f "$c"
KILN_CPU_TUNEWAIT=0.5
run "plugin.cpu.tune_cache=$c"
[ "$(cat "$out" "$err" | grep -E 'bf16 kernel [0-9.]+ ms, f32 kernel' | grep -c 'provisional (timed under contention: waited 0.50 s')" -eq "$t1" ] ||
	fail "contended: not all $t1 timings provisional"
log_has "tune cache $c: $t1 choices timed, $t1 written ($t1 provisional;"
KILN_CPU_PROBEWAIT=0.5
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: $t1 choices read for 2 threads ($t1 provisional)"
log_has "busy, keeping them"
[ "$(timed_lines)" -eq 0 ] || fail "a busy run re-timed $(timed_lines) provisional choices"
KILN_CPU_TUNEWAIT=0 KILN_CPU_PROBEWAIT=0
run "plugin.cpu.tune_cache=$c"
log_has "quiet, re-timing them (at most 8 a run)"
[ "$(timed_lines)" -eq 8 ] || fail "a quiet run re-timed $(timed_lines) provisional choices, want 8"
log_has "tune cache $c: 8 choices timed, $t1 written ($((t1 - 8)) provisional;"
run "plugin.cpu.tune_cache=$c"
[ "$(timed_lines)" -eq $((t1 - 8)) ] || fail "the second quiet run re-timed $(timed_lines), want $((t1 - 8))"
log_has "written (0 provisional;"
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: $t1 choices read for 2 threads (0 provisional)"
[ "$(timed_lines)" -eq 0 ] || fail "confident choices re-timed"
# format 1 (before provisional records): another file format, stale
printf '\001' | dd of="$c" bs=1 seek=8 conv=notrunc 2>/dev/null
run "plugin.cpu.tune_cache=$c"
log_has "tune cache $c: stale (written for another file format); timing again"
echo "ok: contended choices provisional, kept busy, re-timed quiet 8 a run"
echo "PASS: $checks runs"
