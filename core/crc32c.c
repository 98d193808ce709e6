/* core/crc32c.c - CRC32C (Castagnoli, reflected polynomial 0x82F63B78),
 * the checksum of records and checkpoint files.
 *
 * No Debian package offers CRC32C as a library, so kiln has its own: the
 * SSE4.2 crc32 instruction (8 bytes per instruction, three streams at once
 * over 24 KiB blocks) where the CPU has it, a table-driven byte loop
 * elsewhere.  Both give the same value; the
 * standard check value crc32c("123456789") = 0xE3069283 is a unit test.
 */
#include "internal.h"

#include <pthread.h>

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		table[i] = c;
	}
}

static uint32_t crc_soft(uint32_t crc, const uint8_t *p, size_t n)
{
	pthread_once(&table_once, table_init);
	while (n--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <string.h>
/* a * b modulo the polynomial, both in the reflected order (bit 31: x^0) */
static uint32_t mul_mod(uint32_t a, uint32_t b)
{
	uint32_t prod = 0;
	for (uint32_t m = 1u << 31; m; m >>= 1) {
		if (a & m)
			prod ^= b;
		b = b & 1 ? (b >> 1) ^ 0x82F63B78u : b >> 1;
	}
	return prod;
}

/* Three streams (the crc32 instruction's latency is 3 cycles, its
 * throughput one a cycle): blocks of 3 x SPAN bytes, each third from its
 * own register (the 2nd and 3rd from 0); the register is linear, so the
 * block's is (A x^8SPAN + B) x^8SPAN + C.  x8span = x^(8 SPAN) mod P. */
enum { SPAN = 8192 };
static uint32_t x8span;
static pthread_once_t x8span_once = PTHREAD_ONCE_INIT;

static void x8span_init(void)
{
	_Static_assert(8 * SPAN == 1 << 16, "x^(8 SPAN) by 16 squarings");
	uint32_t x = 1u << 30; /* x^1 */
	for (int i = 0; i < 16; i++)
		x = mul_mod(x, x); /* x^(2^(i+1)) */
	x8span = x;
}

__attribute__((target("sse4.2"))) static uint64_t crc_hw3(uint64_t c, const uint8_t *p,
							  size_t blocks)
{
	pthread_once(&x8span_once, x8span_init);
	for (; blocks; blocks--, p += 3 * SPAN) {
		uint64_t b = 0, d = 0;
		for (size_t i = 0; i < SPAN; i += 8) {
			uint64_t u, v, w;
			memcpy(&u, p + i, 8);
			memcpy(&v, p + SPAN + i, 8);
			memcpy(&w, p + 2 * SPAN + i, 8);
			c = __builtin_ia32_crc32di(c, u);
			b = __builtin_ia32_crc32di(b, v);
			d = __builtin_ia32_crc32di(d, w);
		}
		c = mul_mod(mul_mod((uint32_t)c, x8span) ^ (uint32_t)b, x8span) ^ (uint32_t)d;
	}
	return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
							  size_t n)
{
	uint64_t c = crc;
	while (n && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		n--;
	}
	if (n >= 3 * SPAN) {
		size_t blocks = n / (3 * SPAN);
		c = crc_hw3(c, p, blocks);
		p += blocks * 3 * SPAN;
		n -= blocks * 3 * SPAN;
	}
	for (; n >= 8; n -= 8, p += 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	while (n--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return (uint32_t)c;
}
#endif

uint32_t kiln_crc32c(uint32_t crc, const void *buf, size_t n)
{
	crc = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (__builtin_cpu_supports("sse4.2"))
		return ~crc_hw(crc, buf, n);
#endif
	return ~crc_soft(crc, buf, n);
}
