/*
 * Clones one iSCSI LUN onto another of the same size, the way a
 * hypervisor clones a disk, and prints the seconds it took:
 *
 *   iscsi-clone xcopy SRC_URL DST_URL   EXTENDED COPY (LID1), one 4 MiB
 *                                       segment per command sent to the
 *                                       source unit (ESXi's default
 *                                       transfer size), the units named
 *                                       by their NAA designators
 *   iscsi-clone odx SRC_URL DST_URL     Windows' token copy: POPULATE
 *                                       TOKEN of 64 MiB of the source,
 *                                       RECEIVE ROD TOKEN INFORMATION for
 *                                       the token, WRITE USING TOKEN of it
 *                                       to the destination, per 64 MiB
 *   iscsi-clone host SRC_URL DST_URL    READ(16) from the source and
 *                                       WRITE(16) to the destination,
 *                                       4 MiB at a time, through this host
 *
 * Prints "<seconds> <bytes>": the clone's wall time, and the bytes its
 * two connections sent and received meanwhile (TCP_INFO's bytes_acked
 * and bytes_received: what crossed the network to and from the target,
 * headers of iSCSI included). Exit status 0 when every command
 * succeeded.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <sys/socket.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#define BLOCK 512
#define STEP_BLOCKS 8192
#define TOKEN_BLOCKS 131072

static struct iscsi_context *login(const char *url, struct iscsi_url **u)
{
	struct iscsi_context *c = iscsi_create_context("iqn.2026-11.org.braid-storage:bench-clone");
	*u = iscsi_parse_full_url(c, url);
	if (*u == NULL) {
		fprintf(stderr, "%s: %s\n", url, iscsi_get_error(c));
		exit(2);
	}
	iscsi_set_session_type(c, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(c, ISCSI_HEADER_DIGEST_NONE);
	if (iscsi_full_connect_sync(c, (*u)->portal, (*u)->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", url, iscsi_get_error(c));
		exit(1);
	}
	return c;
}

static uint64_t blocks_of(struct iscsi_context *c, int lun)
{
	struct scsi_task *t = iscsi_readcapacity16_sync(c, lun);
	struct scsi_readcapacity16 *rc;
	if (t == NULL || t->status != SCSI_STATUS_GOOD || (rc = scsi_datain_unmarshall(t)) == NULL) {
		fprintf(stderr, "READ CAPACITY(16): %s\n", iscsi_get_error(c));
		exit(1);
	}
	uint64_t n = rc->returned_lba + 1;
	scsi_free_scsi_task(t);
	return n;
}

/* The unit's NAA designator (association 0, type 3), 16 bytes. */
static void naa_of(struct iscsi_context *c, int lun, unsigned char naa[16])
{
	struct scsi_task *t = iscsi_inquiry_sync(c, lun, 1, 0x83, 255);
	if (t == NULL || t->status != SCSI_STATUS_GOOD) {
		fprintf(stderr, "VPD 0x83: %s\n", iscsi_get_error(c));
		exit(1);
	}
	unsigned char *d = t->datain.data;
	int end = 4 + (d[2] << 8 | d[3]);
	for (int at = 4; at + 4 <= end; at += 4 + d[at + 3]) {
		if (((d[at + 1] >> 4) & 3) == 0 && (d[at + 1] & 0xf) == 3 && d[at + 3] == 16) {
			memcpy(naa, d + at + 4, 16);
			scsi_free_scsi_task(t);
			return;
		}
	}
	fprintf(stderr, "no NAA designator in VPD 0x83\n");
	exit(1);
}

static void target_descriptor(unsigned char *d, const unsigned char naa[16])
{
	memset(d, 0, 32);
	d[0] = 0xe4;
	d[4] = 0x01;
	d[5] = 0x03;
	d[7] = 16;
	memcpy(d + 8, naa, 16);
	d[30] = BLOCK >> 8;
}

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = v & 0xff;
}

/* Bytes sent (and acknowledged) and received on the connection of c. */
static uint64_t wire_bytes(struct iscsi_context *c)
{
	struct tcp_info i;
	socklen_t len = sizeof i;
	if (getsockopt(iscsi_get_fd(c), IPPROTO_TCP, TCP_INFO, &i, &len) != 0) {
		perror("TCP_INFO");
		exit(1);
	}
	return i.tcpi_bytes_acked + i.tcpi_bytes_received;
}

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 3; i >= 0; i--, v >>= 8)
		p[i] = v & 0xff;
}

static int good(struct scsi_task *t)
{
	return t != NULL && t->status == SCSI_STATUS_GOOD;
}

/* One token copy of n blocks at lba, from src to dst: POPULATE TOKEN,
 * RECEIVE ROD TOKEN INFORMATION, WRITE USING TOKEN. 1 when all three
 * were GOOD. */
