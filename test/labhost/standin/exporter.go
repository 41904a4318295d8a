package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"
)

type driverSpec struct {
	Type   string                 `yaml:"type"`
	Config map[string]interface{} `yaml:"config"`
}

type exporterConfig struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Namespace string `yaml:"namespace"`
		Name      string `yaml:"name"`
	} `yaml:"metadata"`
	Endpoint string `yaml:"endpoint"`
	Token    string `yaml:"token"`
	TLS      struct {
		CA       string `yaml:"ca"`
		Insecure bool   `yaml:"insecure"`
	} `yaml:"tls"`
	ExitOnLeaseEnd bool                  `yaml:"exitOnLeaseEnd"`
	Export         map[string]driverSpec `yaml:"export"`
}

func runJmp(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Println("jmp (qemu-ssh-provisioner lab stand-in): jmp run --exporter-config FILE")
		return 0
	}
	if args[0] == "version" || args[0] == "--version" {
		fmt.Println("jmp standin")
		return 0
	}
	if args[0] != "run" {
		fmt.Fprintf(os.Stderr, "jmp: unsupported command %q (stand-in knows only run)\n", args[0])
		return 2
	}
	path := flagValue(args[1:], "--exporter-config")
	if path == "" {
		fmt.Fprintln(os.Stderr, "jmp run: --exporter-config FILE is required")
		return 2
	}
	return exporterMain(path)
}

func exporterMain(path string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	logf("standin-exporter: starting uid=%d JUMPSTARTER_LAUNCHER_SOCKET=%s", os.Getuid(),
		orUnset(os.Getenv("JUMPSTARTER_LAUNCHER_SOCKET")))
	cfg, err := loadConfig(path)
	if err != nil {
		logf("standin-exporter: config error: %v", err)
		return 1
	}
	r := &reporter{}
	r.start(cfg, path)
	for s := range sigs {
		if s != syscall.SIGHUP {
			logf("standin-exporter: %s, exiting", sigName(s))
			return 0
		}
		// a broken edit keeps the exporter on its last good config, like a daemon would
		next, err := loadConfig(path)
		if err != nil {
			logf("standin-exporter: SIGHUP, reload failed, keeping the old config: %v", err)
			continue
		}
		logf("standin-exporter: SIGHUP, reloaded %s", path)
		r.start(next, path)
	}
	return 0
}

// loadConfig never lets the token reach an error message: yaml.v3 quotes offending values in type errors.
func loadConfig(path string) (*exporterConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw map[string]interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	cfg := &exporterConfig{}
	if err := yaml.Unmarshal(data, cfg); err != nil {
		msg := err.Error()
		if tok, ok := raw["token"].(string); ok && tok != "" {
			msg = strings.ReplaceAll(msg, tok, "<token>")
		}
		return nil, fmt.Errorf("%s: %s", path, msg)
	}
	if cfg.Kind != "ExporterConfig" {
		logf("standin-exporter: warning: kind=%q, expected ExporterConfig", cfg.Kind)
	}
	return cfg, nil
}

type findings struct {
	launcher, tcp, disk, kvm string
}

func (f findings) ready() bool { return f.launcher == "ok" && f.tcp == "ok" && f.disk == "ok" }

// reporter runs one round of checks per (re)load; a newer round silences an older one still retrying.
type reporter struct {
	mu     sync.Mutex
	gen    int
	cancel context.CancelFunc
}

