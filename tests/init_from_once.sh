#!/bin/sh
# tests/init_from_once.sh - [model] init_from is opened once: its kind
# (kiln checkpoint, llm.c's model file, safetensors) is told from its first
# bytes and its tensors read through that one descriptor.  Before session
# 38 it was opened up to three times (the checkpoint magic, llm.c's magic,
# then the reader), so a file removed between the opens was "cannot open:
# No such file or directory", exit 1, not the documented "[model]
# init_from: PATH: no such file", exit 2 (README.md, "Exit codes"), and a
# file replaced between them was read as the other one.
#
# An LD_PRELOAD shim built here counts the open()s of the path in
# SHIM_PATH (in SHIM_LOG, a line each) and, at the SHIM_AT'th, first
# removes that file (SHIM_DO=rm) or renames SHIM_WITH over it
# (SHIM_DO=swap).  `kiln export` with no checkpoint in out_dir exports the
# weights init_from gives: removed at the first open: exit 2, no such
# file; removed or replaced with a text file at a second open (there is
# none now): the export of the untouched file, byte for byte, one open.
name=init_from_once
. "$(dirname "$0")/lib.sh"
CC=${CC:-cc}
need_source idx
data="$srcdir/tests/data"

cat >"$tmp/shim.c" <<'CEOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int opens;
/* path's open number n: logged; the file removed or replaced at SHIM_AT */
static void seen(const char *path)
{
	const char *want = getenv("SHIM_PATH"), *at = getenv("SHIM_AT");
	const char *what = getenv("SHIM_DO"), *with = getenv("SHIM_WITH");
	if (!want || !path || strcmp(path, want))
		return;
	int n = __atomic_add_fetch(&opens, 1, __ATOMIC_RELAXED);
	FILE *log = getenv("SHIM_LOG") ? fopen(getenv("SHIM_LOG"), "a") : NULL;
	if (log) {
		fprintf(log, "open %d\n", n);
		fclose(log);
	}
	if (!at || atoi(at) != n || !what)
		return;
	if (!strcmp(what, "rm"))
		unlink(path);
	else if (!strcmp(what, "swap") && with)
		rename(with, path);
}
#define SHIM(NAME, ...)                                                        \
	int NAME(__VA_ARGS__, int flags, ...)                                  \
	{                                                                      \
		static int (*real)();                                          \
		mode_t mode = 0;                                               \
		if (flags & (O_CREAT | O_TMPFILE)) {                           \
			va_list ap;                                            \
			va_start(ap, flags);                                   \
			mode = va_arg(ap, mode_t);                             \
			va_end(ap);                                            \
		}                                                              \
		if (!real)                                                     \
			*(void **)&real = dlsym(RTLD_NEXT, #NAME);             \
		seen(path);                                                    \
		return CALL;                                                   \
	}
#define CALL real(path, flags, mode)
SHIM(open, const char *path)
SHIM(open64, const char *path)
#undef CALL
#define CALL real(dirfd, path, flags, mode)
SHIM(openat, int dirfd, const char *path)
SHIM(openat64, int dirfd, const char *path)
CEOF
$CC -shared -fPIC -o "$tmp/shim.so" "$tmp/shim.c" -ldl || fail "cannot build the open() shim"

common="data.path=$data run.out_dir=$tmp/empty"
# a checkpoint to start from too: 5 steps of tests/data/tr_cnn.ini
kiln 0 train "$data/tr_cnn.ini" "data.path=$data" \
	"model.init_from=$data/tr_cnn_init.safetensors" "run.out_dir=$tmp/run"
[ -f "$tmp/run/checkpoints/ckpt-5.kiln" ] || fail "no checkpoint"
echo "not a weights file" >"$tmp/text"

# shim WANT AT DO FILE: kiln export with [model] init_from = $tmp/init
# (a copy of FILE, made anew), the shim doing DO at its AT'th open; the
# opens counted in $tmp/opens
shim() {
	cp "$4" "$tmp/init"
	cp "$tmp/text" "$tmp/with"
	rm -f "$tmp/opens" "$tmp/got.safetensors"
	last="export $common model.init_from=$tmp/init --safetensors $tmp/got.safetensors (at open $2 of init_from: $3)"
	LD_PRELOAD="$tmp/shim.so" SHIM_PATH="$tmp/init" SHIM_AT=$2 SHIM_DO=$3 \
		SHIM_WITH="$tmp/with" SHIM_LOG="$tmp/opens" \
		"$kiln" export "$data/tr_cnn.ini" $common "model.init_from=$tmp/init" \
		--safetensors "$tmp/got.safetensors" >"$out" 2>"$err"
	rc=$?
	[ $rc -eq "$1" ] || fail "exit $rc, expected $1"
}
for kind in safetensors checkpoint; do
	if [ $kind = safetensors ]; then f="$data/tr_cnn_init.safetensors"; else f="$tmp/run/checkpoints/ckpt-5.kiln"; fi
	kiln 0 export "$data/tr_cnn.ini" $common "model.init_from=$f" --safetensors "$tmp/want.safetensors"
	shim 2 1 rm "$f"
	stderr_has "[model] init_from: $tmp/init: no such file"
	echo "ok: $kind init_from removed as it is opened: exit 2, no such file"
	for do in rm swap; do
		shim 0 2 $do "$f"
		[ "$(cat "$tmp/opens")" = "open 1" ] || fail "init_from opened $(wc -l <"$tmp/opens") times"
		cmp -s "$tmp/got.safetensors" "$tmp/want.safetensors" ||
			fail "the export differs from the untouched file's"
		echo "ok: $kind init_from opened once: $do after it changes nothing"
	done
done
echo "PASS"
