/* tests/check_pipeline.c - the pipeline's schedules (core/pipe_schedule.c):
 * every dependency respected, each stage's micro-batches in order, the
 * length 2(M+P-1) and so the bubble (P-1)/(M+P-1), and the activation sets
 * alive at once: gpipe M, 1f1b min(P, M). */
#include <check.h>
#include "check_main.h"
#include <string.h>
#include "pipeline.h"

/* Check schedule `a` of P stages and M micro-batches against the rules. */
static void check_order(const struct kiln_pipe_action *a, int P, int M)
{
	int fdone[8][32], bdone[8][32], nf[8] = { 0 }, nb[8] = { 0 };
	for (int s = 0; s < P; s++)
		for (int j = 0; j < M; j++)
			fdone[s][j] = bdone[s][j] = -1;
	for (int i = 0; i < 2 * P * M; i++) {
		const int s = a[i].stage, j = a[i].mb, t = a[i].tick;
		ck_assert(s >= 0 && s < P && j >= 0 && j < M);
		ck_assert(i == 0 || a[i - 1].tick <= t);
		if (a[i].kind == KILN_PIPE_FWD) {
			ck_assert_int_eq(j, nf[s]++); /* in order */
			ck_assert(s == 0 || (fdone[s - 1][j] >= 0 && fdone[s - 1][j] < t));
			fdone[s][j] = t;
		} else {
			ck_assert_int_eq(j, nb[s]++);
			ck_assert(fdone[s][j] >= 0 && fdone[s][j] < t);
			ck_assert(s == P - 1 || (bdone[s + 1][j] >= 0 && bdone[s + 1][j] < t));
			bdone[s][j] = t;
		}
	}
	for (int s = 0; s < P; s++) {
		ck_assert_int_eq(nf[s], M);
		ck_assert_int_eq(nb[s], M);
	}
}

START_TEST(test_schedules)
{
	static const int Ps[] = { 1, 2, 4, 8 }, Ms[] = { 1, 2, 4, 8, 16, 32 };
	struct kiln_pipe_action a[2 * 8 * 32];
	for (int kind = 0; kind < 2; kind++)
		for (size_t pi = 0; pi < 4; pi++)
			for (size_t mi = 0; mi < 6; mi++) {
				const int P = Ps[pi], M = Ms[mi];
				int ticks = 0, live = 0;
				ck_assert(kiln_pipe_schedule(kind, P, M, a, &ticks, &live) == KILN_OK);
				check_order(a, P, M);
				/* both reach the ideal length with unit-time passes */
				ck_assert_int_eq(ticks, 2 * (M + P - 1));
				double want = (double)(P - 1) / (double)(M + P - 1);
				ck_assert_double_eq_tol(kiln_pipe_bubble(P, M, ticks), want, 1e-12);
				ck_assert_int_eq(live, kind == KILN_PIPE_GPIPE ? M : (P < M ? P : M));
			}
}
END_TEST

/* 1f1b on 4 stages and 8 micro-batches: stage 0 warms up with three
 * forwards, then alternates; the last stage alternates from the start. */
START_TEST(test_1f1b_order)
{
	struct kiln_pipe_action a[64];
	int ticks, live;
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 4, 8, a, &ticks, &live) == KILN_OK);
	char s0[64] = "", s3[64] = "";
	for (int i = 0; i < 64; i++) {
		char *d = a[i].stage == 0 ? s0 : a[i].stage == 3 ? s3 : NULL;
		if (d) {
			size_t n = strlen(d);
			d[n] = a[i].kind == KILN_PIPE_FWD ? 'F' : 'B';
			d[n + 1] = 0;
		}
	}
	ck_assert_str_eq(s0, "FFFFBFBFBFBFBBBB");
	ck_assert_str_eq(s3, "FBFBFBFBFBFBFBFB");
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 0, 8, a, &ticks, &live) != KILN_OK);
	ck_assert(kiln_pipe_schedule(7, 2, 8, a, &ticks, &live) != KILN_OK);
}
END_TEST

static Suite *make_pipeline_suite(void)
{
	Suite *s = suite_create("pipeline");
	check_add_case(s, "schedule", 30, NULL, NULL,
		       (const TTest *[]){ test_schedules, test_1f1b_order, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_pipeline_suite };
