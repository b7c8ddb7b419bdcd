// Seeded corpus of tricky strings for the tokenizer oracle (same strings for a given seed).
//
// generateCorpus(seed, count, unassigned) returns `count` strings mixing: English prose,
// CJK / kana / Hangul (also as decomposed jamo), Arabic, Hebrew, Devanagari, Bengali,
// Tamil, Thai, Vietnamese and Latin with combining marks (precomposed, decomposed and in
// non-canonical mark order), emoji incl. ZWJ sequences, skin tones, flags and keycaps,
// digits and numbers in several scripts, source code, contractions in upper and lower
// case (and 'ſ), tabs, CRLF, runs of spaces and newlines, Unicode spaces, special-token
// strings inside text (whole, partial, nested), lone combining marks, random assigned
// code points, and long strings.
//
// `nfcRelevant` (optional) lists the code points NFC can touch (combining marks,
// decomposable and composable characters, from `tokenizer_oracle_tool nfc-relevant`);
// one category strings them together with base letters to stress normalisation.
//
// `unassigned` is a list of [first, last] code point ranges to avoid: the code points
// utf8proc 2.8 (Unicode 15.0, what lily uses) leaves unassigned, plus surrogates. The
// oracle (Rust tokenizers, Oniguruma, unicode-normalization) and Node's ICU may know newer
// Unicode versions, whose letters and compositions lily cannot know, so such code points
// are kept out of the corpus. Every string is valid Unicode (no lone surrogates).
'use strict';

