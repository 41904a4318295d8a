/**
 * Runs one of the project's build scripts (they cache what they build, see cached_build.sh) and returns the path it
 * prints as its last line. stderr is inherited, so a cold build (minutes) shows its progress instead of looking hung.
 */
export async function builtPath(script: string, ...args: string[]): Promise<string> {
  const out = await new Deno.Command("bash", { args: [script, ...args], stdout: "piped", stderr: "inherit" }).output();
  const path = new TextDecoder().decode(out.stdout).trim().split("\n").pop()?.trim();
  if (!out.success || !path) throw new Error(`${script} failed (exit ${out.code})`);
  return path;
}