static int token_copy(struct iscsi_context *src, int slun, struct iscsi_context *dst, int dlun,
		      uint64_t lba, uint32_t n)
{
	unsigned char cdb[16], pt[32], wut[552];
	memset(cdb, 0, sizeof cdb);
	memset(pt, 0, sizeof pt);
	pt[1] = 30; /* data length: what follows these two bytes */
	pt[15] = 16; /* one range descriptor */
	put64(pt + 16, lba);
	put32(pt + 24, n);
	cdb[0] = 0x83;
	cdb[1] = 0x10;
	put32(cdb + 6, 1); /* list identifier */
	put32(cdb + 10, sizeof pt);
	struct iscsi_data data = { .size = sizeof pt, .data = pt };
	struct scsi_task *t = iscsi_scsi_command_sync(src, slun,
		scsi_create_task(16, cdb, SCSI_XFER_WRITE, sizeof pt), &data);
	if (!good(t))
		return 0;
	scsi_free_scsi_task(t);
	memset(cdb, 0, sizeof cdb);
	cdb[0] = 0x84;
	cdb[1] = 0x07;
	put32(cdb + 2, 1);
	put32(cdb + 10, 1024);
	t = iscsi_scsi_command_sync(src, slun, scsi_create_task(16, cdb, SCSI_XFER_READ, 1024), NULL);
	if (!good(t) || t->datain.size < 32 + 4 + 2 + 512 || t->datain.data[13] != 0) {
		if (t)
			scsi_free_scsi_task(t);
		return 0;
	}
	memset(wut, 0, sizeof wut);
	wut[0] = (sizeof wut - 2) >> 8;
	wut[1] = (sizeof wut - 2) & 0xff;
	memcpy(wut + 16, t->datain.data + 38, 512);
	scsi_free_scsi_task(t);
	wut[535] = 16;
	put64(wut + 536, lba);
	put32(wut + 544, n);
	memset(cdb, 0, sizeof cdb);
	cdb[0] = 0x83;
	cdb[1] = 0x11;
	put32(cdb + 6, 2);
	put32(cdb + 10, sizeof wut);
	data = (struct iscsi_data){ .size = sizeof wut, .data = wut };
	t = iscsi_scsi_command_sync(dst, dlun, scsi_create_task(16, cdb, SCSI_XFER_WRITE, sizeof wut), &data);
	int ok = good(t);
	if (t)
		scsi_free_scsi_task(t);
	return ok;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[1], "xcopy") && strcmp(argv[1], "host") && strcmp(argv[1], "odx"))) {
		fprintf(stderr, "usage: %s xcopy|odx|host SRC_URL DST_URL\n", argv[0]);
		return 2;
	}
	struct iscsi_url *su, *du;
	struct iscsi_context *src = login(argv[2], &su);
	struct iscsi_context *dst = login(argv[3], &du);
	uint64_t blocks = blocks_of(src, su->lun);
	if (blocks_of(dst, du->lun) != blocks) {
		fprintf(stderr, "the units differ in size\n");
		return 1;
	}
	unsigned char params[16 + 64 + 28];
	if (!strcmp(argv[1], "xcopy")) {
		unsigned char a[16], b[16];
		naa_of(src, su->lun, a);
		naa_of(dst, du->lun, b);
		memset(params, 0, sizeof params);
		params[1] = 0x18; /* no list identifier */
		params[3] = 64;
		params[11] = 28;
		target_descriptor(params + 16, a);
		target_descriptor(params + 48, b);
		unsigned char *s = params + 80;
		s[0] = 0x02;
		s[3] = 0x18;
		s[7] = 1; /* from descriptor 0 to descriptor 1 */
	}
	unsigned char *buf = malloc(STEP_BLOCKS * BLOCK);
	uint64_t wire = wire_bytes(src) + wire_bytes(dst);
	double start = now();
	if (!strcmp(argv[1], "odx")) {
		for (uint64_t lba = 0; lba < blocks; lba += TOKEN_BLOCKS) {
			uint32_t n = blocks - lba < TOKEN_BLOCKS ? blocks - lba : TOKEN_BLOCKS;
			if (!token_copy(src, su->lun, dst, du->lun, lba, n)) {
				fprintf(stderr, "odx at block %llu: %s / %s\n", (unsigned long long)lba,
					iscsi_get_error(src), iscsi_get_error(dst));
				return 1;
			}
		}
		blocks = 0;
	}
	for (uint64_t lba = 0; lba < blocks; lba += STEP_BLOCKS) {
		uint32_t n = blocks - lba < STEP_BLOCKS ? blocks - lba : STEP_BLOCKS;
		struct scsi_task *t;
		if (!strcmp(argv[1], "xcopy")) {
			unsigned char *s = params + 80;
			s[10] = n >> 8;
			s[11] = n & 0xff;
			put64(s + 12, lba);
			put64(s + 20, lba);
			struct iscsi_data data = { .size = sizeof params, .data = params };
			t = scsi_cdb_extended_copy(sizeof params);
			t = iscsi_scsi_command_sync(src, su->lun, t, &data);
		} else {
			t = iscsi_read16_sync(src, su->lun, lba, n * BLOCK, BLOCK, 0, 0, 0, 0, 0);
			if (t != NULL && t->status == SCSI_STATUS_GOOD) {
				memcpy(buf, t->datain.data, n * BLOCK);
				scsi_free_scsi_task(t);
				t = iscsi_write16_sync(dst, du->lun, lba, buf, n * BLOCK, BLOCK, 0, 0, 0, 0, 0);
			}
		}
		if (t == NULL || t->status != SCSI_STATUS_GOOD) {
			fprintf(stderr, "%s at block %llu: %s\n", argv[1], (unsigned long long)lba,
				iscsi_get_error(src));
			return 1;
		}
		scsi_free_scsi_task(t);
	}
	double secs = now() - start;
	printf("%.3f %llu\n", secs, (unsigned long long)(wire_bytes(src) + wire_bytes(dst) - wire));
	return 0;
}