function mulberry32(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The added tokens of Qwen3.6 (also covering Qwen3's).
const SPECIAL_TOKENS = [
  '<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|object_ref_start|>', '<|object_ref_end|>',
  '<|box_start|>', '<|box_end|>', '<|quad_start|>', '<|quad_end|>', '<|vision_start|>',
  '<|vision_end|>', '<|vision_pad|>', '<|image_pad|>', '<|video_pad|>', '<tool_call>',
  '</tool_call>', '<|fim_prefix|>', '<|fim_middle|>', '<|fim_suffix|>', '<|fim_pad|>',
  '<|repo_name|>', '<|file_sep|>', '<tool_response>', '</tool_response>', '<think>', '</think>',
  '<|audio_start|>', '<|audio_end|>', '<tts_pad>', '<tts_text_bos>', '<tts_text_eod>',
  '<tts_text_bos_single>', '<|audio_pad|>',
];

const WORDS = (
  'the of and to in is that for it with as was on be are this by you not or have from at an ' +
  'but they which one all we can there their what when will would about if out up so some ' +
  'time people into year your good could them see other than then now look only come its over ' +
  'think also back after use two how our work first well way even new want because any these ' +
  'give day most us tokenizer inference server model weights quantized checkpoint throughput ' +
  'latency memory bandwidth attention expert router prefill decode streaming request response ' +
  'internationalization antidisestablishmentarianism pneumonoultramicroscopic naïve café ' +
  'résumé coöperate façade jalapeño Zürich São Paulo Kraków Ærøskøbing straße Œuvre'
).split(' ');

const CODE = [
  'int main(int argc, char** argv) {\n  return 0;\n}\n',
  'def f(x):\n\treturn x ** 2  # square\n',
  'for (size_t i = 0; i < n; ++i) { sum += a[i] * b[i]; }',
  'const x = await fetch(`/v1/chat?q=${encodeURIComponent(q)}`);\r\n',
  'if (a != b && c <= d || !e) {\r\n    throw new Error("bad");\r\n}\r\n',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;',
  '#include <vector>\n#include "core/error.h"\n\nnamespace lily {}\n',
  '    \tmixed = [1, 2, 3]  \n\n\n    pass\n',
  'x=>x+1;;;;;;;;;;;;;;;;;;; // ===== ---- ____ ****',
  '<div class="a">&amp;&lt;</div>\n<br/>',
  'fn main() { println!("{:?}", vec![1u8, 2, 3]); }',
  '$ ./lily tokenize --tokenizer tokenizer.json < in.jsonl > out.jsonl',
  '{"role": "user", "content": "hi"}',
  'lambda: None\n\n\n\n\n',
  'a\tb\t\tc\t\t\td\n',
  'std::vector<std::pair<int,int>> v{{1,2},{3,4}};',
];

const CONTRACTIONS = [
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'vE",
  "'M", "'LL", "'Ll", "'lL", "'D", "'ſ", "'x", "'", "''", "’s", "’T", "'sss", "'dd", "'lll",
];

const CONTRACTED_SENTENCES = [
  "I'm sure it's fine, isn't it? We'll see; they'd know. You've been here, we're not.",
  "I'M SURE IT'S FINE, ISN'T IT? WE'LL SEE; THEY'D KNOW. YOU'VE BEEN HERE, WE'RE NOT.",
  "i'M sUrE iT'S fInE, We'Ll, tHeY'd, YoU'Ve, wE'rE.",
  "Rock 'n' roll 'til dawn: 'twas the night's end, o'clock, y'all'd've",
  "'sup? 'S alright. ''quoted'' 'single' \"double\" `back`",
  "It’s a curly apostrophe, don’t split it like 'this'.",
  "Naïve ſ: it'ſ an old long s; 'ſ 'ſſ ſ'",
];

const SPACES = [' ', '  ', '   ', '\t', '\n', '\r\n', '\r', '\n\n', ' \n', '\n ', '\t\n', '\u00a0',
  '\u3000', '\u2028', '\u2029', '\u0085', '\u000b', '\u000c', '\u001c', '\u001f', '\u2003', '\u200b',
  '\u202f', '\u205f', '\u1680', '\ufeff', '\u180e'];

const EMOJI = [
  '😀', '😂', '🥲', '🙏', '👍', '👍🏽', '👍🏿', '👩‍💻', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🏴‍☠️', '❤️', '❤️‍🔥', '🇯🇵',
  '🇺🇸', '🇩🇪🇫🇷', '1️⃣', '#️⃣', '*️⃣', '🧑🏾‍🤝‍🧑🏻', '🫠', '🦀', '🐍', '✅', '⚠️', '☺', '☺️', '👋🏼',
  '🤷‍♀️', '🤷🏻‍♂️', '🧔‍♂️', '🏃🏽‍♀️‍➡️', '©️', '™', '🔟', '🆗', '🀄', '🃏',
];

const NUMBERS = [
  '0', '7', '42', '123', '2024', '3.14159', '1,000,000', '-17', '+1 (555) 010-9999', '1e-9',
  '0x7fffffff', '１２３', '²', 'x²+y³', '½', '¾', 'Ⅻ', 'ⅷ', '٣٤٥', '۱۲۳', '१२३', '১২৩',
  '௧௨', '๑๒๓', '①②③', '𝟙𝟚𝟛', '12:30:45', '2024-06-11T12:00:00Z', '99.9%', '$1,234.56',
  '€5', '10⁻³', '٫٥', '00000000000000000000',
];

const SCRIPTS = [
  { name: 'cjk', ranges: [[0x4e00, 0x9fa5]], join: '', punct: ['，', '。', '！', '？', '、', '「', '」'] },
  { name: 'kana', ranges: [[0x3041, 0x3096], [0x30a1, 0x30fa]], join: '', punct: ['ー', '。', '・'] },
  { name: 'hangul', ranges: [[0xac00, 0xd7a3]], join: ' ', punct: ['.', ','] },
  { name: 'arabic', ranges: [[0x0621, 0x063a], [0x0641, 0x064a]], marks: [[0x064b, 0x0652]], join: ' ', punct: ['،', '؟', '.'] },
  { name: 'hebrew', ranges: [[0x05d0, 0x05ea]], marks: [[0x05b0, 0x05bc]], join: ' ', punct: ['.', '־'] },
  { name: 'devanagari', ranges: [[0x0915, 0x0939]], marks: [[0x093e, 0x094d], [0x0901, 0x0903]], join: ' ', punct: ['।', '॥'] },
  { name: 'bengali', ranges: [[0x0995, 0x09a8], [0x09aa, 0x09b0]], marks: [[0x09be, 0x09c4], [0x09cd, 0x09cd]], join: ' ', punct: ['।'] },
  { name: 'tamil', ranges: [[0x0b95, 0x0b95], [0x0b99, 0x0b9a], [0x0ba4, 0x0ba4], [0x0bae, 0x0bb9]], marks: [[0x0bbe, 0x0bc2], [0x0bcd, 0x0bcd]], join: ' ', punct: ['.'] },
  { name: 'thai', ranges: [[0x0e01, 0x0e2e]], marks: [[0x0e31, 0x0e31], [0x0e34, 0x0e3a], [0x0e47, 0x0e4e]], join: '', punct: [' '] },
  { name: 'cyrillic', ranges: [[0x0430, 0x044f], [0x0410, 0x042f]], join: ' ', punct: ['.', ',', '—'] },
  { name: 'greek', ranges: [[0x03b1, 0x03c9], [0x0391, 0x03a9]], marks: [[0x0301, 0x0301], [0x0308, 0x0308]], join: ' ', punct: [';', '·'] },
  { name: 'latin-marks', ranges: [[0x61, 0x7a], [0x41, 0x5a]], marks: [[0x0300, 0x0314], [0x0323, 0x0328], [0x0338, 0x0338]], join: ' ', punct: ['.', ','] },
];

const COMBINING = [0x0301, 0x0300, 0x0308, 0x0323, 0x0307, 0x0338, 0x20dd, 0x093f, 0x094d, 0x0651,
  0x0e49, 0x302a, 0x1ab0, 0xfe0f, 0x200d, 0x0345, 0x05b4, 0x0f71, 0x1dc0, 0x0903];

class Generator {
  constructor(seed, unassigned, nfcRelevant) {
    this.rand = mulberry32(seed);
    this.unassigned = unassigned;  // sorted [lo, hi] ranges
    this.nfcRelevant = nfcRelevant && nfcRelevant.length ? nfcRelevant : COMBINING;
  }
  below(n) { return Math.floor(this.rand() * n); }
  pick(list) { return list[this.below(list.length)]; }
  chance(p) { return this.rand() < p; }

  isUnassigned(cp) {
    let lo = 0;
    let hi = this.unassigned.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const [a, b] = this.unassigned[mid];
      if (cp < a) hi = mid - 1;
      else if (cp > b) lo = mid + 1;
      else return true;
    }
    return false;
  }
  fromRanges(ranges) {
    const [a, b] = this.pick(ranges);
    return a + this.below(b - a + 1);
  }
  char(cp) {
    if (this.isUnassigned(cp)) return '';
    return String.fromCodePoint(cp);
  }

  english() {
    const n = 3 + this.below(25);
    const out = [];
    for (let i = 0; i < n; ++i) {
      let w = this.pick(WORDS);
      const casing = this.below(12);
      if (casing === 0 || i === 0) w = w[0].toUpperCase() + w.slice(1);
      if (casing === 1) w = w.toUpperCase();
      out.push(w);
      if (this.chance(0.12)) out.push(this.pick([',', '.', ';', ':', '!', '?', ' -', ' —', '...']));
    }
    return out.join(' ').replace(/ ([,.;:!?])/g, '$1') + this.pick(['.', '!', '?', '', '\n', '.\n\n']);
  }
  script() {
    const s = this.pick(SCRIPTS);
    const words = 1 + this.below(8);
    let out = '';
    for (let w = 0; w < words; ++w) {
      const len = 1 + this.below(7);
      for (let i = 0; i < len; ++i) {
        out += this.char(this.fromRanges(s.ranges));
        if (s.marks && this.chance(0.45)) {
          out += this.char(this.fromRanges(s.marks));
          if (this.chance(0.2)) out += this.char(this.fromRanges(s.marks));  // mark order may be non-canonical
        }
      }
      if (this.chance(0.2)) out += this.pick(s.punct);
      if (w + 1 < words) out += s.join;
    }
    if (s.name === 'hangul' && this.chance(0.3)) out = out.normalize('NFD');  // decomposed jamo
    if (s.name === 'latin-marks' && this.chance(0.3)) out = out.normalize('NFC');
    return out;
  }
  emoji() {
    let out = '';
    const n = 1 + this.below(6);
    for (let i = 0; i < n; ++i) {
      out += this.pick(EMOJI);
      if (this.chance(0.3)) out += this.pick([' ', '', '\n', 'ok', '!']);
    }
    return out;
  }
  numbers() {
    const n = 1 + this.below(6);
    const out = [];
    for (let i = 0; i < n; ++i) out.push(this.pick(NUMBERS));
    return out.join(this.pick([' ', '', ', ', '\n', '+', 'x']));
  }
  code() {
    let out = this.pick(CODE);
    if (this.chance(0.3)) out = out.replace(/\n/g, '\r\n');
    if (this.chance(0.3)) out = out.replace(/ {4}/g, '\t');
    return out;
  }
  contractions() {
    if (this.chance(0.4)) return this.pick(CONTRACTED_SENTENCES);
    let out = '';
    const n = 1 + this.below(6);
    for (let i = 0; i < n; ++i) {
      out += this.pick(['', 'I', 'you', 'WE', 'it', 'x', '1', ' ', '(', '"']) + this.pick(CONTRACTIONS);
      out += this.pick(['', ' ', 'a', 'S', '.', '\n', "'", '5']);
    }
    return out;
  }
  whitespace() {
    let out = '';
    const n = 1 + this.below(10);
    for (let i = 0; i < n; ++i) {
      const unit = this.pick(SPACES);
      out += unit.repeat(1 + this.below(5));
      if (this.chance(0.5)) out += this.pick(['a', 'word', '1', '.', '!', '😀', 'é', '\u0301', '中', '']);
    }
    return out;
  }
  specials() {
    let out = '';
    const n = 1 + this.below(5);
    for (let i = 0; i < n; ++i) {
      const t = this.pick(SPECIAL_TOKENS);
      const r = this.below(10);
      if (r === 0) out += t.slice(0, 1 + this.below(t.length - 1));          // partial
      else if (r === 1) out += t.slice(1);                                  // partial
      else if (r === 2) out += '<' + t;                                     // nested-looking
      else if (r === 3) out += t + t;                                       // adjacent
      else if (r === 4) out += t.toUpperCase();                             // case differs
      else out += t;
      out += this.pick(['', ' ', '\n', 'user\n', 'assistant\n', 'text', '\u0338', '\u0301', '  ', '>', '|>']);
    }
    return out;
  }
  loneMarks() {
    let out = '';
    const n = 1 + this.below(5);
    for (let i = 0; i < n; ++i) {
      out += this.pick(['', ' ', '\n', '1', '.', 'a', '<think>', '>', '=', '<', '中', '😀', '\t']);
      const marks = 1 + this.below(3);
      for (let k = 0; k < marks; ++k) out += String.fromCodePoint(this.pick(COMBINING));
    }
    return out;
  }
  nfcStress() {
    let out = '';
    const n = 1 + this.below(8);
    for (let i = 0; i < n; ++i) {
      out += this.pick(['a', 'e', 'o', 'A', 'u', 'z', '\u0915', '\u0627', '\u05d0', '\uac00', '\u1100', '\u1161',
        '\u11a8', '\u3046', '\u0b47', '\u0dd9', '\u1025', '\u{11935}', '\u{11099}', ' ', '', '1', '>', '\u03b1']);
      const marks = this.below(4);
      for (let k = 0; k < marks; ++k) out += this.char(this.pick(this.nfcRelevant));
    }
    return out;
  }
  randomCodePoints() {
    let out = '';
    const n = 1 + this.below(12);
    for (let i = 0; i < n; ++i) {
      let cp;
      const plane = this.below(10);
      if (plane < 5) cp = this.below(0x3000);
      else if (plane < 8) cp = this.below(0x10000);
      else if (plane < 9) cp = 0x10000 + this.below(0x20000);
      else cp = this.below(0x110000);
      if (cp >= 0xd800 && cp <= 0xdfff) continue;
      out += this.char(cp);
    }
    return out;
  }
  long() {
    let out = '';
    const target = 1000 + this.below(6000);
    while (out.length < target) out += this.fragment(false) + this.pick([' ', '\n', '', '\n\n']);
    return out;
  }
  fragment(allowLong) {
    const kinds = ['english', 'english', 'script', 'script', 'emoji', 'numbers', 'code', 'contractions',
      'whitespace', 'specials', 'loneMarks', 'randomCodePoints', 'nfcStress'];
    if (allowLong && this.chance(0.01)) return this.long();
    return this[this.pick(kinds)]();
  }
  string() {
    const r = this.below(100);
    if (r < 55) return this.fragment(true);
    if (r < 97) {
      let out = '';
      const n = 2 + this.below(4);
      for (let i = 0; i < n; ++i) out += this.fragment(false) + this.pick(['', ' ', '\n', '\t', '  ']);
      return out;
    }
    return this.pick(['', ' ', '\n', 'a', "'", "'s", '\u0301', '<|im_end|>', '  ', '\r\n', '1', '😀']);
  }
}

function generateCorpus(seed, count, unassigned, nfcRelevant) {
  const gen = new Generator(seed, unassigned, nfcRelevant);
  const out = [];
  for (let i = 0; i < count; ++i) out.push(gen.string());
  return out;
}

module.exports = { generateCorpus, SPECIAL_TOKENS, mulberry32 };

if (require.main === module) {
  // node corpus.js SEED COUNT [UNASSIGNED_JSON [NFC_RELEVANT_JSON]] > corpus.jsonl
  const [seed, count, unassignedFile, nfcFile] = process.argv.slice(2);
  const read = (f) => (f ? JSON.parse(require('fs').readFileSync(f, 'utf8')) : []);
  for (const s of generateCorpus(Number(seed || 1), Number(count || 10), read(unassignedFile), read(nfcFile))) {
    process.stdout.write(JSON.stringify(s) + '\n');
  }
}
