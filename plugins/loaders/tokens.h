/* plugins/loaders/tokens.h - the names of the token shards that
 * `kiln pack --format tokens` (cli/pack_tokens.c) writes and the `tokens`
 * source (tokens.c) reads: DIR/<split>-000000.bin, ... */
#ifndef KILN_LOADERS_TOKENS_H
#define KILN_LOADERS_TOKENS_H

#define TOK_SUFFIX ".bin"
/* "<dir>/<split>.bin-partial": kiln pack renames a split's complete shards
 * into place (from .tmp, after every input is encoded) only while this
 * file exists, and removes it last; the source refuses shards beside one
 * (a pack killed then left an incomplete split, or with --force one that
 * mixes two packs). */
#define TOK_PARTIAL ".bin-partial"

#endif
