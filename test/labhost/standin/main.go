// Command standin replaces the production images on simulated lab hosts, where no registry is reachable.
//
// One static binary plays two roles, picked from argv[0] or the first argument:
//
//	qemu-runtime-standin | standin runtime    stands in for quay.io/jumpstarter-dev/virtual/qemu-runtime
//	jmp | standin exporter                     stands in for quay.io/jumpstarter-dev/jumpstarter ("jmp run ...")
//
// The runtime does not run QEMU: it only offers what the exporter reaches for, the launcher socket in the shared
// volume and the guest's ssh forward on 127.0.0.1:2222 in its network namespace. The exporter reads its
// ExporterConfig, checks that both answer and that /dev/kvm is there, and logs what it found, so tests can assert
// on the journal of a real quadlet deployment.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

var logMu sync.Mutex

// logf writes one line per call to stdout, which podman hands to the journal; a multi-line message (yaml.v3
// errors) would otherwise be split into unrelated journal entries.
func logf(format string, args ...interface{}) {
	msg := strings.ReplaceAll(strings.TrimRight(fmt.Sprintf(format, args...), "\n"), "\n", "; ")
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintln(os.Stdout, msg)
}

func sigName(s os.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}

func usage() int {
	fmt.Fprintln(os.Stderr, "usage: standin runtime [ARGS...] | standin exporter run --exporter-config FILE")
	fmt.Fprintln(os.Stderr, "       (or invoked as qemu-runtime-standin / jmp)")
	return 2
}

func main() {
	args := os.Args[1:]
	role := filepath.Base(os.Args[0])
	if role != "jmp" && role != "qemu-runtime-standin" {
		if len(args) == 0 {
			os.Exit(usage())
		}
		role, args = args[0], args[1:]
	}
	switch role {
	case "qemu-runtime-standin", "runtime":
		os.Exit(runRuntime(args))
	case "jmp", "exporter":
		os.Exit(runJmp(args))
	default:
		os.Exit(usage())
	}
}
