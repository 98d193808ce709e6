/* tests/check_pipeline.c - the pipeline's schedules (core/pipe_schedule.c):
 * every dependency respected, each stage's micro-batches in order, the
 * length 2(M+P-1) and so the bubble (P-1)/(M+P-1), and the activation sets
 * alive at once: gpipe M, 1f1b min(P, M); the measured bubble's replay and
 * split (core/pipe_timing.c); the step's mean folded into the loss
 * layers' gradient seed (core/pipe_run.c, seed_mean); [model] stages =
 * auto's cut (core/pipe_stages.c, kiln_pipe_balance). */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include "dist.h" /* kiln_device_host_fn */
#include "graph.h"
#include "pipeline.h"
#include "pipe_impl.h" /* kiln_pipe_pairs_plan */
#include <time.h>

static struct kiln_registry *reg;

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s", kiln_last_error())

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
		for (int early = 0; early < 3; early++)
			for (size_t pi = 0; pi < 4; pi++)
				for (size_t mi = 0; mi < 6; mi++) {
					const int P = Ps[pi], M = Ms[mi];
					int ticks = 0, live = 0;
					ck_assert(kiln_pipe_schedule(kind, P, M, early, a, &ticks, &live) ==
						  KILN_OK);
					check_order(a, P, M);
					/* all reach the ideal length with unit-time passes */
					ck_assert_int_eq(ticks, 2 * (M + P - 1));
					double want = (double)(P - 1) / (double)(M + P - 1);
					ck_assert_double_eq_tol(kiln_pipe_bubble(P, M, ticks), want, 1e-12);
					/* 1f1b: P sets, and one more per early forward */
					const int sets = P + (P > 1 ? early : 0);
					ck_assert_int_eq(live, kind == KILN_PIPE_GPIPE ? M : (sets < M ? sets : M));
				}
}
END_TEST

/* Stage s's actions of the 64 in a (4 stages, 8 micro-batches) as a
 * string of F and B, into d (at least 17 chars). */
static void stage_string(const struct kiln_pipe_action *a, int s, char *d)
{
	size_t n = 0;
	for (int i = 0; i < 64; i++)
		if (a[i].stage == s)
			d[n++] = a[i].kind == KILN_PIPE_FWD ? 'F' : 'B';
	d[n] = 0;
}

/* 1f1b on 4 stages and 8 micro-batches: stage 0 warms up with three
 * forwards, then alternates; the last stage alternates from the start.
 * One early forward: stage 0 runs a fourth forward ahead, the last stage
 * is as before. */
START_TEST(test_1f1b_order)
{
	struct kiln_pipe_action a[64];
	int ticks, live;
	char s0[32], s3[32];
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 4, 8, 0, a, &ticks, &live) == KILN_OK);
	stage_string(a, 0, s0);
	stage_string(a, 3, s3);
	ck_assert_str_eq(s0, "FFFFBFBFBFBFBBBB");
	ck_assert_str_eq(s3, "FBFBFBFBFBFBFBFB");
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 4, 8, 1, a, &ticks, &live) == KILN_OK);
	stage_string(a, 0, s0);
	stage_string(a, 3, s3);
	ck_assert_str_eq(s0, "FFFFFBFBFBFBBBBB");
	ck_assert_str_eq(s3, "FBFBFBFBFBFBFBFB");
	ck_assert_int_eq(live, 5);
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 0, 8, 0, a, &ticks, &live) != KILN_OK);
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 2, 8, -1, a, &ticks, &live) != KILN_OK);
	ck_assert(kiln_pipe_schedule(7, 2, 8, 0, a, &ticks, &live) != KILN_OK);
}
END_TEST

/* The replay (core/pipe_timing.c) of 1f1b with `early` early forwards,
 * P = 2, every forward taking f[s] and every backward b[s] on stage s and
 * each hand-off `handoff`: the span and the idle share split into the
 * busiest stage's and the imbalance. */
static void replay_early(int M, int early, double handoff, const double *f, const double *b,
			 double *span, double *bubble, double *imbalance, double *idle)
{
	struct kiln_pipe_action a[2 * 2 * 32];
	double dur[2 * 2 * 32], busy[2];
	int ticks, live;
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 2, M, early, a, &ticks, &live) == KILN_OK);
	for (int i = 0; i < 4 * M; i++)
		dur[i] = a[i].kind == KILN_PIPE_FWD ? f[a[i].stage] : b[a[i].stage];
	*span = kiln_pipe_replay(a, 4 * M, dur, handoff, 2, busy);
	ck_assert_double_eq_tol(busy[0], M * (f[0] + b[0]), 1e-9);
	ck_assert_double_eq_tol(busy[1], M * (f[1] + b[1]), 1e-9);
	kiln_pipe_idle_split(busy, 2, *span, bubble, imbalance);
	*idle = 1.0 - (busy[0] + busy[1]) / (2 * *span);
	ck_assert_double_eq_tol(*bubble + *imbalance, *idle, 1e-12);
}

static void replay_1f1b(int M, const double *f, const double *b, double *span, double *bubble,
			double *imbalance, double *idle)
{
	replay_early(M, 0, 0, f, b, span, bubble, imbalance, idle);
}

/* Equal stages (a backward twice a forward, or passes unequal between the
 * stages but equal in sum): the span is (M + 1) passes of a stage and the
 * bubble the schedule's 1/(M + 1), all of it the busiest stage's. */
START_TEST(test_replay_equal)
{
	static const int Ms[] = { 4, 8, 16 };
	for (int k = 0; k < 3; k++) {
		const int M = Ms[k];
		double span, bubble, imb, idle;
		replay_1f1b(M, (const double[]){ 1, 1 }, (const double[]){ 2, 2 }, &span, &bubble,
			    &imb, &idle);
		ck_assert_double_eq_tol(span, 3.0 * (M + 1), 1e-9);
		ck_assert_double_eq_tol(idle, 1.0 / (M + 1), 1e-12);
		ck_assert_double_eq_tol(bubble, 1.0 / (M + 1), 1e-12);
		ck_assert_double_eq_tol(imb, 0, 1e-12);
		/* stage 0's forward longer and its backward shorter (a wide first
		 * layer that computes no input gradient): the same */
		replay_1f1b(M, (const double[]){ 1.4, 1 }, (const double[]){ 1.6, 2 }, &span, &bubble,
			    &imb, &idle);
		ck_assert_double_eq_tol(span, 3.0 * (M + 1), 1e-9);
		ck_assert_double_eq_tol(bubble, 1.0 / (M + 1), 1e-12);
	}
}
END_TEST

/* Stage 1 10% heavier (forward 1.1, backward 2.2 against 1 and 2): it
 * never waits after its first forward, so the span is stage 0's first
 * forward, stage 1's M passes and stage 0's last backward, 3 + 3.3 M; the
 * busiest stage's idle is 3 / (3 + 3.3 M), below the schedule's 1/(M+1),
 * and the idle share over both stages is that plus the imbalance
 * 0.15 M / (3 + 3.3 M): at M = 8 0.102 + 0.041 = 0.143 against 0.111. */
START_TEST(test_replay_imbalance)
{
	static const int Ms[] = { 4, 8, 16 };
	for (int k = 0; k < 3; k++) {
		const int M = Ms[k];
		double span, bubble, imb, idle;
		replay_1f1b(M, (const double[]){ 1, 1.1 }, (const double[]){ 2, 2.2 }, &span, &bubble,
			    &imb, &idle);
		ck_assert_double_eq_tol(span, 3 + 3.3 * M, 1e-9);
		ck_assert_double_eq_tol(bubble, 3 / (3 + 3.3 * M), 1e-12);
		ck_assert_double_eq_tol(imb, 0.15 * M / (3 + 3.3 * M), 1e-12);
		ck_assert(idle > 1.0 / (M + 1) && bubble < 1.0 / (M + 1));
	}
	/* nothing busy, no span: no bubble */
	double bubble, imb;
	kiln_pipe_idle_split((const double[]){ 0, 0 }, 2, 0, &bubble, &imb);
	ck_assert(bubble == 0 && imb == 0);
}
END_TEST

/* Early forwards hide a hand-off behind a pass.  Stage 1 is 5% heavier
 * (forward 1.05, backward 2.1 against 1 and 2): with instant hand-offs it
 * never waits after its first forward, plain 1f1b or not.  With hand-offs
 * of 0.2, plain 1f1b's loop (stage 1's backward of j - 1, its gradient to
 * stage 0, stage 0's backward of j - 1 and forward of j + 1, that
 * activation back: 3 + 2 x 0.2) is longer than stage 1's forward and
 * backward of j (3.15), so stage 1 waits 0.25 every other micro-batch
 * after the first two (it runs two per 3.4 + 3.15): 0.125 (M - 2) in all;
 * one early
 * forward puts stage 0's forward of j + 1 before its backward of j - 1,
 * and stage 1 never waits: span 3 + 0.4 + 3.15 M, busiest stage idle
 * 3.4 / (3.4 + 3.15 M). */
START_TEST(test_replay_early)
{
	static const int Ms[] = { 4, 8, 16 };
	const double f[2] = { 1, 1.05 }, b[2] = { 2, 2.1 };
	for (int k = 0; k < 3; k++) {
		const int M = Ms[k];
		double span0, span1, bubble0, bubble1, imb, idle;
		replay_early(M, 0, 0, f, b, &span0, &bubble0, &imb, &idle);
		replay_early(M, 1, 0, f, b, &span1, &bubble1, &imb, &idle);
		ck_assert_double_eq_tol(span0, 3 + 3.15 * M, 1e-9);
		ck_assert_double_eq_tol(span1, 3 + 3.15 * M, 1e-9);
		replay_early(M, 0, 0.2, f, b, &span0, &bubble0, &imb, &idle);
		replay_early(M, 1, 0.2, f, b, &span1, &bubble1, &imb, &idle);
		ck_assert_double_eq_tol(span1, 3.4 + 3.15 * M, 1e-9);
		ck_assert_double_eq_tol(bubble1, 3.4 / (3.4 + 3.15 * M), 1e-12);
		ck_assert_double_eq_tol(span0, span1 + 0.125 * (M - 2), 1e-9);
		ck_assert(bubble0 > bubble1);
	}
}
END_TEST

/* The gaps between passes (kiln_pipe_gaps): stamps of 1f1b (P = 2, M = 8,
 * unequal stages) made with every pass starting `handoff` after the pass
 * of the other stage it waits for and `own` after its stage's previous
 * one, whichever is later.  With one of the two zero, every gap of that
 * kind is exactly the other one, and the passes that waited are
 * recognised as such. */
static void gap_case(int64_t handoff, int64_t own, double *gap, int64_t *cnt, int64_t *hist,
		     int64_t unit)
{
	enum { M = 8, N = 4 * M };
	struct kiln_pipe_action a[N];
	int64_t st[2 * N], end[2] = { INT64_MIN, INT64_MIN };
	const int64_t f[2] = { 1400 * unit, 1000 * unit }, b[2] = { 2000 * unit, 2200 * unit };
	int ticks, live;
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 2, M, 0, a, &ticks, &live) == KILN_OK);
	for (int i = 0; i < N; i++) {
		const int s = a[i].stage;
		int64_t start = end[s] == INT64_MIN ? 0 : end[s] + own;
		for (int k = 0; k < i; k++) /* the other stage's pass it waits for */
			if (a[k].mb == a[i].mb && a[k].kind == a[i].kind && a[k].stage != s &&
			    st[2 * k + 1] + handoff > start)
				start = st[2 * k + 1] + handoff;
		st[2 * i] = start;
		st[2 * i + 1] = end[s] = start + (a[i].kind == KILN_PIPE_FWD ? f[s] : b[s]);
	}
	gap[0] = gap[1] = 0;
	cnt[0] = cnt[1] = 0;
	kiln_pipe_gaps(a, N, st, gap, cnt, hist);
	ck_assert_int_eq(cnt[0] + cnt[1], N - 1); /* every pass but the step's first */
}

