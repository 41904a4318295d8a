// The image's entrypoint, /exporter-set-controller (the path the operator's Deployment runs): execs the Deno runtime
// on the bundle under the launcher's permission set, as `deno task run:bundle` does. A plain deno cannot carry its
// own arguments (deno compile would, but needs denort from Deno's download site), so this does; the permission flags
// come from scripts/permissions.sh at build time (-X main.flags=...).
package main

import (
	"os"
	"strings"
	"syscall"
)

var flags string

func main() {
	args := []string{"/deno", "run", "--no-config", "--cached-only", "--no-remote", "--no-npm"}
	args = append(args, strings.Fields(flags)...)
	args = append(args, "/qemu-ssh-provisioner.js")
	args = append(args, os.Args[1:]...)
	err := syscall.Exec(args[0], args, os.Environ())
	os.Stderr.WriteString("exporter-set-controller: exec " + args[0] + ": " + err.Error() + "\n")
	os.Exit(127)
}
