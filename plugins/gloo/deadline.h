/* plugins/gloo/deadline.h - kiln's deadline around Gloo's TCP waits
 * (docs/distributed.md "A suspended job").
 *
 * Gloo times its waits on its own clock (steady_clock: a pair's timeout,
 * fixed when the pair is made), so a job suspended whole (SIGSTOP of every
 * process, `scontrol suspend`) for longer than [dist] timeout failed on
 * resume: each rank's pending collective found Gloo's deadline expired.
 * So the pairs get a timeout that never ends a run (kGlooTimeout), and a
 * Deadline measures [dist] timeout for each Gloo operation on the core's
 * run clock (CLOCK_MONOTONIC less the time this whole process stood
 * still).  When it passes, a thread closes every pair of
 * the communicator the way Gloo's own timeout does (each pair's exception
 * set, which wakes every wait on its buffers; an unbound buffer's wait is
 * aborted too), and the waiting operation fails with kiln's message
 * naming the timeout and the peer where it is known ("rank 1 did not
 * answer within [dist] timeout = 3.0 s ..."), never hangs.  A single stuck peer still fails the
 * others within the timeout: their processes run, their run clock is
 * CLOCK_MONOTONIC.  The communicator is dead afterwards (its pairs
 * closed), as after Gloo's own timeout.
 *
 * One thread serves every Deadline of the process (a communicator's
 * splits make no thread: tests/check_comm), asleep while no operation is
 * watched, else looking ten times a second; it starts with the first
 * Deadline and ends with the last.
 *
 * Not used on busy-polling pairs ([plugin.gloo] busy_poll = 1): their
 * reads spin on the calling thread holding the pair's lock, which a
 * closing thread would wait for; they keep Gloo's own timeout.
 */
#ifndef KILN_PLUGINS_GLOO_DEADLINE_H
#define KILN_PLUGINS_GLOO_DEADLINE_H

#include <kiln/plugin.h>

#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln_gloo {

/* The timeout Gloo's pairs get when a Deadline watches them: a year (the
 * pairs' connect waits 5 times it, capped by Gloo at 100 hours; the
 * mesh's connect is kiln's deadline's: [dist] timeout in all, gloo_mesh.cc's
 * connect_mesh). */
constexpr std::chrono::milliseconds kGlooTimeout = std::chrono::hours(24 * 365);

class Deadline {
public:
	/* host: the plugin's table (its run clock, version 7); rank: this
	 * rank in the communicator of world ranks; peer: how its messages name a peer
	 * ("rank", a hierarchical leaders' "the first rank of node");
	 * timeout_ms: [dist] timeout.  Watched by nothing yet (start). */
	Deadline(const struct kiln_host *host, int rank, int world, int timeout_ms, const char *peer);
	~Deadline(); /* no longer watched (the thread ends with the last) */
	Deadline(const Deadline &) = delete;
	Deadline &operator=(const Deadline &) = delete;

	/* Watched from now on (the thread started if none runs); KILN_OK,
	 * or an error (set) naming the rank. */
	kiln_status start();

	/* The transport context whose pairs an expiry closes (once its pairs
	 * exist; shared: kept until the Deadline ends). */
	void watch(std::shared_ptr<gloo::transport::Context> t);

	/* An operation begins: it must end within span_ms of the run clock
	 * (connecting is true while the pairs connect: the message says so).
	 * a, b: its unbound buffers, whose waits an expiry aborts (borrowed
	 * until end).  Returns the slot to pass to end, or -1 when every
	 * slot is taken (the operation runs unwatched: Gloo's waits never end
	 * it then; at most kSlots operations run at once on a communicator). */
	int begin(int64_t span_ms, bool connecting = false,
		  gloo::transport::UnboundBuffer *a = nullptr,
		  gloo::transport::UnboundBuffer *b = nullptr);

	/* The operation of slot ended; true when the communicator's pairs
	 * were closed by an expired deadline (this one's or another's). */
	bool end(int slot);

	/* What an expired wait says: peer did not answer (did not connect)
	 * within the timeout; peer -1: the one a collective waited for,
	 * which Gloo does not say (the other rank on a world of 2); host:
	 * said after the peer (" (host NAME)"), where known. */
	std::string why(int peer, const std::string &host = "") const;

	/* Before a new mesh is connected (connect_mesh's next try): no
	 * expiry, no transport context.  No operation may be running. */
	void reset();

	/* Whether an expiry closed the pairs. */
	bool expired();

	int timeout_ms() const { return timeout_ms_; }

private:
	static constexpr int kSlots = 4;
	struct Slot {
		bool on = false, connecting = false;
		int64_t due = 0; /* run clock, ns */
		gloo::transport::UnboundBuffer *a = nullptr, *b = nullptr;
	};
	friend struct Watcher;
	void expire(const Slot &s); /* (the watcher's lock held) */

	const struct kiln_host *H_;
	const int rank_, world_, timeout_ms_;
	const std::string peer_;
	bool started_ = false;
	/* under the watcher's lock (deadline.cc) */
	bool expired_ = false, connecting_ = false;
	int on_ = 0; /* slots in use */
	Slot slot_[kSlots];
	std::shared_ptr<gloo::transport::Context> ctx_;
};

/* RAII: Deadline::begin and end around one Gloo operation.  d may be
 * NULL (no deadline: busy-polling pairs). */
class Watched {
public:
	explicit Watched(Deadline *d, gloo::transport::UnboundBuffer *a = nullptr,
			 gloo::transport::UnboundBuffer *b = nullptr)
		: d_(d), slot_(d ? d->begin(d->timeout_ms(), false, a, b) : -1) {}
	~Watched() { finish(); }
	/* ends it now; true when an expiry closed the pairs */
	bool finish()
	{
		if (d_ && !done_)
			expired_ = d_->end(slot_), done_ = true;
		return expired_;
	}

private:
	Deadline *d_;
	int slot_;
	bool done_ = false, expired_ = false;
};

} // namespace kiln_gloo

#endif
