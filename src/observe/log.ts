/** Structured logs on stderr, as text or JSON lines. Callers pass fields, never secrets. */

export type Level = "debug" | "info" | "warn" | "error";
const ORDER: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };
export type Fields = Record<string, unknown>;

export interface Logger {
  debug(msg: string, fields?: Fields): void;
  info(msg: string, fields?: Fields): void;
  warn(msg: string, fields?: Fields): void;
  error(msg: string, fields?: Fields): void;
  child(fields: Fields): Logger;
}

export interface LogOptions {
  level?: Level;
  format?: "text" | "json";
  write?: (line: string) => void;
  now?: () => Date;
}

export function createLogger(opts: LogOptions = {}, base: Fields = {}): Logger {
  const min = ORDER[opts.level ?? "info"];
  const write = opts.write ?? ((line: string) => console.error(line));
  const now = opts.now ?? (() => new Date());
  const emit = (level: Level, msg: string, fields: Fields = {}) => {
    if (ORDER[level] < min) return;
    const all = { ...base, ...fields };
    if (opts.format === "json") {
      write(JSON.stringify({ time: now().toISOString(), level, msg, ...all }));
    } else {
      const kv = Object.entries(all).map(([k, v]) => `${k}=${formatValue(v)}`).join(" ");
      write(`${now().toISOString()} ${level.toUpperCase().padEnd(5)} ${msg}${kv ? " " + kv : ""}`);
    }
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    child: (fields) => createLogger(opts, { ...base, ...fields }),
  };
}

function formatValue(v: unknown): string {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  return /[\s"=]/.test(s ?? "") ? JSON.stringify(s) : String(s);
}

/** A logger that drops everything, for tests that do not look at logs. */
export const silentLogger: Logger = createLogger({ write: () => {} });
