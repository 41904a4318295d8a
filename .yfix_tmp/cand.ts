import { Document, Scalar, type ScalarTag, visit } from "yaml";

// PyYAML, which `jmp run` reads the config with, is a YAML 1.1 reader; see the notes in the report
const PY_UNSAFE_CHARS = /[\x7f-\x9f\u2028\u2029\ufffe\uffff]/g;
const PY_UNSAFE = /[\t\x7f-\x9f\u2028\u2029\ufffe\uffff]|^(?:=|<<)$/;
const hex = (c: string) => {
  const n = c.charCodeAt(0);
  return c === "\u0085" ? "\\N" : c === "\u2028" ? "\\L" : c === "\u2029" ? "\\P"
    : n <= 0xff ? `\\x${n.toString(16).padStart(2, "0")}` : `\\u${n.toString(16).padStart(4, "0")}`;
};
// 1.1 floats need a dot: 1e+21 would read back as a string
const expFloat: ScalarTag = {
  tag: "tag:yaml.org,2002:float",
  identify: (v) => typeof v === "number" && Number.isFinite(v) && /e/.test(String(v)) && !String(v).includes("."),
  resolve: (s: string) => Number(s),
  stringify: ({ value }) => String(value).replace("e", ".0e"),
};

export function renderYaml(config: unknown): string {
  const doc = new Document(config, {
    version: "1.1",
    aliasDuplicateObjects: false,
    // the 1.1 schema writes the string "<<" as a merge key, which PyYAML then refuses to construct
    customTags: (tags) => [expFloat, ...tags.filter((t) => typeof t === "string" || t.tag !== "tag:yaml.org,2002:merge")],
  });
  visit(doc, {
    Scalar(_, n) {
      if (typeof n.value === "string" && PY_UNSAFE.test(n.value)) n.type = Scalar.QUOTE_DOUBLE;
    },
  });
  return doc.toString({ lineWidth: 0 }).replace(PY_UNSAFE_CHARS, hex);
}
