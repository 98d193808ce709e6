/* core/crc32c.c - CRC32C (Castagnoli, reflected polynomial 0x82F63B78),
 * the checksum of records and checkpoint files.
 *
 * No Debian package offers CRC32C as a library, so kiln has its own: the
 * SSE4.2 crc32 instruction (8 bytes per instruction) where the CPU has it,
 * a table-driven byte loop elsewhere.  Both give the same value; the
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
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
							  size_t n)
{
	uint64_t c = crc;
	while (n && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
		n--;
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
