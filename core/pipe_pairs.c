/* core/pipe_pairs.c - which of a pipeline step's sends go paired with the
 * recv after them in one sendrecv ([pipeline] sendrecv, stages on ranks:
 * core/pipe_rank.c; docs/pipeline.md, "Stages on ranks"): every pair that
 * cannot deadlock the step.
 *
 * The executor (core/pipe_run.c: xsend, xrecv, xflush) holds a stage's
 * last send until its next hand-off, and a recv from the same stage pairs
 * with it.  In 1f1b's steady state with one crossing tensor each way that
 * is safe; with two each way (a skip connection across the cut) it hung:
 * stage 0 paired activation e1 of micro-batch j + 1 with gradient e0 of j,
 * stage 1 gradient e1 of j with activation e0 of j + 1, and each pair
 * first waits for the earlier sends to its peer on the transport's send
 * stream (rank_sendrecv: activation e0 of j + 1; gradient e0 of j), which
 * the peer receives in its own pair, after its own wait.  Where a send
 * waits for its recv (Gloo's TCP, MPI's large messages, NCCL) both waited
 * until [dist] timeout.
 *
 * So every rank plays the step's hand-offs through before the first step,
 * the same on every rank (the schedule and the crossing tensors are), on
 * the slowest transport: each send waits for its recv to be posted, each
 * recv for its send; an unpaired send goes on its stage's send stream
 * (first in, first out); a pair waits for the send stream's last send to
 * its peer, then posts both halves, which complete apart; a stage's
 * stream runs its hand-offs in order.  Every wait there ends on something
 * posted, and a faster transport (an eager or buffered send; one sent at
 * once from the stage's stream, send_now) posts nothing later and waits
 * for nothing more, so a step that completes here completes there.  Where
 * it deadlocks, the stuck pair issued first in the schedule's order goes
 * alone (its send, then its recv), and the step is played again, until it
 * completes, from a snapshot before that pair's action (struct play; from
 * the step's start it was about M^2 P^3: 0.38 s at M = 256, P = 8 with a
 * skip across each cut).  A step that completed before keeps every pair
 * it had.  Stuck with no pair to leave
 * alone, it is played once more with every send alone; stuck still (the
 * schedule's own order waits for ever), the plan fails naming the stage
 * and its message.  (Not
 * modelled, as the unpaired hand-offs' design does not: a token's send to
 * a shared-memory channel waiting for room, send_direct.) */
#include "pipe_impl.h"

enum { H_SEND, H_RECV, H_FLUSH };

/* A stage's hand-off as the executor issues it, before pairing. */
struct handoff {
	int kind; /* H_SEND, H_RECV, or H_FLUSH: work (a held send goes first) */
	int peer;
	int slot; /* the message's (kiln_pipe_tag_slot) */
	int act;  /* the schedule's action it belongs to, -1 the step's start */
};

/* What a stage's stream runs once paired. */
enum { P_SEND, P_RECV, P_PAIR };
struct pop {
	int kind;
	int a, b; /* P_SEND, P_RECV: message a; P_PAIR: send a, recv b */
	int w;    /* P_SEND: its place on the send stream; P_PAIR: the place of
		   * the last send to the peer before it there, -1 none */
	int act;
};

struct walk {
	const struct kiln_pipe *pp;
	int n_msgs, n;   /* as pp->n_pair_msgs, pp->n_pair_slots */
	struct handoff *h;
	int nh, cap;
	int first[KILN_PIPE_MAX_STAGES + 1]; /* stage s's: h[first[s] .. first[s + 1]) */
};

static kiln_status add(struct walk *w, int kind, int peer, uint64_t tag, int act)
{
	if (w->nh == w->cap) {
		const int cap = w->cap ? 2 * w->cap : 256;
		struct handoff *h = realloc(w->h, (size_t)cap * sizeof *h);
		if (!h)
			return kiln_error(KILN_ENOMEM, "out of memory");
		w->h = h, w->cap = cap;
	}
	w->h[w->nh++] = (struct handoff){ kind, peer,
					   kind == H_FLUSH ? -1 : kiln_pipe_tag_slot(tag, w->n_msgs, w->n),
					   act };
	return KILN_OK;
}

