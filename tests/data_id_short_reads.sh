#!/bin/sh
# tests/data_id_short_reads.sh - the ranks of a data-parallel run compare
# what they read of their data files (core/data_identity.c: each file's
# size, the CRC32C of its first and last 4096 bytes, a gzip file's header
# and trailer) while rank 1's reads of them are cut short, as on a network
# or FUSE file system: the LD_PRELOAD shim (tests/shim_fault.c,
# SHIM_READ_PATH) fails every other read(), pread() of Fashion-MNIST's
# files with EINTR and lets the others transfer half of what they ask.
# The files are the same, so both ranks train two steps and exit 0.
# Before session 40's review the identity's reads
# retried EINTR but took a short read for the file's end: rank 1 hashed
# half of each end and found no trailer, and both ranks refused, exit 3:
# "rank 1's data differ from rank 0's: .../train-images-idx3-ubyte.gz:
# '26421846 gzip 00829ff1 cc9e0091 contents 47040016 bytes, CRC32
# b4f29f28' on rank 0 but '26421846 gzip 1f29e212 3b50d050' on rank 1".
name=data_id_short_reads needs=gloo
. "$(dirname "$0")/dist_common.sh"
export KILN_STORE_TOKEN="${KILN_STORE_TOKEN:-kiln-tests-0123456789abcdef}"
shim_build || { cat "$tmp/shim.err"; fail "cannot build the shim"; }

ini="$tmp/mlp.ini"
mlp_ini "$ini" 5 60 gloo
# rank 1 alone under the shim (kiln launch gives every rank one command)
cat > "$tmp/rank.sh" <<SH
#!/bin/sh
[ "\$KILN_RANK" = 1 ] && export LD_PRELOAD="$shim" SHIM_READ_PATH=fashion-mnist
exec "$kiln" "\$@"
SH
chmod +x "$tmp/rank.sh"

last="launch -n 2 train (rank 1's reads of the data cut short)"
timeout 120 "$kiln" launch -n 2 -- "$tmp/rank.sh" train "$ini" run.out_dir="$tmp/out" \
	train.max_steps=2 data.unzip_cache=none data.eval.unzip_cache=none >"$out" 2>"$err"
rc=$?
grep "error" "$out" "$err" | head -5
[ $rc -eq 0 ] || fail "exit code $rc, expected 0 (the same files on both ranks)"
loss=$(field train_loss "$out")
[ -n "$loss" ] || fail "no train_loss"
echo "ok: kiln $last: exit 0, train_loss $loss"
echo "PASS"
exit 0
