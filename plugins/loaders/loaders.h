/* plugins/loaders/loaders.h - what the files of kiln-loaders.so share.
 *
 * kiln-loaders.so carries every data source.  Each source is one file
 * (idx.c, ...) that defines one descriptor; loaders.c lists them.
 */
#ifndef KILN_LOADERS_H
#define KILN_LOADERS_H

#include <kiln/plugin.h>

/* The IDX (MNIST / Fashion-MNIST) source: idx.c. */
extern const struct kiln_plugin loaders_idx_plugin;

/* kiln's packed record shards (.krec): records.c, format in records.h. */
extern const struct kiln_plugin loaders_records_plugin;

#endif /* KILN_LOADERS_H */
