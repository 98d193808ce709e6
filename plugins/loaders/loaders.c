/* plugins/loaders/loaders.c - the entry point of kiln-loaders.so.
 *
 * The file exports exactly one symbol, kiln_plugin_init, which returns the
 * NULL-terminated list of every data source this file carries.  Adding a
 * source is one new file plus one row in `loaders_list`.
 */
#include "loaders.h"

#include <stddef.h> /* NULL */

static const struct kiln_plugin *const loaders_list[] = {
	&loaders_idx_plugin,
	&loaders_records_plugin,
	&loaders_folder_plugin,
	&loaders_tar_plugin,
	&loaders_lmdb_plugin,
	&loaders_synthetic_plugin,
	&loaders_tokens_plugin,
	&loaders_seq2seq_plugin,
	NULL
};

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);

const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	(void)host; /* sources receive the host table again in open() */
	return loaders_list;
}
