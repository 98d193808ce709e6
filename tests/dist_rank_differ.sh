#!/bin/sh
# tests/dist_rank_differ.sh - ranks started by hand (no launcher, which
# would end the others once one exits) that differ from each other
# (docs/distributed.md "The same config on every rank", "Failures"):
#  1. [dist] heartbeat differs (a key that may): rank 1 at 2 s, rank 0 at
#     0 (off), then 4 against 60; each rank judges a peer by the heartbeat
#     the peer posted: both train ~10 s and exit 0 (before session 34 the
#     rank at 2 s called the peer at 0 silent after 2 s, the one at 4 the
#     one at 60, beating every 15 s, after 4 s);
#  2. rank 1 fails with its own error after the rendezvous (its data file
#     truncated; its message names it, "rank 1 of 2: ..."): rank 0
#     exits within seconds naming rank 1 as failed
#     (before, it waited for [dist] heartbeat or timeout, 60 s here, and
#     blamed silence, a stuck peer or no rank at all);
#  3. rank 1's data set is smaller (another file at the same path on its
#     node): both ranks refuse at once naming both counts (before, they
#     met in different collectives and hung until [dist] timeout);
#  4. both ranks fail with their own error at the same point (the same
#     truncated file), rank 1's teardown slow (KILN_TEST_CLOSE_DELAY_MS,
#     3 s: a device's frees): each rank's error is its own (before
#     session 35 rank 1's watchdog read rank 0's FAILED mark during that
#     teardown and ended it naming rank 0, its own error never printed).
#  5. rank 1's data set has the same size but other contents (one pixel of
#     the first sample, then of the last): both ranks refuse at once,
#     exit 3, naming rank 1, the file and which end differs (before
#     session 35 they trained on different data without a word); an
#     identical copy at another place passes.
#  6. rank 0 refuses its out_dir (an earlier run there), naming its rank
#     ("rank 0 of 2: ", since session 36): rank 1 names it failed once (before session 35 the explanation was wrapped twice:
#     "rank 0 ... failed with its own error ...: rank 1 of 2: rank 0 ...
#     failed with its own error ...", the stream worker's and the sync's).
#  7. rank 0 fails at its data while rank 1 is still opening its own
#     (KILN_TEST_OPEN_DELAY_MS, 6 s: a big folder's scan): rank 1's
#     watchdog ends it naming rank 0, and rank 0 prints its own error
#     within 5 s (before session 35 it waited 10 s in its teardown for
#     rank 1, which its watchdog's end never counted as leaving, and
#     under kiln launch the launcher's stop swallowed that error).
#  8. gzip files compared by their contents' CRC32 and size (the
#     trailer) and their compressed bytes past the header: another time
#     stamp or a stored name passes (before session 35 refused), one
#     pixel in the middle is named by the trailer, the same contents at
#     another level and a .gz against the plain file are refused saying
#     files are compared and how to check.
name=dist_rank_differ needs=gloo
. "$(dirname "$0")/dist_common.sh"
export KILN_STORE_TOKEN="${KILN_STORE_TOKEN:-kiln-tests-0123456789abcdef}"
fm=/usr/share/datasets/fashion-mnist
ini="$tmp/mlp.ini"
{
	ini run seed=5 threads=1 comm=gloo
	ini_fmnist limit=2048 path="$fm"
	ini_layers flat:flatten fc1:linear:out=64 r1:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=2 batch=64 lr=0.05 momentum=0.9 log_every=16 eval=0 checkpoint_every=1000
	ini plugin.cpu async=1
	ini dist bucket_mb=0.05 timeout=60 heartbeat=60
} > "$ini"