START_TEST(test_gaps)
{
	double gap[2];
	int64_t cnt[2];
	gap_case(30, 0, gap, cnt, NULL, 1);
	ck_assert_int_gt(cnt[0], 2); /* stage 1's first forward, stage 0's waits for B0 ... */
	ck_assert_double_eq_tol(gap[0], 30.0 * (double)cnt[0], 1e-9);
	ck_assert(gap[1] >= 0 && gap[1] <= 30.0 * (double)cnt[1]);
	gap_case(0, 25, gap, cnt, NULL, 1);
	ck_assert_int_gt(cnt[1], 2);
	ck_assert_double_eq_tol(gap[1], 25.0 * (double)cnt[1], 1e-9);
	ck_assert(gap[0] >= 0 && gap[0] <= 25.0 * (double)cnt[0]);
	gap_case(0, 0, gap, cnt, NULL, 1);
	ck_assert_double_eq_tol(gap[0] + gap[1], 0, 1e-12);
}
END_TEST

/* The hand-offs' latencies by bin (kiln_pipe_gaps' hist) and their
 * quantiles: every hand-off 37 us (passes of milliseconds) lands in bin
 * 37; hand-made counts give the median and the 90% of the bins' lower
 * ends, the coarse bins past 1 ms included. */
START_TEST(test_gap_quantiles)
{
	static int64_t hist[KILN_PIPE_GAP_BINS];
	double gap[2];
	int64_t cnt[2];
	gap_case(37000, 0, gap, cnt, hist, 1000);
	ck_assert_int_gt(cnt[0], 2);
	ck_assert_int_eq(hist[37], cnt[0]);
	ck_assert_double_eq(kiln_pipe_gap_quantile(hist, cnt[0], 0.5), 37.0);
	ck_assert_double_eq(kiln_pipe_gap_quantile(hist, cnt[0], 0.9), 37.0);
	memset(hist, 0, sizeof hist);
	/* 10 hand-offs: 5 at 5 us, 3 at 7 us, one at 1,250 us, one past 100 ms */
	hist[5] = 5, hist[7] = 3, hist[1000 + 2] = 1, hist[KILN_PIPE_GAP_BINS - 1] = 1;
	ck_assert_double_eq(kiln_pipe_gap_quantile(hist, 10, 0.5), 7.0); /* 5 of 10 is not more than half */
	ck_assert_double_eq(kiln_pipe_gap_quantile(hist, 10, 0.4), 5.0);
	ck_assert_double_eq(kiln_pipe_gap_quantile(hist, 10, 0.8), 1200.0);
	ck_assert_double_eq(kiln_pipe_gap_quantile(hist, 10, 0.9), 1000.0 + 100.0 * (KILN_PIPE_GAP_BINS - 1001));
}
END_TEST

/* 1f1b, P = 2, M micro-batches: the schedule in a[] and each pass's
 * duration in dur[]: stage s's forwards f[s] and backwards b[s], those of
 * micro-batch j plus jit[0] (forwards) and jit[1] (backwards) for even j,
 * minus them for odd j (M even: the means stay f and b). */
static int jittered(int M, const double *f, const double *b, const double *jit,
		    struct kiln_pipe_action *a, double *dur)
{
	int ticks, live;
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, 2, M, 0, a, &ticks, &live) == KILN_OK);
	for (int i = 0; i < 4 * M; i++) {
		const int fwd = a[i].kind == KILN_PIPE_FWD, sign = a[i].mb % 2 ? -1 : 1;
		dur[i] = (fwd ? f[a[i].stage] : b[a[i].stage]) + sign * jit[!fwd];
	}
	return 4 * M;
}

/* Passes of equal stages that vary from micro-batch to micro-batch: the
 * replay as measured is longer than the schedule's; the smooth replay
 * (every pass at its stage's mean) gives back the schedule's span 3 (M + 1)
 * and bubble 1 / (M + 1) exactly.  Stage 1 10% heavier and jittered:
 * smooth, the imbalance's span 3 + 3.3 M (test_replay_imbalance). */
START_TEST(test_smooth)
{
	static const int Ms[] = { 4, 8, 16 };
	struct kiln_pipe_action a[4 * 16];
	double dur[4 * 16], busy[2];
	for (int k = 0; k < 3; k++) {
		const int M = Ms[k];
		const int n = jittered(M, (const double[]){ 1, 1 }, (const double[]){ 2, 2 },
				       (const double[]){ 0.3, 0.5 }, a, dur);
		const double span = kiln_pipe_replay(a, n, dur, 0, 2, busy);
		const double smooth = kiln_pipe_smooth(a, n, dur, 0);
		ck_assert_double_eq_tol(smooth, 3.0 * (M + 1), 1e-9);
		ck_assert(span > smooth + 0.1);
		ck_assert_double_eq_tol(1.0 - (busy[0] + busy[1]) / (2 * smooth), 1.0 / (M + 1), 1e-12);
		jittered(M, (const double[]){ 1, 1.1 }, (const double[]){ 2, 2.2 },
			 (const double[]){ 0.3, 0.5 }, a, dur);
		ck_assert_double_eq_tol(kiln_pipe_smooth(a, n, dur, 0), 3 + 3.3 * M, 1e-9);
	}
}
END_TEST

/* Equal stages whose end passes are longer: the step's first forward
 * (stage 0's of micro-batch 0) by 0.5 and its last backward (stage 0's of
 * micro-batch M - 1) by 0.7.  Both are on the critical path, so the span
 * is the schedule's 3 (M + 1) + 1.2, which the smooth replay that keeps
 * the end passes gives (the one that smooths them into stage 0's means
 * gives no more: stage 0, now the busier, stays on the critical path). */
START_TEST(test_end_passes)
{
	static const int Ms[] = { 4, 8, 16 };
	struct kiln_pipe_action a[4 * 16];
	double dur[4 * 16], busy[2];
	for (int k = 0; k < 3; k++) {
		const int M = Ms[k];
		const int n = jittered(M, (const double[]){ 1, 1 }, (const double[]){ 2, 2 },
				       (const double[]){ 0, 0 }, a, dur);
		ck_assert(a[0].kind == KILN_PIPE_FWD && a[0].stage == 0 && a[0].mb == 0);
		ck_assert(a[n - 1].kind == KILN_PIPE_BWD && a[n - 1].stage == 0 && a[n - 1].mb == M - 1);
		dur[0] += 0.5;
		dur[n - 1] += 0.7;
		const double span = kiln_pipe_replay(a, n, dur, 0, 2, busy);
		const double ends = kiln_pipe_smooth(a, n, dur, 1);
		ck_assert_double_eq_tol(span, 3.0 * (M + 1) + 1.2, 1e-9);
		ck_assert_double_eq_tol(ends, span, 1e-9);
		ck_assert(kiln_pipe_smooth(a, n, dur, 0) <= ends + 1e-9);
		/* the bubble: the schedule's plus the end passes' 1.2 idle on
		 * stage 1 and 1.2 busy on stage 0 over the span */
		ck_assert_double_eq_tol(1.0 - (busy[0] + busy[1]) / (2 * ends),
					1.0 - (6.0 * M + 1.2) / (2 * (3.0 * (M + 1) + 1.2)), 1e-12);
		ck_assert(1.0 - (busy[0] + busy[1]) / (2 * ends) > 1.0 / (M + 1));
	}
}
END_TEST

/* ---- [model] stages = auto (pipe_stages.c) ------------------------------ */

/* kiln_pipe_balance's cut of n layers of costs c into P stages, no stage
 * starting at a layer of nocut, is want. */
static void balanced_no(const double *c, int n, int P, const char *nocut, const int *want)
{
	int got[16];
	char g[64] = "", w[64] = "";
	OK(kiln_pipe_balance(c, n, P, nocut, got));
	for (int i = 0; i < n; i++)
		g[i] = (char)('0' + got[i]), w[i] = (char)('0' + want[i]);
	ck_assert_msg(!strcmp(g, w), "P = %d: cut %s, expected %s", P, g, w);
}

static void balanced(const double *c, int n, int P, const int *want)
{
	balanced_no(c, n, P, NULL, want);
}

/* The least busiest stage, then the most even others: a layer of 8 among
 * ones and a 4.  P = 2: the 8 with the four before it (12 | 8; 16 | 4 or
 * 13 | 7 otherwise); P = 3: the 8 alone (4 | 8 | 8); P = 4: still 8 the
 * busiest, and the four 1s before it one stage, the 1, 1, 1, 1, 4 after
 * it split 4 | 4 (squares 16 + 64 + 16 + 16) rather than 2 | 2 | 8 before
 * and after (4 + 4 + 64 + 64) or 3 | 5; equal layers evenly; zero costs
 * (no FLOPs) tie, and so do 3 + 3 + 2 layers of 8 equal ones: the later
 * stages start first. */
START_TEST(test_balance)
{
	const double c[10] = { 1, 1, 1, 1, 8, 1, 1, 1, 1, 4 };
	balanced(c, 10, 2, (const int[]){ 0, 0, 0, 0, 0, 1, 1, 1, 1, 1 });
	balanced(c, 10, 3, (const int[]){ 0, 0, 0, 0, 1, 2, 2, 2, 2, 2 });
	balanced(c, 10, 4, (const int[]){ 0, 0, 0, 0, 1, 2, 2, 2, 2, 3 });
	balanced(c, 10, 1, (const int[]){ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 });
	balanced(c, 10, 10, (const int[]){ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 });
	const double e[8] = { 3, 3, 3, 3, 3, 3, 3, 3 };
	balanced(e, 8, 4, (const int[]){ 0, 0, 1, 1, 2, 2, 3, 3 });
	balanced(e, 8, 3, (const int[]){ 0, 0, 1, 1, 1, 2, 2, 2 });
	const double z[4] = { 0, 0, 0, 0 };
	balanced(z, 4, 2, (const int[]){ 0, 1, 1, 1 });
	/* no stage may start at layer 5 (a fused ReLU): 12 | 8 becomes 13 | 7;
	 * where every cut is barred, the bar is ignored */
	balanced_no(c, 10, 2, (const char[]){ 0, 0, 0, 0, 0, 1, 0, 0, 0, 0 },
		    (const int[]){ 0, 0, 0, 0, 0, 0, 1, 1, 1, 1 });
	balanced_no(e, 3, 2, (const char[]){ 0, 1, 1 }, (const int[]){ 0, 1, 1 });
	int st[4];
	ck_assert_int_eq(kiln_pipe_balance(z, 4, 5, NULL, st), KILN_EINVAL);
	ck_assert_int_eq(kiln_pipe_balance(z, 4, 0, NULL, st), KILN_EINVAL);
}
END_TEST

/* Busiest stages within 0.1% of the least tie (BALANCE_TIE): a flatten
 * (cost 1), fc1 and its fused ReLU (1e6 + 10), fc2 and its ReLU (5e5 + 5),
 * fc3 (2e4) and the loss (1) in 3 stages.  The least busiest is fc1, r1
 * alone (1e6 + 10), which leaves the flatten a stage of its own and fc2 to
 * the loss the third (520006); the flatten with fc1 makes the busiest 1 more
 * (1e6 + 11, within the tie) and the others 500005 | 20001, squares 2.5e11
 * against 2.7e11: that cut. */
