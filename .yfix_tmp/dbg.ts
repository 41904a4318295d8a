import { Document, Scalar, visit, stringify } from "yaml";
const doc = new Document({ a: "<<", "<<": "x", b: "=" }, { version: "1.1", merge: false });
visit(doc, { Scalar(_, n) { console.log(JSON.stringify(n.value), n.type, n.constructor.name); if (typeof n.value === "string" && /^(?:=|<<)$/.test(n.value)) n.type = Scalar.QUOTE_DOUBLE; } });
console.log(doc.toString());
console.log(stringify({ a: "<<" }));
console.log(stringify({ a: "<<" }, {version: "1.1"}));
