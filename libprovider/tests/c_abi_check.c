/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/* Built as C: the public headers must stand alone in a C program. */
#include <errno.h>
#include <odpwatch/memwatch.h>
#include <odpwatch/odpwatch.h>
#include <odpwatch/regcache.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	struct odpwatch_odp_caps caps;

	memset(&caps, 0, sizeof(caps));
	if (odpwatch_query_odp_caps(NULL, &caps) >= 0) {
		fprintf(stderr, "a NULL context must be rejected\n");
		return 1;
	}
	if (odpwatch_memwatch_create(0, 0, NULL) != -EINVAL) {
		fprintf(stderr, "a NULL memwatch pointer must be rejected\n");
		return 1;
	}
	printf("odpwatch %s\n", odpwatch_version());
	return 0;
}