START_TEST(test_balance_tie)
{
	const double c[7] = { 1, 1e6, 10, 5e5, 5, 2e4, 1 };
	const char relu[7] = { 0, 0, 1, 0, 1, 0, 0 };
	balanced_no(c, 7, 3, relu, (const int[]){ 0, 0, 0, 1, 1, 2, 2 });
	/* a real difference (1%) still decides: fc1 alone when the flatten costs 1e4 */
	const double d[7] = { 1e4, 1e6, 10, 5e5, 5, 2e4, 1 };
	balanced_no(d, 7, 3, relu, (const int[]){ 0, 1, 1, 2, 2, 2, 2 });
}
END_TEST

/* The cost of a layer counts the bytes its passes move (session 20):
 * kiln_pipe_layer_cost, and cuts that the bytes change.  At 4 FLOPs a
 * byte, a sample:
 * - a layernorm after the data (4 FLOPs, 8 bytes in and out, 1 of
 *   parameters, no input gradient): FLOPs 1 + 4 (1 + 1) = 9; bytes: the
 *   forward 8 + 8 + 1 = 17, its parameters' gradient 8 + 8 + 2 = 18, so
 *   9 + 4 x 35 = 149;
 * - a linear (50 FLOPs, 1 byte in and out, no parameter bytes, both
 *   gradients): 1 + 150 = 151; bytes 2 + (2 + 1) + 2 = 7: 151 + 28 = 179;
 * - the loss (10 FLOPs, 1 byte in, none out, its input's gradient): 1 +
 *   20 = 21; bytes 1 + 2 = 3: 21 + 12 = 33;
 * - a ReLU fused into the linear before it (1 FLOP, 1 byte in and out, its
 *   input's gradient): 1 + 2 = 3; its forward is the linear's epilogue,
 *   bytes 2 + 1 = 3 of the gradient alone: 3 + 12 = 15 (unfused 2 more:
 *   23).
 * layernorm, 3 linears, loss in 2 stages: by FLOPs [9, 151, 151, 151, 21]
 * the cut after the second linear (311 | 172; after the first 160 | 323),
 * with the bytes [149, 179, 179, 179, 33] after the first (328 | 391;
 * after the second 507 | 212): the layernorm's passes move the linear to
 * stage 1.  In 3 stages both cut ln, fc1 | fc2 | fc3, loss (by FLOPs 160,
 * 151, 172; with bytes 328, 179, 212, against ln | fc1, fc2 | fc3, loss's
 * 358 or ln, fc1 | fc2, fc3 | loss's 358). */
START_TEST(test_balance_bytes)
{
	const struct kiln_pipe_layer_est ln = { 4, 8, 8, 1, 0, 1, 0 }, fc = { 50, 1, 1, 0, 1, 1, 0 },
					 loss = { 10, 1, 0, 0, 1, 0, 0 }, relu = { 1, 1, 1, 0, 1, 0, 1 };
	struct kiln_pipe_layer_est unfused = relu;
	unfused.epilogue = 0;
	ck_assert_double_eq(kiln_pipe_layer_cost(&ln, 0), 9);
	ck_assert_double_eq(kiln_pipe_layer_cost(&ln, 4), 149);
	ck_assert_double_eq(kiln_pipe_layer_cost(&fc, 0), 151);
	ck_assert_double_eq(kiln_pipe_layer_cost(&fc, 4), 179);
	ck_assert_double_eq(kiln_pipe_layer_cost(&loss, 0), 21);
	ck_assert_double_eq(kiln_pipe_layer_cost(&loss, 4), 33);
	ck_assert_double_eq(kiln_pipe_layer_cost(&relu, 4), 15);
	ck_assert_double_eq(kiln_pipe_layer_cost(&unfused, 4), 23);
	ck_assert_double_eq(kiln_pipe_layer_cost(&unfused, -1), 3); /* <= 0: FLOPs alone */
	const struct kiln_pipe_layer_est *model[5] = { &ln, &fc, &fc, &fc, &loss };
	double by_flops[5], with_bytes[5];
	for (int i = 0; i < 5; i++) {
		by_flops[i] = kiln_pipe_layer_cost(model[i], 0);
		with_bytes[i] = kiln_pipe_layer_cost(model[i], 4);
	}
	balanced(by_flops, 5, 2, (const int[]){ 0, 0, 0, 1, 1 });
	balanced(with_bytes, 5, 2, (const int[]){ 0, 0, 1, 1, 1 });
	balanced(by_flops, 5, 3, (const int[]){ 0, 0, 1, 2, 2 });
	balanced(with_bytes, 5, 3, (const int[]){ 0, 0, 1, 2, 2 });
}
END_TEST

/* ---- the mean in the loss layers' seed ---------------------------------- */

/* A linear layer of 3 inputs and 4 classes under softmax_xent, batch 8 in
 * M = 4 micro-batches of 2 (one stage: the pipeline's plans are whole
 * plans, which kiln_plan_run runs alone). */
struct seed_rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
	float *x, *metrics;
	int32_t *y;
	size_t n;          /* the gradients' elements */
};

enum { SEED_B = 8, SEED_M = 4, SEED_IN = 3 };

static void seed_open_layers(struct seed_rig *r, const char *layers, const char *extra)
{
	char ini[512];
	memset(r, 0, sizeof *r);
	snprintf(ini, sizeof ini, "%s[pipeline]\nmicro_batches = %d\n%s", layers, SEED_M, extra);
	r->cfg = test_config(reg, ini);
	OK(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev));
	int64_t in = SEED_IN;
	struct kiln_tensor_desc sample;
	kiln_tensor_desc_init(&sample, KILN_F32, 1, &in);
	OK(kiln_model_create(r->cfg, reg, r->dev, &sample, &r->m));
	OK(kiln_device_stream_create(r->dev, &r->stream));
	OK(kiln_model_init_params(r->m, 1, r->stream));
	r->n = r->m->n_elems;
	float x[SEED_B * SEED_IN];
	int32_t y[SEED_B];
	for (int i = 0; i < SEED_B * SEED_IN; i++)
		x[i] = test_hash_val((uint32_t)i, 7);
	for (int i = 0; i < SEED_B; i++)
		y[i] = (i * 3) % 4;
	OK(kiln_device_alloc(r->dev, sizeof x, (void **)&r->x));
	OK(kiln_device_alloc(r->dev, sizeof y, (void **)&r->y));
	OK(kiln_device_alloc(r->dev, 64, (void **)&r->metrics));
	TEST_H2D(r, r->x, x, sizeof x);
	TEST_H2D(r, r->y, y, sizeof y);
}

static void seed_open(struct seed_rig *r, const char *extra)
{
	seed_open_layers(r, "[layer.fc]\ntype = linear\nout = 4\n[layer.loss]\ntype = softmax_xent\n",
			 extra);
}

static void seed_close(struct seed_rig *r)
{
	void *bufs[] = { r->x, r->y, r->metrics };
	test_rig_free_bufs(r->dev, r->stream, bufs, 3);
	kiln_model_free(r->m);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

/* The parameters' gradients after plan p's run over `rows` rows from row 0. */
static void seed_grads(struct seed_rig *r, struct kiln_plan *p, float *g)
{
	static const float zero[16];
	TEST_H2D(r, r->metrics, zero, 64);
	OK(kiln_plan_run(p, r->x, r->y, r->metrics, r->stream));
	TEST_D2H(r, g, r->m->grads_d, r->n * sizeof *g);
}

/* max |a - k b| / max |k b| */
static double seed_rel(const float *a, const float *b, double k, size_t n)
{
	double err = 0, scale = 0;
	for (size_t i = 0; i < n; i++) {
		err = fmax(err, fabs((double)a[i] - k * b[i]));
		scale = fmax(scale, fabs(k * b[i]));
	}
	ck_assert(scale > 0);
	return err / scale;
}

/* A pipeline step of pp leaves the batch's plain plan's gradients: the
 * gradients it must overwrite (not the padding) are poisoned first. */
static void step_is_plain(struct seed_rig *r, struct kiln_pipe *pp)
{
	float *plain = calloc(r->n, sizeof(float)), *piped = calloc(r->n, sizeof(float));
	ck_assert(plain && piped);
	struct kiln_plan *all;
	OK(kiln_model_plan(r->m, SEED_B, 1, &all));
	seed_grads(r, all, plain);
	static const float zero[16];
	TEST_H2D(r, r->metrics, zero, 64);
	for (size_t i = 0; i < r->n; i++)
		piped[i] = plain[i] != 0 ? 1e3f : 0;
	TEST_H2D(r, r->m->grads_d, piped, r->n * sizeof(float));
	OK(kiln_pipe_step(pp, r->x, r->y, sizeof(int32_t), r->metrics));
	TEST_D2H(r, piped, r->m->grads_d, r->n * sizeof(float));
	ck_assert_double_le(seed_rel(piped, plain, 1.0, r->n), 1e-6);
	kiln_plan_free(all);
	free(plain);
	free(piped);
}

/* A pipeline plan's loss seed is 1 / (M x micro-batch) (the one-process
 * batch's 1 / B), not 1 / micro-batch: its gradients over a micro-batch
 * are a plain plan's over the same rows divided by M (reverting seed_mean
 * gives them undivided); and a pipeline step's gradients are the batch's
 * plain ones (with the old scale pass after the last micro-batch as well
 * they come out M times too small, with neither M times too large). */
START_TEST(test_loss_grad_mean)
{
	struct seed_rig r;
	seed_open(&r, "");
	float *plain = calloc(r.n, sizeof(float)), *piped = calloc(r.n, sizeof(float));
	ck_assert(plain && piped);
	int yes = 0;
	OK(kiln_pipe_wanted(r.cfg, r.m, &yes));
	ck_assert_int_eq(yes, 1);
	struct kiln_pipe *pp;
	OK(kiln_pipe_open(r.m, SEED_B, 1, 1, r.stream, &pp));
	ck_assert(!kiln_pipe_hookable(pp)); /* (one process) */
	struct kiln_plan *mb;
	OK(kiln_model_plan(r.m, SEED_B / SEED_M, 1, &mb));
	seed_grads(&r, mb, plain);
	seed_grads(&r, kiln_pipe_plan0(pp), piped);
	ck_assert_double_le(seed_rel(piped, plain, 1.0 / SEED_M, r.n), 1e-6);
	kiln_plan_free(mb);
	free(plain);
	free(piped);
	/* the whole step against the batch's plain plan */
	step_is_plain(&r, pp);
	kiln_pipe_free(pp);
	seed_close(&r);
}
END_TEST

/* The loss alone on the last stage (issue 21): the logits cross to stage
 * 1, the loss writes their gradient into the crossing tensor's gradient
 * receive buffer and the return copies it into fc's gradient storage on
 * stage 0.  That storage must stay fc's own, with its bytes: the loss's
 * gradient-over-its-input merge (plan_grad_over_input) had folded it into
 * fc's output, so the return wrote into a storage of no bytes (at the
 * arena's offset 0: with fc the first layer, its own output's, right by
 * luck; hence fc0 and a ReLU before it) and fc's backward read the logits
 * as their gradient (the step's gradients 24 times off the batch's).  The
 * step's gradients are the batch's plain ones. */
START_TEST(test_loss_alone)
{
	struct seed_rig r;
	seed_open_layers(&r, "[layer.fc0]\ntype = linear\nout = 5\n[layer.act]\ntype = relu\n"
			 "[layer.fc]\ntype = linear\nout = 4\n"
			 "[layer.loss]\ntype = softmax_xent\nstage = 1\n", "");
	int yes = 0;
	OK(kiln_pipe_wanted(r.cfg, r.m, &yes)); /* (reads the stages) */
	ck_assert_int_eq(r.m->n_stages, 2);
	struct kiln_pipe *pp;
	OK(kiln_pipe_open(r.m, SEED_B, 1, 1, r.stream, &pp));
	const struct kiln_plan *p = kiln_pipe_plan0(pp);
	ck_assert_int_eq(p->n_xfer, 1);
	const struct plan_xfer *xf = &p->xfer[0];
	ck_assert_int_eq(xf->from, 0);
	ck_assert_int_eq(xf->to, 1);
	ck_assert_int_ge(xf->grecv, 0);
	const int fc = r.m->n_layers - 2;
	ck_assert_int_eq(xf->gsrc, p->nodes[fc].gstore);
	ck_assert_int_ne(p->nodes[fc].gstore, kiln_plan_late_store(p, fc));
	ck_assert_uint_eq(p->store[xf->gsrc].bytes, xf->bytes);
	ck_assert_uint_ge(xf->bytes, (SEED_B / SEED_M) * 4 * sizeof(float));
	step_is_plain(&r, pp);
	kiln_pipe_free(pp);
	seed_close(&r);
}
END_TEST

/* ---- the hand-offs on ranks paired (session 13) ----------------------
 * A communicator that only writes down what the pipeline's rank transport
 * (core/pipe_rank.c) asks of it, in order: 's' a send, 'r' a recv, 'x' a
 * sendrecv, each to or from rank 1 - mine.  Nothing moves: the tensors
 * received are whatever the buffers held, which is all the same here. */
static struct pair_log {
	struct kiln_device *dev;
	char ops[64];
	int n, peer_ok;
} plog;

static void pair_note(char c, void *stream, void *done)
{
	if (plog.n < (int)sizeof plog.ops - 1)
		plog.ops[plog.n++] = c;
	if (done)
		OK(kiln_device_event_record(plog.dev, done, stream));
}

static int pair_peer; /* the rank every call must name */

static kiln_status pair_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			     void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype;
	plog.peer_ok &= peer == pair_peer;
	pair_note('s', stream, done);
	return KILN_OK;
}

