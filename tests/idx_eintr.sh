#!/bin/sh
# tests/idx_eintr.sh - the idx source reads its files whole through reads
# that a signal cuts short (EINTR) and that return less than asked: the run
# trains on the same bytes as without.  Before session 37 the files were
# read through zlib's gzread, whose read() loop takes EINTR for an error
# (Z_ERRNO: "cannot read the image file: Interrupted system call", exit 3),
# gzipped or not.
#
# An LD_PRELOAD shim built here fails every other read(), pread() and
# pread64() of a file whose path holds EINTR_PATH with EINTR, and lets the
# others transfer at most half of what they ask (at least one byte).
name=idx_eintr
. "$(dirname "$0")/lib.sh"
CC=${CC:-cc}
need_source idx
command -v gzip >/dev/null || { echo "SKIP: no gzip"; exit 77; }

cat >"$tmp/eintr.c" <<'CEOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static long calls;
static int mine(int fd)
{
	char l[64], p[4096];
	const char *want = getenv("EINTR_PATH");
	snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(l, p, sizeof p - 1);
	if (!want || n <= 0)
		return 0;
	p[n] = 0;
	return strstr(p, want) != NULL;
}
/* 1: fail this call with EINTR; else *n cut to half */
static int cut(int fd, size_t *n)
{
	if (!mine(fd))
		return 0;
	if (__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED) % 2) {
		errno = EINTR;
		return 1;
	}
	if (*n > 1)
		*n /= 2;
	return 0;
}
ssize_t read(int fd, void *b, size_t n)
{
	static ssize_t (*real)(int, void *, size_t);
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "read");
	return cut(fd, &n) ? -1 : real(fd, b, n);
}
ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	static ssize_t (*real)(int, void *, size_t, off_t);
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "pread");
	return cut(fd, &n) ? -1 : real(fd, b, n, off);
}
ssize_t pread64(int fd, void *b, size_t n, off_t off)
{
	static ssize_t (*real)(int, void *, size_t, off_t);
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "pread64");
	return cut(fd, &n) ? -1 : real(fd, b, n, off);
}
CEOF
$CC -shared -fPIC -o "$tmp/eintr.so" "$tmp/eintr.c" -ldl || fail "cannot build the EINTR shim"

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
	LD_PRELOAD=$_pre EINTR_PATH=big_ timeout -k 5 120 "$kiln" train "$srcdir/tests/data/tr_cnn.ini" \
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
	run $kind.eintr "$dir" "$sfx" "$tmp/eintr.so"
	cmp -s "$tmp/loss.$kind" "$tmp/loss.$kind.eintr" ||
		fail "$kind: train_loss $(cat "$tmp/loss.$kind.eintr") under EINTR, $(cat "$tmp/loss.$kind") without"
	echo "ok: $kind IDX files read through EINTR and short reads: train_loss $(cat "$tmp/loss.$kind"), as without"
done
