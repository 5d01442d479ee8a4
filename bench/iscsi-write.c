/*
 * Writes to an iSCSI LUN for a fixed time through libiscsi's asynchronous
 * API, QD commands in flight, and prints what it moved: the write client
 * of bench/iscsi (libiscsi's own iscsi-perf only reads).
 *
 *   iscsi-write URL SECONDS BLOCKSIZE QD seq|rand
 *
 * Prints one line: "<ops> <bytes> <seconds>". Exit status 0 when every
 * write succeeded.
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#define BLOCK 512

static int in_flight, failed;
static uint64_t ops;

static void done(struct iscsi_context *iscsi, int status, void *data, void *private)
{
	(void)private;
	in_flight--;
	if (status != SCSI_STATUS_GOOD) {
		fprintf(stderr, "WRITE(16): status %d: %s\n", status, iscsi_get_error(iscsi));
		failed++;
	}
	ops++;
	scsi_free_scsi_task(data);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s URL SECONDS BLOCKSIZE QD seq|rand\n", argv[0]);
		return 2;
	}
	double seconds = atof(argv[2]);
	uint32_t bs = (uint32_t)strtoul(argv[3], NULL, 10);
	int qd = atoi(argv[4]);
	int random = strcmp(argv[5], "rand") == 0;
	if (bs == 0 || bs % BLOCK != 0 || qd < 1) {
		fprintf(stderr, "BLOCKSIZE must be a multiple of %d, QD at least 1\n", BLOCK);
		return 2;
	}
	struct iscsi_context *iscsi = iscsi_create_context("iqn.2026-11.org.braid-storage:bench-write");
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
	struct scsi_task *cap = iscsi_readcapacity16_sync(iscsi, url->lun);
	struct scsi_readcapacity16 *rc = cap ? scsi_datain_unmarshall(cap) : NULL;
	if (rc == NULL) {
		fprintf(stderr, "READ CAPACITY(16): %s\n", iscsi_get_error(iscsi));
		return 1;
	}
	uint64_t slots = (rc->returned_lba + 1) * BLOCK / bs;
	scsi_free_scsi_task(cap);
	unsigned char *buf = malloc(bs);
	for (uint32_t i = 0; i < bs; i++)
		buf[i] = (unsigned char)(i * 31 + 7);

	uint64_t next = 0, rng = 88172645463325252ull;
	double start = now(), end = start + seconds;
	while ((now() < end || in_flight > 0) && !failed) {
		while (in_flight < qd && now() < end) {
			uint64_t slot;
			if (random) {
				rng ^= rng << 13;
				rng ^= rng >> 7;
				rng ^= rng << 17;
				slot = rng % slots;
			} else {
				slot = next++ % slots;
			}
			if (iscsi_write16_task(iscsi, url->lun, slot * (bs / BLOCK), buf, bs, BLOCK,
					       0, 0, 0, 0, 0, done, NULL) == NULL) {
				fprintf(stderr, "queueing a write: %s\n", iscsi_get_error(iscsi));
				return 1;
			}
			in_flight++;
		}
		struct pollfd pfd = { .fd = iscsi_get_fd(iscsi), .events = iscsi_which_events(iscsi) };
		if (poll(&pfd, 1, 30000) <= 0) {
			fprintf(stderr, "no answer within 30 s (%d in flight)\n", in_flight);
			return 1;
		}
		if (iscsi_service(iscsi, pfd.revents) < 0) {
			fprintf(stderr, "iscsi_service: %s\n", iscsi_get_error(iscsi));
			return 1;
		}
	}
	double took = now() - start;
	printf("%llu %llu %.3f\n", (unsigned long long)ops, (unsigned long long)(ops * bs), took);
	iscsi_logout_sync(iscsi);
	iscsi_destroy_url(url);
	iscsi_destroy_context(iscsi);
	free(buf);
	return failed ? 1 : 0;
}
