// SPDX-License-Identifier: GPL-2.0
/*
 * Each rxe ODP test, when rdma-core's libibverbs was missing at build time:
 * a test that says why it cannot run.
 */
#include "../kselftest.h"

int main(void)
{
	ksft_print_header();
	ksft_exit_skip("built without rdma-core's libibverbs and its headers\n");
}
