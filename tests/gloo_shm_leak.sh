#!/bin/sh
# tests/gloo_shm_leak.sh - kiln-gloo's shared-memory object is unlinked when
# rank 0 cannot size it (session 30).  posix_fallocate on a full /dev/shm
# fails (ENOSPC); here RLIMIT_FSIZE (1 MiB, SIGXFSZ ignored) makes it fail
# the same way without root (EFBIG).  The run falls back to Gloo's
# collectives and trains; the object rank 0 made (named in its message)
# must be gone: before, open_object dropped its name on failure and no one
# unlinked it, one empty /dev/shm/kiln-gloo-<pid>-... per run.
name=gloo-shm-leak needs=gloo
. "$(dirname "$0")/dist_common.sh"
[ -d /dev/shm ] || { echo "SKIP: no /dev/shm"; exit 77; }
ini="$tmp/mlp.ini"
mlp_ini "$ini" 1 60 gloo
timeout 120 "$kiln" launch -n 2 -- /usr/bin/python3 -c '
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
os.execv(sys.argv[1], sys.argv[1:])' "$kiln" train "$ini" run.out_dir="$tmp/run" train.max_steps=4 \
	> "$tmp/run.log" 2>&1
rc=$?
[ "$rc" = 0 ] || { bad "exit $rc, expected 0 (Gloo's collectives)"; tail -5 "$tmp/run.log"; }
obj=$(sed -n 's/.*rank 0: posix_fallocate(\/\(kiln-gloo-[0-9]*-[0-9a-f]*\), [0-9]*): File too large.*/\1/p' "$tmp/run.log" | head -1)
if [ -z "$obj" ]; then
	bad "no 'posix_fallocate(/kiln-gloo-...): File too large' in the log"
	grep -i "shared memory\|shm" "$tmp/run.log" | head -3
elif [ -e "/dev/shm/$obj" ]; then
	bad "/dev/shm/$obj is left behind"
	rm -f "/dev/shm/$obj"
else
	echo "posix_fallocate failed (EFBIG): /dev/shm/$obj unlinked"
fi
exit $fail
