/* core/config_diff.c - resolved config texts compared key by key (see
 * config_diff.h). */
#include "config_diff.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_kv_parse(const char *text, struct kiln_kv **out, int *n)
{
	int cap = 0, k = 0;
	struct kiln_kv *v = NULL;
	const char *sec = "", *p = text;
	int sec_n = 0;
	while (*p) {
		int len = (int)strcspn(p, "\n");
		const char *line = p;
		p += len + (p[len] != 0);
		if (!len)
			continue;
		if (line[0] == '[') {
			const char *e = memchr(line, ']', (size_t)len);
			sec = line + 1;
			sec_n = e ? (int)(e - sec) : len - 1;
			continue;
		}
		int unset = line[0] == ';';
		if (unset && len < 3)
			continue;
		if (unset)
			line += 2, len -= 2;
		const char *eq = memchr(line, '=', (size_t)len);
		if (!eq || eq == line)
			continue;
		if (k == cap) {
			cap = cap ? 2 * cap : 256;
			struct kiln_kv *nv = realloc(v, sizeof *v * (size_t)cap);
			if (!nv) {
				free(v);
				return kiln_error(KILN_ENOMEM, "out of memory");
			}
			v = nv;
		}
		struct kiln_kv *e = &v[k++];
		e->sec = sec;
		e->sec_n = sec_n;
		e->key = line;
		e->key_n = (int)(eq - line) - 1; /* "key = value" */
		if (e->key_n < 0)
			e->key_n = 0;
		e->val = unset ? NULL : eq + 2;
		e->val_n = unset ? 0 : len - (int)(eq + 2 - line);
		if (e->val_n < 0)
			e->val_n = 0;
		/* the value as every kiln reads it: a kiln before session 34
		 * kept an override's spaces ("layer.fc1.out=128 " was written
		 * '128 ', read as 128), which this kiln trims */
		while (e->val && e->val_n && (e->val[0] == ' ' || e->val[0] == '\t'))
			e->val++, e->val_n--;
		while (e->val && e->val_n && (e->val[e->val_n - 1] == ' ' || e->val[e->val_n - 1] == '\t'))
			e->val_n--;
	}
	*out = v;
	*n = k;
	return KILN_OK;
}

static int kv_same_key(const struct kiln_kv *a, const struct kiln_kv *b)
{
	return a->sec_n == b->sec_n && a->key_n == b->key_n &&
	       !memcmp(a->sec, b->sec, (size_t)a->sec_n) && !memcmp(a->key, b->key, (size_t)a->key_n);
}

static const struct kiln_kv *kv_find(const struct kiln_kv *v, int n, const struct kiln_kv *e)
{
	for (int j = 0; j < n; j++)
		if (kv_same_key(e, &v[j]))
			return &v[j];
	return NULL;
}

const struct kiln_kv *kiln_kv_lookup(const struct kiln_kv *v, int n, const char *sec,
				     const char *key)
{
	const struct kiln_kv e = { sec, key, NULL, (int)strlen(sec), (int)strlen(key), 0 };
	return kv_find(v, n, &e);
}

/* Values x[0..xn) and y[0..yn) of [sec] key: equal bytes, or equal by
 * `same` (NULL: bytes alone). */
static int val_equal(const char *sec, const char *key, const char *x, size_t xn, const char *y,
		     size_t yn, kiln_kv_same_fn same, void *u)
{
	if (xn == yn && !memcmp(x, y, xn))
		return 1;
	return same && same(sec, key, x, xn, y, yn, u);
}

static int kv_equal(const struct kiln_kv *x, const struct kiln_kv *y, const char *sec,
		    const char *key, kiln_kv_same_fn same, void *u)
{
	if (!x || !y)
		return 0;
	/* one unset: its default may be another key's value (a pooling's
	 * stride, its kernel), which `same` knows */
	if (!x->val != !y->val)
		return same && same(sec, key, x->val, (size_t)x->val_n, y->val, (size_t)y->val_n, u);
	return !x->val || val_equal(sec, key, x->val, (size_t)x->val_n, y->val, (size_t)y->val_n,
				    same, u);
}

