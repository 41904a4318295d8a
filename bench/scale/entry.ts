/**
 * The controller's command line on the main thread, for CPU profiles only: main.ts runs the same `cli` in a Worker
 * with narrowed permissions, and Deno's inspector profiles the main isolate alone. Everything else is identical.
 */
import { cli } from "../../src/cli/main.ts";

Deno.exit(await cli(Deno.args));
