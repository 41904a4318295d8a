/**
 * Pooled SSH command execution against lab hosts, on top of ssh2 (the only module allowed to import it).
 *
 * Why a pool: a reconcile runs many short commands per host; a fresh SSH handshake each time costs far more than the
 * command, and lab hosts throttle unauthenticated connections (MaxStartups). One connection per (host, port, user,
 * client key) is kept open and multiplexed, staying below OpenSSH's MaxSessions (10) per connection.
 */
// @ts-types="@types/ssh2"
import { Client, utils as ssh2Utils } from "ssh2";
// @ts-types="@types/ssh2"
import type { ClientChannel, ConnectConfig, ServerHostKeyAlgorithm } from "ssh2";
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { checkHostKey, type HostKeyVerdict, knownHostsLine, lookup } from "./known_hosts.ts";
import { checkPrivateKey } from "./ssh_key.ts";
import { netAddress } from "./lab_hosts.ts";
import { Semaphore } from "../semaphore.ts";

export type HostKeyPolicy = "Strict" | "AcceptNew";

export interface SshTarget {
  /** Host name as recorded in known_hosts and shown in messages. */
  host: string;
  /** Where to connect if not `host` (like OpenSSH's HostKeyAlias the other way round); host keys stay checked under `host`. */
  address?: string;
  port: number;
  user: string;
  /** Private key text (OpenSSH or PEM RSA), unencrypted. */
  privateKey: string;
  /** known_hosts text; may be empty under AcceptNew. */
  knownHosts: string;
  hostKeyPolicy: HostKeyPolicy;
  /**
   * Where this caller's pins are recorded (the namespace of its pin Secret): a connection reused by another scope
   * calls onHostKeyAccepted for that scope too, once.
   */
  pinScope?: string;
}

export interface ExecResult {
  /** Exit status; 128+N when the remote process died of signal N (as a shell reports it), -1 if none was sent. */
  code: number;
  stdout: string;
  stderr: string;
  /** Set when the remote process was killed by a signal, in Node's spelling (e.g. "SIGKILL"). */
  signal?: string;
}

/**
 * - hostkey: the host key is unknown (Strict), changed, or revoked. Fix known_hosts; retrying does not help.
 * - auth: the server refused the client key.
 * - connect: TCP/handshake failure or handshake timeout; host unreachable or sshd down.
 * - timeout: a command exceeded its time limit, waiting for a channel included (the connection itself may be fine).
 * - output: a command printed more than maxOutputBytes on stdout or stderr, and was killed.
 * - key: the private key is unusable (checked before connecting).
 * - closed: the pool was closed, or the connection dropped while the command ran (it may or may not have run).
 */
export type SshErrorKind = "hostkey" | "auth" | "connect" | "timeout" | "output" | "key" | "closed";

export class SshError extends Error {
  override name = "SshError";
  readonly kind: SshErrorKind;
  readonly host: string;
  readonly port: number;
  /** During connect backoff: epoch ms before which no new connection attempt is made to this target. */
  readonly retryAt?: number;

  constructor(
    kind: SshErrorKind,
    target: { host: string; port: number },
    message: string,
    opts?: { cause?: unknown; retryAt?: number },
  ) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.kind = kind;
    this.host = target.host;
    this.port = target.port;
    this.retryAt = opts?.retryAt;
  }
}

export interface SshPoolOptions {
  /** Concurrent channels per connection; default 6, below OpenSSH's MaxSessions=10 so sshd never refuses one. */
  maxChannels?: number;
  /** Default per-command limit, default 120000; it covers the wait for a free channel on the connection too. */
  commandTimeoutMs?: number;
  /**
   * Bytes a command may print on stdout, and again on stderr, default 4 MiB (16 times the largest report seen). A
   * compromised host or a runaway journal would otherwise fill the heap and take every other host down with it.
   */
  maxOutputBytes?: number;
  /** TCP connect + SSH handshake + authentication, default 20000. */
  connectTimeoutMs?: number;
  /** SSH-level keepalive interval, default 15000 (0 disables). */
  keepaliveIntervalMs?: number;
  /** Unanswered keepalives before the connection is declared dead, default 3. */
  keepaliveCountMax?: number;
  /** First delay after a failed connect to a target, default 1000; doubles per failure, with jitter. */
  backoffBaseMs?: number;
  /** Upper bound of the connect backoff, default 60000. */
  backoffMaxMs?: number;
  /**
   * First delay after the server refused the key, default 20000; doubles per failure up to backoffMaxMs (a lower
   * backoffMaxMs does not shorten it). Retrying soon cannot help (someone must change authorized_keys or the Secret,
   * and a new key is a new target), and sshd (OpenSSH >= 9.8, PerSourcePenalties authfail:5s min:15s) shuts out the
   * controller's whole address, for every namespace and key, once its failures come faster than one per 5 s.
   */
  authBackoffBaseMs?: number;
  /**
   * Called under AcceptNew when a host without known_hosts entries is trusted for the first time. The connection
   * proceeds only after this resolves; if it throws, the key is not trusted (so nothing runs on an unpinned host).
   */
  onHostKeyAccepted?: (t: SshTarget, knownHostsLine: string, fingerprint: string) => Promise<void> | void;
  /** Called once per connection established (authenticated), for metrics. */
  onConnect?: (t: SshTarget) => void;
  /** A connection with no command for this long is closed (default 600000; 0 keeps them): each holds a descriptor. */
  idleCloseMs?: number;
  /** Handshakes in progress at once, default 32: a rollout to 2000 hosts must not open 2000 sockets in one go. */
  maxHandshakes?: number;
  /**
   * Connections open at once (default: no bound). At the bound the longest idle one is closed for a new one; with
   * none idle, connecting fails, naming the bound: better than EMFILE, which would also fail the leader's Lease.
   */
  maxConnections?: number;
}