static kiln_status pair_recv(void *ctx, void *buf, size_t count, int dtype, int peer,
			     void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype;
	plog.peer_ok &= peer == pair_peer;
	pair_note('r', stream, done);
	return KILN_OK;
}

static kiln_status pair_sendrecv(void *ctx, const void *sbuf, size_t scount, int dst, void *rbuf,
				 size_t rcount, int src, int dtype, void *stream, void *done)
{
	(void)ctx, (void)sbuf, (void)rbuf, (void)dtype;
	plog.peer_ok &= dst == pair_peer && src == pair_peer && scount > 0 && rcount > 0;
	pair_note('x', stream, done);
	return KILN_OK;
}

/* Stage `mine` of 2 on "ranks" (M = 4, 1f1b) through a communicator of
 * comm ops `version` whose plugin is named `comm`, with [pipeline]
 * sendrecv = `pair` (NULL: not set, the default): the calls it made in
 * one step. */
static const char pair_mlp[] = "[layer.fc]\ntype = linear\nout = 4\n"
			       "[layer.fc2]\ntype = linear\nout = 4\nstage = 1\n"
			       "[layer.loss]\ntype = softmax_xent\n";

static void pair_run_layers(const char *layers, int version, int mine, const char *pair,
			    const char *comm, char *out)
{
	struct seed_rig r;
	char key[64] = "";
	if (pair)
		snprintf(key, sizeof key, "sendrecv = %s\n", pair);
	seed_open_layers(&r, layers, key);
	struct kiln_comm_ops ops = { .version = (uint32_t)version, .send = pair_send,
				     .recv = pair_recv,
				     .sendrecv = version >= 7 ? pair_sendrecv : NULL };
	static const int rank_of[2] = { 0, 1 };
	struct kiln_pipe *pp;
	int yes = 0;
	OK(kiln_pipe_wanted(r.cfg, r.m, &yes)); /* (reads the stages) */
	ck_assert_int_eq(yes, 1);
	OK(kiln_pipe_open(r.m, SEED_B, 1, 1, r.stream, &pp));
	ck_assert_int_eq(kiln_pipe_stages(pp), 2);
	OK(kiln_pipe_use_ranks(pp, &ops, NULL, comm, mine, rank_of, rank_of));
	memset(&plog, 0, sizeof plog);
	plog.dev = r.dev;
	plog.peer_ok = 1;
	pair_peer = 1 - mine;
	OK(kiln_pipe_step(pp, r.x, r.y, sizeof(int32_t), r.metrics));
	OK(kiln_device_stream_sync(r.dev, r.stream));
	ck_assert_msg(plog.peer_ok, "a call named another rank than %d", pair_peer);
	strcpy(out, plog.ops);
	kiln_pipe_free(pp);
	seed_close(&r);
}

static void pair_run(int version, int mine, const char *pair, const char *comm, char *out)
{
	pair_run_layers(pair_mlp, version, mine, pair, comm, out);
}

/* 1f1b on 2 stages, 4 micro-batches, [pipeline] sendrecv = 1: stage 0
 * sends activation 0 alone (its second forward's work follows), then
 * pairs activation 1 with gradient 0, 2 with 1, 3 with 2, and receives
 * gradient 3 alone; stage 1 pairs each gradient but the last with the
 * next activation.  Without the communicator's sendrecv (comm ops version
 * 6), with sendrecv = 0, or without the pairing, each is a send and a
 * recv.  sendrecv = auto (the default, session 14) pairs on "mpi" and
 * "nccl", not on "gloo" nor on a communicator without a name. */
START_TEST(test_pair_handoffs)
{
	char got[64];
	pair_run(7, 0, "1", "gloo", got);
	ck_assert_str_eq(got, "sxxxr");
	pair_run(7, 1, "on", "gloo", got);
	ck_assert_str_eq(got, "rxxxs");
	pair_run(6, 0, "1", "mpi", got);
	ck_assert_str_eq(got, "ssrsrsrr");
	pair_run(6, 1, "1", "mpi", got);
	ck_assert_str_eq(got, "rsrsrsrs");
	pair_run(7, 0, "0", "mpi", got);
	ck_assert_str_eq(got, "ssrsrsrr");
	pair_run(7, 1, "off", "nccl", got);
	ck_assert_str_eq(got, "rsrsrsrs");
	/* auto, set and by default */
	pair_run(7, 0, "auto", "mpi", got);
	ck_assert_str_eq(got, "sxxxr");
	pair_run(7, 1, NULL, "mpi", got);
	ck_assert_str_eq(got, "rxxxs");
	pair_run(7, 0, NULL, "nccl", got);
	ck_assert_str_eq(got, "sxxxr");
	pair_run(7, 0, "auto", "gloo", got);
	ck_assert_str_eq(got, "ssrsrsrr");
	pair_run(7, 1, NULL, "gloo", got);
	ck_assert_str_eq(got, "rsrsrsrs");
	pair_run(7, 0, NULL, NULL, got);
	ck_assert_str_eq(got, "ssrsrsrr");
	ck_assert_int_eq(kiln_pipe_pair_auto("mpi"), 1);
	ck_assert_int_eq(kiln_pipe_pair_auto("nccl"), 1);
	ck_assert_int_eq(kiln_pipe_pair_auto("gloo"), 0);
	ck_assert_int_eq(kiln_pipe_pair_auto(NULL), 0);
}
END_TEST

/* Two crossing tensors each way (a skip connection across the cut: fc's
 * output and its ReLU's, concatenated on stage 1): 1f1b on 2 stages, 4
 * micro-batches, sendrecv = 1.  Paired as in the test above, stage 0's
 * pair of activation e1 of j + 1 and gradient e0 of j and stage 1's of
 * gradient e1 of j and activation e0 of j + 1 each first wait for the
 * send stream's earlier send to the peer (activation e0 of j + 1;
 * gradient e0 of j), which the peer receives in its pair, after its own
 * wait: where a send waits for its recv the step hung until [dist]
 * timeout (tests/pipeline_dist.sh).  The plan of the pairs
 * (core/pipe_pairs.c) leaves stage 0's alone and keeps stage 1's; before
 * session 41 stage 0 issued "sssxrsxrsxrrr". */
struct alone_log {
	int n;
};

static void alone_sink(void *user, int level, const char *who, const char *msg)
{
	(void)level;
	if (!strcmp(who, "pipeline") && strstr(msg, " go alone, not paired "))
		((struct alone_log *)user)->n++;
}

START_TEST(test_pair_skip_alone)
{
	static const char skip[] = "[layer.fc]\ntype = linear\nout = 4\n"
				   "[layer.r]\ntype = relu\n"
				   "[layer.cat]\ntype = concat\ninputs = fc, r\nstage = 1\n"
				   "[layer.fc2]\ntype = linear\nout = 4\n"
				   "[layer.loss]\ntype = softmax_xent\n";
	char got[64];
	pair_run_layers(skip, 7, 0, "1", "mpi", got);
	ck_assert_str_eq(got, "ssssrrssrrssrrrr");
	pair_run_layers(skip, 7, 1, "1", "mpi", got);
	ck_assert_str_eq(got, "rrsxrsxrsxrss");
	/* without the communicator's sendrecv nothing pairs, and no line says
	 * that sends go alone for fear of a wait (before session 41 stage 0
	 * played the step and said so) */
	struct alone_log l = { 0 };
	kiln_log_set_sink(alone_sink, &l);
	pair_run_layers(skip, 6, 0, "1", "mpi", got);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_str_eq(got, "ssssrrssrrssrrrr");
	ck_assert_int_eq(l.n, 0);
	kiln_log_set_sink(alone_sink, &l);
	pair_run_layers(skip, 7, 0, "1", "mpi", got);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_int_eq(l.n, 1);
}
END_TEST

/* The plan of the pairs at M = 256, P = 8 (1f1b) with two crossing
 * tensors each way at every cut (a skip connection across each): it
 * completes (each deadlocking play once unpaired one pair and replayed
 * the whole step: about M^2 P^3, 0.38 s here; a play per stuck front
 * since session 41), and what it keeps pairs. */
static kiln_status big_sendrecv(void *ctx, int me, int peer, uint64_t stag, const void *sbuf,
				size_t sbytes, uint64_t rtag, void *rbuf, size_t rbytes, void *stream)
{
	(void)ctx, (void)me, (void)peer, (void)stag, (void)sbuf, (void)sbytes, (void)rtag;
	(void)rbuf, (void)rbytes, (void)stream;
	return KILN_OK;
}

START_TEST(test_pair_plan_large)
{
	enum { P = 8, M = 256, X = 2 * (P - 1) };
	static const struct kiln_stage_transport_ops ops = { NULL, NULL, big_sendrecv };
	struct kiln_pipe_action *a = calloc(2 * P * M, sizeof *a);
	int ticks, live[P];
	ck_assert(a != NULL);
	ck_assert(kiln_pipe_schedule(KILN_PIPE_1F1B, P, M, 0, a, &ticks, live) == KILN_OK);
	struct plan_xfer x[X];
	for (int e = 0; e < X; e++)
		x[e] = (struct plan_xfer){ .from = e / 2, .to = e / 2 + 1, .grecv = 0 };
	struct kiln_plan plan = { .xfer = x, .n_xfer = X };
	struct kiln_plan *plans[1] = { &plan };
	struct kiln_pipe pp = { .P = P, .M = M, .K = 1, .plan = plans, .act = a, .pair = 1,
				.tr = { &ops, NULL }, .mine = 0 };
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	OK(kiln_pipe_pairs_plan(&pp, 0));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	int paired = 0;
	for (int i = 0; i < pp.n_pair_slots; i++)
		paired += pp.pair_with[i] != 0;
	fprintf(stderr, "pair plan M = %d, P = %d, 2 tensors each way: %d sends paired, %.1f ms\n",
		M, P, paired, 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec));
	ck_assert_int_gt(paired, 0);
	free(pp.pair_with);
	free(a);
}
END_TEST

