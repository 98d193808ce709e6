#!/bin/sh
# tests/launch_pack_opts.sh - `kiln launch` and `kiln pack` (both formats)
# read their options with the parser the other commands share (cli_opt,
# cli_opt_int, cli_flag in cli/kiln.c; their own loops before session 33):
# every option still accepted in both forms, --opt VALUE and --opt=VALUE,
# and their usage errors the other commands' (exit 2, the option named):
# "kiln: error: unknown option 'X'" then the usage, "NAME needs a value",
# "NAME 'V': expected an integer in [LO, HI]", "NAME given twice".
name=launch_pack_opts
. "$(dirname "$0")/lib.sh"
c="$srcdir/tests/config/cli.ini"

[ -x "$kiln" ] || { echo "FAIL: $kiln not built"; exit 99; }

# ---- accepted syntax: the same before and after ------------------------------
kiln 0 launch --nproc 1 --nnodes 1 --node-rank 0 --grace 5 --max-restarts 0 --bind none -- true
stderr_has "ranks 0..0 of 1"
stderr_has "ranks not bound (--bind none)"
kiln 0 launch --nproc=2 --nnodes=1 --node-rank=0 --grace=5 --max-restarts=0 --bind=core -- true
stderr_has "ranks 0..1 of 2"
kiln 0 launch -n 1 -- true
kiln 0 launch -n=2 -- true
stderr_has "ranks 0..1 of 2"
# --master's value reaches its own check in both forms
kiln 2 launch -n 1 --master nohost -- true
stderr_has "--master 'nohost': expected HOST:PORT"
kiln 2 launch -n 1 --master=nohost -- true
stderr_has "--master 'nohost': expected HOST:PORT"
# the command kiln launch runs gets the user's ulimit -n, not the raised
# soft limit kiln itself reads its shards under (cli/kiln.c; a reviewer's
# find in session 38: `sh -c 'ulimit -Sn'` said the hard limit)
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 512 ]; then
	got=$(ulimit -Sn 512 && "$kiln" launch -n 1 -- sh -c 'ulimit -Sn' 2>/dev/null)
	[ "$got" = 512 ] || fail "kiln launch's command had ulimit -n '$got', not the user's 512"
	checks=$((checks + 1))
fi
# options after `--` are the command's
kiln 0 launch -n 1 -- sh -c 'exit 0' --bogus --nproc
kiln 0 launch --help
stdout_has "usage: kiln launch -n N"
kiln 2 launch --nnodes 2 --node-rank 2 -n 1 -- true
stderr_has "--node-rank 2 with --nnodes 2"

# every option of kiln pack in both forms: parsed, then the config is read
kiln 2 pack "$tmp/none.ini" --out "$tmp/o" --section data.eval --split a --shard-size 1M \
	--store jpeg --quality 80 --resize 8 --workers 2 --force --format records
stderr_has "none.ini"
kiln 2 pack "$tmp/none.ini" --out="$tmp/o" --section=data --split=a --shard-size=1M \
	--store=png --resize=8 --workers=2 --format=folder
stderr_has "none.ini"
[ ! -e "$tmp/o" ] || fail "a refused pack made its directory"
# --format tokens, every option in both forms
printf 'hello world, hello kiln\n' >"$tmp/in.txt"
kiln 0 pack --format tokens "$tmp/in.txt" --out "$tmp/t" --split a --val-split b \
	--val-fraction 0.5 --shard-tokens 1000 --force
stdout_has "a"
[ -f "$tmp/t/a-000000.bin" ] && [ -f "$tmp/t/b-000000.bin" ] || fail "no shards: $(ls "$tmp/t")"
kiln 0 pack --format=tokens "$tmp/in.txt" --out="$tmp/t" --split=a --val-split=b \
	--val-fraction=0.5 --shard-tokens=1000 --force
kiln 2 pack --format tokens "$tmp/in.txt" --out "$tmp/t2" --vocab="$tmp/v.json"
stderr_has "byte-pair encoding needs both --vocab and --merges"
kiln 2 pack --format tokens "$tmp/in.txt" --out "$tmp/t2" --merges "$tmp/m.txt"
stderr_has "byte-pair encoding needs both --vocab and --merges"

