/**
 * For the tests of the host scripts (scripts/*.sh as remote.ts sends them): run a script, or a part of one, under a
 * local shell, with some of its header's values changed (paths into a temporary directory) and some of its commands
 * replaced by a recorder. Test support only.
 */

/** The shells the lab hosts may run `sh -s` with: Debian's /bin/sh is dash, others have bash. */
export const SHELLS = ["dash", "bash"] as const;

export interface ShellResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs `script` on the stdin of `shell ARGS` (`shell -s` as the hosts do, or `ssh ... COMMAND` to reach one), with
 * `env` over this process's environment.
 */
export async function runShell(
  shell: string,
  script: string,
  args: string[] = ["-s"],
  env: Record<string, string> = {},
): Promise<ShellResult> {
  const p = new Deno.Command(shell, { args, env, stdin: "piped", stdout: "piped", stderr: "piped" }).spawn();
  const w = p.stdin.getWriter();
  await w.write(new TextEncoder().encode(script));
  await w.close();
  const out = await p.output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** The script with `values` assigned after its header's, so they win (the header ends where lib.sh starts). */
export function withValues(script: string, lib: string, values: Record<string, string>): string {
  const at = script.indexOf(lib);
  if (at < 0) throw new Error("withValues: the script does not contain lib.sh");
  const lines = Object.entries(values).map(([k, v]) => `${k}='${v.replaceAll("'", `'\\''`)}'\n`).join("");
  return script.slice(0, at) + lines + script.slice(at);
}

/** The script up to its first step: header, lib.sh and the functions its steps call, nothing run on the host yet. */
export function definitions(script: string): string {
  const at = script.search(/^step=(?!start$)/m);
  if (at < 0) throw new Error("definitions: the script has no step");
  return script.slice(0, at);
}

/**
 * `rec NAME ARG...` prints its words NUL-separated, with their count first; `recorder(["put", ...])` defines each
 * named command as a function that records its call.
 */
export const recorder = (commands: string[]) =>
  `rec() { printf '%s\\0' "$#" "$@"; }\n${commands.map((c) => `${c}() { rec ${c} "$@"; }`).join("\n")}\n`;

/** The calls `rec` printed, each as its words. */
export function records(out: string): string[][] {
  const parts = out.split("\0");
  const calls: string[][] = [];
  for (let i = 0; i < parts.length - 1;) {
    const n = Number(parts[i]);
    calls.push(parts.slice(i + 1, i + 1 + n));
    i += n + 1;
  }
  return calls;
}