/* A step that waits for ever with every send alone (stage 0 runs its
 * backward, the recv of gradient 0, before the forward whose activation
 * stage 1 waits for): the plan of the pairs says so, naming the stage and
 * the message; before session 41 it left every send alone and went on. */
START_TEST(test_pair_plan_stuck)
{
	static const struct kiln_stage_transport_ops ops = { NULL, NULL, big_sendrecv };
	struct kiln_pipe_action a[4] = { { KILN_PIPE_BWD, 0, 0, 0 }, { KILN_PIPE_FWD, 0, 0, 1 },
					 { KILN_PIPE_FWD, 1, 0, 2 }, { KILN_PIPE_BWD, 1, 0, 3 } };
	struct plan_xfer x = { .from = 0, .to = 1, .grecv = 0 };
	struct kiln_plan plan = { .xfer = &x, .n_xfer = 1 };
	struct kiln_plan *plans[1] = { &plan };
	struct kiln_pipe pp = { .P = 2, .M = 1, .K = 1, .plan = plans, .act = a, .pair = 1,
				.tr = { &ops, NULL }, .mine = 0 };
	ck_assert_int_eq(kiln_pipe_pairs_plan(&pp, 0), KILN_EINTERNAL);
	ck_assert_msg(strstr(kiln_last_error(), "stage 0's hand-offs wait for ever with every send alone, at its recv of micro-batch 0's gradient 0") != NULL,
		      "%s", kiln_last_error());
	ck_assert_ptr_null(pp.pair_with);
}
END_TEST

/* The log lines of the test below ("pipeline" only). */
struct busy_log {
	char line[4096];
	int n;
};

static void busy_sink(void *user, int level, const char *who, const char *msg)
{
	struct busy_log *l = user;
	(void)level;
	if (!strcmp(who, "pipeline") && !strncmp(msg, "pipeline busy ms/step, the pipe's ranks:", 40)) {
		snprintf(l->line, sizeof l->line, "%s", msg);
		l->n++;
	}
}

/* Stage 0's line of the pipe's busy times (stages on ranks) is whole at
 * 24 stages, about 780 characters: a fixed 512 cut its last stages and
 * the bubble. */
START_TEST(test_busy_line_whole)
{
	enum { P = 24, M = 1 };
	struct kiln_pipe_action a[2 * P * M];
	struct kiln_device *devs[P];
	struct kiln_config *cfg = test_config(reg, "");
	struct kiln_device *dev;
	struct kiln_pipe_timing *t;
	void *stream;
	int ticks, live;
	OK(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	OK(kiln_device_stream_create(dev, &stream));
	OK(kiln_pipe_schedule(KILN_PIPE_1F1B, P, M, 0, a, &ticks, &live));
	for (int s = 0; s < P; s++)
		devs[s] = dev;
	OK(kiln_pipe_timing_open(devs, P, a, 2 * P * M, 0.5, NULL, &t));
	ck_assert(t != NULL);
	kiln_pipe_timing_only(t, 0);
	for (int step = 0; step < 2; step++) { /* the first is not counted */
		for (int i = 0; i < 2 * P * M; i++)
			if (a[i].stage == 0) {
				OK(kiln_pipe_timing_mark(t, dev, stream, i, 0));
				OK(kiln_pipe_timing_mark(t, dev, stream, i, 1));
			}
		OK(kiln_pipe_timing_step(t, dev, stream));
		OK(kiln_device_stream_sync(dev, stream));
	}
	/* busy, CPU and span ms a step of each stage: stage 0's span the
	 * longest (the step's) */
	double ms[3 * P];
	for (int s = 0; s < P; s++)
		ms[3 * s] = 1.0 + 0.125 * s, ms[3 * s + 1] = 0.5, ms[3 * s + 2] = s ? 5.0 : 10.0;
	struct busy_log log = { .n = 0 };
	kiln_log_set_sink(busy_sink, &log);
	kiln_pipe_timing_report_pipe(t, ms);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_int_eq(log.n, 1);
	ck_assert_msg(strstr(log.line, " stage 23 3.875 (CPU 0.500),") != NULL, "%s", log.line);
	ck_assert_msg(strstr(log.line, " span 10.000 (stage 0's); bubble ") != NULL, "%s", log.line);
	/* the busiest stage is the last; the line ends with the split */
	const char *end = strstr(log.line, "; bubble ");
	ck_assert_msg(end && strstr(end, "busiest stage 23 idle ") && strstr(end, " + imbalance "),
		      "%zu characters: %s", strlen(log.line), log.line);
	ck_assert_int_gt((int)strlen(log.line), 700);
	kiln_pipe_timing_free(t);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}
END_TEST

/* Every "pipeline" log line, each ending in a newline. */
struct report_log {
	char *text;
	size_t len;
	int lines;
};

static void report_sink(void *user, int level, const char *who, const char *msg)
{
	struct report_log *l = user;
	const size_t n = strlen(msg);
	(void)level;
	if (strcmp(who, "pipeline"))
		return;
	char *t = realloc(l->text, l->len + n + 2);
	ck_assert(t != NULL);
	memcpy(t + l->len, msg, n);
	t[l->len + n] = '\n', t[l->len + n + 1] = 0;
	l->text = t, l->len += n + 1, l->lines++;
}

/* The line of l that starts with `start` (its length in *n), or NULL. */
static const char *report_find(const struct report_log *l, const char *start, size_t *n)
{
	for (const char *p = l->text; p && *p; p = strchr(p, '\n') + 1) {
		*n = (size_t)(strchr(p, '\n') - p);
		if (!strncmp(p, start, strlen(start)))
			return p;
	}
	return NULL;
}

/* kiln_pipe_timing_report with all stages here (one stream), P stages of
 * M micro-batches stamped for two steps (the first is not counted): every
 * line whole.  8 stages of 128 micro-batches: a stage's passes line at
 * debug level is about 2,300 characters (a fixed 2,048 cut it); 24
 * stages: the passes' means line about 1,500 (a fixed 1,024 cut it). */
static void report_whole(int P, int M)
{
	const int n = 2 * P * M;
	struct kiln_pipe_action *a = malloc(sizeof *a * (size_t)n);
	struct kiln_device **devs = malloc(sizeof *devs * (size_t)P);
	struct kiln_config *cfg = test_config(reg, "");
	struct kiln_device *dev;
	struct kiln_pipe_timing *t;
	void *stream;
	int ticks, live;
	ck_assert(a && devs);
	OK(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	OK(kiln_device_stream_create(dev, &stream));
	OK(kiln_pipe_schedule(KILN_PIPE_1F1B, P, M, 0, a, &ticks, &live));
	for (int s = 0; s < P; s++)
		devs[s] = dev;
	OK(kiln_pipe_timing_open(devs, P, a, n, 0.5, NULL, &t));
	ck_assert(t != NULL);
	for (int step = 0; step < 2; step++) {
		for (int i = 0; i < n; i++) {
			OK(kiln_pipe_timing_mark(t, dev, stream, i, 0));
			OK(kiln_pipe_timing_mark(t, dev, stream, i, 1));
		}
		OK(kiln_pipe_timing_step(t, dev, stream));
		OK(kiln_device_stream_sync(dev, stream));
	}
	struct report_log log = { NULL, 0, 0 };
	const int level = kiln_log_get_level();
	double bubble;
	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(report_sink, &log);
	OK(kiln_pipe_timing_report(t, &bubble));
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	ck_assert_int_eq(log.lines, 7 + P);
	char want[64];
	size_t len = 0, most = 0;
	const char *l = report_find(&log, "pipeline busy ms/step:", &len);
	snprintf(want, sizeof want, " stage %d ", P - 1);
	ck_assert_msg(l != NULL, "no busy line: %s", log.text);
	ck_assert_msg(strstr(l, want) && !strncmp(l + len - 6, " steps", 6), "%.*s", (int)len, l);
	l = report_find(&log, "pipeline passes' means, ms (CPU):", &len);
	snprintf(want, sizeof want, " stage %d forward ", P - 1);
	ck_assert_msg(l != NULL, "no means line: %s", log.text);
	ck_assert_msg(strstr(l, want) && !strncmp(l + len - 2, "%)", 2), "%zu: %.*s", len, (int)len, l);
	most = len;
	for (int s = 0; s < P; s++) {
		char start[64];
		snprintf(start, sizeof start, "last step's passes, stage %d, CPU ms:", s);
		l = report_find(&log, start, &len);
		ck_assert_msg(l != NULL, "no line for stage %d: %s", s, log.text);
		/* the stage's last pass (1f1b: the backward of the last
		 * micro-batch), among the last step's passes: before the counted
		 * steps' means, which name every pass again */
		const char *over = strstr(l, "; over the ");
		ck_assert_msg(over && over < l + len, "stage %d, no means: %.*s", s, (int)len, l);
		snprintf(want, sizeof want, " B%d ", M - 1);
		const char *last = strstr(l, want);
		ck_assert_msg(last && last < over, "stage %d: %.*s", s, (int)len, l);
		most = len > most ? len : most;
	}
	ck_assert_int_gt((int)most, P >= 24 ? 1024 : 2048); /* what a fixed buffer would cut */
	free(log.text);
	kiln_pipe_timing_free(t);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	free(devs);
	free(a);
}

START_TEST(test_report_whole)
{
	report_whole(8, 128);
	report_whole(24, 2);
}
END_TEST

/* ---- a hand-off that fails names world ranks (session 14) -------------
 * Pipe 1 of [dist] pipeline = 2 on 4 ranks: its stages are ranks 0 and 1
 * of the pipe's communicator but ranks 2 and 3 of the world.  A
 * communicator whose send, recv or sendrecv fails at once (as NCCL's do
 * once a peer is gone): the pipeline's message names each stage's world
 * rank, never its rank in the pipe's communicator. */
static kiln_status gone_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			     void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)stream, (void)done;
	return kiln_error(KILN_EIO, "fake: send to rank %d: peer gone", peer);
}

static kiln_status gone_recv(void *ctx, void *buf, size_t count, int dtype, int peer,
			     void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)stream, (void)done;
	return kiln_error(KILN_EIO, "fake: recv from rank %d: peer gone", peer);
}

static kiln_status gone_sendrecv(void *ctx, const void *sbuf, size_t scount, int dst, void *rbuf,
				 size_t rcount, int src, int dtype, void *stream, void *done)
{
	(void)ctx, (void)sbuf, (void)scount, (void)rbuf, (void)rcount, (void)src, (void)dtype;
	(void)stream, (void)done;
	return kiln_error(KILN_EIO, "fake: sendrecv with rank %d: peer gone", dst);
}

/* Stage `mine` of pipe 1 (world ranks 2, 3) through a communicator whose
 * recv fails (and, with `sends_fail`, its send and sendrecv), comm ops
 * `version`, [pipeline] sendrecv = `pair`: the step's error message. */
