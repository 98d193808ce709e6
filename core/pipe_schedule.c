/* core/pipe_schedule.c - the micro-batch schedules: each stage's own list
 * of forwards and backwards (gpipe, 1f1b), run together tick by tick as
 * early as their dependencies allow, into one order that an executor can
 * issue. */
#include "pipeline.h"

/* Stage s's own list: gpipe's M forwards then M backwards; 1f1b's
 * warm-up of min(P-1-s, M) forwards (early more on every stage but the
 * last), then a forward and a backward in turn, then the backwards left. */
static void stage_list(int kind, int P, int M, int early, int s, struct kiln_pipe_action *a)
{
	int n = 0, f = 0, b = 0;
	int warm = kind == KILN_PIPE_1F1B ? P - 1 - s + (s < P - 1 ? early : 0) : M;
	if (warm > M)
		warm = M;
	while (f < warm)
		a[n++] = (struct kiln_pipe_action){ KILN_PIPE_FWD, s, f++, 0 };
	while (f < M) {
		a[n++] = (struct kiln_pipe_action){ KILN_PIPE_FWD, s, f++, 0 };
		a[n++] = (struct kiln_pipe_action){ KILN_PIPE_BWD, s, b++, 0 };
	}
	while (b < M)
		a[n++] = (struct kiln_pipe_action){ KILN_PIPE_BWD, s, b++, 0 };
}

/* Whether action a may run at tick t: what it depends on finished before
 * t (fdone/bdone[s * M + mb]: the tick it ran in, -1 not yet). */
static int ready(const struct kiln_pipe_action *a, int P, int M, const int *fdone,
		 const int *bdone, int t)
{
	const int s = a->stage, j = a->mb;
	if (a->kind == KILN_PIPE_FWD)
		return s == 0 || (fdone[(s - 1) * M + j] >= 0 && fdone[(s - 1) * M + j] < t);
	if (fdone[s * M + j] < 0 || fdone[s * M + j] >= t)
		return 0;
	return s == P - 1 || (bdone[(s + 1) * M + j] >= 0 && bdone[(s + 1) * M + j] < t);
}

kiln_status kiln_pipe_schedule(int kind, int P, int M, int early, struct kiln_pipe_action *out,
			       int *ticks, int *inflight)
{
	if (P < 1 || M < 1 || P > KILN_PIPE_MAX_STAGES || early < 0 ||
	    (kind != KILN_PIPE_GPIPE && kind != KILN_PIPE_1F1B))
		return kiln_error(KILN_EINVAL, "pipeline schedule: %d stages, %d micro-batches, %d early forwards",
				  P, M, early);
	const int per = 2 * M, total = P * per;
	struct kiln_pipe_action *lists = malloc(sizeof *lists * (size_t)total);
	int *next = calloc((size_t)P, sizeof(int));
	int *fdone = malloc(sizeof(int) * (size_t)P * (size_t)M);
	int *bdone = malloc(sizeof(int) * (size_t)P * (size_t)M);
	kiln_status st = KILN_OK;
	if (!lists || !next || !fdone || !bdone) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < P * M; i++)
		fdone[i] = bdone[i] = -1;
	for (int s = 0; s < P; s++)
		stage_list(kind, P, M, early, s, lists + s * per);
	int n = 0, t = 0, live = 0, most = 0;
	while (n < total) {
		int moved = 0;
		for (int s = 0; s < P; s++) {
			if (next[s] == per)
				continue;
			struct kiln_pipe_action *a = &lists[s * per + next[s]];
			if (!ready(a, P, M, fdone, bdone, t))
				continue;
			a->tick = t;
			(a->kind == KILN_PIPE_FWD ? fdone : bdone)[s * M + a->mb] = t;
			if (s == 0)
				live += a->kind == KILN_PIPE_FWD ? 1 : -1;
			if (live > most)
				most = live;
			out[n++] = *a;
			next[s]++;
			moved = 1;
		}
		if (!moved && t > 2 * total) {
			st = kiln_error(KILN_EINTERNAL, "pipeline schedule: stuck at tick %d", t);
			goto out;
		}
		t++;
	}
	*ticks = t;
	*inflight = most;
out:
	free(lists);
	free(next);
	free(fdone);
	free(bdone);
	return st;
}

int kiln_pipe_sets_lagged(const struct kiln_pipe_action *act, int P, int M, int lag, int inflight)
{
	int live = 0, most = inflight;
	for (int i = 0; i < 2 * P * M; i++) {
		if (act[i].stage)
			continue;
		live += act[i].kind == KILN_PIPE_FWD ? 1 : act[i].mb >= lag ? -1 : 0;
		most = live > most ? live : most;
	}
	return most;
}

double kiln_pipe_bubble(int P, int M, int ticks)
{
	(void)P;
	return ticks > 0 ? 1.0 - 2.0 * M / (double)ticks : 0.0;
}
