#!/bin/sh
# tests/idx_eintr.sh - the idx source reads its files whole through reads
# that a signal cuts short (EINTR) and that return less than asked: the run
# trains on the same bytes as without.  Before session 37 the files were
# read through zlib's gzread, whose read() loop takes EINTR for an error
# (Z_ERRNO: "cannot read the image file: Interrupted system call", exit 3),
# gzipped or not.
#
# The LD_PRELOAD shim (tests/shim_fault.c, SHIM_READ_PATH) fails every
# other read(), pread() and pread64() of a file whose path holds big_ with
# EINTR, and lets the others transfer at most half of what they ask (at
# least one byte).
name=idx_eintr
. "$(dirname "$0")/lib.sh"
need_source idx
command -v gzip >/dev/null || { echo "SKIP: no gzip"; exit 77; }

shim_build || { cat "$tmp/shim.err"; fail "cannot build the EINTR shim"; }

# the test images and labels 40 times over (120 KiB of images: many
# reads), plain and gzipped
/usr/bin/python3 - "$srcdir/tests/data" "$tmp" <<'PY' || fail "cannot write the IDX files"
import struct, sys
src, dst = sys.argv[1], sys.argv[2]
for name, hdr in (("images", 16), ("labels", 8)):
    b = open("%s/tr_cnn_%s.idx" % (src, name), "rb").read()
    dims = list(struct.unpack(">%dI" % ((hdr - 4) // 4), b[4:hdr]))
    dims[0] *= 40
    open("%s/big_%s.idx" % (dst, name), "wb").write(
        b[:4] + struct.pack(">%dI" % len(dims), *dims) + b[hdr:] * 40)
PY
mkdir "$tmp/gz"
for f in images labels; do gzip -c "$tmp/big_$f.idx" > "$tmp/gz/big_$f.idx.gz"; done

# run LABEL DIR SUFFIX [PRELOAD]: two steps on DIR's files, train_loss in $tmp/loss.LABEL
run() {
	_pre=${4:-}
	last="train on $2 (big_*.idx$3${_pre:+, reads cut short by EINTR})"
	LD_PRELOAD=$_pre SHIM_READ_PATH=big_ timeout -k 5 120 "$kiln" train "$srcdir/tests/data/tr_cnn.ini" \
		"data.path=$2" "data.images=big_images.idx$3" "data.labels=big_labels.idx$3" \
		"data.eval.images=big_images.idx$3" "data.eval.labels=big_labels.idx$3" \
		data.unzip_cache=none data.eval.unzip_cache=none run.out_dir= train.max_steps=2 \
		train.eval=0 >"$out" 2>"$err" || fail "exit $?"
	field train_loss "$out" > "$tmp/loss.$1"
	[ -s "$tmp/loss.$1" ] || fail "no train_loss"
}
for kind in plain gz; do
	if [ $kind = gz ]; then dir="$tmp/gz" sfx=.gz; else dir="$tmp" sfx=; fi
	run $kind "$dir" "$sfx"
	run $kind.eintr "$dir" "$sfx" "$shim"
	cmp -s "$tmp/loss.$kind" "$tmp/loss.$kind.eintr" ||
		fail "$kind: train_loss $(cat "$tmp/loss.$kind.eintr") under EINTR, $(cat "$tmp/loss.$kind") without"
	echo "ok: $kind IDX files read through EINTR and short reads: train_loss $(cat "$tmp/loss.$kind"), as without"
done