/* Action i's hand-offs in the order stage_forward, or stage_backward with
 * receive_grads and tie_grads, issues them (core/pipe_run.c). */
static kiln_status walk_action(struct walk *w, int i)
{
	const struct kiln_pipe *pp = w->pp;
	const struct kiln_plan *p = pp->plan[0];
	const struct kiln_pipe_action *a = &pp->act[i];
	const int s = a->stage, j = a->mb;
	kiln_status st = KILN_OK;
	int su, so;
	if (a->kind == KILN_PIPE_FWD) {
		for (int e = 0; e < p->n_xfer && !st; e++)
			if (p->xfer[e].to == s)
				st = add(w, H_RECV, p->xfer[e].from, pipe_tag(j, e, 0), i);
		st = st ? st : add(w, H_FLUSH, -1, 0, i);
		for (int e = 0; e < p->n_xfer && !st; e++)
			if (p->xfer[e].from == s)
				st = add(w, H_SEND, p->xfer[e].to, pipe_tag(j, e, 0), i);
		return st;
	}
	for (int to = pp->P - 1; to > s; to--)
		for (int e = 0; e < p->n_xfer && !st; e++)
			if (p->xfer[e].from == s && p->xfer[e].to == to && p->xfer[e].grecv >= 0)
				st = add(w, H_RECV, to, pipe_tag(j, e, 1), i);
	for (int t = 0; !st && pipe_tie_user(pp, t, &su, &so) >= 0; t++)
		if (so == s)
			st = add(w, H_RECV, su, pipe_tag(j, p->n_xfer + t, 1), i);
	st = st ? st : add(w, H_FLUSH, -1, 0, i);
	for (int e = 0; e < p->n_xfer && !st; e++)
		if (p->xfer[e].to == s && p->xfer[e].grecv >= 0)
			st = add(w, H_SEND, p->xfer[e].from, pipe_tag(j, e, 1), i);
	for (int t = 0; !st && pipe_tie_user(pp, t, &su, &so) >= 0; t++)
		if (su == s)
			st = add(w, H_SEND, so, pipe_tag(j, p->n_xfer + t, 1), i);
	return st;
}

/* Every stage's hand-offs in a step: the tied weights at its start
 * (tie_weights: not held, never paired), its actions', the step's end. */
static kiln_status walk_step(struct walk *w)
{
	const struct kiln_pipe *pp = w->pp;
	const int n_xfer = pp->plan[0]->n_xfer;
	kiln_status st = KILN_OK;
	int su, so;
	for (int s = 0; s < pp->P && !st; s++) {
		w->first[s] = w->nh;
		for (int t = 0; !st && pipe_tie_user(pp, t, &su, &so) >= 0; t++) {
			if (so == s && !(st = add(w, H_SEND, su, pipe_tag(0, n_xfer + t, 0), -1)))
				st = add(w, H_FLUSH, -1, 0, -1);
			if (su == s && !st)
				st = add(w, H_RECV, so, pipe_tag(0, n_xfer + t, 0), -1);
		}
		for (int i = 0; i < 2 * pp->P * pp->M && !st; i++)
			if (pp->act[i].stage == s)
				st = walk_action(w, i);
		st = st ? st : add(w, H_FLUSH, -1, 0, -1);
	}
	w->first[pp->P] = w->nh;
	return st;
}

/* Stage s's stream once paired as xsend and xrecv pair (a held send and
 * a recv from its peer right after it), but for the sends alone[] names:
 * into op, its count returned; each pair's send slot -> 1 + its recv's
 * into with (NULL: not kept). */
