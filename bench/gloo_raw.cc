/* bench/gloo_raw.cc - the raw-Gloo baseline of `kiln bench comm`:
 * gloo::allreduce (new-style options API, f32 sum, in place, TCP on
 * 127.0.0.1) called directly, same sizes, iteration counts and median as
 * `kiln bench comm --rank`.  Rank and world from KILN_RANK/KILN_WORLD_SIZE (start
 * it with `kiln launch -n N`); the ranks meet through Gloo's own FileStore
 * in DIR, which must be empty and the same for all:
 *   kiln launch -n 2 -- bench/gloo_raw DIR [MAX_BYTES] */
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char **argv)
{
	if (argc < 2) {
		std::fprintf(stderr, "usage: gloo_raw DIR [MAX_BYTES]\n");
		return 2;
	}
	const char *r = std::getenv("KILN_RANK"), *w = std::getenv("KILN_WORLD_SIZE");
	int rank = r ? std::atoi(r) : 0, world = w ? std::atoi(w) : 1;
	size_t max = argc > 2 ? (size_t)std::atoll(argv[2]) : (size_t)256 << 20;
	try {
		gloo::transport::tcp::attr attr;
		attr.hostname = "127.0.0.1";
		auto dev = gloo::transport::tcp::CreateDevice(attr);
		gloo::rendezvous::FileStore store(argv[1]);
		auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
		ctx->setTimeout(std::chrono::seconds(120));
		ctx->connectFullMesh(store, dev);
		std::vector<float> buf(max / 4, 0.0f);
		if (!rank)
			std::printf("# raw Gloo, %d ranks\n# %10s %12s %12s\n", world, "bytes", "time_us",
				    "busbw_GBps");
		uint32_t tag = 1;
		for (size_t bytes = 4096; bytes <= max; bytes *= 4) {
			int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 20 : 5;
			std::vector<double> t;
			auto once = [&]() {
				gloo::AllreduceOptions o(ctx);
				o.setTag(tag++);
				o.setOutput(buf.data(), bytes / 4);
				o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
					&gloo::sum<float>));
				gloo::allreduce(o);
			};
			for (int k = 0; k < 3; k++)
				once();
			for (int i = 0; i < iters; i++) {
				gloo::BarrierOptions b(ctx);
				b.setTag(tag++);
				gloo::barrier(b);
				auto t0 = std::chrono::steady_clock::now();
				once();
				t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
			}
			std::sort(t.begin(), t.end());
			double med = t[(size_t)iters / 2];
			if (!rank)
				std::printf("  %10zu %12.1f %12.3f\n", bytes, med * 1e6,
					    (double)bytes / med * 2.0 * (world - 1) / world / 1e9);
			std::fflush(stdout);
		}
	} catch (const std::exception &e) {
		std::fprintf(stderr, "gloo_raw: rank %d: %s\n", rank, e.what());
		return 1;
	}
	return 0;
}