/* e's value as a message shows it; a key the text lacks reads as its
 * default where `def` knows it. */
static void kv_show(const struct kiln_kv *e, const char *sec, const char *key,
		    kiln_kv_default_fn def, void *u, char *buf, size_t n)
{
	const char *v;
	size_t len = 0;
	if (!e && def && def(sec, key, u, &v, &len))
		snprintf(buf, n, v ? "'%.*s' (not set: the default)" : "unset (not set: no default)",
			 (int)len, v ? v : "");
	else if (!e)
		snprintf(buf, n, "absent");
	else if (!e->val)
		snprintf(buf, n, "unset");
	else
		snprintf(buf, n, "'%.*s'", e->val_n, e->val);
}

/* Is `have`'s value (of text a when in_a, else b) what its key reads as
 * in the other text, which lacks it: its default, or where the default
 * is unset, what `same` makes of an unset key there (a pooling's stride
 * is its kernel: resolved as a fresh config would resolve it, where
 * before session 36 the schema's "unset" alone was compared and an old
 * checkpoint without the key was refused)? */
static int at_default(const struct kiln_kv *have, int in_a, const char *sec, const char *key,
		      kiln_kv_default_fn def, kiln_kv_same_fn same, void *u)
{
	const char *v;
	size_t n = 0;
	if (!def || !def(sec, key, u, &v, &n))
		return 0;
	if (!v && have->val)
		return same && (in_a ? same(sec, key, have->val, (size_t)have->val_n, NULL, 0, u)
				     : same(sec, key, NULL, 0, have->val, (size_t)have->val_n, u));
	if (!v || !have->val)
		return !v && !have->val;
	return val_equal(sec, key, have->val, (size_t)have->val_n, v, n, same, u);
}

kiln_status kiln_config_diff(const char *a, const char *b, kiln_kv_wanted_fn wanted,
			     kiln_kv_default_fn def, kiln_kv_same_fn same, void *u, int show_defaults,
			     int *differs, struct kiln_config_delta *d)
{
	struct kiln_kv *va = NULL, *vb = NULL;
	int na = 0, nb = 0;
	kiln_status st;
	*differs = 0;
	if ((st = kiln_kv_parse(a, &va, &na)) || (st = kiln_kv_parse(b, &vb, &nb)))
		goto out;
	for (int pass = 0; pass < 2 && !*differs; pass++) {
		const struct kiln_kv *x = pass ? vb : va, *y = pass ? va : vb;
		int nx = pass ? nb : na, ny = pass ? na : nb;
		for (int i = 0; i < nx; i++) {
			const struct kiln_kv *e = &x[i];
			char sec[128], key[128];
			snprintf(sec, sizeof sec, "%.*s", e->sec_n, e->sec);
			snprintf(key, sizeof key, "%.*s", e->key_n, e->key);
			if (wanted && !wanted(sec, key, u))
				continue;
			const struct kiln_kv *o = kv_find(y, ny, e);
			if (pass && o)
				continue; /* compared in the first pass */
			if (kv_equal(e, o, sec, key, same, u) ||
			    (!o && at_default(e, !pass, sec, key, def, same, u)))
				continue;
			const struct kiln_kv *ea = pass ? o : e, *eb = pass ? e : o;
			snprintf(d->section, sizeof d->section, "%s", sec);
			snprintf(d->key, sizeof d->key, "%s", key);
			kiln_kv_default_fn shown = show_defaults ? def : NULL;
			kv_show(ea, sec, key, shown, u, d->a, sizeof d->a);
			kv_show(eb, sec, key, shown, u, d->b, sizeof d->b);
			*differs = 1;
			break;
		}
	}
out:
	free(va);
	free(vb);
	return st;
}