export interface SshPoolStats {
  /** Successful connections (handshake and authentication done) since the pool was created. */
  connectionsOpened: number;
  /** Commands started (channels opened). */
  commands: number;
  /** Connections currently open. */
  open: number;
  /** Callers waiting for a turn to connect (at most maxHandshakes connect at once). */
  handshakesWaiting: number;
  /** Session opens sshd refused and that were retried (see ChannelRefused); steadily rising means MaxSessions is low. */
  channelRetries: number;
}

interface Conn {
  key: string;
  label: string;
  client: Client;
  /** The host key the server proved, re-checked on reuse against the caller's current known_hosts. */
  hostKey: Buffer;
  sem: Semaphore;
  alive: boolean;
  /** performance.now() of the last command started or finished on it. */
  lastUsed: number;
  /**
   * Pins made on reuse, by the caller's known_hosts and policy: a connection opened for one namespace and reused for
   * another must still pin the key for the second (each namespace has its own pin Secret), once, not per command.
   */
  pins: Map<string, Promise<void>>;
}

interface Failure {
  count: number;
  retryAt: number;
  error: SshError;
  /** known_hosts + policy at the time: a changed Secret deserves an immediate retry instead of the backoff wait. */
  configHash: string;
}

/** Thrown inside the pool when a channel could not even be opened because the connection had died: safe to retry. */
class NotStarted extends Error {}

/**
 * sshd refused to open a session on a live connection. sshd frees a closed session only after its main loop has
 * handled the whole input batch, so our CLOSE and the next OPEN arriving together can briefly exceed MaxSessions even
 * though we never have more than maxChannels open. The command never started, so it is retried after a short pause.
 */
class ChannelRefused extends Error {}
const CHANNEL_RETRIES = 6;

/** How long after a timeout sshd gets to confirm the channel closed before the connection is presumed dead. */
const CLOSE_GRACE_MS = 5_000;

const DEFAULTS = {
  maxChannels: 6,
  idleCloseMs: 600_000,
  maxHandshakes: 32,
  maxConnections: Infinity,
  commandTimeoutMs: 120_000,
  maxOutputBytes: 4 * 1024 * 1024,
  connectTimeoutMs: 20_000,
  keepaliveIntervalMs: 15_000,
  keepaliveCountMax: 3,
  backoffBaseMs: 1_000,
  backoffMaxMs: 60_000,
  authBackoffBaseMs: 20_000,
};

export class SshPool {
  readonly #opts: typeof DEFAULTS & Pick<SshPoolOptions, "onHostKeyAccepted" | "onConnect">;
  readonly #conns = new Map<string, Conn>();
  readonly #connecting = new Map<string, Promise<Conn>>();
  readonly #failures = new Map<string, Failure>();
  /** Every client not yet closed, including ones still handshaking, so close() can wait for all sockets. */
  readonly #clients = new Map<Client, Promise<void>>();
  readonly #keyInfo = new Map<string, { fingerprint: string; type: string } | string>();
  #closed = false;
  #stats = { connectionsOpened: 0, commands: 0, channelRetries: 0 };
  #handshakes: Semaphore;
  #lastSweep = performance.now();