static int pair_ops(const struct walk *w, int s, const unsigned char *alone, struct pop *op,
		    int *with)
{
	int last[KILN_PIPE_MAX_STAGES], n = 0, nq = 0;
	const struct handoff *held = NULL;
	for (int q = 0; q < w->pp->P; q++)
		last[q] = -1;
	for (int i = w->first[s]; i <= w->first[s + 1]; i++) {
		const struct handoff *x = i < w->first[s + 1] ? &w->h[i] : NULL;
		if (held && x && x->kind == H_RECV && x->peer == held->peer && !alone[held->slot]) {
			op[n++] = (struct pop){ P_PAIR, held->slot, x->slot, last[x->peer], x->act };
			if (with)
				with[held->slot] = 1 + x->slot;
			held = NULL;
			continue;
		}
		if (held) { /* (rank_send: last[] names the send stream's latest) */
			op[n++] = (struct pop){ P_SEND, held->slot, -1, nq, held->act };
			last[held->peer] = nq++;
			held = NULL;
		}
		if (x && x->kind == H_SEND)
			held = x;
		else if (x && x->kind == H_RECV)
			op[n++] = (struct pop){ P_RECV, x->slot, -1, -1, x->act };
	}
	return n;
}

/* The state of a play: per message its send and its recv posted; per
 * stage the next of its n[s] ops (at[s]), whether that pair's halves are
 * posted, and its send stream: q[s] from qh[s] (done before) to qn[s].
 * Each stage runs its ops in order and waits only for flags that, once
 * set, stay set, so where a play ends does not depend on the order the
 * stages move in: played in rounds (ops of actions before lim, lim = 0,
 * 1, ...), it ends where played at once.  snap[k]: the state at the start
 * of round k stride (sent, rcvd, then per stage posted, at, qh, qn), the
 * point a replay starts from when a pair of an action from there on goes
 * alone (the ops before it, the stage's send stream's included, are
 * those it had). */
struct play {
	unsigned char *sent, *rcvd, *posted;
	int *at, *nop, *qh, *qn;
	int **q;
	struct pop **op;
	unsigned char *snap;
	size_t snap_size;
	int stride;
};

static void post(unsigned char *f, int i, int *moved)
{
	if (!f[i])
		f[i] = 1, *moved = 1;
}

/* Stage s's stream, as far as it goes with the ops of actions before lim,
 * and then its send stream. */
static void play_stage(struct play *g, int s, int lim, int *moved)
{
	while (g->at[s] < g->nop[s] && g->op[s][g->at[s]].act < lim) {
		const struct pop *o = &g->op[s][g->at[s]];
		if (o->kind == P_SEND) {
			g->q[s][g->qn[s]++] = o->a;
		} else if (o->kind == P_RECV) {
			post(g->rcvd, o->a, moved);
			if (!g->sent[o->a])
				break;
		} else {
			if (!g->posted[s] && o->w >= g->qh[s])
				break; /* the send stream's earlier sends to the peer */
			post(g->posted, s, moved);
			post(g->sent, o->a, moved);
			post(g->rcvd, o->b, moved);
			if (!g->rcvd[o->a] || !g->sent[o->b])
				break;
			g->posted[s] = 0;
		}
		g->at[s]++;
		*moved = 1;
	}
	while (g->qh[s] < g->qn[s]) {
		const int m = g->q[s][g->qh[s]];
		post(g->sent, m, moved);
		if (!g->rcvd[m])
			break;
		g->qh[s]++;
		*moved = 1;
	}
}

/* The state at snap[k] (save 1: kept there; 0: taken from there). */
static void snapshot(const struct walk *w, struct play *g, int k, int save)
{
	const size_t n = (size_t)w->n, P = (size_t)w->pp->P, ip = P * sizeof(int);
	unsigned char *at = g->snap + (size_t)k * g->snap_size;
	struct { void *p; size_t size; } part[] = { { g->sent, n }, { g->rcvd, n }, { g->posted, P },
						    { g->at, ip }, { g->qh, ip }, { g->qn, ip } };
	for (size_t i = 0; i < sizeof part / sizeof *part; at += part[i++].size)
		save ? memcpy(at, part[i].p, part[i].size) : memcpy(part[i].p, at, part[i].size);
}