# two NAME "R0 overrides" "R1 overrides": both ranks on loopback, by
# hand, each in the folder $tmp/NAME-wR when there is one (a relative
# data.path: the same config value, another file on each rank, as on two
# nodes); each one's output in $tmp/NAME-rR.log, its exit status and the
# seconds from the start to its exit in $tmp/NAME-rR.end ("RC SECONDS");
# with $stop_after set, SIGTERM to both ranks that many seconds in; $envR
# (optional): VAR=VALUE words in rank R's environment
two() {
	_n=$1 _o0=$2 _o1=$3 _port=$(free_port 3)
	_s=$(date +%s.%N)
	for _r in 0 1; do
		eval "_o=\$_o$_r _e=\${env$_r:-}"
		( cd "$tmp/$_n-w$_r" 2> /dev/null || cd "$tmp"
		  KILN_RANK=$_r KILN_WORLD_SIZE=2 KILN_MASTER_ADDR=127.0.0.1 KILN_MASTER_PORT=$_port \
			timeout 150 env $_e "$kiln" train "$ini" run.out_dir="$tmp/$_n-r$_r" $_o \
			> "$tmp/$_n-r$_r.log" 2>&1
		  _rc=$?
		  awk -v a="$_s" -v b="$(date +%s.%N)" -v rc=$_rc 'BEGIN { printf "%d %.2f\n", rc, b - a }' \
			> "$tmp/$_n-r$_r.end" ) &
		eval "_pid$_r=\$!"
	done
	if [ -n "${stop_after:-}" ]; then
		sleep "$stop_after"
		# (timeout passes SIGTERM on to kiln; the subshells' children)
		pkill -TERM -P "$_pid0" 2> /dev/null
		pkill -TERM -P "$_pid1" 2> /dev/null
	fi
	wait
	echo "$_n: rank 0 exit/s $(cat "$tmp/$_n-r0.end"), rank 1 $(cat "$tmp/$_n-r1.end")"
}
rc_of() { cut -d' ' -f1 "$tmp/$1.end"; }
secs_of() { _t=$(cut -d' ' -f2 "$tmp/$1.end" | cut -d. -f1); echo "${_t:-0}"; }

# ---- 1. different heartbeats ------------------------------------------------
# a run far longer than the test (100000 epochs), stopped by SIGTERM to
# both ranks after 8 s (a stop the ranks agree on at a log point: exit 0),
# so each run trains past the limits of 2 and 4 s and a beat on a fast
# machine as on a slow one (the first version ran 600 epochs, which took
# 4 s on a quiet machine: too short to tell, session 34's merge)
long="train.epochs=100000 train.batch=32"
stop_after=8
two hb0 "$long dist.heartbeat=0" "$long dist.heartbeat=2"
two hb60 "$long dist.heartbeat=60" "$long dist.heartbeat=4"
stop_after=
for n in hb0 hb60; do
	for r in 0 1; do
		[ "$(rc_of $n-r$r)" = 0 ] || { bad "$n: rank $r exited $(rc_of $n-r$r)"; grep error "$tmp/$n-r$r.log"; }
	done
	[ "$(secs_of $n-r0)" -ge 8 ] || bad "$n: rank 0 ended after $(secs_of $n-r0) s, before the stop"
	grep -q "watchdog" "$tmp/$n-r0.log" "$tmp/$n-r1.log" && bad "$n: a watchdog message"
done

# ---- 2. rank 1 fails on its own ---------------------------------------------
mkdir -p "$tmp/trunc"
cp "$fm"/train-labels-idx1-ubyte.gz "$tmp/trunc/"
head -c 3000000 "$fm"/train-images-idx3-ubyte.gz > "$tmp/trunc/train-images-idx3-ubyte.gz"
mkdir "$tmp/own-w0" "$tmp/own-w1"
ln -s "$fm" "$tmp/own-w0/fm"
ln -s "$tmp/trunc" "$tmp/own-w1/fm"
two own "train.epochs=40 data.path=fm" "train.epochs=40 data.path=fm"
# rank 1's own error, then rank 0's naming it, within 10 s of rank 1's exit
# ([dist] timeout and heartbeat 60 s)
# (its message names its rank, as a bad sample's does: before session 35
# a rank started by hand said only the path)
grep -q "^kiln: error: rank 1 of 2: [^ ]*fm/train-images-idx3-ubyte.gz: truncated data" "$tmp/own-r1.log" ||
	{ bad "own: rank 1 did not fail on its truncated file"; cat "$tmp/own-r1.log"; }
