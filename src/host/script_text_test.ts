import assert from "node:assert/strict";
import { withoutComments } from "./script_text.ts";

const SCRIPTS = ["lib", "apply", "remove", "inspect", "stage"];

/**
 * bash's own reading of TEXT as a function body (`declare -f` prints it back without comments, strings and
 * here-documents as they are): the same for a script and the script sent only if no removed line was part of a string.
 */
async function asBashReadsIt(text: string): Promise<string> {
  const out = await new Deno.Command("bash", { stdin: "piped", stdout: "piped", stderr: "piped" }).spawn();
  const w = out.stdin.getWriter();
  await w.write(new TextEncoder().encode(`f() {\n${text}\n}\ndeclare -f f\n`));
  await w.close();
  const { code, stdout, stderr } = await out.output();
  const td = new TextDecoder();
  return code === 0 ? td.decode(stdout) : `exit ${code}: ${td.decode(stderr)}`;
}

Deno.test("the scripts as sent: only comment lines go, none of them inside a string or a here-document", async () => {
  for (const name of SCRIPTS) {
    const text = await Deno.readTextFile(new URL(`./scripts/${name}.sh`, import.meta.url));
    const sent = withoutComments(text);
    assert.ok(sent.length < text.length * 0.8, `${name}.sh: its comments are gone`);
    assert.doesNotMatch(sent, /^\s*#/m, name);
    const read = await asBashReadsIt(sent);
    assert.match(read, /^f \(\) $/m, name);
    assert.equal(read, await asBashReadsIt(text), `${name}.sh reads the same without its comments`);
  }
  // the check sees a string's line that starts with #
  const quoted = 'echo "a\n# b\nc"\n';
  assert.notEqual(await asBashReadsIt(withoutComments(quoted)), await asBashReadsIt(quoted));
});
