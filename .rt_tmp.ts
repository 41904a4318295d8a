import { renderCommand } from "./src/cli/render.ts";
Deno.exit(await renderCommand(Deno.args));