/* Stage s's ops with the pairs alone[] leaves (all stages: s = -1). */
static void play_ops(const struct walk *w, const unsigned char *alone, struct play *g, int s)
{
	for (int t = s < 0 ? 0 : s; t < (s < 0 ? w->pp->P : s + 1); t++) {
		g->op[t] = g->op[0] + w->first[t];
		g->q[t] = g->q[0] + w->first[t];
		g->nop[t] = pair_ops(w, t, alone, g->op[t], NULL);
	}
}

/* The step played on from round lim to its end: -1 when it completes,
 * else the stage stuck at the pair issued first (the schedule's order,
 * then the stages'), -2 stuck with no pair. */
static int play_step(const struct walk *w, struct play *g, int lim)
{
	const int P = w->pp->P, A = 2 * P * w->pp->M;
	for (; lim < A + g->stride; lim += g->stride) {
		snapshot(w, g, lim / g->stride, 1);
		for (int moved = 1; moved;) {
			moved = 0;
			for (int s = 0; s < P; s++)
				play_stage(g, s, lim, &moved);
		}
	}
	int stuck = -1, done = 1;
	for (int s = 0; s < P; s++) {
		if (g->at[s] == g->nop[s] && g->qh[s] == g->qn[s])
			continue;
		done = 0;
		const struct pop *o = g->at[s] < g->nop[s] ? &g->op[s][g->at[s]] : NULL;
		if (o && o->kind == P_PAIR && (stuck < 0 || o->act < g->op[stuck][g->at[stuck]].act))
			stuck = s;
	}
	return done ? -1 : stuck < 0 ? -2 : stuck;
}

/* A step stuck with every send alone: the first stuck stage and what it
 * waits for, as an internal error (the schedule or the walk is wrong). */
static kiln_status stuck_error(const struct walk *w, const struct play *g)
{
	int s = 0;
	while (s + 1 < w->pp->P && g->at[s] == g->nop[s] && g->qh[s] == g->qn[s])
		s++;
	const int on = g->at[s] < g->nop[s], m = on ? g->op[s][g->at[s]].a : g->q[s][g->qh[s]];
	return kiln_error(KILN_EINTERNAL, "pipeline: the plan of the pairs: stage %d's hand-offs wait for ever with every send alone, at its %s of micro-batch %d's %s %d (message slot %d; core/pipe_pairs.c)",
			  s, on && g->op[s][g->at[s]].kind == P_RECV ? "recv" : "send",
			  m / (2 * w->n_msgs), m & 1 ? "gradient" : "crossing tensor",
			  m / 2 % w->n_msgs, m);
}

/* Sends of this rank's stage that the step leaves alone though a recv
 * from their peer follows (alone[], set by the plays), logged. */
static void log_alone(const struct walk *w, const unsigned char *alone)
{
	const struct kiln_pipe *pp = w->pp;
	const int s = pp->mine;
	uint64_t peers = 0;
	int n = 0;
	for (int i = w->first[s]; i + 1 < w->first[s + 1]; i++)
		if (w->h[i].kind == H_SEND && w->h[i + 1].kind == H_RECV &&
		    w->h[i + 1].peer == w->h[i].peer && alone[w->h[i].slot])
			n++, peers |= 1ull << w->h[i].peer;
	if (!n)
		return;
	char list[256] = "";
	for (int q = 0, k = 0; q < pp->P && k + 8 < (int)sizeof list; q++)
		if (peers >> q & 1)
			k += snprintf(list + k, sizeof list - (size_t)k, "%s%d", k ? ", " : "", q);
	kiln_log(KILN_LOG_INFO, "pipeline", "stage %d: %d sends a step go alone, not paired with the recv from stage %s after them: paired, the stages' hand-offs could wait on each other for ever where a send waits for its recv (core/pipe_pairs.c)",
		 s, n, list);
}

