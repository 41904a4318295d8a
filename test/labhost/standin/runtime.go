package main

import (
	"bufio"
	"errors"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

const sshBanner = "SSH-2.0-qemu-runtime-standin"

func getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// runRuntime serves the launcher socket and the ssh forward until SIGTERM. Arguments are only logged: a quadlet's
// Exec= is appended to the image's entrypoint, and whatever the real runtime would take must not break the stand-in.
func runRuntime(args []string) int {
	sockPath := getenv("STANDIN_LAUNCHER_SOCKET", "/shared/launcher.sock")
	sshAddr := getenv("STANDIN_SSH_LISTEN", "127.0.0.1:2222")
	logf("qemu-runtime-standin: starting pid=%d args=%q kvm=%s", os.Getpid(), args, kvmState())

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	if err := os.MkdirAll(filepath.Dir(sockPath), 0o755); err != nil {
		logf("qemu-runtime-standin: error: %v", err)
		return 1
	}
	// a socket left by a killed predecessor in the persistent volume would make Listen fail
	_ = os.Remove(sockPath)
	launcher, err := net.Listen("unix", sockPath)
	if err != nil {
		logf("qemu-runtime-standin: error: launcher socket: %v", err)
		return 1
	}
	defer os.Remove(sockPath)
	ssh, err := net.Listen("tcp", sshAddr)
	if err != nil {
		logf("qemu-runtime-standin: error: ssh forward: %v", err)
		return 1
	}
	go serve(launcher, "launcher", handleLauncher)
	go serve(ssh, "ssh", handleSSH)
	logf("qemu-runtime-standin: listening launcher=%s ssh=%s", sockPath, sshAddr)

	s := <-sigs
	logf("qemu-runtime-standin: %s, exiting", sigName(s))
	launcher.Close()
	ssh.Close()
	return 0
}

func serve(l net.Listener, what string, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				logf("qemu-runtime-standin: %s accept: %v", what, err)
			}
			return
		}
		go handle(c)
	}
}

// The launcher protocol of the real runtime is not modelled: the stand-in greets and logs what it is sent.
func handleLauncher(c net.Conn) {
	defer c.Close()
	logf("qemu-runtime-standin: launcher connection")
	if _, err := c.Write([]byte("qemu-runtime-standin ready\n")); err != nil {
		return
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if len(line) > 200 {
			line = line[:200] + "..."
		}
		logf("qemu-runtime-standin: launcher request %q", line)
		if _, err := c.Write([]byte("ok\n")); err != nil {
			return
		}
	}
}

func handleSSH(c net.Conn) {
	defer c.Close()
	logf("qemu-runtime-standin: ssh connection from %s", c.RemoteAddr())
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
