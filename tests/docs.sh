#!/bin/sh
# docs/config.md must equal `kiln config --doc`: every key is documented, and
# the documentation cannot drift from the schema tables in the code; nor can
# docs/checkpoints.md's table of keys safe to change on resume drift from
# core/resume.c's safe_keys.
set -u
: "${srcdir:=.}"
: "${top_builddir:=.}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$top_builddir/kiln" config --doc > "$out"; then
	echo "FAIL: kiln config --doc exited $?"; exit 1
fi
if ! diff -u "$srcdir/docs/config.md" "$out"; then
	echo "FAIL: docs/config.md is stale; regenerate: ./kiln config --doc > docs/config.md"
	exit 1
fi
echo "PASS: docs/config.md matches kiln config --doc"

# docs/checkpoints.md's table of keys safe to change on resume must list
# exactly core/resume.c's safe_keys (section.key, one a line, sorted)
code=$(sed -n '/} safe_keys\[\] = {/,/^};/p' "$srcdir/core/resume.c" |
	grep -o '{ "[^"]*", "[^"]*" }' | sed 's/{ "\([^"]*\)", "\([^"]*\)" }/\1.\2/' | sort)
table=$(sed -n '/^   | section | keys |$/,/^$/p' "$srcdir/docs/checkpoints.md" | tail -n +3 |
	while IFS= read -r row; do
		[ -n "$row" ] || continue
		for s in $(echo "$row" | cut -d'|' -f2 | grep -o '\[[a-z.*]*\]' | tr -d '[]'); do
			for k in $(echo "$row" | cut -d'|' -f3 | grep -o '`[a-z_]*`' | tr -d '`'); do
				echo "$s.$k"
			done
		done
	done | sort)
[ -n "$code" ] || { echo "FAIL: no safe_keys found in core/resume.c"; exit 1; }
if [ "$code" != "$table" ]; then
	echo "FAIL: docs/checkpoints.md's keys safe to change on resume differ from core/resume.c safe_keys:"
	echo "$code" > "$out"
	echo "$table" | diff -u "$out" - | tail -n +3
	exit 1
fi
echo "PASS: docs/checkpoints.md lists core/resume.c's $(echo "$code" | wc -l) keys safe to change on resume"