static void gone_run(int version, int mine, int sends_fail, const char *pair, char *msg,
		     size_t cap)
{
	struct seed_rig r;
	char key[64];
	snprintf(key, sizeof key, "sendrecv = %s\n", pair);
	seed_open_layers(&r, "[layer.fc]\ntype = linear\nout = 4\n"
			 "[layer.fc2]\ntype = linear\nout = 4\nstage = 1\n"
			 "[layer.loss]\ntype = softmax_xent\n", key);
	struct kiln_comm_ops ops = { .version = (uint32_t)version,
				     .send = sends_fail ? gone_send : pair_send, .recv = gone_recv,
				     .sendrecv = version >= 7 ? gone_sendrecv : NULL };
	static const int rank_of[2] = { 0, 1 }, world_of[2] = { 2, 3 };
	struct kiln_pipe *pp;
	int yes = 0;
	OK(kiln_pipe_wanted(r.cfg, r.m, &yes));
	OK(kiln_pipe_open(r.m, SEED_B, 1, 1, r.stream, &pp));
	OK(kiln_pipe_use_ranks(pp, &ops, NULL, "fake", mine, rank_of, world_of));
	memset(&plog, 0, sizeof plog);
	plog.dev = r.dev;
	plog.peer_ok = 1;
	pair_peer = 1 - mine;
	kiln_status st = kiln_pipe_step(pp, r.x, r.y, sizeof(int32_t), r.metrics);
	ck_assert_int_eq(st, KILN_EIO);
	snprintf(msg, cap, "%s", kiln_last_error());
	kiln_device_stream_sync(r.dev, r.stream); /* (what was enqueued; its status is not ours) */
	kiln_pipe_free(pp);
	seed_close(&r);
}

START_TEST(test_gone_world_ranks)
{
	char msg[1024];
	/* stage 1's first hand-off: micro-batch 0's activation from stage 0 */
	gone_run(6, 1, 0, "0", msg, sizeof msg);
	ck_assert_msg(strstr(msg, "pipeline: stage 1 (rank 3) receiving micro-batch 0, crossing tensor 0 (the activation, forward) (32 bytes) from stage 0 (rank 2): ") &&
			      strstr(msg, "fake: recv from rank 0: peer gone"),
		      "%s", msg);
	/* stage 0's first: micro-batch 0's activation to stage 1 (by the
	 * send stream: no send_now here) */
	gone_run(6, 0, 1, "0", msg, sizeof msg);
	ck_assert_msg(strstr(msg, "pipeline: stage 0 (rank 2) sending micro-batch 0, crossing tensor 0 (the activation, forward) to stage 1 (rank 3): ") &&
			      strstr(msg, "fake: send to rank 1: peer gone"),
		      "%s", msg);
	/* paired: activation 1 with gradient 0, after activation 0 alone */
	gone_run(7, 0, 0, "1", msg, sizeof msg);
	ck_assert_msg(strstr(msg, "pipeline: stage 0 (rank 2) sending micro-batch 1, crossing tensor 0 (the activation, forward) to and receiving micro-batch 0, crossing tensor 0 (its gradient, backward) from stage 1 (rank 3): ") &&
			      strstr(msg, "fake: sendrecv with rank 1: peer gone"),
		      "%s", msg);
}
END_TEST

/* ---- the rig of the hand-off tests below: the two-stage model (fc on
 * stage 0, fc2 and the loss on stage 1; `layers` NULL) or `layers`, M = 4,
 * 1f1b, [pipeline] sendrecv = `paired`, [plugin.cpu] async = `async`:
 * its pipe, not yet on ranks ... */
static const char two_stages[] = "[layer.fc]\ntype = linear\nout = 4\n"
				 "[layer.fc2]\ntype = linear\nout = 4\nstage = 1\n"
				 "[layer.loss]\ntype = softmax_xent\n";

static struct kiln_pipe *rig_pipe(struct seed_rig *r, const char *layers, int paired, int async)
{
	char key[64];
	struct kiln_pipe *pp;
	int yes = 0;
	snprintf(key, sizeof key, "sendrecv = %d\n[plugin.cpu]\nasync = %d\n", paired, async);
	seed_open_layers(r, layers ? layers : two_stages, key);
	OK(kiln_pipe_wanted(r->cfg, r->m, &yes));
	ck_assert_int_eq(yes, 1);
	OK(kiln_pipe_open(r->m, SEED_B, 1, 1, r->stream, &pp));
	return pp;
}

/* ... put on "ranks" as stage `mine` of pipe 1 (world ranks 2, 3, ...:
 * stage s is world rank 2 + s) through a communicator of ops (the
 * caller's, alive until rig_close), its log reset (pair_peer: the next
 * stage, or the previous for the last) ... */
static void rig_ranks(struct seed_rig *r, struct kiln_pipe *pp, const struct kiln_comm_ops *ops,
		      int mine)
{
	static const int rank_of[4] = { 0, 1, 2, 3 }, world_of[4] = { 2, 3, 4, 5 };
	OK(kiln_pipe_use_ranks(pp, ops, NULL, "fake", mine, rank_of, world_of));
	memset(&plog, 0, sizeof plog);
	plog.dev = r->dev;
	plog.peer_ok = 1;
	pair_peer = mine + 1 < kiln_pipe_stages(pp) ? mine + 1 : mine - 1;
}

/* ... and closed, once what was enqueued ran (its status is not ours). */
static void rig_close(struct seed_rig *r, struct kiln_pipe *pp)
{
	kiln_device_stream_sync(r->dev, r->stream);
	kiln_pipe_free(pp);
	seed_close(r);
}

/* ---- a send that fails on a stream names its hand-off once (session 14)
 * Sent now (comm ops version 6): the stage's stream tries each message
 * (send_now without waiting, send_try in core/pipe_rank.c) and the send
 * stream sends what it left (waiting, send_late).  A communicator whose
 * send_now fails on try number `fail_nth` of kind `fail_wait` (0 the
 * stage's stream's, 1 the send stream's) and leaves every try of kind 0
 * before it to the send stream.  With [plugin.cpu] async = 1 the
 * failure happens on a stream's thread and comes back later from
 * another call (the step's next op on the stream, or the sync after it);
 * with async = 0 at once, through rank_send. */
static int late_wait, late_nth, late_n;

static kiln_status late_send_now(void *ctx, const void *buf, size_t count, int dtype, int peer,
				 int wait, int *sent)
{
	(void)ctx, (void)buf, (void)count, (void)dtype;
	*sent = 0;
	if (wait == late_wait && ++late_n == late_nth)
		return kiln_error(KILN_EIO, "fake: send_now to rank %d (wait %d): peer gone", peer,
				  wait);
	return KILN_OK;
}

/* Stage 0 of pipe 1 (world ranks 2, 3), M = 4, 1f1b: the message of the
 * step's failure (or of the sync after it) */
static void late_run(int async, int fail_wait, int fail_nth, char *msg, size_t cap)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 6, .send = pair_send, .recv = pair_recv,
				     .send_now = late_send_now };
	struct kiln_pipe *pp = rig_pipe(&r, NULL, 0, async);
	rig_ranks(&r, pp, &ops, 0);
	late_wait = fail_wait, late_nth = fail_nth, late_n = 0;
	kiln_status st = kiln_pipe_step(pp, r.x, r.y, sizeof(int32_t), r.metrics);
	if (!st)
		st = kiln_device_stream_sync(r.dev, r.stream);
	ck_assert_int_eq(st, KILN_EIO);
	snprintf(msg, cap, "%s", kiln_last_error());
	rig_close(&r, pp);
}

static int count_of(const char *s, const char *what)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* The hand-off named once, by stage and world rank, and the
 * communicator's message kept: async and inline, tried on the stage's
 * stream (the first message) and left to the send stream (the last of
 * the step's 4, whose failure no later send of the step reports). */
START_TEST(test_late_send_named_once)
{
	static const struct { int async, wait, nth; } cases[] = {
		{ 1, 0, 1 }, { 1, 1, 4 }, { 0, 0, 1 }, { 0, 1, 4 }, { 1, 1, 1 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char msg[1024], fake[64];
		late_run(cases[i].async, cases[i].wait, cases[i].nth, msg, sizeof msg);
		snprintf(fake, sizeof fake, "fake: send_now to rank 1 (wait %d): peer gone",
			 cases[i].wait);
		ck_assert_msg(count_of(msg, "pipeline: stage 0 (rank 2) sending micro-batch ") == 1 &&
				      count_of(msg, " to stage 1 (rank 3): ") == 1 &&
				      count_of(msg, "pipeline: ") == 1 && count_of(msg, fake) == 1,
			      "async %d wait %d: %s", cases[i].async, cases[i].wait, msg);
	}
}
END_TEST

/* ---- a receive that fails on a stream, named by kiln_pipe_explain
 * (session 15).  A communicator whose recv (or sendrecv) number
 * `fail_nth` fails in a host function on the stage's stream: with
 * [plugin.cpu] async = 1 on the stream's worker, and the failure comes
 * back from the step's sync in the fake's words alone, which the
 * trainer gives kiln_pipe_explain; with async = 0 at once, named by
 * rank_recv (or rank_sendrecv), and kiln_pipe_explain adds nothing. */
static int xr_nth, xr_n;
/* closed (0): the failing host function waits until the test opens it,
 * so that on a stream worker the failure comes after the enqueue has
 * returned, whatever the worker's timing (open by default) */
static atomic_int xr_gate = 1;

static kiln_status xr_fail(void *arg)
{
	(void)arg;
	for (int i = 0; i < 20000 && !atomic_load(&xr_gate); i++) /* <= 20 s */
		usleep(1000);
	return kiln_error(KILN_EIO, "fake: recv from rank 0: peer gone");
}

static kiln_status xr_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			   void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer, (void)done;
	return ++xr_n == xr_nth ? kiln_device_host_fn(plog.dev, stream, xr_fail, NULL) : KILN_OK;
}

static kiln_status xr_sendrecv(void *ctx, const void *sbuf, size_t scount, int dst, void *rbuf,
			       size_t rcount, int src, int dtype, void *stream, void *done)
{
	(void)sbuf, (void)scount, (void)dst, (void)rcount;
	return xr_recv(ctx, rbuf, rcount, dtype, src, stream, done);
}

/* Stage 1 of pipe 1 (world ranks 2, 3), M = 4, 1f1b, receives paired or
 * not: the message of the step's failure (or its sync's), explained. */
static void explain_run(int async, int paired, int nth, char *msg, size_t cap)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 7, .send = pair_send, .recv = xr_recv,
				     .sendrecv = xr_sendrecv };
	struct kiln_pipe *pp = rig_pipe(&r, NULL, paired, async);
	rig_ranks(&r, pp, &ops, 1);
	xr_nth = nth, xr_n = 0;
	kiln_status st = kiln_pipe_step(pp, r.x, r.y, sizeof(int32_t), r.metrics);
	if (!st)
		st = kiln_device_stream_sync(r.dev, r.stream);
	if (!nth) { /* every receive went well: another failure after them */
		OK(st);
		st = kiln_error(KILN_EIO, "fake: something else");
	}
	ck_assert_int_eq(st, KILN_EIO);
	ck_assert_int_eq(kiln_pipe_explain(pp, st), KILN_EIO);
	snprintf(msg, cap, "%s", kiln_last_error());
	rig_close(&r, pp);
}

/* Stage 1's receives (1f1b): micro-batch k's activation is receive k + 1
 * unpaired; paired, the first alone, then each with gradient k - 1's
 * send.  Async: explained with the fake's message kept; inline: named
 * once, by the hand-off itself.  A failure without a receive open (a
 * step that went well) is left as it is. */
