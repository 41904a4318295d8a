/**
 * A tiny OpenAPI v3 schema builder whose values also carry their TypeScript type, so each CRD field is declared once
 * and both the CRD YAML and the controller's types come from that declaration.
 */

export type JsonSchema = { [key: string]: unknown };

export interface Schema<T, Opt extends boolean = boolean> {
  readonly json: JsonSchema;
  readonly optional: Opt;
  /** Phantom: only here so `Infer` can read the type back. */
  readonly _type?: T;
}

export type Infer<S> = S extends Schema<infer T> ? T : never;

type Props = Record<string, Schema<unknown>>;
type RequiredKeys<P extends Props> = { [K in keyof P]: P[K] extends Schema<unknown, false> ? K : never }[keyof P];
type OptionalKeys<P extends Props> = Exclude<keyof P, RequiredKeys<P>>;
type Flatten<T> = { [K in keyof T]: T[K] };
export type ObjectOf<P extends Props> = Flatten<
  & { [K in RequiredKeys<P>]: Infer<P[K]> }
  & { [K in OptionalKeys<P>]?: Infer<P[K]> }
>;

/** Extra OpenAPI keywords (description, default, bounds, CEL rules) passed through verbatim. */
type Extra = JsonSchema & { description?: string };

function req<T>(json: JsonSchema): Schema<T, false> {
  return { json, optional: false };
}

export function optional<T>(s: Schema<T>): Schema<T, true> {
  return { json: s.json, optional: true };
}

export function string(extra: Extra = {}): Schema<string, false> {
  return req({ type: "string", ...extra });
}

export function enumOf<const V extends readonly string[]>(values: V, extra: Extra = {}): Schema<V[number], false> {
  return req({ type: "string", enum: [...values], ...extra });
}

export function integer(extra: Extra = {}): Schema<number, false> {
  return req({ type: "integer", format: "int32", ...extra });
}

export function boolean(extra: Extra = {}): Schema<boolean, false> {
  return req({ type: "boolean", ...extra });
}

export function array<T>(items: Schema<T>, extra: Extra = {}): Schema<T[], false> {
  return req({ type: "array", items: items.json, ...extra });
}

export function stringMap(extra: Extra = {}): Schema<Record<string, string>, false> {
  return req({ type: "object", additionalProperties: { type: "string" }, ...extra });
}

/** A free-form object the API server keeps as written (`x-kubernetes-preserve-unknown-fields`). */
export function freeForm(extra: Extra = {}): Schema<Record<string, unknown>, false> {
  return req({ type: "object", "x-kubernetes-preserve-unknown-fields": true, ...extra });
}

export function object<P extends Props>(props: P, extra: Extra = {}): Schema<ObjectOf<P>, false> {
  const properties: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const [name, s] of Object.entries(props)) {
    properties[name] = s.json;
    if (!s.optional) required.push(name);
  }
  return req({ type: "object", properties, ...(required.length ? { required } : {}), ...extra });
}
