package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const sshBanner = "SSH-2.0-jumpstarter-exec-standin"

// defaultSSHListen is where the stand-in plays QEMU's ssh forward. An image whose QEMU really runs (the 0.9.0
// exporter image of the real chain) builds it empty with -ldflags "-X main.defaultSSHListen=", leaving the port to
// QEMU.
var defaultSSHListen = "127.0.0.1:2222"

func getenv(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

// runExec is `jumpstarter-exec serve --socket PATH`: it serves the launcher socket (and the ssh forward) until
// SIGTERM. Like upstream's launcher it runs as root in the runtime container and makes the socket reachable by the
// exporter's uid.
func runExec(args []string) int {
	sockPath := ""
	if len(args) > 0 && args[0] == "serve" {
		sockPath = flagValue(args[1:], "--socket")
	}
	if sockPath == "" {
		fmt.Fprintln(os.Stderr, "jumpstarter-exec: usage: jumpstarter-exec serve --socket PATH")
		return 2
	}
	sshAddr := getenv("STANDIN_SSH_LISTEN", defaultSSHListen)
	logf("jumpstarter-exec: starting pid=%d uid=%d kvm=%s log_fields=%q", os.Getpid(), os.Getuid(), kvmState(),
		os.Getenv("JUMPSTARTER_EXEC_LOG_FIELDS"))
	// QEMU opens /dev/kvm (root:kvm 0660) from here: a runtime not run as root fails the way the real one would.
	if kvmState() == "present" && syscall.Access("/dev/kvm", 6 /* R_OK|W_OK */) != nil {
		logf("jumpstarter-exec: error: /dev/kvm is not accessible to uid %d (the runtime must run as root)", os.Getuid())
		return 1
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	// a socket left by a killed predecessor in the persistent volume would make Listen fail
	_ = os.Remove(sockPath)
	// born 0666: the exporter connects as another uid than this root process
	old := syscall.Umask(0o111)
	launcher, err := net.Listen("unix", sockPath)
	syscall.Umask(old)
	if err != nil {
		logf("jumpstarter-exec: error: launcher socket: %v", err)
		return 1
	}
	defer os.Remove(sockPath)
	go serve(launcher, "launcher", handleLauncher)
	var ssh net.Listener
	if sshAddr != "" {
		if ssh, err = net.Listen("tcp", sshAddr); err != nil {
			logf("jumpstarter-exec: error: ssh forward: %v", err)
			return 1
		}
		go serve(ssh, "ssh", handleSSH)
	}
	logf("jumpstarter-exec: listening launcher=%s ssh=%s", sockPath, orUnset(sshAddr))

	s := <-sigs
	logf("jumpstarter-exec: %s, exiting", sigName(s))
	launcher.Close()
	if ssh != nil {
		ssh.Close()
	}
	return 0
}

func serve(l net.Listener, what string, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				logf("jumpstarter-exec: %s accept: %v", what, err)
			}
			return
		}
		go handle(c)
	}
}

// The launcher protocol of the real runtime is not modelled: the stand-in greets and logs what it is sent.
func handleLauncher(c net.Conn) {
	defer c.Close()
	logf("jumpstarter-exec: launcher connection")
	if _, err := c.Write([]byte("jumpstarter-exec ready\n")); err != nil {
		return
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if len(line) > 200 {
			line = line[:200] + "..."
		}
		logf("jumpstarter-exec: launcher request %q", line)
		reply := "ok"
		if nonce, ok := strings.CutPrefix(line, "disk-check "); ok {
			reply = diskCheck(nonce)
			logf("jumpstarter-exec: %s", reply)
		}
		if _, err := c.Write([]byte(reply + "\n")); err != nil {
			return
		}
	}
}

// diskCheck plays QEMU opening the disk the exporter flashed: upstream main's driver writes it to /disk in the
// exporter's container and QEMU reads it from /disk in this one, so both must mount the same volume there.
func diskCheck(nonce string) string {
	data, err := os.ReadFile(flashPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "disk unshared: " + flashPath + " is not in the runtime's /disk"
	case err != nil:
		return "disk unreadable: " + err.Error()
	case string(data) != nonce:
		return "disk mismatch: " + flashPath + " holds another flash"
	}
	return "disk ok"
}

func handleSSH(c net.Conn) {
	defer c.Close()
	logf("jumpstarter-exec: ssh connection from %s", c.RemoteAddr())
	if _, err := c.Write([]byte(sshBanner + "\r\n")); err != nil {
		return
	}
	// hold the connection like an sshd waiting for the client's banner, until the peer hangs up
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

func kvmState() string {
	fi, err := os.Stat("/dev/kvm")
	switch {
	case err != nil:
		return "missing"
	case fi.Mode()&os.ModeCharDevice == 0:
		return "not-a-char-device"
	default:
		return "present"
	}
}
