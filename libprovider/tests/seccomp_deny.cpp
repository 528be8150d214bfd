// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Runs a command under a seccomp filter that answers some system calls with
// an errno, as a container runtime answers the calls its profile does not
// allow (EPERM), or as a kernel without them would (ENOSYS). The filter
// stays with the command and everything it starts.
//   odpwatch-seccomp-deny EPERM|ENOSYS CALL[,CALL...] COMMAND [ARG...]
// CALL: memwatch_create, userfaultfd, or a system call's number.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace
{

int usage()
{
	std::fprintf(stderr, "usage: odpwatch-seccomp-deny EPERM|ENOSYS CALL[,CALL...] COMMAND "
			     "[ARG...]\n  CALL: memwatch_create, userfaultfd or a number\n");
	return 2;
}

// A system call's number, or -1.
long number_of(std::string_view name)
{
	if (name == "memwatch_create")
		return ODPWATCH_NR_MEMWATCH_CREATE;
	if (name == "userfaultfd")
		return SYS_userfaultfd;
	char *end = nullptr;
	const std::string s(name);
	long nr = std::strtol(s.c_str(), &end, 10);
	return !s.empty() && *end == '\0' && nr >= 0 ? nr : -1;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 4)
		return usage();
	const std::string_view err = argv[1];
	if (err != "EPERM" && err != "ENOSYS")
		return usage();
	const unsigned errno_value = err == "EPERM" ? EPERM : ENOSYS;
	std::vector<long> calls;
	for (std::string_view list = argv[2]; !list.empty();) {
		const size_t comma = list.find(',');
		const long nr = number_of(list.substr(0, comma));
		if (nr < 0) {
			std::fprintf(stderr, "odpwatch-seccomp-deny: unknown system call in '%s'\n",
				     argv[2]);
			return usage();
		}
		calls.push_back(nr);
		list = comma == list.npos ? std::string_view{} : list.substr(comma + 1);
	}
	// Load the number; for each call, answer with the errno if it matches;
	// allow the rest. (x86-64 only, as the guests are: the architecture is
	// not checked.)
	std::vector<sock_filter> filter{
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr))};
	for (long nr : calls) {
		filter.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, unsigned(nr), 0, 1));
		filter.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | errno_value));
	}
	filter.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
	sock_fprog prog{static_cast<unsigned short>(filter.size()), filter.data()};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		std::fprintf(stderr, "odpwatch-seccomp-deny: seccomp filter: %s\n",
			     std::strerror(errno));
		return 1;
	}
	execvp(argv[3], argv + 3);
	std::fprintf(stderr, "odpwatch-seccomp-deny: %s: %s\n", argv[3], std::strerror(errno));
	return 127;
}
