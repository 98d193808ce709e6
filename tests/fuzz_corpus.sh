#!/bin/sh
# tests/fuzz_corpus.sh - every fuzz target's committed corpus as a
# regression test: tests/fuzz/fuzz_NAME (linked with tests/fuzz/driver.c,
# no libFuzzer needed) runs each file of tests/fuzz/corpus/NAME once; a
# crash, a hang (the harness aborts) or a missing corpus fails.
# (docs/fuzzing.md; `make fuzz` is the fuzzing itself.)
name=fuzz_corpus
. "$(dirname "$0")/lib.sh"

fail=0
for t in config checkpoint safetensors store sources; do
	bin="$top_builddir/tests/fuzz/fuzz_$t"
	corpus="$srcdir/tests/fuzz/corpus/$t"
	if [ ! -x "$bin" ]; then
		echo "fuzz_$t: not built (its plugin is not configured)"
		continue
	fi
	n=$(ls "$corpus" | wc -l)
	if [ "$n" -lt 1 ]; then
		echo "FAIL: $corpus is empty"
		fail=1
		continue
	fi
	# (without make check's KILN_STORE_TOKEN, as `make fuzz` runs them:
	# fuzz_init sets one; fuzz_store aborted on its first input before)
	if ! out=$(env -u KILN_STORE_TOKEN "$bin" "$corpus" 2>&1); then
		echo "$out" | tail -20
		echo "FAIL: fuzz_$t over $corpus"
		fail=1
		continue
	fi
	echo "$out"
	case "$out" in
	*": $n inputs"*) ;;
	*) echo "FAIL: fuzz_$t ran not all $n inputs"; fail=1 ;;
	esac
done
exit $fail