line=$(grep "^kiln: error: rank 0 of 2: .*rank 1 (host [^)]*) failed with its own error (its log says why)" "$tmp/own-r0.log")
echo "own: rank 0: $(echo "$line" | cut -c1-200)"
[ -n "$line" ] || { bad "own: rank 0 did not name rank 1 as failed"; grep error "$tmp/own-r0.log"; }
[ "$(rc_of own-r0)" != 0 ] && [ "$(rc_of own-r0)" != 124 ] || bad "own: rank 0 exited $(rc_of own-r0)"
[ $(($(secs_of own-r0) - $(secs_of own-r1))) -le 10 ] ||
	bad "own: rank 0 ended $(($(secs_of own-r0) - $(secs_of own-r1))) s after rank 1"

# and mid-training: rank 1's copy of a kiln pack (the same path, as on
# another node) has corrupt records, which it reads in its first epoch
# (on_error = fail) while rank 0 waits in a collective
{
	ini run seed=5 threads=1 comm=gloo
	ini data source=records path=rec
	ini_layers flat:flatten fc1:linear:out=64 r1:relu fc2:linear:out=10 loss:softmax_xent
	ini train epochs=40 batch=32 lr=0.05 momentum=0.9 log_every=16 eval=0 checkpoint_every=1000
	ini dist bucket_mb=0.05 timeout=60 heartbeat=60
} > "$tmp/rec.ini"
ini_fmnist limit=2048 path="$fm" > "$tmp/pack.ini"
mkdir "$tmp/mid-w0" "$tmp/mid-w1"
"$kiln" pack "$tmp/pack.ini" --out "$tmp/mid-w0/rec" > "$tmp/pack.log" 2>&1 ||
	{ cat "$tmp/pack.log"; bad "kiln pack"; }
cp -r "$tmp/mid-w0/rec" "$tmp/mid-w1/"
# (records of 808 bytes from offset 80, tests/dist_data.sh: 200 of them
# with a payload byte flipped, a CRC32C mismatch each)
/usr/bin/python3 - "$tmp/mid-w1/rec/train-00000.krec" <<'PYEOF' || bad "corrupting the shard"
import sys
with open(sys.argv[1], "r+b") as f:
    for i in range(1000, 1200):
        at = 80 + i * 808 + 24 + 10
        f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0xFF]))
PYEOF
ini_save=$ini
ini="$tmp/rec.ini"
two mid "" ""
ini=$ini_save
grep -q "^kiln: error: rank 1 of 2: \[data\] sample [0-9]*: .*CRC32C mismatch" "$tmp/mid-r1.log" ||
	{ bad "mid: rank 1 did not fail on a corrupt record"; grep error "$tmp/mid-r1.log"; }
line=$(grep "^kiln: error: rank 0 of 2: .*rank 1 (host [^)]*) failed with its own error (its log says why)" "$tmp/mid-r0.log")
echo "mid: rank 0: $(echo "$line" | cut -c1-200)"
[ -n "$line" ] || { bad "mid: rank 0 did not name rank 1 as failed"; grep error "$tmp/mid-r0.log"; }
[ "$(rc_of mid-r0)" != 0 ] && [ "$(rc_of mid-r0)" != 124 ] || bad "mid: rank 0 exited $(rc_of mid-r0)"
[ $(($(secs_of mid-r0) - $(secs_of mid-r1))) -le 10 ] ||
	bad "mid: rank 0 ended $(($(secs_of mid-r0) - $(secs_of mid-r1))) s after rank 1"

# ---- 3. data sets of different sizes ----------------------------------------
/usr/bin/python3 - "$fm" "$tmp/small" <<'PYEOF' || bad "making the smaller data set"
import gzip, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
n = 1000
for name, rec in (("train-images-idx3-ubyte.gz", 784), ("train-labels-idx1-ubyte.gz", 1)):
    b = gzip.open(os.path.join(src, name)).read()
    hdr = 16 if rec > 1 else 8
    out = bytearray(b[:hdr]); out[4:8] = struct.pack(">I", n)
    gzip.open(os.path.join(dst, name), "wb").write(bytes(out) + b[hdr:hdr + n * rec])
