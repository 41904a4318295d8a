// Command standin replaces the production images on simulated lab hosts, where no registry is reachable.
//
// One static binary plays two roles, picked from argv[0] or the first argument:
//
//	jumpstarter-exec serve --socket PATH   stands in for upstream's launcher, which the exporter image carries at
//	                                       /jumpstarter/bin/jumpstarter-exec and the runtime image runs from the
//	                                       shared volume (/shared/jumpstarter-exec) once it has been staged there
//	jmp run --exporter-config FILE         stands in for quay.io/jumpstarter-dev/jumpstarter's exporter
//
// The images built from it keep upstream's contract (labhost.sh): the runtime image has USER 65532 and no launcher
// of its own, so it only starts when the controller staged the launcher and runs it as root; the exporter image has
// USER 65532. The launcher does not run QEMU: it offers what the exporter reaches for, the launcher socket in the
// shared volume and the guest's ssh forward on 127.0.0.1:2222 in its network namespace. The exporter reads its
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
	fmt.Fprintln(os.Stderr, "usage: jumpstarter-exec serve --socket PATH | jmp run --exporter-config FILE")
	fmt.Fprintln(os.Stderr, "       (or standin jumpstarter-exec ... / standin jmp ...)")
	return 2
}

func main() {
	args := os.Args[1:]
	role := filepath.Base(os.Args[0])
	if role != "jmp" && role != "jumpstarter-exec" {
		if len(args) == 0 {
			os.Exit(usage())
		}
		role, args = args[0], args[1:]
	}
	switch role {
	case "jumpstarter-exec":
		os.Exit(runExec(args))
	case "jmp":
		os.Exit(runJmp(args))
	default:
		os.Exit(usage())
	}
}

// flagValue is the value of `--name VALUE` or `--name=VALUE` in args, "" if absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}
