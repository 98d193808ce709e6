/* core/store_msg.c - the rendezvous store's request parser, its token,
 * the HMAC challenge and how soon the server drops a silent connection
 * (core/store.h).  The MAC and the random nonce come
 * from OpenSSL's libcrypto. */
#include "internal.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

long kiln_store_msg_parse(const void *buf, size_t have, uint32_t max_val,
			  struct kiln_store_msg *m)
{
	const unsigned char *b = buf;
	if (have < 1)
		return 0;
	if (b[0] < STORE_OP_HELLO || b[0] > STORE_OP_CANCEL)
		return -1;
	if (have < 5)
		return 0;
	uint32_t klen = get32(b + 1);
	if (klen > STORE_MAX_KEY)
		return -1;
	if (have < 9 + (size_t)klen)
		return 0;
	uint32_t vlen = get32(b + 5 + klen);
	if (vlen > max_val)
		return -1;
	size_t need = 9 + (size_t)klen + vlen;
	if (have < need)
		return 0;
	m->op = b[0];
	m->key = (const char *)b + 5;
	m->klen = klen;
	m->val = b + 9 + klen;
	m->vlen = vlen;
	return (long)need;
}

/* The first line of path into tok[0..n), after checking that only this
 * user may read it. */
static kiln_status token_file(const char *path, char *tok, size_t n)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat sb;
	if (fd < 0)
		return kiln_error(KILN_EUSAGE, "KILN_STORE_TOKEN_FILE=%s: %s", path, strerror(errno));
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() ||
	    (sb.st_mode & 077)) {
		close(fd);
		return kiln_error(KILN_EUSAGE, "KILN_STORE_TOKEN_FILE=%s: must be a regular file owned by you that only you can read (chmod 600)",
				  path);
	}
	ssize_t k = read(fd, tok, n - 1);
	close(fd);
	if (k < 0)
		return kiln_error(KILN_EUSAGE, "KILN_STORE_TOKEN_FILE=%s: %s", path, strerror(errno));
	tok[k] = 0;
	tok[strcspn(tok, "\r\n")] = 0;
	return KILN_OK;
}

kiln_status store_token(char *tok, size_t n)
{
	const char *v = getenv("KILN_STORE_TOKEN");
	const char *file = getenv("KILN_STORE_TOKEN_FILE");
	kiln_status st;
	tok[0] = 0;
	if (v && *v) {
		if (strlen(v) >= n)
			return kiln_error(KILN_EUSAGE, "KILN_STORE_TOKEN has more than %zu characters", n - 1);
		memcpy(tok, v, strlen(v) + 1);
	} else if (file && *file) {
		if ((st = token_file(file, tok, n)))
			return st;
	} else {
		return kiln_error(KILN_EUSAGE, "the rendezvous store needs a secret every rank shares: `kiln launch` makes one; under torchrun, Slurm or mpirun export KILN_STORE_TOKEN=$(openssl rand -hex 32) (or KILN_STORE_TOKEN_FILE=PATH, a file only you can read) on every node");
	}
	if (strlen(tok) < STORE_TOKEN_MIN)
		return kiln_error(KILN_EUSAGE, "%s: the store token has %zu characters, at least %d are needed (e.g. openssl rand -hex 32)",
				  v && *v ? "KILN_STORE_TOKEN" : "KILN_STORE_TOKEN_FILE", strlen(tok),
				  STORE_TOKEN_MIN);
	return KILN_OK;
}

int store_mac(const char *token, const unsigned char *nonce, unsigned char *mac)
{
	static const char label[] = "kiln-store-auth-v1";
	unsigned char msg[sizeof label - 1 + STORE_NONCE_LEN];
	unsigned int len = 0;
	memcpy(msg, label, sizeof label - 1);
	memcpy(msg + sizeof label - 1, nonce, STORE_NONCE_LEN);
	if (!HMAC(EVP_sha256(), token, (int)strlen(token), msg, sizeof msg, mac, &len) ||
	    len != STORE_MAC_LEN)
		return -1;
	return 0;
}

int kiln_store_dead_after_ms(int timeout_ms)
{
	const int q = timeout_ms / 4;
	return q < 1000 ? 1000 : q > 10000 ? 10000 : q;
}

int kiln_store_auth_ms(int timeout_ms)
{
	const int q = timeout_ms / 4;
	return q < 1000 ? 1000 : q > 10000 ? 10000 : q;
}

int store_random(unsigned char *buf, size_t n)
{
	return RAND_bytes(buf, (int)n) == 1 ? 0 : -1;
}
