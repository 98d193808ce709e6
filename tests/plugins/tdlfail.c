/* tests/plugins/tdlfail.c - kiln-tdlfail.so: references a function that no
 * library defines, so dlopen(RTLD_NOW) fails with "undefined symbol". */
#include "test_plugin.h"

extern const struct kiln_plugin *const *kiln_test_symbol_nobody_defines(void);

TEST_PLUGIN_INIT(kiln_test_symbol_nobody_defines())
