// gguf_oracle.mjs — tandem's reading of a GGUF file against @huggingface/gguf's.
//
//   node tests/gguf_oracle.mjs FILE.gguf TANDEM_DUMP.json
//
// TANDEM_DUMP.json is `gguf_tool dump FILE.gguf` (tests/tools/gguf_tool.c).
// Checks: the same metadata keys with equal values (numbers exactly; floats
// dumped as "%.17g" strings, 64-bit integers as decimal strings; arrays
// element by element), the same tensor table (names, n_dims, shapes, types,
// offsets, in file order) and the same data section offset. Prints one
// "PASS gguf_oracle_<name>" or "FAIL ..." line with the first differences.
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const require = createRequire(path.join(root, ".cache/npm/package.json"));
const { gguf } = await import(require.resolve("@huggingface/gguf"));

const [file, dumpPath] = process.argv.slice(2);
const name = path.basename(file);
const ours = JSON.parse(fs.readFileSync(dumpPath, "utf8"));
const ref = await gguf(file, { allowLocalFile: true });
const bad = [];
const norm = (v) => (typeof v === "bigint" ? v.toString() : v);

const md = { ...ref.metadata };
if (md.version !== ours.version) bad.push(`version ${md.version} vs ${ours.version}`);
if (BigInt(md.tensor_count) !== BigInt(ours.tensors.length)) bad.push(`tensor_count ${md.tensor_count} vs ${ours.tensors.length}`);
if (BigInt(md.kv_count) !== BigInt(Object.keys(ours.metadata).length)) bad.push(`kv_count ${md.kv_count}`);
for (const k of ["version", "tensor_count", "kv_count"]) delete md[k];
const refKeys = Object.keys(md), ourKeys = Object.keys(ours.metadata);
if (refKeys.join("\n") !== ourKeys.join("\n")) bad.push(`keys differ: ${refKeys.length} vs ${ourKeys.length}`);
let compared = 0;
for (const k of refKeys) {
  const o = ours.metadata[k];
  if (!o) { bad.push(`key ${k} missing in tandem`); continue; }
  const rv = md[k];
  const eq = (a, b) => typeof a === "bigint" ? String(a) === b
    : typeof a === "number" ? (typeof b === "number" ? a === b : Number(b) === a) : a === b;
  if (Array.isArray(rv)) {
    if (!Array.isArray(o.value) || rv.length !== o.value.length) { bad.push(`${k}: array length ${rv.length} vs ${o.value?.length}`); continue; }
    for (let i = 0; i < rv.length; i++) {
      if (!eq(rv[i], o.value[i])) { bad.push(`${k}[${i}]: ${norm(rv[i])} vs ${o.value[i]}`); break; }
      compared++;
    }
  } else if (!eq(rv, o.value)) bad.push(`${k}: ${norm(rv)} vs ${o.value}`);
  else compared++;
}
if (ref.tensorInfos.length !== ours.tensors.length) bad.push("tensor count differs");
ref.tensorInfos.forEach((t, i) => {
  const o = ours.tensors[i];
  if (!o) return;
  const same = t.name === o.name && t.n_dims === o.n_dims && t.dtype === o.type && String(t.offset) === o.offset &&
    t.shape.map(String).join(",") === o.shape.join(",");
  if (!same) bad.push(`tensor ${i}: ${t.name} [${t.shape}] type ${t.dtype} @${t.offset} vs ${o.name} [${o.shape}] type ${o.type} @${o.offset}`);
});
if (String(ref.tensorDataOffset) !== ours.data_offset) bad.push(`data offset ${ref.tensorDataOffset} vs ${ours.data_offset}`);
if (bad.length) {
  console.log(`FAIL gguf_oracle_${name}`);
  for (const b of bad.slice(0, 8)) console.log(`  ${b}`);
} else {
  console.log(`PASS gguf_oracle_${name} (${refKeys.length} keys, ${compared} values, ${ref.tensorInfos.length} tensors agree with @huggingface/gguf)`);
}