PYEOF
cp "$fm"/t10k-* "$tmp/small/"
mkdir "$tmp/size-w0" "$tmp/size-w1"
ln -s "$fm" "$tmp/size-w0/fm"
ln -s "$tmp/small" "$tmp/size-w1/fm"
two size data.path=fm data.path=fm
for r in 0 1; do
	line=$(grep "^kiln: error: rank $r of 2: \[data\]: the ranks. data sets differ in size (rank 0 has 2048, rank 1 has 1000 samples)" "$tmp/size-r$r.log")
	echo "size: rank $r: $(echo "$line" | cut -c1-200)"
	[ -n "$line" ] || { bad "size: rank $r did not name both counts"; grep error "$tmp/size-r$r.log"; }
	[ "$(rc_of size-r$r)" = 3 ] || bad "size: rank $r exited $(rc_of size-r$r), expected 3 (a data error)"
	[ "$(secs_of size-r$r)" -le 40 ] || bad "size: rank $r ended after $(secs_of size-r$r) s"
done
# ---- 4. both ranks fail with their own error at once ------------------------
mkdir "$tmp/both-w0" "$tmp/both-w1"
ln -s "$tmp/trunc" "$tmp/both-w0/fm"
ln -s "$tmp/trunc" "$tmp/both-w1/fm"
env1=KILN_TEST_CLOSE_DELAY_MS=3000
two both "train.epochs=40 data.path=fm" "train.epochs=40 data.path=fm"
env1=
for r in 0 1; do
	line=$(grep "^kiln: error: " "$tmp/both-r$r.log" | head -1)
	echo "both: rank $r: $(echo "$line" | cut -c1-200)"
	echo "$line" | grep -q "fm/train-images-idx3-ubyte.gz: truncated data" ||
		{ bad "both: rank $r's first error is not its own truncated file"; grep error "$tmp/both-r$r.log"; }
	grep -q "failed with its own error" "$tmp/both-r$r.log" &&
		bad "both: rank $r names the other as failed"
	[ "$(rc_of both-r$r)" != 0 ] && [ "$(rc_of both-r$r)" != 124 ] || bad "both: rank $r exited $(rc_of both-r$r)"
	[ "$(secs_of both-r$r)" -le 40 ] || bad "both: rank $r ended after $(secs_of both-r$r) s"
done
# ---- 5. data sets of the same size, other contents -------------------------
# uncompressed IDX files of 3000 samples (the files' first and last 4 KiB
# are what a rank reads of them, core/data_identity.c): the same on rank 0
# and in "same", one pixel of sample 0 flipped in "head", of sample 2999 in
# "tail"
/usr/bin/python3 - "$fm" "$tmp" <<'PYEOF' || bad "making the copies"
import gzip, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
n = 3000
img = bytearray(gzip.open(os.path.join(src, "train-images-idx3-ubyte.gz")).read()[:16 + n * 784])
lab = bytearray(gzip.open(os.path.join(src, "train-labels-idx1-ubyte.gz")).read()[:8 + n])
img[4:8] = struct.pack(">I", n); lab[4:8] = struct.pack(">I", n)
for name, flip in (("ref", None), ("same", None), ("head", 16 + 300), ("tail", 16 + (n - 1) * 784 + 300)):
    d = os.path.join(dst, "copy-" + name); os.makedirs(d)
    b = bytearray(img)
    if flip is not None:
        b[flip] ^= 0x40
    open(os.path.join(d, "train-images-idx3-ubyte"), "wb").write(b)
    open(os.path.join(d, "train-labels-idx1-ubyte"), "wb").write(lab)
PYEOF
for n in same head tail; do
	mkdir "$tmp/$n-w0" "$tmp/$n-w1"
	ln -s "$tmp/copy-ref" "$tmp/$n-w0/fm"
	ln -s "$tmp/copy-$n" "$tmp/$n-w1/fm"
	two $n "data.path=fm train.epochs=1" "data.path=fm train.epochs=1"
done
for r in 0 1; do
	[ "$(rc_of same-r$r)" = 0 ] || { bad "same: rank $r exited $(rc_of same-r$r)"; grep error "$tmp/same-r$r.log"; }
	for n in head:first tail:last; do
		line=$(grep "^kiln: error: rank $r of 2: \[data\]: rank 1's data differ from rank 0's: fm/train-images-idx3-ubyte: its ${n#*:} 4096 bytes differ (CRC32C [0-9a-f]* on rank 0, [0-9a-f]* on rank 1): every rank must read the same data" "$tmp/${n%:*}-r$r.log")
		echo "${n%:*}: rank $r: $(echo "$line" | cut -c1-200)"
		[ -n "$line" ] || { bad "${n%:*}: rank $r did not name the file and its ${n#*:} bytes"; grep error "$tmp/${n%:*}-r$r.log"; }
		[ "$(rc_of ${n%:*}-r$r)" = 3 ] || bad "${n%:*}: rank $r exited $(rc_of ${n%:*}-r$r), expected 3 (a data error)"
	done