kiln_status kiln_pipe_pairs_plan(struct kiln_pipe *pp, int n_tie)
{
	free(pp->pair_with);
	pp->pair_with = NULL;
	if (!pp->pair || !pp->tr.ops->sendrecv) /* (rank_alone_ops: no sendrecv) */
		return KILN_OK;
	struct walk w = { .pp = pp, .n_msgs = pp->plan[0]->n_xfer + n_tie };
	w.n = 2 * pp->M * w.n_msgs;
	struct play g = { 0 };
	unsigned char *alone = calloc((size_t)w.n + 1, 1);
	int *with = calloc((size_t)w.n + 1, sizeof *with);
	kiln_status st = alone && with ? walk_step(&w) : kiln_error(KILN_ENOMEM, "out of memory");
	const size_t nh = (size_t)w.nh + 1, P = (size_t)pp->P;
	if (!st && (!(g.sent = calloc((size_t)w.n + 1, 1)) || !(g.rcvd = calloc((size_t)w.n + 1, 1)) ||
		    !(g.posted = calloc(P, 1)) || !(g.at = calloc(P, sizeof(int))) ||
		    !(g.nop = calloc(P, sizeof(int))) || !(g.qh = calloc(P, sizeof(int))) ||
		    !(g.qn = calloc(P, sizeof(int))) || !(g.q = calloc(P, sizeof *g.q)) ||
		    !(g.op = calloc(P, sizeof *g.op)) || !(g.q[0] = calloc(nh, sizeof(int))) ||
		    !(g.op[0] = calloc(nh, sizeof(struct pop)))))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	/* (at most 66 snapshots: a replay plays at most 1/64 of the step's
	 * actions again before the pair it unpairs) */
	g.stride = 2 * pp->P * pp->M / 64 + 1;
	g.snap_size = 2 * (size_t)w.n + P + 3 * P * sizeof(int);
	if (!st && !(g.snap = malloc((size_t)(2 * pp->P * pp->M / g.stride + 2) * g.snap_size)))
		st = kiln_error(KILN_ENOMEM, "out of memory");
	/* each play that deadlocks leaves the pair it is stuck at first alone
	 * and plays on from before that pair's action */
	if (!st)
		play_ops(&w, alone, &g, -1);
	for (int s, lim = 0, all = 0; !st && (s = play_step(&w, &g, lim)) != -1;) {
		if (s >= 0) {
			const struct pop *o = &g.op[s][g.at[s]];
			lim = o->act < 0 ? 0 : o->act / g.stride * g.stride;
			alone[o->a] = 1;
			play_ops(&w, alone, &g, s);
		} else if (!all) { /* stuck at no pair: played again with none */
			memset(alone, 1, (size_t)w.n), all = 1, lim = 0;
			play_ops(&w, alone, &g, -1);
		} else {
			st = stuck_error(&w, &g);
		}
		snapshot(&w, &g, lim / g.stride, 0);
	}
	for (int s = 0; !st && s < pp->P; s++)
		pair_ops(&w, s, alone, g.op[0], with);
	if (!st)
		log_alone(&w, alone);
	if (g.q)
		free(g.q[0]);
	if (g.op)
		free(g.op[0]);
	free(g.sent), free(g.rcvd), free(g.posted), free(g.at), free(g.nop);
	free(g.qh), free(g.qn), free(g.q), free(g.op), free(g.snap);
	free(w.h);
	free(alone);
	if (st) {
		free(with);
		return st;
	}
	pp->pair_with = with;
	pp->n_pair_msgs = w.n_msgs;
	pp->n_pair_slots = w.n;
	return KILN_OK;
}