START_TEST(test_explain_recv)
{
	static const struct { int async, paired, nth, mb; } cases[] = {
		{ 1, 0, 1, 0 }, { 1, 0, 3, 2 }, { 1, 1, 1, 0 }, { 1, 1, 3, 2 }, { 0, 0, 2, 1 },
		{ 0, 1, 4, 3 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char msg[1024], want[256];
		explain_run(cases[i].async, cases[i].paired, cases[i].nth, msg, sizeof msg);
		snprintf(want, sizeof want, "receiving micro-batch %d, crossing tensor 0 (the activation, forward)",
			 cases[i].mb);
		ck_assert_msg(count_of(msg, want) == 1 && count_of(msg, "pipeline: ") == 1 &&
				      count_of(msg, "fake: recv from rank 0: peer gone") == 1,
			      "case %zu: %s", i, msg);
		if (cases[i].async) {
			/* named by kiln_pipe_explain at the sync ("started on the
			 * stage's stream and not finished") or, when a later
			 * hand-off of the step saw the worker's failure first, by
			 * that hand-off's enqueue: which comes first is the
			 * worker's timing, the receive and its peer named either way */
			snprintf(want, sizeof want, "pipeline: stage 1 (rank 3) receiving micro-batch %d, crossing tensor 0 (the activation, forward)",
				 cases[i].mb);
			ck_assert_msg(strstr(msg, want) && strstr(msg, "from stage 0 (rank 2)"), "case %zu: %s", i, msg);
		}
	}
	/* no receive open: a later failure stays as it is */
	char msg[1024];
	explain_run(1, 0, 0, msg, sizeof msg);
	ck_assert_str_eq(msg, "fake: something else");
	explain_run(1, 1, 0, msg, sizeof msg);
	ck_assert_str_eq(msg, "fake: something else");
}
END_TEST

/* ---- the staged evaluation's receive (sessions 16, 17): kiln_pipe_eval_recv
 * of crossing tensor 0 of evaluation batch 17 from stage 0 on stage 1 of
 * pipe 1, failing on the stream's worker (async = 1: the sync's failure
 * in the fake's words, explained as the evaluation's) or at once
 * (async = 0: named by the receive itself, kiln_pipe_explain adding
 * nothing); without ranks, an internal error. */
static void eval_recv_run(int async, char *msg, size_t cap)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 7, .send = pair_send, .recv = xr_recv,
				     .sendrecv = xr_sendrecv };
	struct kiln_pipe *pp = rig_pipe(&r, NULL, 0, async);
	void *buf;
	ck_assert_int_eq(kiln_pipe_eval_recv(pp, 0, 0, 17, r.x, 16, r.stream), KILN_EINTERNAL);
	ck_assert_int_eq(kiln_pipe_eval_send(pp, 1, 0, 17, r.x, 16, r.stream), KILN_EINTERNAL);
	rig_ranks(&r, pp, &ops, 1);
	OK(kiln_device_alloc(r.dev, 64, &buf));
	xr_nth = 1, xr_n = 0;
	/* on a worker (async) the receive fails after its enqueue returned,
	 * every time: found at the sync, explained by kiln_pipe_explain */
	atomic_store(&xr_gate, !async);
	kiln_status st = kiln_pipe_eval_recv(pp, 0, 0, 17, buf, 64, r.stream);
	if (async)
		ck_assert_int_eq(st, KILN_OK);
	atomic_store(&xr_gate, 1);
	if (!st)
		st = kiln_device_stream_sync(r.dev, r.stream);
	ck_assert_int_eq(st, KILN_EIO);
	ck_assert_int_eq(xr_n, 1);
	ck_assert_int_eq(kiln_pipe_explain(pp, st), KILN_EIO);
	snprintf(msg, cap, "%s", kiln_last_error());
	kiln_device_stream_sync(r.dev, r.stream);
	kiln_device_free(r.dev, buf);
	rig_close(&r, pp);
}

/* (on integ, before session 17: "receiving micro-batch 0, ...") */
START_TEST(test_explain_eval)
{
	for (int async = 0; async <= 1; async++) {
		char msg[1024];
		eval_recv_run(async, msg, sizeof msg);
		ck_assert_msg(count_of(msg, "pipeline: stage 1 (rank 3) evaluating: receiving batch 17, crossing tensor 0 (the activation, forward) ") == 1 &&
				      count_of(msg, "from stage 0 (rank 2)") == 1 &&
				      count_of(msg, "pipeline: ") == 1 && !strstr(msg, "micro-batch") &&
				      count_of(msg, "fake: recv from rank 0: peer gone") == 1 &&
				      (!async || strstr(msg, "started on the stage's stream and not finished")),
			      "async %d: %s", async, msg);
	}
}
END_TEST

/* ---- the staged evaluation's send (session 17): through the rank
 * transport, on the stage's own stream (not the send stream: a chain
 * needs no staging), its failure named by batch, stage and world rank.
 * Stage 0 of the two-stage pipe: a send that fails at once. */
START_TEST(test_eval_send)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 7, .send = pair_send, .recv = pair_recv,
				     .sendrecv = pair_sendrecv };
	struct kiln_pipe *pp = rig_pipe(&r, NULL, 1, 1);
	void *buf;
	rig_ranks(&r, pp, &ops, 0);
	OK(kiln_device_alloc(r.dev, 64, &buf));
	OK(kiln_pipe_eval_send(pp, 1, 0, 5, buf, 64, r.stream));
	OK(kiln_pipe_eval_send(pp, 1, 0, 6, buf, 64, r.stream));
	OK(kiln_device_stream_sync(r.dev, r.stream));
	/* two sends of their own, never paired, to stage 1 */
	ck_assert_str_eq(plog.ops, "ss");
	ck_assert_int_eq(plog.peer_ok, 1);
	/* not to its own stage or an earlier one: the forward is a chain */
	ck_assert_int_eq(kiln_pipe_eval_send(pp, 0, 0, 5, buf, 64, r.stream), KILN_EINTERNAL);
	ops.send = gone_send;
	ck_assert_int_eq(kiln_pipe_eval_send(pp, 1, 0, 5, buf, 64, r.stream), KILN_EIO);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", kiln_last_error());
	ck_assert_msg(count_of(msg, "pipeline: stage 0 (rank 2) evaluating: sending batch 5, crossing tensor 0 (the activation, forward) (64 bytes) to stage 1 (rank 3): ") == 1 &&
			      count_of(msg, "pipeline: ") == 1 &&
			      count_of(msg, "fake: send to rank 1: peer gone") == 1,
		      "%s", msg);
	kiln_device_free(r.dev, buf);
	rig_close(&r, pp);
}
END_TEST

/* A send whose enqueue reports the failure of the receive before it on
 * the stage's stream (stage 1 of 3: batch 3's receive from stage 0 fails
 * on the worker once let go, after its enqueue returned; the send to
 * stage 2 is enqueued on the stopped stream): the receive is named, as
 * the step's sends name it, not the send. */
static atomic_int gate_go;

static kiln_status probe_ok(void *arg)
{
	(void)arg;
	return KILN_OK;
}

static kiln_status gate_fail(void *arg)
{
	(void)arg;
	for (int i = 0; i < 20000 && !atomic_load(&gate_go); i++) /* <= 20 s */
		usleep(1000);
	return kiln_error(KILN_EIO, "fake: recv from rank 0: peer gone");
}

static kiln_status gate_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			     void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer, (void)done;
	return kiln_device_host_fn(plog.dev, stream, gate_fail, NULL);
}

static kiln_status stopped_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
				void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer, (void)done;
	atomic_store(&gate_go, 1);
	kiln_device_stream_sync(plog.dev, stream); /* (the receive's failure first) */
	return kiln_device_host_fn(plog.dev, stream, probe_ok, NULL);
}

START_TEST(test_eval_send_after_recv)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 7, .send = stopped_send, .recv = gate_recv };
	struct kiln_pipe *pp = rig_pipe(&r, "[layer.fc]\ntype = linear\nout = 4\n"
					"[layer.fc2]\ntype = linear\nout = 4\nstage = 1\n"
					"[layer.fc3]\ntype = linear\nout = 4\nstage = 2\n"
					"[layer.loss]\ntype = softmax_xent\n", 0, 1);
	void *buf;
	rig_ranks(&r, pp, &ops, 1);
	OK(kiln_device_alloc(r.dev, 64, &buf));
	atomic_store(&gate_go, 0);
	OK(kiln_pipe_eval_recv(pp, 0, 0, 3, buf, 64, r.stream));
	kiln_status st = kiln_pipe_eval_send(pp, 2, 1, 3, buf, 64, r.stream);
	ck_assert_int_eq(st, KILN_EIO);
	ck_assert_int_eq(kiln_pipe_explain(pp, st), KILN_EIO);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", kiln_last_error());
	kiln_device_free(r.dev, buf);
	rig_close(&r, pp);
	ck_assert_msg(count_of(msg, "pipeline: stage 1 (rank 3) evaluating: receiving batch 3, crossing tensor 0 (the activation, forward) from stage 0 (rank 2): started on the stage's stream and not finished") == 1 &&
			      count_of(msg, "pipeline: ") == 1 && !strstr(msg, "sending"),
		      "%s", msg);
}
END_TEST

/* ---- an evaluation plan's crossing tensors (session 17).  A staged
 * evaluation receives in the slots of training's crossing tensors
 * (micro-batch 0's), so it must not have more.  The planner makes them
 * the same: views (fused activations) differ between the plans, but a
 * fused activation is its producer's only reader on the producer's
 * stage, so one crossing tensor stands for the other.  Here GELU fuses
 * into fc in the evaluation's plan alone (its derivative needs the
 * input) and its output crosses to stage 1 twice (fc2, and the add
 * there): one crossing tensor in both plans.  A plan with more is
 * refused, and so is a hand-off past training's (on integ it went on
 * unmarked: the fake's recv below was called and the call succeeded). */
START_TEST(test_eval_xfers)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 7, .send = pair_send, .recv = pair_recv,
				     .sendrecv = pair_sendrecv };
	struct kiln_pipe *pp = rig_pipe(&r, "[layer.fc]\ntype = linear\nout = 4\n"
					"[layer.act]\ntype = gelu\n"
					"[layer.fc2]\ntype = linear\nout = 4\nstage = 1\n"
					"[layer.sum]\ntype = add\ninputs = fc2, act\n"
					"[layer.loss]\ntype = softmax_xent\n", 0, 0);
	const struct kiln_plan *pt = kiln_pipe_plan0(pp);
	struct kiln_plan *pe;
	r.m->plan_staged = 1;
	OK(kiln_model_plan(r.m, 5, 0, &pe));
	r.m->plan_staged = 0;
	ck_assert_int_eq(pe->staged, 1);
	ck_assert_int_eq(pt->nodes[1].l.is_view, 0); /* act: its own output in training */
	ck_assert_int_eq(pe->nodes[1].l.is_view, 1); /* fc's epilogue when evaluating */
	ck_assert_int_eq(pt->n_xfer, 1);
	ck_assert_int_eq(pe->n_xfer, 1);
	ck_assert_int_eq(pe->xfer[0].from, 0);
	ck_assert_int_eq(pe->xfer[0].to, 1);
	OK(kiln_pipe_eval_check(pp, pe));
	pe->n_xfer = 2; /* (what a plan with one more would say) */
	ck_assert_int_eq(kiln_pipe_eval_check(pp, pe), KILN_EINTERNAL);
	ck_assert_msg(strstr(kiln_last_error(), "the evaluation's plan (batch 5) has 2 crossing tensors, training's 1"),
		      "%s", kiln_last_error());
	pe->n_xfer = 1;
	rig_ranks(&r, pp, &ops, 1);
	ck_assert_int_eq(kiln_pipe_eval_recv(pp, 0, 1, 0, r.x, 16, r.stream), KILN_EINTERNAL);
	ck_assert_msg(strstr(kiln_last_error(), "receiving batch 0, crossing tensor 1 from stage 0: training has 1 crossing tensors"),
		      "%s", kiln_last_error());
	ck_assert_int_eq(kiln_pipe_eval_recv(pp, 0, 0, -1, r.x, 16, r.stream), KILN_EINTERNAL);
	ck_assert_int_eq(plog.n, 0); /* no receive posted */
	kiln_plan_free(pe);
	rig_close(&r, pp);
}
END_TEST

/* ---- an unrelated failure while a receive is under way (session 16):
 * stage 1's first receive holds its stream's worker (waiting for its
 * peer, not failed) when the step's first send fails at its enqueue.
 * The send is named, not the receive: a receive is blamed only where
 * its stream stopped at it. */