done
# ---- 6. rank 0 refuses its out_dir -----------------------------------------
mkdir -p "$tmp/outdir-r0"
echo "{\"event\": \"train\"}" > "$tmp/outdir-r0/metrics.jsonl" # (an empty one is a failed start, replaced)
two outdir "" ""
# (named as every rank's own error is: before session 36 rank 0's read
# "kiln: error: [run] out_dir ...", without "rank 0 of 2: ")
grep -q "^kiln: error: rank 0 of 2: \[run\] out_dir '[^']*' holds an earlier run" "$tmp/outdir-r0.log" ||
	{ bad "outdir: rank 0 did not refuse its out_dir naming its rank"; grep error "$tmp/outdir-r0.log"; }
line=$(grep "^kiln: error: rank 1 of 2: rank 0 (host [^)]*) failed with its own error" "$tmp/outdir-r1.log")
echo "outdir: rank 1: $(echo "$line" | cut -c1-200)"
[ -n "$line" ] || { bad "outdir: rank 1 did not name rank 0 as failed"; grep error "$tmp/outdir-r1.log"; }
[ "$(echo "$line" | grep -o "failed with its own error" | wc -l)" = 1 ] ||
	bad "outdir: rank 1's message names rank 0's failure more than once"
# ---- 7. rank 0 fails at its data while rank 1 is still opening its own -----
# (a big folder's scan: KILN_TEST_OPEN_DELAY_MS, 6 s): rank 1's watchdog
# ends it within ~1 s naming rank 0, and rank 0 exits within 5 s with its
# own error (before session 35 rank 0 waited 10 s in its teardown for
# rank 1 to leave, which the watchdog's end never told the store, and
# under kiln launch the launcher's stop, at rank 1's exit, swallowed
# rank 0's error: review of session 35)
mkdir "$tmp/slow-w0" "$tmp/slow-w1"
ln -s "$tmp/trunc" "$tmp/slow-w0/fm"
ln -s "$fm" "$tmp/slow-w1/fm"
env1=KILN_TEST_OPEN_DELAY_MS=6000
two slow "data.path=fm" "data.path=fm"
env1=
line=$(grep "^kiln: error: rank 0 of 2: [^ ]*fm/train-images-idx3-ubyte.gz: truncated data" "$tmp/slow-r0.log")
echo "slow: rank 0: $(echo "$line" | cut -c1-200)"
[ -n "$line" ] || { bad "slow: rank 0 did not print its own error"; grep error "$tmp/slow-r0.log"; }
[ "$(secs_of slow-r0)" -lt 5 ] || bad "slow: rank 0 ended after $(secs_of slow-r0) s (its teardown waited for rank 1)"
line=$(grep "^kiln: error: rank 1 of 2: watchdog: rank 0 (host [^)]*) failed with its own error (its log says why); ending this rank" "$tmp/slow-r1.log")
echo "slow: rank 1: $(echo "$line" | cut -c1-200)"
[ -n "$line" ] || { bad "slow: rank 1 did not name rank 0 as failed"; grep error "$tmp/slow-r1.log"; }
[ "$(rc_of slow-r1)" != 0 ] && [ "$(rc_of slow-r1)" != 124 ] || bad "slow: rank 1 exited $(rc_of slow-r1)"
[ "$(secs_of slow-r1)" -lt 5 ] || bad "slow: rank 1 ended after $(secs_of slow-r1) s (not by its watchdog)"
# ---- 8. gzip files: their contents by the trailer, not their header -------
# 3000 samples gzipped (level 9, no name, time stamp 0) on rank 0; in
# "gzn" the same with another time stamp (`gzip -n` on another day: the
# same size, 4 bytes of the header differ), in "gzname" with the file's
# name in the header too (identical data stored otherwise: before session
# 35 "its first 4096 bytes differ" and "... bytes on rank 0 but ..."); in "gzmid" one pixel of sample 1500 flipped (the
# middle of the file: the trailer's CRC32 of the contents tells); in
# "gzlev" the same contents at level 1; in "gzplain" the files
# uncompressed, which the idx source reads when no .gz is there
/usr/bin/python3 - "$fm" "$tmp" <<'PYEOF' || bad "making the gzip copies"
import gzip, io, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
n = 3000
img = bytearray(gzip.open(os.path.join(src, "train-images-idx3-ubyte.gz")).read()[:16 + n * 784])
lab = bytearray(gzip.open(os.path.join(src, "train-labels-idx1-ubyte.gz")).read()[:8 + n])
img[4:8] = struct.pack(">I", n); lab[4:8] = struct.pack(">I", n)
def gz(data, name="", mtime=0, level=9):
    b = io.BytesIO()
    with gzip.GzipFile(filename=name, mode="wb", fileobj=b, mtime=mtime, compresslevel=level) as f:
        f.write(data)
    return b.getvalue()
