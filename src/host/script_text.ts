/**
 * The host scripts as they are sent: their text is part of the module (and so of the bundle and the binary), not read
 * from disk at run time, and without their comment lines, which are for people reading the repository. Every apply
 * carries lib.sh and apply.sh (and stage.sh, as base64), and its stdin waits in native buffers until the host has
 * read it: at 500 hosts x 8 those buffers were ~110 MiB of the controller's RSS (bench/results/scale-findings.md),
 * and comments were 40% of the text. No script has a line starting with `#` inside a string or a here-document
 * (script_text_test.ts), so none changes meaning.
 */
import LIB from "./scripts/lib.sh" with { type: "text" };
import APPLY from "./scripts/apply.sh" with { type: "text" };
import REMOVE from "./scripts/remove.sh" with { type: "text" };
import INSPECT from "./scripts/inspect.sh" with { type: "text" };
import STAGE from "./scripts/stage.sh" with { type: "text" };

/** TEXT without its comment lines (`#` first, after any indentation). */
export const withoutComments = (text: string) => text.split("\n").filter((l) => !/^\s*#/.test(l)).join("\n");

export const LIB_SH = withoutComments(LIB);
export const APPLY_SH = withoutComments(APPLY);
export const REMOVE_SH = withoutComments(REMOVE);
export const INSPECT_SH = withoutComments(INSPECT);
export const STAGE_SH = withoutComments(STAGE);
