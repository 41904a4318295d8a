/**
 * Whether each lab host answers, from the SSH commands the controller runs there anyway (applies, inspections,
 * removals): a host is failing from its first unanswered command until one is answered again. A pooled set fails a
 * host's idle instances over once it has been failing for its hostFailureTimeout (placement.ts). In memory only.
 */
import type { HostOps } from "../host/lab.ts";
import { SshError } from "../host/ssh.ts";
import { errorText } from "./problems.ts";
import { hostKey, type Reach } from "./placement.ts";

/** SSH failures that say the host did not answer; a refusal (key, auth, script) is an answer. */
const SILENT = new Set(["connect", "timeout", "closed"]);

/** `ops` with each command's outcome recorded per host in `reach`. */
export function recordingReach(ops: HostOps, reach: Map<string, Reach>, now: () => Date): HostOps {
  const track = <T>(t: { host: string; port: number }, start: () => Promise<T>): Promise<T> => {
    const key = hostKey(t.host, t.port);
    let run: Promise<T>;
    try {
      run = start();
    } catch (err) {
      run = Promise.reject(err);
    }
    return run.then((v) => {
      reach.delete(key);
      return v;
    }, (err) => {
      if (err instanceof SshError && SILENT.has(err.kind)) {
        reach.set(key, { failingSince: reach.get(key)?.failingSince ?? now().getTime(), lastError: errorText(err) });
      } else reach.delete(key);
      throw err;
    });
  };
  return {
    apply: (t, r, opts) => track(t, () => ops.apply(t, r, opts)),
    remove: (t, name, uid) => track(t, () => ops.remove(t, name, uid)),
    inspect: (t) => track(t, () => ops.inspect(t)),
    units: (t, opts) => track(t, () => ops.units(t, opts)),
  };
}