func (r *reporter) start(cfg *exporterConfig, path string) {
	r.mu.Lock()
	if r.cancel != nil {
		r.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.gen++
	r.cancel = cancel
	gen := r.gen
	r.mu.Unlock()
	go r.check(ctx, gen, cfg, path)
}

func (r *reporter) current(gen int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return gen == r.gen
}

// unreadyController marks an endpoint whose controller is not ready yet: the stand-in then does what `jmp run` does
// there, 5 failed connections within 60 s and a clean exit ("allow container/service restart"), so a test can show
// what a Restart=on-failure unit is left with.
const unreadyController = ".unready.invalid"

func (r *reporter) check(ctx context.Context, gen int, cfg *exporterConfig, path string) {
	if host, _, err := net.SplitHostPort(cfg.Endpoint); err == nil && strings.HasSuffix(host, unreadyController) {
		for i := 1; i <= 5; i++ {
			logf("standin-exporter: cannot reach the controller at %s (%d/5)", cfg.Endpoint, i)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		if r.current(gen) {
			logf("standin-exporter: 5 failures, exiting with status 0 as jmp run does")
			os.Exit(0)
		}
		return
	}
	sock := launcherSocket(cfg)
	target := tcpTarget(cfg)
	logf("standin-exporter: config=%s apiVersion=%s kind=%s drivers=%s launcher_socket=%s tcp=%s tls.insecure=%t",
		path, cfg.APIVersion, cfg.Kind, describeDrivers(cfg), orUnset(sock), orUnset(target), cfg.TLS.Insecure)

	// the runtime may still be starting: retry for a while, as the real exporter would keep reconnecting
	retry := 60 * time.Second
	if v, err := time.ParseDuration(os.Getenv("STANDIN_RETRY")); err == nil {
		retry = v
	}
	deadline := time.Now().Add(retry)
	lastWait := time.Time{}
	var f findings
	for {
		f = findings{launcher: probeLauncher(sock), tcp: probeTCP(target), disk: probeDisk(sock), kvm: kvmState()}
		if f.ready() || time.Now().After(deadline) {
			break
		}
		if time.Since(lastWait) >= 10*time.Second {
			logf("standin-exporter: waiting launcher=%s tcp=%s disk=%s", f.launcher, f.tcp, f.disk)
			lastWait = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
	if ctx.Err() != nil || !r.current(gen) {
		return
	}
	// A flash that QEMU cannot reach leaves the exporter useless: fail like a broken deployment, not quietly.
	if f.launcher == "ok" && f.disk != "ok" {
		logf("standin-exporter: error: disk=%s", f.disk)
		os.Exit(1)
	}
	token := "<missing>"
	if cfg.Token != "" {
		token = "<set>"
	}
	logf("standin-exporter: name=%s/%s endpoint=%s launcher=%s tcp=%s kvm=%s exitOnLeaseEnd=%t token=%s disk=%s",
		orUnset(cfg.Metadata.Namespace), orUnset(cfg.Metadata.Name), orUnset(cfg.Endpoint),
		f.launcher, f.tcp, f.kvm, cfg.ExitOnLeaseEnd, token, f.disk)
}

func orUnset(s string) string {
	if s == "" {
		return "<unset>"
	}
	return s
}

func sortedExports(cfg *exporterConfig) []string {
	names := make([]string, 0, len(cfg.Export))
	for n := range cfg.Export {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func describeDrivers(cfg *exporterConfig) string {
	parts := []string{}
	for _, n := range sortedExports(cfg) {
		parts = append(parts, n+"("+cfg.Export[n].Type+")")
	}
	if len(parts) == 0 {
		return "<none>"
	}
	return strings.Join(parts, ",")
}

// launcherSocket prefers export.qemu and falls back to any driver that names a launcher socket.
func launcherSocket(cfg *exporterConfig) string {
	if s, ok := cfg.Export["qemu"].Config["launcher_socket"].(string); ok {
		return s
	}
	for _, n := range sortedExports(cfg) {
		if s, ok := cfg.Export[n].Config["launcher_socket"].(string); ok {
			return s
		}
	}
	return ""
}

// tcpTarget prefers export.tcp and falls back to any TcpNetwork driver.
func tcpTarget(cfg *exporterConfig) string {
	d, ok := cfg.Export["tcp"]
	if !ok {
		for _, n := range sortedExports(cfg) {
			if strings.HasSuffix(cfg.Export[n].Type, "TcpNetwork") {
				d, ok = cfg.Export[n], true
				break
			}
		}
	}
	if !ok {
		return ""
	}
	host, _ := d.Config["host"].(string)
	var port string
	switch p := d.Config["port"].(type) {
	case int:
		port = strconv.Itoa(p)
	case string:
		port = p
	}
	if host == "" || port == "" {
		return ""
	}
	return net.JoinHostPort(host, port)
}

func probeLauncher(sock string) string {
	if sock == "" {
		return "unset"
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return "fail"
	}
	c.Close()
	return "ok"
}

// flashPath is where the stand-in flashes: in /disk, where upstream main's driver keeps root, bios and OVMF files.
const flashPath = "/disk/standin-flash"

// probeDisk flashes a fresh nonce into this container's /disk and asks the runtime, over the launcher socket, to
// read it from its own: "ok" only when both containers share one writable /disk.
func probeDisk(sock string) string {
	if sock == "" {
		return "unset"
	}
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(os.Getpid())
	tmp := flashPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(nonce), 0o644); err != nil {
		return "unwritable"
	}
	if err := os.Rename(tmp, flashPath); err != nil {
		return "unwritable"
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return "no-launcher"
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	rd := bufio.NewReader(c)
	if _, err := rd.ReadString('\n'); err != nil {
		return "no-launcher"
	}
	if _, err := c.Write([]byte("disk-check " + nonce + "\n")); err != nil {
		return "no-launcher"
	}
	reply, err := rd.ReadString('\n')
	if err != nil {
		return "no-launcher"
	}
	reply = strings.TrimSpace(reply)
	if reply == "disk ok" {
		return "ok"
	}
	// "disk unshared: ..." -> "unshared"
	word, _, _ := strings.Cut(strings.TrimPrefix(reply, "disk "), ":")
	return word
}

// probeTCP wants the ssh banner, not just an open port: QEMU's hostfwd accepts before the guest's sshd is up.
func probeTCP(target string) string {
	if target == "" {
		return "unset"
	}
	c, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		return "fail"
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "SSH-") {
		return "no-banner"
	}
	return "ok"
}