# ---- the shared parser's errors (each command's own wording before) -----------
# unknown: ARGS... whose first line of stderr is the unknown option '--bogus',
# then the command's usage
unknown() {
	kiln 2 "$@"
	[ "$(head -n 1 "$err")" = "kiln: error: unknown option '--bogus'" ] ||
		fail "the first line of stderr is '$(head -n 1 "$err")'"
	stderr_has "usage: kiln $1"
}
unknown launch --bogus -- true
unknown pack "$c" --out "$tmp/o" --bogus
kiln 2 pack "$c" --bogus=1 --out "$tmp/o"
stderr_has "kiln: error: unknown option '--bogus=1'"
kiln 2 launch -n 2 --bogus=3 -- true
stderr_has "kiln: error: unknown option '--bogus=3'"
unknown pack --format tokens "$tmp/in.txt" --out "$tmp/o" --bogus
unknown pack --format tokens "$tmp/in.txt" --bogus x --out "$tmp/o"

# needs_value ARGS... FLAG: FLAG last, without its value
needs_value() {
	kiln 2 "$@"
	eval "flag=\${$#}"
	stderr_has "kiln: error: $flag needs a value"
}
for f in -n --nproc --nnodes --node-rank --grace --max-restarts --bind --master; do
	needs_value launch $f
done
for f in --out --section --split --shard-size --store --quality --resize --workers --format; do
	needs_value pack "$c" $f
done
for f in --out --vocab --merges --split --val-split --val-fraction --shard-tokens; do
	needs_value pack --format tokens "$tmp/in.txt" $f
done

# not_int ARGS... FLAG VALUE: refused naming both and the range
not_int() {
	kiln 2 "$@"
	eval "flag=\${$(($# - 1))} v=\${$#}"
	stderr_has "kiln: error: $flag '$v': expected an integer in ["
}
not_int launch -n 2.5
stderr_has "kiln: error: -n '2.5': expected an integer in [1, 1048576]"
not_int launch --nproc x
not_int launch -n 1 --nnodes 0
not_int launch -n 1 --node-rank -1
stderr_has "--node-rank '-1': expected an integer in [0, 1048576]"
not_int launch -n 1 --grace 1e3
not_int launch -n 1 --max-restarts 99999999999
not_int pack "$c" --out "$tmp/o" --quality 0
stderr_has "--quality '0': expected an integer in [1, 100]"
not_int pack "$c" --out "$tmp/o" --resize 70000
not_int pack "$c" --out "$tmp/o" --workers 1.5
stderr_has "--workers '1.5': expected an integer in [1, 256]"
not_int pack --format tokens "$tmp/in.txt" --out "$tmp/o" --shard-tokens 0
stderr_has "--shard-tokens '0': expected an integer in [1, 2147483647]"
kiln 2 launch -n=2.5 -- true
stderr_has "kiln: error: -n '2.5': expected an integer in [1, 1048576]"

# an option given twice, under either of its names
kiln 2 launch -n 2 --nproc=3 -- true
stderr_has "kiln: error: --nproc given twice: give it once"
kiln 2 launch --nproc 2 -n 3 -- true
stderr_has "kiln: error: --nproc given twice: give it once"
kiln 2 launch -n 1 --grace 2 --grace=3 -- true
stderr_has "kiln: error: --grace given twice: give it once"
kiln 2 pack --format tokens "$tmp/in.txt" --out "$tmp/o" --val-fraction 0.1 --val-fraction=0.2
stderr_has "kiln: error: --val-fraction given twice: give it once"

# a flag takes no value; values of their own kind named
kiln 2 pack "$c" --out "$tmp/o" --force=yes
stderr_has "kiln: error: --force takes no value ('--force=yes')"
kiln 2 pack --format tokens "$tmp/in.txt" --out "$tmp/o" --force=1
stderr_has "kiln: error: --force takes no value ('--force=1')"
kiln 2 launch -n 1 --bind all -- true
stderr_has "kiln: error: --bind 'all': choose core or none"
kiln 2 pack "$c" --out "$tmp/o" --store gif
stderr_has "kiln: error: --store 'gif': choose raw, jpeg or png"
kiln 2 pack --format tokens "$tmp/in.txt" --out "$tmp/o" --val-fraction 1.5
stderr_has "kiln: error: --val-fraction '1.5': a fraction in 0..0.99"
# a word where launch wants an option: the command goes after `--`
kiln 2 launch -n 1 kiln train x.ini
stderr_has "kiln: error: unexpected argument 'kiln': the command follows \`--\`"
stderr_has "usage: kiln launch"
[ ! -e "$tmp/o" ] || fail "a refused pack wrote $tmp/o"

echo "PASS: $checks kiln runs"
exit 0