# docs/distributed.md's multi-process examples must work as written: a run
# of several processes needs the store's token (KILN_STORE_TOKEN, the same
# for every rank; without it each rank stops at once, exit 2), so every
# fenced example that runs srun, mpirun or `kiln launch --nnodes M` sets it
# first (on each node for a `nodeK$` prompt) and every mpirun passes it on
# (-x KILN_STORE_TOKEN); before session 30 the Slurm and mpirun ones did not
bad=$(awk '
	/^```/ { inb = !inb; split("", set); any = 0; next }
	!inb { next }
	{ node = $0 ~ /^[a-z0-9]+\$ / ? $1 : "" }
	/export KILN_STORE_TOKEN/ { set[node] = 1; any = 1 }
	/(^|[ $])(srun|mpirun) / || /kiln launch .*--nnodes [0-9]/ {
		if (!(node != "" ? set[node] : any)) print FILENAME ":" NR ": runs without KILN_STORE_TOKEN set: " $0
	}
	/(^|[ $])mpirun / && !/-x KILN_STORE_TOKEN/ { print FILENAME ":" NR ": mpirun without -x KILN_STORE_TOKEN: " $0 }
' "$srcdir/docs/distributed.md")
if [ -n "$bad" ]; then
	echo "FAIL: docs/distributed.md's multi-process examples lack the store's token:"
	echo "$bad"
	exit 1
fi
echo "PASS: docs/distributed.md's srun, mpirun and multi-node kiln launch examples set KILN_STORE_TOKEN"

# every docs/NAME.md that README.md, docs/, the headers and the sources name
# must exist (core/proto/ is ONNX's generated code, naming ONNX's docs);
# before session 38 kiln.h, core/summary.c and cli/cmd_summary.c named a
# docs/summary.md that never was (`kiln summary` is in docs/report.md)
bad=$(cd "$srcdir" && grep -rnoE 'docs/[A-Za-z0-9_.-]+\.md' README.md docs include cli core plugins \
	--include='*.md' --include='*.[ch]' --include='*.ini' | grep -v '^core/proto/' |
	while IFS=: read -r f l ref; do [ -f "$ref" ] || echo "$f:$l: $ref"; done)
if [ -n "$bad" ]; then
	echo "FAIL: references to docs that do not exist:"
	echo "$bad"
	exit 1
fi
echo "PASS: every docs/*.md that README.md, docs/, include/, cli/, core/ and plugins/ name exists"

# README.md's commands (lines starting `kiln` or `./kiln`) that read
# runs/NAME/checkpoints/ckpt-N.kiln must follow, in the same fenced block,
# a `kiln train` with checkpoint_every=M (M dividing N) and keep_last=0,
# and no `kiln train` between them that keeps fewer (keep_last's default 3 deletes ckpt-N once newer ones come);
# before session 38 `kiln eval ... ckpt-1000.kiln` followed a run of 7020
# steps keeping the newest 3
bad=$(awk '
	/^```/ { inb = !inb; every = 0; keep0 = 0; next }
	!inb { next }
	!/^(\.\/)?kiln / { next }
	/kiln train / && !/init_from=/ {
		if (match($0, /checkpoint_every=[0-9]+/)) every = substr($0, RSTART + 17, RLENGTH - 17) + 0
		keep0 = $0 ~ /keep_last=0/
	}
	/checkpoints\/ckpt-[0-9]+\.kiln/ {
		match($0, /ckpt-[0-9]+\.kiln/); n = substr($0, RSTART + 5, RLENGTH - 10) + 0
		if (!every || n % every || !keep0)
			print FILENAME ":" NR ": ckpt-" n ".kiln: no run before it in the block keeps it: " $0
	}
' "$srcdir/README.md")
if [ -n "$bad" ]; then
	echo "FAIL: README.md reads checkpoints its commands do not keep:"
	echo "$bad"
	exit 1
fi
echo "PASS: README.md's commands read only checkpoints its runs keep"

# the docs' commands (lines starting `kiln`) that read the CNN example's
# runs/fashion_mnist_cnn/checkpoints/ckpt-N.kiln name the one its run
# writes after its last step: [train] epochs x (60,000 Fashion-MNIST
# training images / batch, the last partial batch dropped); before session
# 38 docs/inference.md quantized ckpt-7035.kiln, which no run writes
cnn="$srcdir/examples/fashion_mnist_cnn.ini"
ep=$(sed -n '/^\[train\]/,/^\[/s/^epochs *= *\([0-9]*\).*/\1/p' "$cnn")
bs=$(sed -n '/^\[train\]/,/^\[/s/^batch *= *\([0-9]*\).*/\1/p' "$cnn")
last=$((ep * (60000 / bs)))
bad=$(grep -nE '^ *(\./)?kiln .*runs/fashion_mnist_cnn/checkpoints/ckpt-[0-9]+\.kiln' "$srcdir"/docs/*.md |
	grep -v "/ckpt-$last\.kiln")
if [ -n "$bad" ]; then
	echo "FAIL: the docs read a CNN checkpoint other than ckpt-$last.kiln, the last its run writes:"
	echo "$bad"
	exit 1
fi
echo "PASS: the docs' commands read the CNN run's last checkpoint, ckpt-$last.kiln"

# docs/plugins.md's sample of `kiln plugins` ("What `kiln plugins` prints")
# lists today's built-in layers and optimizers with today's ABI (those rows
# do not depend on the build's options or the machine); before session 38
# it was ABI 2.2 with 18 layers, no transformer or RNN layers
rows() { awk '$1 == "layer" || $1 == "optim" { print $1, $2, $3 }'; }
doc=$(sed -n '/^### What `kiln plugins` prints$/,/^## /p' "$srcdir/docs/plugins.md" | rows)
now=$("$top_builddir/kiln" plugins 2> /dev/null | rows)
[ -n "$now" ] || { echo "FAIL: kiln plugins listed no layer or optim"; exit 1; }
if [ "$doc" != "$now" ]; then
	echo "FAIL: docs/plugins.md's sample of kiln plugins differs from today's layer and optim rows:"
	echo "$now" > "$out"
	echo "$doc" | diff -u "$out" - | tail -n +3
	exit 1
fi
echo "PASS: docs/plugins.md's sample of kiln plugins lists today's $(echo "$now" | wc -l) built-in layers and optimizers"

# docs/rnn.md's seq2seq result and docs/pipeline.md's unsplit row quote one
# run: the same held-out token accuracy for epochs 1-3; before session 38
# they quoted different runs (0.7024 ... 0.999875 against ... 0.99994);
# the table of its section only (the classifier's above it has epochs too)
rnn=$(sed -n '/^## The seq2seq example$/,$p' "$srcdir/docs/rnn.md" |
	awk -F'|' '$2 ~ /^ [123] $/ { split($3, w, " "); printf "%s ", w[1] }')
pipe=$(awk -F'|' '$2 ~ /`kiln train examples\/seq2seq.ini`/ { n = split($3, w, ", "); for (i = 1; i <= 3; i++) { sub(/^ /, "", w[i]); printf "%s ", w[i] } }' "$srcdir/docs/pipeline.md")
if [ -z "$rnn" ] || [ "$rnn" != "$pipe" ]; then
	echo "FAIL: docs/rnn.md's seq2seq accuracies by epoch ($rnn) differ from docs/pipeline.md's ($pipe)"
	exit 1
fi
echo "PASS: docs/rnn.md and docs/pipeline.md quote one seq2seq run ($rnn)"
