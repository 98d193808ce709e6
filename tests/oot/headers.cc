// tests/oot/headers.cc - a C++ program that includes every installed
// header and calls a function of each that declares one: it links only
// where each header wraps its declarations in extern "C" (session 36:
// kiln/image.h did not, and kiln_xform_* were looked up under their C++
// mangled names).  tests/install_link.sh builds it against the install and
// checks that it includes every header installed.
#include <kiln/config.h>
#include <kiln/dist.h>
#include <kiln/image.h>
#include <kiln/infer.h>
#include <kiln/kiln.h>
#include <kiln/ops.h>
#include <kiln/plugin.h>
#include <kiln/status.h>
#include <kiln/tensor.h>

#include <cstdio>
#include <cstring>

int main()
{
	int h = 0, w = 0;
	kiln_xform_resize_shorter(10, 20, 5, &h, &w);           // image.h
	struct kiln_xform_scratch s;
	std::memset(&s, 0, sizeof s);
	kiln_xform_scratch_free(&s);
	kiln_config_free(nullptr);                               // config.h
	kiln_infer_free(nullptr);                                // infer.h
	struct kiln_dist_env env;                                // dist.h
	const int dist = kiln_dist_env_read(&env) == KILN_OK;
	kiln_clear_error();                                      // status.h
	const size_t f32 = kiln_dtype_size(KILN_F32);            // tensor.h
	struct kiln_op op;                                       // ops.h (no functions)
	std::memset(&op, 0, sizeof op);
	std::printf("%s resize %dx%d f32 %zu dist %d abi %d.%d\n", kiln_version(), // kiln.h
		    h, w, f32, dist, KILN_ABI_MAJOR, KILN_ABI_MINOR); // plugin.h
	return h == 5 && w == 10 && f32 == 4 && dist ? 0 : 1;
}
