#!/bin/sh
# `deno task bundle [OUT]`: one JavaScript file (default dist/qemu-ssh-provisioner.js) with every dependency inside,
# run by a bare `deno` without network or cache: `deno run --no-config $(sh scripts/permissions.sh) OUT`.
set -eu
out=${1:-dist/qemu-ssh-provisioner.js}
mkdir -p "$(dirname "$out")"
tmp=$out.tmp
# ssh2 and cpu-features require optional native addons inside try/catch; they fall back to JavaScript without them.
deno bundle --quiet --platform deno --external '*.node' --output "$tmp" main.ts
# What CommonJS code expects and an ES module lacks: `require` (the bundle's CommonJS modules require node: built-ins)
# and ssh2's poly1305 (emscripten) reads __dirname.
{
  echo 'import { createRequire } from "node:module";'
  echo 'const require = createRequire(import.meta.url), __dirname = import.meta.dirname, __filename = import.meta.filename;'
  cat "$tmp"
} >"$out"
rm -f "$tmp"
echo "$out"