  constructor(opts: SshPoolOptions = {}) {
    const o = { ...DEFAULTS };
    for (const k of Object.keys(DEFAULTS) as (keyof typeof DEFAULTS)[]) {
      const v = opts[k];
      if (v !== undefined) {
        if (!Number.isFinite(v) || v < 0) throw new RangeError(`SshPoolOptions.${k} must be a number >= 0`);
        o[k] = v;
      }
    }
    if (o.maxChannels < 1) throw new RangeError("SshPoolOptions.maxChannels must be >= 1");
    if (o.maxHandshakes < 1) throw new RangeError("SshPoolOptions.maxHandshakes must be >= 1");
    if (o.maxConnections < 1) throw new RangeError("SshPoolOptions.maxConnections must be >= 1");
    this.#handshakes = new Semaphore(o.maxHandshakes);
    this.#opts = { ...o, onHostKeyAccepted: opts.onHostKeyAccepted, onConnect: opts.onConnect };
  }

  async exec(
    target: SshTarget,
    command: string,
    /** `signal`: once aborted, the command is not started, or is killed if running (a fenced ex-leader's). */
    opts: { stdin?: string; timeoutMs?: number; signal?: AbortSignal } = {},
  ): Promise<ExecResult> {
    validateTarget(target);
    const timeoutMs = opts.timeoutMs ?? this.#opts.commandTimeoutMs;
    // One deadline for waiting on a channel slot and running: a wedged host must not park callers without bound.
    const deadline = performance.now() + timeoutMs;
    // Retries only happen when the channel was never opened: a command that may have run is never repeated.
    let reconnects = 0;
    let refusals = 0;
    for (;;) {
      this.#throwIfClosed(target);
      if (opts.signal?.aborted) throw abortedError(target, opts.signal);
      const conn = await this.#connection(target);
      if (!(await conn.sem.acquire(deadline - performance.now(), opts.signal))) {
        if (opts.signal?.aborted) throw abortedError(target, opts.signal);
        throw new SshError(
          "timeout",
          target,
          `ssh ${conn.label}: no free channel within ${timeoutMs}ms: all ${this.#opts.maxChannels} are busy with ` +
            `commands that have not finished (is the host's systemd or podman hanging?); the command was not run`,
        );
      }
      conn.lastUsed = performance.now();
      if (opts.signal?.aborted) {
        conn.sem.release();
        throw abortedError(target, opts.signal);
      }
      if (!conn.alive) {
        conn.sem.release();
        if (reconnects++ === 0) continue;
        throw closedError(target, "connection dropped before the command could start");
      }
      try {
        const left = Math.max(0, Math.round(deadline - performance.now()));
        return await this.#run(conn, target, command, opts.stdin, left, timeoutMs, opts.signal);
      } catch (e) {
        if (e instanceof NotStarted) {
          if (reconnects++ === 0) continue;
          throw closedError(target, e.message);
        }
        if (e instanceof ChannelRefused) {
          if (refusals < CHANNEL_RETRIES) {
            this.#stats.channelRetries++;
            await new Promise((r) => setTimeout(r, 20 * 2 ** refusals++));
            continue;
          }
          throw new SshError(
            "connect",
            target,
            `ssh ${label(target)}: sshd refused to open a session ${refusals + 1} times (${e.message}); is ` +
              `MaxSessions on the host below maxChannels=${this.#opts.maxChannels}?`,
            { cause: e },
          );
        }
        throw e;
      }
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    const waits = [...this.#clients.values()];
    for (const c of this.#conns.values()) {
      c.alive = false;
      c.sem.fail();
    }
    const established = new Set([...this.#conns.values()].map((c) => c.client));
    // Established connections get a polite disconnect; handshakes in progress have nothing worth finishing.
    for (const client of this.#clients.keys()) established.has(client) ? client.end() : destroyClient(client);
    this.#conns.clear();
    this.#failures.clear();
    // end() is a polite disconnect; a peer that never answers must not make close() hang.
    const grace = new Promise<"late">((r) => {
      const t = setTimeout(() => r("late"), 2000);
      Promise.all(waits).then(() => clearTimeout(t));
    });
    if ((await Promise.race([Promise.all(waits), grace])) === "late") {
      for (const client of this.#clients.keys()) destroyClient(client);
      await Promise.all(waits);
    }
    await Promise.allSettled([...this.#connecting.values()]);
  }

  stats(): SshPoolStats {
    let open = 0;
    for (const c of this.#conns.values()) if (c.alive) open++;
    return { ...this.#stats, open, handshakesWaiting: this.#handshakes.waiting };
  }

  #throwIfClosed(target: SshTarget): void {
    if (this.#closed) throw new SshError("closed", target, `ssh ${hostPort(target)}: the SSH pool is closed`);
  }

  #checkKey(target: SshTarget): { fingerprint: string; type: string } {
    const cacheKey = createHash("sha256").update(target.privateKey).digest("base64");
    let info = this.#keyInfo.get(cacheKey);
    if (info === undefined) {
      const c = checkPrivateKey(target.privateKey);
      if (!c.ok) info = c.reason;
      else {
        // Our parser and ssh2's must agree, or ssh2 would fail later with a less helpful message.
        const parsed = ssh2Utils.parseKey(target.privateKey);
        info = parsed instanceof Error ? `ssh2 cannot use the private key: ${parsed.message}` : c;
      }
      if (this.#keyInfo.size > 256) this.#keyInfo.clear();
      this.#keyInfo.set(cacheKey, info);
    }
    if (typeof info === "string") throw new SshError("key", target, `ssh ${label(target)}: ${info}`);
    return info;
  }

  /**
   * Closes connections idle past idleCloseMs and forgets connect failures long past their backoff; run from
   * #connection at most once a minute, so a pool without traffic holds no timer.
   */
  #sweepIdle(): void {
    const now = performance.now();
    if (now - this.#lastSweep < Math.min(60_000, this.#opts.idleCloseMs || 60_000)) return;
    this.#lastSweep = now;
    if (this.#opts.idleCloseMs > 0) {
      for (const c of [...this.#conns.values()]) {
        if (c.sem.idle() && now - c.lastUsed > this.#opts.idleCloseMs) this.#drop(c);
      }
    }
    for (const [k, f] of this.#failures) if (Date.now() - f.retryAt > this.#opts.backoffMaxMs) this.#failures.delete(k);
  }

  /** Room for one more connection under maxConnections: the longest idle one goes, or the connect fails. */
  #makeRoom(target: SshTarget): void {
    if (this.#conns.size + this.#connecting.size < this.#opts.maxConnections) return;
    const idle = [...this.#conns.values()].filter((c) => c.sem.idle()).sort((a, b) => a.lastUsed - b.lastUsed);
    if (idle[0]) return this.#drop(idle[0]);
    throw new SshError(
      "connect",
      target,
      `ssh ${label(target)}: ${this.#opts.maxConnections} SSH connections are open and busy, the most the file ` +
        `descriptor budget allows (maxConnections, --max-ssh-connections); raise it with the nofile limit`,
    );
  }

  async #connection(target: SshTarget): Promise<Conn> {
    const key = this.#checkKey(target);
    this.#sweepIdle();
    const poolKey = `${target.user}@${hostPort(target)}/${target.address ?? ""}#${key.fingerprint}`;
    const existing = this.#conns.get(poolKey);
    if (existing?.alive) {
      await this.#recheckHostKey(existing, target);
      return existing;
    }
    let pending = this.#connecting.get(poolKey);
    if (!pending) {
      const failure = this.#failures.get(poolKey);
      const configHash = hashConfig(target);
      if (failure && Date.now() < failure.retryAt && failure.configHash === configHash) {
        const secs = Math.ceil((failure.retryAt - Date.now()) / 1000);
        throw new SshError(
          failure.error.kind,
          target,
          `${failure.error.message} (${failure.count} failed attempt(s); next attempt allowed in ${secs}s, at ` +
            `${new Date(failure.retryAt).toISOString()})`,
          { cause: failure.error, retryAt: failure.retryAt },
        );
      }
      this.#makeRoom(target);
      pending = this.#handshake(target, poolKey, key).then(
        (conn) => {
          this.#failures.delete(poolKey);
          return conn;
        },
        (err: SshError) => {
          const count = (this.#failures.get(poolKey)?.count ?? 0) + 1;
          const base = err.kind === "auth" ? this.#opts.authBackoffBaseMs : this.#opts.backoffBaseMs;
          const delay = Math.min(Math.max(this.#opts.backoffMaxMs, base), base * 2 ** (count - 1));
          // Equal jitter: keeps a floor of half the delay while spreading many controllers' retries apart.
          const retryAt = Date.now() + delay / 2 + Math.random() * delay / 2;
          this.#failures.set(poolKey, { count, retryAt, error: err, configHash });
          throw err;
        },
      ).finally(() => this.#connecting.delete(poolKey));
      this.#connecting.set(poolKey, pending);
    }
    const conn = await pending;
    // A concurrent caller may have different known_hosts than the one whose connect we shared.
    await this.#recheckHostKey(conn, target);
    return conn;
  }

  async #recheckHostKey(conn: Conn, target: SshTarget): Promise<void> {
    const verdict = checkHostKey(target.knownHosts, target.host, target.port, conn.hostKey);
    if (verdict.status === "match") return;
    if (verdict.status === "unknown" && target.hostKeyPolicy === "AcceptNew") {
      // First use for this caller (another namespace, or a pin not yet in its cache): pin as a new connection would.
      const key = pinKey(target);
      let pin = conn.pins.get(key);
      if (!pin) {
        pin = this.#pin(target, conn.hostKey, verdict.fingerprint);
        conn.pins.set(key, pin);
        pin.catch(() => conn.pins.delete(key));
      }
      return await pin;
    }
    // known_hosts now says this key is wrong (revoked or replaced in the Secret): nobody should keep using it. A mere
    // "unknown" only concerns this caller, and every exec is checked against its own known_hosts anyway.
    if (verdict.status !== "unknown") this.#drop(conn);
    throw hostKeyError(target, verdict);
  }

  #drop(conn: Conn): void {
    conn.alive = false;
    conn.sem.fail();
    if (this.#conns.get(conn.key) === conn) this.#conns.delete(conn.key);
    conn.client.end();
  }

  /** #connect within maxHandshakes; the wait for a turn counts in connectTimeoutMs. */
  async #handshake(target: SshTarget, poolKey: string, key: { fingerprint: string; type: string }): Promise<Conn> {
    const t0 = performance.now();
    if (!(await this.#handshakes.acquire(this.#opts.connectTimeoutMs))) {
      throw new SshError(
        "connect",
        target,
        `ssh ${label(target)}: no turn to connect within ${this.#opts.connectTimeoutMs}ms: ` +
          `${this.#opts.maxHandshakes} SSH handshakes are in progress (maxHandshakes)`,
      );
    }
    try {
      return await this.#connect(target, poolKey, key, this.#opts.connectTimeoutMs - (performance.now() - t0));
    } finally {
      this.#handshakes.release();
    }
  }

  #connect(
    target: SshTarget,
    poolKey: string,
    key: { fingerprint: string; type: string },
    timeoutMs: number,
  ): Promise<Conn> {
    if (this.#closed) return Promise.reject(closedError(target, "the SSH pool is closed"));
    const client = new Client();
    let closeResolve!: () => void;
    this.#clients.set(client, new Promise<void>((r) => (closeResolve = r)));
    let hostKeyFailure: SshError | undefined;
    let presented: Buffer | undefined;
    let pinned = false;

    const knownTypes = lookup(target.knownHosts, target.host, target.port).keys.map((k) => k.type);
    const config: ConnectConfig = {
      host: target.address ?? target.host,
      port: target.port,
      username: target.user,
      privateKey: target.privateKey,
      authHandler: ["publickey"],
      readyTimeout: Math.max(1, Math.round(timeoutMs)),
      keepaliveInterval: this.#opts.keepaliveIntervalMs,
      keepaliveCountMax: this.#opts.keepaliveCountMax,
      algorithms: { serverHostKey: hostKeyAlgorithms(knownTypes) },
      hostVerifier: (blob: Buffer, verify: (ok: boolean) => void) => {
        presented = Buffer.from(blob);
        const verdict = checkHostKey(target.knownHosts, target.host, target.port, presented);
        if (verdict.status === "match") {
          verify(true);
          return;
        }
        if (verdict.status !== "unknown" || target.hostKeyPolicy !== "AcceptNew") {
          hostKeyFailure = hostKeyError(target, verdict);
          verify(false);
          return;
        }
        this.#pin(target, presented, verdict.fingerprint).then(() => {
          pinned = true;
          verify(true);
        }, (e: SshError) => {
          hostKeyFailure = e;
          verify(false);
        });
      },
    };

    return new Promise<Conn>((resolve, reject) => {
      let conn: Conn | undefined;
      let settled = false;
      const fail = (err: SshError) => {
        if (settled) return;
        settled = true;
        reject(err);
        destroyClient(client);
      };
      client.once("ready", () => {
        if (this.#closed) {
          client.end();
          return fail(closedError(target, "the SSH pool was closed while connecting"));
        }
        if (settled) return;
        settled = true;
        client.setNoDelay(true);
        conn = {
          key: poolKey,
          label: label(target),
          client,
          hostKey: presented!,
          sem: new Semaphore(this.#opts.maxChannels),
          alive: true,
          lastUsed: performance.now(),
          // the caller whose handshake pinned the key is done with it
          pins: new Map(pinned ? [[pinKey(target), Promise.resolve()]] : []),
        };
        this.#stats.connectionsOpened++;
        this.#opts.onConnect?.(target);
        this.#conns.set(poolKey, conn);
        resolve(conn);
      });
      client.on("error", (err: Error & { level?: string }) => {
        if (conn) {
          // Keepalive timeout, socket reset, protocol error: the connection is gone; the next exec reconnects.
          this.#markDead(conn);
          return;
        }
        if (this.#closed) return fail(closedError(target, "the SSH pool was closed while connecting"));
        fail(hostKeyFailure ?? connectError(target, key, err, this.#opts.connectTimeoutMs));
      });
      client.on("close", () => {
        this.#clients.delete(client);
        closeResolve();
        if (conn) return this.#markDead(conn);
        if (this.#closed) return fail(closedError(target, "the SSH pool was closed while connecting"));
        const lost = new Error("connection closed during the SSH handshake");
        fail(hostKeyFailure ?? connectError(target, key, lost, this.#opts.connectTimeoutMs));
      });
      try {
        client.connect(config);
      } catch (e) {
        // ssh2 throws synchronously for config it cannot use; the key was pre-checked, so this is rare.
        this.#clients.delete(client);
        closeResolve();
        reject(new SshError("key", target, `ssh ${label(target)}: ${errorMessage(e)}`, { cause: e }));
      }
    });
  }

  /** Records a first-use host key through onHostKeyAccepted; a failure is a hostkey SshError (nothing may run). */
  async #pin(target: SshTarget, key: Buffer, fingerprint: string): Promise<void> {
    try {
      await this.#opts.onHostKeyAccepted?.(target, knownHostsLine(target.host, target.port, key), fingerprint);
    } catch (e) {
      // The recorder may know better than our known_hosts (a key pinned meanwhile): its refusal stands as it is.
      if (e instanceof SshError && e.kind === "hostkey") throw e;
      throw new SshError(
        "hostkey",
        target,
        `ssh ${hostPort(target)}: new host key ${fingerprint} was not trusted because recording it failed: ` +
          errorMessage(e),
        { cause: e },
      );
    }
  }

  #markDead(conn: Conn): void {
    if (!conn.alive) return;
    conn.alive = false;
    conn.sem.fail();
    if (this.#conns.get(conn.key) === conn) this.#conns.delete(conn.key);
  }

  #run(
    conn: Conn,
    target: SshTarget,
    command: string,
    stdin: string | undefined,
    leftMs: number,
    timeoutMs: number,
    signal: AbortSignal | undefined,
  ) {
    return new Promise<ExecResult>((resolve, reject) => {
      let settled = false;
      let channel: ClientChannel | undefined;
      let graceTimer: ReturnType<typeof setTimeout> | undefined;
      let released = false;
      // The slot is held until sshd has really closed the session, so MaxSessions is never exceeded.
      const release = () => {
        clearTimeout(graceTimer);
        if (!released) {
          released = true;
          conn.lastUsed = performance.now();
          conn.sem.release();
        }
      };
      const settle = (f: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        f();
      };
      const abandon = (why?: SshError) => {
        settle(() =>
          reject(
            why ?? (signal?.aborted ? abortedError(target, signal) : new SshError(
              "timeout",
              target,
              `ssh ${conn.label}: command timed out after ${timeoutMs}ms (channel wait included) and was killed`,
            )),
          )
        );
        if (channel) killChannel(channel);
        // No close confirmation means the connection is silently dead (keepalive may be off or slower): drop it
        // rather than leave this slot, and every command queued behind it, stuck.
        graceTimer = setTimeout(() => {
          if (released) return;
          this.#markDead(conn);
          destroyClient(conn.client);
        }, CLOSE_GRACE_MS);
      };
      // The limit covers opening the channel too: a wedged server must not hold the caller forever.
      const timer = setTimeout(abandon, leftMs);
      const onAbort = () => abandon();
      signal?.addEventListener("abort", onAbort, { once: true });

      const onChannel = (err: Error | undefined, ch: ClientChannel) => {
        if (err) {
          release();
          if (!conn.alive) {
            return settle(() => reject(new NotStarted(`connection to ${conn.label} dropped: ${err.message}`)));
          }
          // A refusal leaves the connection usable; exec() retries it (see ChannelRefused).
          return settle(() => reject(new ChannelRefused(err.message)));
        }
        channel = ch;
        // Errors surface as an early close below; without a listener an 'error' would be thrown as uncaught.
        ch.on("error", () => {});
        if (settled) {
          // Timed out while the channel was being opened: the command must not run late.
          ch.on("close", release);
          killChannel(ch);
          return;
        }
        this.#stats.commands++;
        const out: Buffer[] = [];
        const errOut: Buffer[] = [];
        const size = { stdout: 0, stderr: 0 };
        const max = this.#opts.maxOutputBytes;
        const collect = (into: Buffer[], stream: "stdout" | "stderr") => (d: Buffer) => {
          if (settled) return;
          size[stream] += d.length;
          if (size[stream] <= max) return void into.push(d);
          abandon(
            new SshError(
              "output",
              target,
              `ssh ${conn.label}: the command printed more than ${max} bytes on ${stream} and was killed ` +
                `(maxOutputBytes); look on the host for what floods it (a journal, a listing)`,
            ),
          );
        };
        let exit: { code: number | null; signal?: string } | undefined;
        ch.on("data", collect(out, "stdout"));
        ch.stderr.on("data", collect(errOut, "stderr"));
        ch.on("exit", (code: number | null, signal?: string) => (exit = { code, signal }));
        ch.on("close", () => {
          release();
          if (!exit) {
            if (!conn.alive || !isConnected(conn.client)) {
              this.#markDead(conn);
              return settle(() =>
                reject(closedError(target, "connection dropped while the command was running (it may have partly run)"))
              );
            }
            return settle(() => resolve({ code: -1, stdout: decode(out), stderr: decode(errOut) }));
          }
          const sig = exit.signal ? (exit.signal.startsWith("SIG") ? exit.signal : `SIG${exit.signal}`) : undefined;
          const result: ExecResult = {
            code: exit.code ?? 128 + (sig ? SIGNAL_NUMBERS[sig.slice(3)] ?? 0 : 0),
            stdout: decode(out),
            stderr: decode(errOut),
          };
          if (sig) result.signal = sig;
          settle(() => resolve(result));
        });
        // stdin goes over the channel, never into argv, so scripts carrying secrets stay out of `ps` and logs.
        if (stdin !== undefined) ch.end(stdin);
        else ch.end();
      };

      try {
        conn.client.exec(command, onChannel);
      } catch (e) {
        // exec() throws "Not connected" when the socket died after our alive check.
        release();
        this.#markDead(conn);
        settle(() => reject(new NotStarted(`connection to ${conn.label} dropped: ${errorMessage(e)}`)));
      }
    });
  }
}

function abortedError(target: SshTarget, signal: AbortSignal): SshError {
  const reason = signal.reason instanceof Error ? signal.reason.message : String(signal.reason);
  return new SshError("closed", target, `ssh ${hostPort(target)}: command not run or killed: ${reason}`);
}

/**
 * ssh2 only sends a signal while the channel is writable, but stdin was already ended (that is how `sh -s` gets
 * its EOF). Sending the request through the protocol object reaches sshd, which kills the process group.
 */
function killChannel(ch: ClientChannel): void {
  const internal = ch as unknown as {
    outgoing?: { id?: number; state?: string };
    _client?: { _protocol?: { signal?: (id: number, sig: string) => void } };
  };
  const out = internal.outgoing;
  try {
    if (out && typeof out.id === "number" && (out.state === "open" || out.state === "eof")) {
      internal._client?._protocol?.signal?.(out.id, "KILL");
    }
  } catch {
    // Best effort: closing the channel below is what frees our side.
  }
  try {
    ch.close();
  } catch {
    // Already closing.
  }
}

/** Client.destroy() skips sockets that are not writable yet, i.e. still connecting; those must go too. */
function destroyClient(client: Client): void {
  client.destroy();
  (client as unknown as { _sock?: { destroy?: () => void } })._sock?.destroy?.();
}

function isConnected(client: Client): boolean {
  const sock = (client as unknown as { _sock?: { writable?: boolean; destroyed?: boolean } })._sock;
  return !!sock && sock.writable === true && !sock.destroyed;
}

/**
 * Host key algorithms, those matching keys already in known_hosts first: sshd presents the first mutually supported
 * one, and an ed25519 key would be refused as a mismatch when only the host's RSA key was recorded.
 * ed25519 and RSA come before ECDSA by default because they are the ones verified to work with ssh2 under Deno.
 */
export function hostKeyAlgorithms(knownTypes: string[]): ServerHostKeyAlgorithm[] {
  const all: ServerHostKeyAlgorithm[] = [
    "ssh-ed25519",
    "rsa-sha2-512",
    "rsa-sha2-256",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
  ];
  const preferred: ServerHostKeyAlgorithm[] = [];
  for (const t of knownTypes) {
    // An RSA host key can be proven with any of the RSA signature algorithms.
    const algs = (t === "ssh-rsa" ? ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] : [t]) as ServerHostKeyAlgorithm[];
    for (const a of algs) if (all.includes(a) && !preferred.includes(a)) preferred.push(a);
  }
  return [...preferred, ...all.filter((a) => !preferred.includes(a))];
}

export function hostKeyError(target: { host: string; port: number }, verdict: HostKeyVerdict): SshError {
  const hp = hostPort(target);
  const fix = "If the host was legitimately reinstalled, update known_hosts in the Secret " +
    `(ssh-keygen -R ... then ssh-keyscan -p ${target.port} ${target.host}, and verify the fingerprint out of band).`;
  let msg: string;
  switch (verdict.status) {
    case "revoked":
      msg = `ssh ${hp}: host presented key ${verdict.fingerprint}, which known_hosts marks @revoked; refusing to ` +
        `connect. ${fix}`;
      break;
    case "mismatch":
      msg = `ssh ${hp}: HOST KEY MISMATCH: expected ${verdict.expected.join(" or ")}, host presented ` +
        `${verdict.fingerprint}. Someone may be impersonating the host; refusing to connect. ${fix}`;
      break;
    case "unknown":
      msg = `ssh ${hp}: host key ${verdict.fingerprint} is not in known_hosts and hostKeyPolicy is Strict; ` +
        `refusing to connect. Add the host's key to known_hosts in the Secret (e.g. from ` +
        `\`ssh-keyscan -p ${target.port} ${target.host}\`, after checking the fingerprint), or use AcceptNew.`;
      break;
    default:
      msg = `ssh ${hp}: host key ${verdict.fingerprint} unexpectedly matched`;
  }
  return new SshError("hostkey", target, msg);
}

function connectError(
  target: SshTarget,
  key: { fingerprint: string; type: string },
  err: Error & { level?: string; code?: string },
  connectTimeoutMs: number,
): SshError {
  const where = label(target);
  if (err.level === "client-authentication") {
    return new SshError(
      "auth",
      target,
      `ssh ${where}: authentication refused for key ${key.fingerprint} (${key.type}); make sure its public key is ` +
        `in ~${target.user}/.ssh/authorized_keys on the host and the user name is right`,
      { cause: err },
    );
  }
  if (err.level === "client-timeout") {
    return new SshError(
      "connect",
      target,
      `ssh ${where}: no SSH handshake within ${connectTimeoutMs}ms (host down, firewalled or overloaded?)`,
      { cause: err },
    );
  }
  const detail = err.code ? `${err.code}: ${err.message}` : err.message;
  const fix = err.code === "EMFILE" ? "; the process is out of file descriptors: lower --max-ssh-connections" : "";
  return new SshError("connect", target, `ssh ${where}: cannot connect: ${detail}${fix}`, { cause: err });
}

function closedError(target: SshTarget, why: string): SshError {
  return new SshError("closed", target, `ssh ${label(target)}: ${why}`);
}

function validateTarget(t: SshTarget): void {
  const bad = (m: string) => new SshError("connect", t ?? { host: "?", port: 0 }, `invalid SSH target: ${m}`);
  if (!t || typeof t.host !== "string" || t.host === "") throw bad("host is empty");
  if (t.address !== undefined && (typeof t.address !== "string" || t.address === "")) throw bad("address is empty");
  if (!Number.isInteger(t.port) || t.port < 1 || t.port > 65535) throw bad(`port ${t.port} is not 1-65535`);
  if (typeof t.user !== "string" || t.user === "") throw bad("user is empty");
  if (t.hostKeyPolicy !== "Strict" && t.hostKeyPolicy !== "AcceptNew") {
    throw bad(`hostKeyPolicy must be Strict or AcceptNew, not ${t.hostKeyPolicy}`);
  }
}

function hostPort(t: { host: string; port: number }): string {
  return netAddress(t.host, t.port);
}

function label(t: SshTarget): string {
  const via = t.address && t.address !== t.host ? ` (via ${t.address})` : "";
  return `${t.user}@${hostPort(t)}${via}`;
}

/** One pin per scope and known_hosts: the same text in another namespace is that namespace's first use. */
const pinKey = (t: SshTarget) => `${t.pinScope ?? ""}\0${hashConfig(t)}`;

function hashConfig(t: SshTarget): string {
  return createHash("sha256").update(t.hostKeyPolicy).update("\0").update(t.knownHosts).digest("base64");
}

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function decode(chunks: Buffer[]): string {
  return Buffer.concat(chunks).toString("utf8");
}

const SIGNAL_NUMBERS: Record<string, number> = {
  HUP: 1,
  INT: 2,
  QUIT: 3,
  ILL: 4,
  ABRT: 6,
  FPE: 8,
  KILL: 9,
  USR1: 10,
  SEGV: 11,
  USR2: 12,
  PIPE: 13,
  ALRM: 14,
  TERM: 15,
};
