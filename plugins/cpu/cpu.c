#include <kiln/plugin.h>
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *h);
const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *h){ static const struct kiln_plugin *const l[]={NULL}; (void)h; return l; }
