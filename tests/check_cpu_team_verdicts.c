/* tests/check_cpu_team_verdicts.c - the CPU device's kept outcomes of
 * dnnteam.c's probes (plugins/cpu/team_verdicts.c, linked into this
 * program): whether an op's oneDNN version for a smaller team gives the
 * opening team's bytes, by op, kernel and team.
 *  - cap: more verdicts than CPU_TEAM_VERDICTS (a server calling with
 *    every row count: one op key a size) keep the newest CPU_TEAM_VERDICTS,
 *    each found with its own outcome, the oldest forgotten (probed again),
 *    and the chains a lookup walks stay short (before session 42: one list
 *    without a cap, searched from its head);
 *  - failed: a probe that could not run for want of memory (outcome -1)
 *    keeps nothing, so a later plan probes and keeps what it finds
 *    (before, it was kept as "other bytes": the op stayed on the opening
 *    team for the context's life); a kernel's or a prepare's own failure
 *    is a verdict, "other bytes", kept, so a later plan does not probe an
 *    op whose probe always fails (~11 ms a plan).  The status -> outcome
 *    mapping is dnnteam.c's (cpu_team_probe_failed, which its probe_run
 *    and version_for call); the probes themselves need a oneDNN kernel
 *    that fails on demand, which the plugin has no hook for.
 */
#include "plugins/cpu/cpu.h"

#include <kiln/plugin.h>

#include <check.h>
#include <stdlib.h>
#include "check_main.h"

/* The key of a 3x3 convolution of `rows` rows on a team of n (dnnteam.c's
 * verdict_key for such a plan): zeroed, its fields set, hashed. */
static void conv_key(int64_t rows, int n, struct cpu_team_verdict *k)
{
	memset(k, 0, sizeof *k);
	k->key.type = KILN_OP_CONV;
	k->key.n_in = 2, k->key.n_out = 1;
	k->key.in[0] = (struct kiln_tensor_desc){ .dtype = KILN_F32, .ndim = 4, .dims = { rows, 32, 24, 24 } };
	k->key.in[1] = (struct kiln_tensor_desc){ .dtype = KILN_F32, .ndim = 4, .dims = { 32, 32, 3, 3 } };
	k->key.out[0] = k->key.in[0];
	k->kern_f32 = 0, k->conv_impl = 1;
	k->n = n;
	cpu_team_verdict_hash(k);
}

/* the outcome a test keeps for key i: the same bytes for even rows */
static int outcome(int i) { return i % 2 == 0; }

START_TEST(test_cap)
{
	struct cpu_team_verdicts vs = { 0 };
	struct cpu_team_verdict k;
	const int extra = 100, total = CPU_TEAM_VERDICTS + extra;
	for (int i = 0; i < total; i++) {
		conv_key(1 + i, 1, &k);
		ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), -1);
		cpu_team_verdict_keep(&vs, &k, outcome(i));
	}
	ck_assert_msg(vs.n == CPU_TEAM_VERDICTS, "%d probes' verdicts kept: %d, at most %d expected",
		      total, vs.n, CPU_TEAM_VERDICTS);
	int forgotten = 0, wrong = 0;
	for (int i = 0; i < total; i++) {
		conv_key(1 + i, 1, &k);
		const int got = cpu_team_verdict_find(&vs, &k);
		if (i < extra)
			forgotten += got == -1;
		else
			wrong += got != outcome(i);
	}
	ck_assert_msg(forgotten == extra, "the %d oldest verdicts: %d forgotten, all expected", extra,
		      forgotten);
	ck_assert_msg(!wrong, "%d of the %d newest verdicts not found with their outcome", wrong,
		      CPU_TEAM_VERDICTS);
	/* another team of a kept op's key is another verdict */
	conv_key(total, 2, &k);
	ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), -1);
	/* a lookup walks one hash chain: none much longer than the mean */
	int longest = 0;
	for (int b = 0; b < CPU_TEAM_VERDICT_BUCKETS; b++) {
		int len = 0;
		for (const struct cpu_team_verdict *x = vs.bucket[b]; x; x = x->next)
			len++;
		longest = len > longest ? len : longest;
	}
	const int mean = CPU_TEAM_VERDICTS / CPU_TEAM_VERDICT_BUCKETS;
	ck_assert_msg(longest <= 4 * mean + 4, "the longest hash chain holds %d of %d verdicts (%d buckets)",
		      longest, CPU_TEAM_VERDICTS, CPU_TEAM_VERDICT_BUCKETS);
	/* a forgotten one kept again: the then oldest goes */
	conv_key(1, 1, &k);
	cpu_team_verdict_keep(&vs, &k, 0);
	ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), 0);
	conv_key(1 + extra, 1, &k);
	ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), -1);
	ck_assert_int_eq(vs.n, CPU_TEAM_VERDICTS);
	cpu_team_verdicts_clear(&vs);
	ck_assert_int_eq(vs.n, 0);
	ck_assert_ptr_null(vs.oldest);
	conv_key(2 + extra, 1, &k);
	ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), -1);
}
END_TEST

START_TEST(test_failed)
{
	struct cpu_team_verdicts vs = { 0 };
	struct cpu_team_verdict k;
	conv_key(5, 1, &k);
	ck_assert_int_eq(cpu_team_probe_failed(KILN_ENOMEM), -1);
	cpu_team_verdict_keep(&vs, &k, cpu_team_probe_failed(KILN_ENOMEM)); /* could not run */
	ck_assert_msg(cpu_team_verdict_find(&vs, &k) == -1,
		      "a probe that could not run was kept (as %d): the op's later plans would not probe",
		      cpu_team_verdict_find(&vs, &k));
	ck_assert_int_eq(vs.n, 0);
	cpu_team_verdict_keep(&vs, &k, 1); /* a later plan's probe ran */
	ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), 1);
	conv_key(6, 1, &k);
	cpu_team_verdict_keep(&vs, &k, 0); /* other bytes: kept */
	ck_assert_int_eq(cpu_team_verdict_find(&vs, &k), 0);
	ck_assert_int_eq(vs.n, 2);
	/* a kernel's own failure: a verdict, kept, so no later plan probes */
	const kiln_status fails[] = { KILN_EDEVICE, KILN_EINTERNAL, KILN_ENOTSUP, KILN_EINVAL };
	for (int i = 0; i < (int)(sizeof fails / sizeof fails[0]); i++) {
		conv_key(7 + i, 1, &k);
		cpu_team_verdict_keep(&vs, &k, cpu_team_probe_failed(fails[i]));
		ck_assert_msg(cpu_team_verdict_find(&vs, &k) == 0,
			      "a probe whose kernel failed (status %d): kept as %d, 0 (other bytes) "
			      "expected, or every new plan of the op probes again",
			      (int)fails[i], cpu_team_verdict_find(&vs, &k));
	}
	cpu_team_verdicts_clear(&vs);
}
END_TEST

static Suite *make_cpu_team_verdicts_suite(void)
{
	Suite *s = suite_create("cpu_team_verdicts");
	TCase *t = tcase_create("cap");
	tcase_add_test(t, test_cap);
	suite_add_tcase(s, t);
	t = tcase_create("failed");
	tcase_add_test(t, test_failed);
	suite_add_tcase(s, t);
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_team_verdicts_suite };