for d, flip, name, mtime, level in (("gzref", None, "", 0, 9), ("gzn", None, "", 1765000000, 9),
                                    ("gzname", None, "train-images-idx3-ubyte", 1765000123, 9),
                                    ("gzmid", 16 + 1500 * 784 + 300, "", 0, 9),
                                    ("gzlev", None, "", 0, 1), ("gzplain", None, None, 0, 0)):
    os.makedirs(os.path.join(dst, d))
    b = bytearray(img)
    if flip is not None:
        b[flip] ^= 0x40
    for f, data in (("train-images-idx3-ubyte", bytes(b)), ("train-labels-idx1-ubyte", bytes(lab))):
        if name is None:
            open(os.path.join(dst, d, f), "wb").write(data)
        else:
            open(os.path.join(dst, d, f + ".gz"), "wb").write(gz(data, name and f, mtime, level))
PYEOF
for n in gzn gzname gzmid gzlev gzplain; do
	mkdir "$tmp/$n-w0" "$tmp/$n-w1"
	ln -s "$tmp/gzref" "$tmp/$n-w0/fm"
	ln -s "$tmp/$n" "$tmp/$n-w1/fm"
	two $n "data.path=fm train.epochs=1" "data.path=fm train.epochs=1"
done
f=fm/train-images-idx3-ubyte
for r in 0 1; do
	for n in gzn gzname; do
		[ "$(rc_of $n-r$r)" = 0 ] || { bad "$n: rank $r exited $(rc_of $n-r$r)"; grep error "$tmp/$n-r$r.log"; }
	done
	for n in "gzmid:$f.gz: its contents differ, by its gzip trailer (contents 2352016 bytes, CRC32 [0-9a-f]* on rank 0; contents 2352016 bytes, CRC32 [0-9a-f]* on rank 1)" \
		"gzlev:$f.gz: the same contents by its gzip trailer (contents 2352016 bytes, CRC32 [0-9a-f]*), compressed otherwise ([0-9]* compressed bytes after its header on rank 0 but [0-9]* on rank 1): files are compared, not what they inflate to: .gzip -dc FILE | cksum. on each node tells whether their contents are the same; store the same file on every rank" \
		"gzplain:rank 0 reads $f.gz where rank 1 reads $f (another list of files: the same name, gzip-compressed on one rank only; files are compared, not what they inflate to: store them alike on every rank, all compressed or none)"; do
		line=$(grep "^kiln: error: rank $r of 2: \[data\]: rank 1's data differ from rank 0's: ${n#*:}: every rank must read the same data" "$tmp/${n%%:*}-r$r.log")
		echo "${n%%:*}: rank $r: $(echo "$line" | cut -c1-200)"
		[ -n "$line" ] || { bad "${n%%:*}: rank $r's message"; grep error "$tmp/${n%%:*}-r$r.log"; }
		[ "$(rc_of ${n%%:*}-r$r)" = 3 ] || bad "${n%%:*}: rank $r exited $(rc_of ${n%%:*}-r$r), expected 3 (a data error)"
	done
done
[ $fail = 0 ] && echo "PASS"
exit $fail
