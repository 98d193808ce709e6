/* plugins/gloo/deadline.cc - see deadline.h. */
#include "deadline.h"
#include "../common/c_locale.h" /* common_snprintf_c */

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <unistd.h>    /* getpid */

/* plugins/common/watchdog.c: the run clock (host table version 7) */
extern "C" long long watchdog_now_ns(void);

namespace kiln_gloo {

/* The process's one watching thread and the Deadlines it watches.  m
 * guards every Deadline's state too (begin and end take it twice per Gloo
 * operation; the operations take milliseconds on TCP).  life serialises a
 * whole start or stop of the thread, the join included (a start between a
 * stop's release and its join would overwrite the handle). */
struct Watcher {
	static std::mutex life, m;
	static std::condition_variable cv;
	static std::thread *t; /* (leaked in a child forked while it ran) */
	static pid_t pid;      /* the process t runs in */
	static std::vector<Deadline *> all;
	static int on; /* slots in use, every Deadline's */
	static bool quit;

	static void loop();
};

std::mutex Watcher::life, Watcher::m;
std::condition_variable Watcher::cv;
std::thread *Watcher::t;
pid_t Watcher::pid;
std::vector<Deadline *> Watcher::all;
int Watcher::on;
bool Watcher::quit;

/* Asleep while nothing is watched; else ten looks a second at the run
 * clock (a condition timed on steady_clock, CLOCK_MONOTONIC: the run
 * clock is read on each wake-up, so a suspension is not counted). */
void Watcher::loop()
{
	prctl(PR_SET_NAME, "kiln-gloo-due");
	std::unique_lock<std::mutex> lk(m);
	while (!quit) {
		if (on == 0)
			cv.wait(lk);
		else
			cv.wait_for(lk, std::chrono::milliseconds(100));
		if (quit || on == 0)
			continue;
		const int64_t now = (int64_t)watchdog_now_ns();
		for (Deadline *d : all) {
			if (d->expired_ || !d->on_)
				continue;
			for (const Deadline::Slot &s : d->slot_)
				if (s.on && now >= s.due) {
					d->expire(s);
					break;
				}
		}
	}
}

Deadline::Deadline(const struct kiln_host *host, int rank, int world, int timeout_ms,
		   const char *peer)
	: H_(host), rank_(rank), world_(world), timeout_ms_(timeout_ms), peer_(peer)
{
}

kiln_status Deadline::start()
{
	std::lock_guard<std::mutex> life(Watcher::life);
	{
		std::lock_guard<std::mutex> g(Watcher::m);
		if (Watcher::t && Watcher::pid != getpid()) {
			/* a child forked while its parent's thread ran: the
			 * thread is not here, nor are the parent's Deadlines */
			Watcher::t = nullptr;
			Watcher::all.clear();
			Watcher::on = 0;
		}
		Watcher::all.push_back(this);
		started_ = true;
		if (Watcher::t)
			return KILN_OK;
		Watcher::quit = false;
	}
	try {
		Watcher::t = new std::thread(Watcher::loop);
		Watcher::pid = getpid();
	} catch (const std::exception &e) {
		std::lock_guard<std::mutex> g(Watcher::m);
		Watcher::all.erase(std::find(Watcher::all.begin(), Watcher::all.end(), this));
		started_ = false;
		return H_->error(KILN_EIO, "gloo: rank %d: no thread for the collectives' deadline: %s",
				 rank_, e.what());
	}
	return KILN_OK;
}

Deadline::~Deadline()
{
	if (!started_)
		return;
	std::lock_guard<std::mutex> life(Watcher::life);
	std::thread *t = nullptr;
	{
		std::lock_guard<std::mutex> g(Watcher::m);
		auto it = std::find(Watcher::all.begin(), Watcher::all.end(), this);
		if (it == Watcher::all.end())
			return; /* (a forked child's copy of its parent's) */
		Watcher::all.erase(it);
		Watcher::on -= on_;
		if (Watcher::all.empty() && Watcher::t && Watcher::pid == getpid()) {
			t = Watcher::t;
			Watcher::t = nullptr;
			Watcher::quit = true;
			Watcher::cv.notify_all();
		}
	}
	if (t) {
		t->join(); /* (life held: no start meanwhile) */
		delete t;
	}
}

void Deadline::watch(std::shared_ptr<gloo::transport::Context> t)
{
	std::lock_guard<std::mutex> g(Watcher::m);
	ctx_ = std::move(t);
}

int Deadline::begin(int64_t span_ms, bool connecting, gloo::transport::UnboundBuffer *a,
		    gloo::transport::UnboundBuffer *b)
{
	const int64_t due = (int64_t)watchdog_now_ns() + span_ms * 1000000;
	std::lock_guard<std::mutex> g(Watcher::m);
	for (int k = 0; k < kSlots; k++) {
		Slot &s = slot_[k];
		if (s.on)
			continue;
		s.on = true, s.connecting = connecting, s.due = due, s.a = a, s.b = b;
		on_++;
		if (Watcher::on++ == 0)
			Watcher::cv.notify_all(); /* it slept: nothing was watched */
		return k;
	}
	return -1;
}

bool Deadline::end(int slot)
{
	std::lock_guard<std::mutex> g(Watcher::m);
	if (slot >= 0 && slot_[slot].on) {
		slot_[slot] = Slot();
		on_--;
		Watcher::on--;
	}
	return expired_;
}

void Deadline::reset()
{
	std::lock_guard<std::mutex> g(Watcher::m);
	expired_ = connecting_ = false;
	ctx_.reset();
}

bool Deadline::expired()
{
	std::lock_guard<std::mutex> g(Watcher::m);
	return expired_;
}

std::string Deadline::why(int peer, const std::string &host) const
{
	char m[600], who[320];
	if (peer < 0 && world_ == 2)
		peer = 1 - rank_; /* the only peer */
	if (peer >= 0)
		std::snprintf(who, sizeof who, "%s %d%s", peer_.c_str(), peer, host.c_str());
	else
		std::snprintf(who, sizeof who, "a peer (Gloo does not say which)");
	if (connecting_)
		common_snprintf_c(m, sizeof m, "%s did not connect within [dist] timeout = %.1f s (kiln's deadline for the whole mesh, on the run clock; rank %d closed its pairs)",
			      who, timeout_ms_ / 1000.0, rank_);
	else
		common_snprintf_c(m, sizeof m, "%s did not answer within [dist] timeout = %.1f s (kiln's deadline, on the run clock: a time in which this whole process stood still, a suspended job, is not counted; rank %d closed its pairs)",
			      who, timeout_ms_ / 1000.0, rank_);
	return m;
}

/* Close every pair and abort the unbound buffers' waits.  Gloo's own way
 * (its public interface has no other): an unbound buffer's wait that
 * times out sets an exception on every pair of its context, which wakes
 * every wait on the pairs' buffers and pending operations with "Application
 * timeout caused pair closure" and closes the sockets (the peers see the
 * connection closed).  (Under Watcher::m: begin and end wait for it; the
 * pairs' locks are taken inside, and no thread holding one waits for m.) */
void Deadline::expire(const Slot &s)
{
	expired_ = true;
	connecting_ = s.connecting;
	if (ctx_) {
		char one = 0;
		try {
			auto ub = ctx_->createUnboundBuffer(&one, 1);
			ub->waitRecv(nullptr, std::chrono::milliseconds(1));
		} catch (const std::exception &) {
			/* (the expected end of that wait) */
		}
	}
	for (const Slot &o : slot_)
		if (o.on) {
			if (o.a)
				o.a->abortWaitRecv(), o.a->abortWaitSend();
			if (o.b)
				o.b->abortWaitRecv(), o.b->abortWaitSend();
		}
}

} // namespace kiln_gloo
