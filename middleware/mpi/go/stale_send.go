// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)

// stale_send (stale_send.cpp) with Go's own allocator: rank 0's buffers come
// from the Go runtime and go back to it. The runtime gives freed memory back
// to the kernel with system calls of its own (its scavenger's
// madvise(MADV_DONTNEED)), never through the C library, so no hook on the C
// library sees it. Rank 0 allocates a slice, fills every word with the
// message's number, sends it, drops it and has the runtime give the memory
// back (debug.FreeOSMemory: a collection, then every free page scavenged);
// the next slice of the size lands where the last one was. Rank 1 checks
// every word. Prints stale_send.cpp's lines for the way "go":
//
//	stale_send: way=go size=S messages=N corrupt=C      (rank 1)
//	stale_send: sender way=go not_freed=F elsewhere=E   (rank 0)
//	stale_send: rank R way=go monitor_hits=H            (libodpwatch-ofi preloaded)
//	stale_send: rank R way=go registrations=G           (libodpwatch-ucx-preload)
//
// F: times the old pages were still resident after the runtime gave them
// back (mincore); E: messages sent from an address no earlier message used,
// where no stale registration can be (the runtime may move the slice and
// come back: every address used before may hold one).
//
// Usage: mpirun -np 2 stale_send_go go SIZE COUNT
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <odpwatch/ofi_monitor.h>
#include <odpwatch/ucx_preload.h>

static int init(void) { return MPI_Init(NULL, NULL); }
static int rank(void) { int r = -1; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
static int ranks(void) { int n = 0; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }
static int send_bytes(void *buf, int n)
{
	return MPI_Send(buf, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
}
static int recv_bytes(void *buf, int n)
{
	return MPI_Recv(buf, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}
static void finish(void) { MPI_Finalize(); }
static void abort_job(void) { MPI_Abort(MPI_COMM_WORLD, 1); }

// The hits of libodpwatch-ofi's monitor so far, or -1 if it is not preloaded.
static int64_t monitor_hits(void)
{
	int (*fn)(struct odpwatch_ofi_stats *) = (int (*)(struct odpwatch_ofi_stats *))
		dlsym(RTLD_DEFAULT, "odpwatch_ofi_monitor_stats");
	struct odpwatch_ofi_stats s = { 0 };

	return fn && !fn(&s) ? (int64_t)s.hits : -1;
}

// The pinned registrations UCX made so far (libodpwatch-ucx-preload), or -1.
static int64_t ucx_registrations(void)
{
	int (*fn)(struct odpwatch_ucx_stats *) = (int (*)(struct odpwatch_ucx_stats *))
		dlsym(RTLD_DEFAULT, "odpwatch_ucx_preload_stats");
	struct odpwatch_ucx_stats s = { 0 };

	return fn && !fn(&s) ? (int64_t)s.registrations : -1;
}
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"unsafe"
)

// die: the whole job ends, not just this rank (the other would wait forever).
func die(what string, err error) {
	fmt.Fprintf(os.Stderr, "stale_send_go: %s: %v\n", what, err)
	C.abort_job()
	os.Exit(1)
}

// resident: whether any page of [p, p+len(vec) pages) is in memory (mincore
// into vec, one byte a page).
func resident(p uintptr, vec []byte) bool {
	size := uintptr(len(vec) * os.Getpagesize())
	_, _, e := syscall.Syscall(syscall.SYS_MINCORE, p, size, uintptr(unsafe.Pointer(&vec[0])))
	if e == syscall.ENOMEM {
		return false // nothing mapped there any more
	}
	if e != 0 {
		die("mincore", e)
	}
	for _, v := range vec {
		if v&1 != 0 {
			return true
		}
	}
	return false
}

// words: the slice's memory as 64-bit words.
func words(buf []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&buf[0])), len(buf)/8)
}

// sendAll: rank 0, count messages, each from a new slice of the runtime's.
func sendAll(size, count int) {
	notFreed, elsewhere := 0, 0
	used := map[uintptr]bool{}
	vec := make([]byte, size/os.Getpagesize()) // size is whole pages (main)
	for i := 0; i < count; i++ {
		buf := make([]byte, size)
		at := uintptr(unsafe.Pointer(&buf[0]))
		if i > 0 && !used[at] {
			elsewhere++
		}
		used[at] = true
		ws := words(buf)
		for w := range ws {
			ws[w] = uint64(i)
		}
		if rc := C.send_bytes(unsafe.Pointer(&buf[0]), C.int(size)); rc != 0 {
			die("MPI_Send", fmt.Errorf("error %d", rc))
		}
		runtime.KeepAlive(buf)
		// A collection frees the slice; every free page goes back to
		// the kernel, by the runtime's own madvise().
		debug.FreeOSMemory()
		if resident(at, vec) {
			notFreed++
		}
	}
	fmt.Printf("stale_send: sender way=go not_freed=%d elsewhere=%d\n", notFreed, elsewhere)
}

// receiveAll: rank 1, checks every word of count messages.
func receiveAll(size, count int) {
	got := make([]byte, size)
	corrupt := 0
	var firstBad uint64
	for i := 0; i < count; i++ {
		if rc := C.recv_bytes(unsafe.Pointer(&got[0]), C.int(size)); rc != 0 {
			die("MPI_Recv", fmt.Errorf("error %d", rc))
		}
		for _, v := range words(got) {
			if v != uint64(i) {
				if corrupt == 0 {
					firstBad = v
				}
				corrupt++
				break
			}
		}
	}
	fmt.Printf("stale_send: way=go size=%d messages=%d corrupt=%d", size, count, corrupt)
	if corrupt != 0 {
		fmt.Printf(" first_corrupt_word=%d", firstBad)
	}
	fmt.Println()
}

// MPI is called from the main thread only: the runtime may not move the
// main goroutine to another thread.
func init() { runtime.LockOSThread() }

func main() {
	if rc := C.init(); rc != 0 {
		// No MPI_Abort before MPI is up.
		fmt.Fprintf(os.Stderr, "stale_send_go: MPI_Init: error %d\n", rc)
		os.Exit(1)
	}
	rank := int(C.rank())
	size, err1 := strconv.Atoi(arg(2))
	count, err2 := strconv.Atoi(arg(3))
	if C.ranks() != 2 || arg(1) != "go" || err1 != nil || err2 != nil ||
		size < os.Getpagesize() || size%os.Getpagesize() != 0 || count < 1 {
		if rank == 0 {
			fmt.Fprintln(os.Stderr, "usage: stale_send_go go SIZE COUNT (two ranks; SIZE in whole pages)")
		}
		C.finish()
		os.Exit(2)
	}
	hits0, regs0 := C.monitor_hits(), C.ucx_registrations()
	if rank == 0 {
		sendAll(size, count)
	} else {
		receiveAll(size, count)
	}
	if hits := C.monitor_hits(); hits >= 0 {
		fmt.Printf("stale_send: rank %d way=go monitor_hits=%d\n", rank, hits-hits0)
	}
	if regs := C.ucx_registrations(); regs >= 0 {
		fmt.Printf("stale_send: rank %d way=go registrations=%d\n", rank, regs-regs0)
	}
	C.finish()
	// The C library's exit, not the runtime's: the preloaded libraries
	// print their counters from exit handlers, which Go's exit skips.
	C.exit(0)
}

func arg(i int) string {
	if i < len(os.Args) {
		return os.Args[i]
	}
	return ""
}
