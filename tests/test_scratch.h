/* tests/test_scratch.h - scratch directories for a Check suite whose
 * tests write run directories: scratch_dir makes $TMPDIR/kiln-TAG-XXXXXX
 * (TAG is SCRATCH_TAG, defined before this header is included) and
 * records it; the checked teardown scratch_teardown removes every one
 * with all it holds.  Check runs a checked teardown only after a test
 * that passed (a failed assertion ends the test's fork first; with
 * CK_FORK=no it runs after a failure too), so a failure leaves its files
 * for a look and a pass leaves nothing in $TMPDIR.  Register the pair
 * with check_add_case(..., scratch_setup, scratch_teardown, ...).
 * One suite per program: the record is this file's static state. */
#ifndef KILN_TESTS_TEST_SCRATCH_H
#define KILN_TESTS_TEST_SCRATCH_H
#include "test_util.h"

#ifndef SCRATCH_TAG
#error "define SCRATCH_TAG (the directories' kiln-TAG- prefix) before test_scratch.h"
#endif

/* the most scratch directories one test makes */
#define SCRATCH_MAX 4
static char scratch[SCRATCH_MAX][1024];
static int n_scratch;

/* A fresh scratch directory into dir (n bytes), removed after the test passes. */
static void scratch_dir(char *dir, size_t n)
{
	ck_assert(n_scratch < SCRATCH_MAX);
	ck_assert(test_tmpdir_make(dir, n, SCRATCH_TAG) != NULL);
	snprintf(scratch[n_scratch++], sizeof scratch[0], "%s", dir);
}

static void scratch_setup(void) { n_scratch = 0; }

static void scratch_teardown(void)
{
	for (int i = 0; i < n_scratch; i++)
		test_tmpdir_remove(scratch[i]);
	n_scratch = 0;
}
#endif
