#!/bin/sh
# tests/dist_files.sh - every file git tracks goes into `make dist`'s
# tarball (DISTFILES, a file listed or under a listed directory), but for
# the few that belong to the git checkout alone (below).  Before session 36
# docs/pipeline.md, bench/fuse.sh, bench/pipeline_pair.sh and
# tests/dist_explain_ab.sh were tracked and missing from the tarball.
# A new file needs its EXTRA_DIST line (or _SOURCES, TESTS, ...) in its
# directory's local.mk.  SKIP outside a git checkout (a tarball's tree).
# Environment (tests/local.mk): top_builddir, MAKE; srcdir.
name=dist_files
. "$(dirname "$0")/lib.sh"
MAKE=${MAKE:-make}
command -v git >/dev/null 2>&1 || { echo "SKIP: no git"; exit 77; }
# (the top of one: `make distcheck`'s unpacked tarball may lie inside one)
top=$(git -C "$srcdir" rev-parse --show-toplevel 2>/dev/null) &&
	[ "$(cd "$top" && pwd -P)" = "$(cd "$srcdir" && pwd -P)" ] ||
	{ echo "SKIP: $srcdir is not a git checkout"; exit 77; }
# git's own files
only_git='.gitignore'

# DISTFILES as the Makefile has it, relative to the source tree
printf 'kiln-print-distfiles:\n\t@echo $(srcdir)\n\t@echo $(DISTFILES)\n' >"$tmp/print.mk"
(unset MAKEFLAGS MFLAGS MAKELEVEL; \
 $MAKE -s -C "$top_builddir" -f Makefile -f "$tmp/print.mk" kiln-print-distfiles) >"$tmp/raw" 2>"$tmp/make.err" ||
	{ cat "$tmp/make.err"; fail "could not print the Makefile's DISTFILES"; }
sd=$(sed -n 1p "$tmp/raw")
sed -n '2,$p' "$tmp/raw" | tr ' ' '\n' | awk -v sd="$sd/" 'NF {
	if (index($0, sd) == 1) $0 = substr($0, length(sd) + 1)
	while (substr($0, 1, 2) == "./") $0 = substr($0, 3)
	sub("/+$", ""); print }' | sort -u >"$tmp/dist"
[ -s "$tmp/dist" ] || fail "DISTFILES is empty"

git -C "$srcdir" ls-files >"$tmp/git" || fail "git ls-files failed"
missing=$(awk -v only="$only_git" '
	BEGIN { n = split(only, o, " "); for (i = 1; i <= n; i++) skip[o[i]] = 1 }
	NR == FNR { d[$0] = 1; next }
	($0 in skip) { next }
	{ p = $0; while (p != "") { if (p in d) next; if (!sub("/[^/]*$", "", p)) p = "" }
	  print }' "$tmp/dist" "$tmp/git")
[ -z "$missing" ] || fail "tracked by git but not in make dist's tarball (add them to EXTRA_DIST):
$missing"
echo "PASS: $(wc -l <"$tmp/git") tracked files, all in DISTFILES ($(wc -l <"$tmp/dist") entries)"
exit 0