static atomic_int ub_started, ub_release;

static kiln_status ub_wait(void *arg)
{
	(void)arg;
	atomic_store(&ub_started, 1);
	for (int i = 0; i < 20000 && !atomic_load(&ub_release); i++) /* <= 20 s */
		usleep(1000);
	return KILN_OK;
}

static kiln_status ub_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			   void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer, (void)done;
	return ++xr_n == 1 ? kiln_device_host_fn(plog.dev, stream, ub_wait, NULL) : KILN_OK;
}

static kiln_status ub_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			   void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer, (void)stream, (void)done;
	/* (the receive under way on the worker first) */
	for (int i = 0; i < 20000 && !atomic_load(&ub_started); i++)
		usleep(1000);
	return kiln_error(KILN_EIO, "fake: send to rank 0: link down");
}

START_TEST(test_explain_unrelated)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 7, .send = ub_send, .recv = ub_recv,
				     .sendrecv = xr_sendrecv };
	struct kiln_pipe *pp = rig_pipe(&r, NULL, 0, 1);
	rig_ranks(&r, pp, &ops, 1);
	xr_n = 0;
	atomic_store(&ub_started, 0);
	atomic_store(&ub_release, 0);
	kiln_status st = kiln_pipe_step(pp, r.x, r.y, sizeof(int32_t), r.metrics);
	ck_assert_int_eq(st, KILN_EIO);
	ck_assert_int_eq(atomic_load(&ub_started), 1);
	ck_assert_int_eq(kiln_pipe_explain(pp, st), KILN_EIO);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", kiln_last_error());
	atomic_store(&ub_release, 1);
	rig_close(&r, pp);
	ck_assert_msg(count_of(msg, "pipeline: stage 1 (rank 3) sending micro-batch 0, crossing tensor 0 (its gradient, backward) to stage 0 (rank 2): ") == 1 &&
			      count_of(msg, "pipeline: ") == 1 && !strstr(msg, "receiving") &&
			      count_of(msg, "fake: send to rank 0: link down") == 1,
		      "%s", msg);
}
END_TEST

/* ---- a staging slot whose size changes (session 17) ------------------
 * rank_send reallocates a slot that a message of another size uses: it
 * must first wait for the slot's last send, which the send stream may
 * still be running (the step's flush orders the next step's streams
 * after it, not the host).  A communicator whose send takes 300 ms on the
 * send stream (async = 1): the second send, 16 -> 32 bytes in the same
 * slot, returns only after the first send finished.  (The old code freed
 * the slot at once: done was still 0.) */
static struct kiln_device *resize_dev;
static atomic_int resize_done;

static kiln_status resize_slow(void *arg)
{
	(void)arg;
	usleep(300000);
	atomic_store(&resize_done, 1);
	return KILN_OK;
}

static kiln_status resize_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			       void *stream, void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer;
	OK(kiln_device_host_fn(resize_dev, stream, resize_slow, NULL));
	return done ? kiln_device_event_record(resize_dev, done, stream) : KILN_OK;
}

START_TEST(test_slot_resize_waits)
{
	struct seed_rig r;
	struct kiln_pipe *pp = rig_pipe(&r, NULL, 0, 1);
	struct kiln_comm_ops ops = { .version = 5, .send = resize_send, .recv = pair_recv };
	static const int rank_of[2] = { 0, 1 }, world_of[2] = { 2, 3 };
	struct kiln_pipe_rank *R;
	struct kiln_stage_transport tr;
	resize_dev = r.dev;
	OK(kiln_pipe_rank_open(&ops, NULL, r.dev, 2, 0, rank_of, world_of, 1, 1, &R, &tr));
	atomic_store(&resize_done, 0);
	OK(tr.ops->send(tr.ctx, 0, 1, 0, r.x, 16, r.stream));
	OK(tr.ops->send(tr.ctx, 0, 1, 0, r.x, 32, r.stream));
	const int done = atomic_load(&resize_done);
	ck_assert_msg(done == 1, "the slot was reallocated before its last send ended");
	OK(kiln_pipe_rank_flush(R, r.stream));
	OK(kiln_device_stream_sync(r.dev, r.stream));
	kiln_pipe_rank_free(R);
	rig_close(&r, pp);
}
END_TEST

/* ---- a pipe's stages drained at the teardown (session 48).  A step
 * that fails on the host half enqueued (here the communicator refuses the
 * step's last receive) returns before the step's end makes the trainer's
 * stream wait for the stages: trainer_close's sync of that stream left
 * the stage's stream running (held in the third receive here), and
 * free_device then freed the batch's buffers that its queued passes read.
 * kiln_pipe_drain, which free_device and kiln_pipe_free now call first,
 * returns once the held stage has run its queue. */
static int fq_n;
static atomic_int fq_released, fq_gate;
static atomic_llong fq_live; /* the device's live bytes as the held receive ends */

/* The held receive: it waits for the test's gate (opened after the
 * premise is checked: the window, whatever the test thread's delay;
 * 20 s at most, so that a premise gone wrong fails rather than hangs),
 * then 300 ms more, which a drain that does not wait returns within. */
static kiln_status fq_slow(void *arg)
{
	(void)arg;
	for (int i = 0; i < 20000 && !atomic_load(&fq_gate); i++)
		usleep(1000);
	usleep(300 * 1000);
	size_t live, peak;
	kiln_device_mem(plog.dev, &live, &peak);
	atomic_store(&fq_live, (long long)live);
	atomic_store(&fq_released, 1);
	return KILN_OK;
}

static kiln_status fq_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			   void *done)
{
	(void)ctx, (void)buf, (void)count, (void)dtype, (void)peer, (void)done;
	if (++fq_n == 3)
		return kiln_device_host_fn(plog.dev, stream, fq_slow, NULL);
	if (fq_n == 4)
		return kiln_error(KILN_EIO, "fake: recv refused");
	return KILN_OK;
}

/* The step that fails half enqueued, its stage's stream held (the gate
 * shut), the trainer's stream synced as trainer_close does first */
static struct kiln_pipe *fq_open(struct seed_rig *r, const struct kiln_comm_ops *ops)
{
	struct kiln_pipe *pp = rig_pipe(r, NULL, 0, 1);
	rig_ranks(r, pp, ops, 0);
	fq_n = 0;
	atomic_store(&fq_released, 0);
	atomic_store(&fq_gate, 0);
	atomic_store(&fq_live, -1);
	ck_assert_int_eq(kiln_pipe_step(pp, r->x, r->y, sizeof(int32_t), r->metrics), KILN_EIO);
	ck_assert_int_eq(fq_n, 4);
	kiln_device_stream_sync(r->dev, r->stream);
	ck_assert_msg(!atomic_load(&fq_released), "the stage was not held (the test's premise)");
	return pp;
}

START_TEST(test_free_queued)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 4, .send = pair_send, .recv = fq_recv };
	struct kiln_pipe *pp = fq_open(&r, &ops);
	atomic_store(&fq_gate, 1);
	kiln_pipe_drain(pp);
	ck_assert_msg(atomic_load(&fq_released), "kiln_pipe_drain returned with the stage's queue held");
	kiln_pipe_free(pp);
	seed_close(&r);
}
END_TEST

/* The same through the teardown itself (session 49): kiln_pipe_free, the
 * stage still held, frees no device memory before the held receive has
 * ended (its stream runs the rest of its queue on the pipe's buffers and
 * messages), and returns after it: the device's live bytes as it ends are
 * those before the free.  Without kiln_pipe_free's drain the free went on
 * at once (the rank transport's messages, the plans' buffers) while the
 * stage was held. */
START_TEST(test_free_queued_teardown)
{
	struct seed_rig r;
	struct kiln_comm_ops ops = { .version = 4, .send = pair_send, .recv = fq_recv };
	struct kiln_pipe *pp = fq_open(&r, &ops);
	size_t before, peak;
	kiln_device_mem(r.dev, &before, &peak);
	atomic_store(&fq_gate, 1);
	kiln_pipe_free(pp);
	ck_assert_msg(atomic_load(&fq_released), "kiln_pipe_free returned with the stage's queue held");
	ck_assert_msg(atomic_load(&fq_live) == (long long)before,
		      "the device held %lld bytes as the held stage ended, %zu before kiln_pipe_free: it freed while the stage ran",
		      atomic_load(&fq_live), before);
	seed_close(&r);
}
END_TEST

/* defer_wgrad = auto's reading: an unreadable one (< 0) reads quiet and
 * keeps the last good reading, so the next good one measures from it
 * (not from -1, which read ~1.1 s a second here); a drop (threads
 * exited) reads 0. */
START_TEST(test_wauto_rate)
{
	int64_t w = 1000000000, t = 0;
	ck_assert(kiln_pipe_wauto_rate(&w, &t, -1, 1000000000) == 0);
	ck_assert_msg(w == 1000000000 && t == 0, "unreadable: kept %lld ns at %lld", (long long)w, (long long)t);
	double r = kiln_pipe_wauto_rate(&w, &t, 1100000000, 2000000000);
	ck_assert_msg(fabs(r - 0.05) < 1e-9, "after an unreadable reading: %.3f s a second, not 0.05", r);
	ck_assert(w == 1100000000 && t == 2000000000);
	ck_assert(kiln_pipe_wauto_rate(&w, &t, 500000000, 3000000000) == 0);
	r = kiln_pipe_wauto_rate(&w, &t, 800000000, 4000000000);
	ck_assert_msg(fabs(r - 0.3) < 1e-9, "after a drop: %.3f s a second, not 0.3", r);
}
END_TEST

static Suite *make_pipeline_suite(void)
{
	Suite *s = suite_create("pipeline");
	check_add_case(s, "schedule", 30, NULL, NULL,
		       (const TTest *[]){ test_schedules, test_1f1b_order, NULL });
	check_add_case(s, "replay", 30, NULL, NULL,
		       (const TTest *[]){ test_replay_equal, test_replay_imbalance, test_replay_early,
					  test_gaps, test_gap_quantiles, test_smooth, test_end_passes,
					  NULL });
	check_add_case(s, "balance", 30, NULL, NULL, (const TTest *[]){ test_balance, test_balance_tie, test_balance_bytes, NULL });
	check_add_case(s, "seed", 60, NULL, NULL, (const TTest *[]){ test_loss_grad_mean, test_loss_alone, NULL });
	check_add_case(s, "pair", 60, NULL, NULL, (const TTest *[]){ test_pair_handoffs, test_pair_skip_alone, test_pair_plan_large,
								 test_pair_plan_stuck, NULL });
	check_add_case(s, "busy_line", 30, NULL, NULL, (const TTest *[]){ test_busy_line_whole, test_report_whole, NULL });
	check_add_case(s, "wauto", 10, NULL, NULL, (const TTest *[]){ test_wauto_rate, NULL });
	check_add_case(s, "gone", 60, NULL, NULL, (const TTest *[]){ test_gone_world_ranks, NULL });
	check_add_case(s, "late", 60, NULL, NULL, (const TTest *[]){ test_late_send_named_once, NULL });
	check_add_case(s, "resize", 60, NULL, NULL, (const TTest *[]){ test_slot_resize_waits, NULL });
	check_add_case(s, "free_queued", 60, NULL, NULL, (const TTest *[]){ test_free_queued, test_free_queued_teardown, NULL });
	check_add_case(s, "explain", 60, NULL, NULL, (const TTest *[]){ test_explain_recv, test_explain_unrelated, test_explain_eval,
								   test_eval_send, test_eval_send_after_recv, test_eval_xfers, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_pipeline_suite, .reg = &reg,
					       .need_cpu = 1 };
