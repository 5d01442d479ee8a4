/*
 * A small iSCSI client over libiscsi's asynchronous C API, for the tests:
 * writes COUNT chunks of 64 KiB with WRITE(16), QD at a time, then reads
 * them all back with READ(16), QD at a time, and checks every byte against
 * the pattern (pattern() below; the Rust test computes the same one).
 *
 *   qd_client URL COUNT QD SEED      e.g. iscsi://127.0.0.1:3260/iqn.../0
 *
 * Exit status 0 when every byte read back is what was written.
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#define BLOCK 512
#define CHUNK (64 * 1024)

static uint32_t seed;

static uint8_t pattern(uint64_t chunk, uint32_t at)
{
	uint32_t x = seed ^ (uint32_t)(chunk * 0x9e3779b9u) ^ at;
	x ^= x >> 13;
	x *= 0x5bd1e995u;
	x ^= x >> 15;
	return (uint8_t)x;
}

struct op {
	uint64_t chunk;
	int reading;
	unsigned char buf[CHUNK];
};

static int in_flight, failed, mismatched;

static void done(struct iscsi_context *iscsi, int status, void *data, void *private)
{
	struct op *op = private;
	struct scsi_task *task = data;

	(void)iscsi;
	in_flight--;
	if (status != SCSI_STATUS_GOOD) {
		fprintf(stderr, "%s of chunk %llu: status %d: %s\n",
			op->reading ? "READ(16)" : "WRITE(16)",
			(unsigned long long)op->chunk, status, iscsi_get_error(iscsi));
		failed++;
	} else if (op->reading) {
		if (task->datain.size != CHUNK) {
			fprintf(stderr, "chunk %llu: %d bytes read, not %d\n",
				(unsigned long long)op->chunk, task->datain.size, CHUNK);
			mismatched++;
		} else {
			for (uint32_t i = 0; i < CHUNK; i++) {
				if (task->datain.data[i] != pattern(op->chunk, i)) {
					fprintf(stderr, "chunk %llu differs at byte %u\n",
						(unsigned long long)op->chunk, i);
					mismatched++;
					break;
				}
			}
		}
	}
	scsi_free_scsi_task(task);
	free(op);
}

/* Keeps QD commands in flight until COUNT have been sent and answered. */
static int pass(struct iscsi_context *iscsi, int lun, uint64_t count, int qd, int reading)
{
	uint64_t next = 0;

	while (next < count || in_flight > 0) {
		while (next < count && in_flight < qd) {
			struct op *op = calloc(1, sizeof(*op));
			struct scsi_task *t;

			op->chunk = next;
			op->reading = reading;
			if (reading) {
				t = iscsi_read16_task(iscsi, lun, next * (CHUNK / BLOCK), CHUNK,
						      BLOCK, 0, 0, 0, 0, 0, done, op);
			} else {
				for (uint32_t i = 0; i < CHUNK; i++)
					op->buf[i] = pattern(next, i);
				t = iscsi_write16_task(iscsi, lun, next * (CHUNK / BLOCK), op->buf,
						       CHUNK, BLOCK, 0, 0, 0, 0, 0, done, op);
			}
			if (t == NULL) {
				fprintf(stderr, "queueing chunk %llu: %s\n",
					(unsigned long long)next, iscsi_get_error(iscsi));
				free(op);
				return -1;
			}
			in_flight++;
			next++;
		}
		struct pollfd pfd = { .fd = iscsi_get_fd(iscsi), .events = iscsi_which_events(iscsi) };
		if (poll(&pfd, 1, 30000) <= 0) {
			fprintf(stderr, "no answer within 30 s (%d in flight)\n", in_flight);
			return -1;
		}
		if (iscsi_service(iscsi, pfd.revents) < 0) {
			fprintf(stderr, "iscsi_service: %s\n", iscsi_get_error(iscsi));
			return -1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s URL COUNT QD SEED\n", argv[0]);
		return 2;
	}
	uint64_t count = strtoull(argv[2], NULL, 10);
	int qd = atoi(argv[3]);
	seed = (uint32_t)strtoul(argv[4], NULL, 10);

	struct iscsi_context *iscsi = iscsi_create_context("iqn.2026-11.org.braid-storage:libiscsi-client");
	struct iscsi_url *url = iscsi_parse_full_url(iscsi, argv[1]);
	if (url == NULL) {
		fprintf(stderr, "bad URL %s: %s\n", argv[1], iscsi_get_error(iscsi));
		return 2;
	}
	iscsi_set_targetname(iscsi, url->target);
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE_CRC32C);
	if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0) {
		fprintf(stderr, "login to %s: %s\n", argv[1], iscsi_get_error(iscsi));
		return 1;
	}
	if (pass(iscsi, url->lun, count, qd, 0) != 0 || failed)
		return 1;
	if (pass(iscsi, url->lun, count, qd, 1) != 0 || failed || mismatched)
		return 1;
	printf("wrote and read back %llu bytes at queue depth %d: every byte as written\n",
	       (unsigned long long)(count * CHUNK), qd);
	iscsi_logout_sync(iscsi);
	iscsi_destroy_url(url);
	iscsi_destroy_context(iscsi);
	return 0;
}
