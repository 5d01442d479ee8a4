/*
 * The floor under every queue-depth-1 figure on loopback: how many request
 * and answer round trips per second two processes manage over one TCP
 * connection on 127.0.0.1 when neither does anything else. A 4 KiB iSCSI
 * READ is a 48-byte request and a 48-byte header with 4 KiB of data back; a
 * WRITE the other way round. No target can answer QD1 commands faster than
 * this, whatever it does inside.
 *
 *   roundtrip SECONDS            prints "read N" and "write N" (round trips/s)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fullio.h"

#define HEADER 48
#define DATA 4096

static char buf[HEADER + DATA];

/* One run: the client sends `ask` bytes and waits for `answer` bytes, for
 * `seconds`; returns round trips per second. */
static double run(int seconds, size_t ask, size_t answer) {
	int one = 1;
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof a;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)&a, &len)) {
		perror("roundtrip: listen on 127.0.0.1");
		exit(1);
	}
	pid_t server = fork();
	if (server == 0) {
		int c = accept(l, NULL, NULL);
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		while (take(c, buf, ask) && give(c, buf, answer))
			;
		_exit(0);
	}
	close(l);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) {
		perror("roundtrip: connect");
		kill(server, SIGKILL);
		exit(1);
	}
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	memset(buf, 0x5a, sizeof buf);
	double start = now(), end = start + seconds, t = start;
	long n = 0;
	while (t < end) {
		if (!give(s, buf, ask) || !take(s, buf, answer)) {
			fprintf(stderr, "roundtrip: the server went away\n");
			exit(1);
		}
		n++;
		t = now();
	}
	close(s);
	waitpid(server, NULL, 0);
	return (double)n / (t - start);
}

int main(int argc, char **argv) {
	int seconds = argc == 2 ? atoi(argv[1]) : 0;
	if (seconds < 1 || seconds > 600) {
		fprintf(stderr, "usage: roundtrip SECONDS (1 to 600)\n");
		return 2;
	}
	printf("read %.0f\n", run(seconds, HEADER, HEADER + DATA));
	printf("write %.0f\n", run(seconds, HEADER + DATA, HEADER));
	return 0;
}
