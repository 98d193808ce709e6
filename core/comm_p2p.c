/* core/comm_p2p.c - a send and a recv that progress together, over any
 * communicator (comm ops version 7's sendrecv; docs/plugins.md "ABI
 * 2.13", docs/distributed.md).
 *
 * A communicator built before version 7 has no sendrecv: the pair is then
 * a send and a recv enqueued on the stream one after the other, ordered
 * by rank so that two ranks exchanging with each other never both send
 * first (the lower rank sends first, the higher receives first).  That
 * order is deadlock-free only for one peer (dst == src); a send to one
 * rank and a recv from another at once (a ring shift) has no safe order
 * without the plugin, and is refused with KILN_ENOTSUP. */
#include "dist.h"
#include "internal.h"

#include <kiln/plugin.h>

/* the emulation: the two halves in rank order, done after the last */
static kiln_status sendrecv_ordered(const struct kiln_comm_ops *ops, void *comm, int rank,
				    const void *sbuf, size_t scount, int dst, void *rbuf,
				    size_t rcount, int src, int dtype, void *stream, void *done)
{
	const int send_first = !rcount || (scount && rank < dst);
	kiln_status st = KILN_OK;
	if (send_first) {
		if (scount)
			st = ops->send(comm, sbuf, scount, dtype, dst, stream, rcount ? NULL : done);
		if (!st && rcount)
			st = ops->recv(comm, rbuf, rcount, dtype, src, stream, done);
	} else {
		st = ops->recv(comm, rbuf, rcount, dtype, src, stream, scount ? NULL : done);
		if (!st && scount)
			st = ops->send(comm, sbuf, scount, dtype, dst, stream, done);
	}
	return st;
}

kiln_status kiln_comm_sendrecv(const struct kiln_comm_ops *ops, void *comm, int rank,
			       const void *send_buf, size_t send_count, int dst, void *recv_buf,
			       size_t recv_count, int src, int dtype, void *stream, void *done)
{
	/* the arguments, checked here once for every communicator: a plugin's
	 * sendrecv checks only what it alone knows, that the peers are below
	 * its world size (docs/plugins.md, "sendrecv") */
	if (!send_count && !recv_count)
		return kiln_error(KILN_EINVAL, "rank %d: a sendrecv with nothing to send or receive",
				  rank);
	if ((send_count && (dst < 0 || dst == rank)) || (recv_count && (src < 0 || src == rank)))
		return kiln_error(KILN_EINVAL, "rank %d: sendrecv to rank %d, from rank %d: no such peer (%s)",
				  rank, dst, src,
				  (send_count && dst == rank) || (recv_count && src == rank)
					  ? "a rank cannot send to or receive from itself"
					  : "ranks are 0 or more");
	if (ops->version >= 7 && ops->sendrecv)
		return ops->sendrecv(comm, send_buf, send_count, dst, recv_buf, recv_count, src,
				     dtype, stream, done);
	if (ops->version < 4 || !ops->send || !ops->recv)
		return kiln_error(KILN_ENOTSUP, "a send and recv need point-to-point send and recv (comm ops version 4); this communicator has version %u",
				  ops->version);
	if (send_count && recv_count && dst != src)
		return kiln_error(KILN_ENOTSUP, "rank %d: a send to rank %d with a recv from rank %d at once needs the communicator's sendrecv (comm ops version 7); this communicator has version %u%s",
				  rank, dst, src, ops->version,
				  ops->version >= 7 ? " without it" : "");
	return sendrecv_ordered(ops, comm, rank, send_buf, send_count, dst, recv_buf, recv_count,
				src, dtype, stream, done);
}
